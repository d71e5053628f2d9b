"""Class 6, messages name the cause in the user's words: the option typed, the file and field.

Each case checks that the one error line names what the user wrote (`--rate`, not the scenario
key it becomes; the unknown router, not "give distinct names"; `hardware.gpu`, not the section
that first used it; the scenario file as well as the field) and, where there is a choice, lists
the known names.
"""

from __future__ import annotations

from tests.hostile.harness import Case, tiny

#: A tiny synthetic workload (cluster-capacity and capacity need one): no model, linear steps.
SYNTH = """\
name: synth
model: null
cache: {block_size: 16, num_gpu_blocks: 64, num_cpu_blocks: 0, sliding_window: null}
scheduler: {design: v1-engine, max_model_len: 256}
workload:
  kind: synthetic
  num_requests: 4
  seed: 1
  arrival: {process: poisson, rate_per_s: 2}
  lengths:
    prompt: {kind: fixed, value: 16}
    output: {kind: fixed, value: 2}
step_time: {linear: {fixed_s: 0.01}}
"""

#: The tiny scenario on a catalog model (so the GPU is looked up), blocks given.
ON_GPU = tiny().replace("model: null", "model: llama-3.1-8b\nhardware: {gpu: GPU}")
#: ... with the measured step-time model (the GPU's first user used to be `step_time`).
ON_GPU_MEASURED = ON_GPU.replace("step_time: {linear: {fixed_s: 0.01}}\n", "")
#: ... with a derived block count (the GPU's first user used to be `cache.num_gpu_blocks`).
ON_GPU_DERIVED = ON_GPU_MEASURED.replace("num_gpu_blocks: 64, ", "")


def _expect(violations: str) -> str:
    return tiny().replace("expect: {violations: none}", f"expect: {{violations: {violations}}}")


def _cc(*extra: str) -> tuple[str, ...]:
    """`kvsim cluster-capacity` on the synthetic scenario with valid SLOs."""
    return ("cluster-capacity", "s.yaml", "--ttft-p99-s", "1", "--tpot-p99-s", "1", *extra)


def _cases() -> list[Case]:
    cases: list[Case] = []

    def add(argv, exit, fragment, name, files=None, **kw) -> None:
        cases.append(
            Case("messages", tuple(argv), exit, fragment, files=files or {}, name=name, **kw)
        )

    synth = {"s.yaml": SYNTH}
    # --rate is the option typed; workload.arrival.rate_per_s is kvsim's business.
    for rate, shown in (("inf", "inf"), ("nan", "nan"), ("1e400", "inf"), ("-inf", "-inf")):
        add(_cc("--rate", rate), 2, f"--rate {shown}", f"cluster-capacity --rate {rate}", synth)
    add(_cc("--rate", "-1"), 2, "--rate -1", "cluster-capacity --rate negative", synth)
    add(_cc("--rate", "1", "--max-gpus", "0"), 2, "--max-gpus 0", "cluster-capacity gpus 0", synth)
    # --routers: an unknown name is named, with the known ones; "distinct" only for repeats.
    add(
        _cc("--rate", "1", "--routers", "bogus,round_robin"),
        2,
        "unknown router 'bogus'",
        "routers: unknown among distinct is named, not 'give distinct names'",
        synth,
    )
    add(
        _cc("--rate", "1", "--routers", "bogus"),
        2,
        "known: round_robin, least_outstanding",
        "routers: one unknown lists the known routers",
        synth,
    )
    add(
        _cc("--rate", "1", "--routers", "round_robin,bogus2,bogus3"),
        2,
        "'bogus2', 'bogus3'",
        "routers: every unknown name is named",
        synth,
    )
    add(
        _cc("--rate", "1", "--routers", "round_robin,round_robin"),
        2,
        "round_robin is given twice",
        "routers: a repeat says which name repeats",
        synth,
    )
    add(
        _cc("--rate", "1", "--routers", "round_robin,,least_kv_usage"),
        2,
        "an empty name",
        "routers: an empty name between commas",
        synth,
    )
    # --target-rate and --compare on capacity are named as typed.
    add(
        ("capacity", "s.yaml", "--slo", "ttft_p99=1s", "--target-rate", "inf", "--no-plots"),
        2,
        "--target-rate inf",
        "capacity --target-rate inf is bad input, not an OverflowError",
        synth,
    )
    add(
        ("capacity", "s.yaml", "--slo", "ttft_p99=1s", "--compare", "scheduler.bogus=1,2"),
        2,
        "--compare scheduler.bogus=1",
        "capacity --compare names --compare, not --set",
        synth,
    )
    # run --set: the assignment at fault is named as typed.
    add(
        ("run", "s.yaml", "--no-plots", "--set", "cache.block_size=4", "--set", "bogus.key=1"),
        2,
        "--set bogus.key=1",
        "run --set names the assignment at fault",
        {"s.yaml": tiny()},
    )
    add(
        ("run", "s.yaml", "--no-plots", "--set", "scheduler.design=bogus"),
        2,
        "--set scheduler.design=bogus",
        "run --set names a bad value's assignment",
        {"s.yaml": tiny()},
    )
    # expect: an unknown violation kind is named and the known kinds listed.
    for argv in (("check", "s.yaml"), ("run", "s.yaml", "--no-plots")):
        add(
            argv,
            2,
            "unknown violation kind 'bogus_kind'",
            f"{argv[0]}: expect lists an unknown kind",
            {"s.yaml": _expect("[bogus_kind]")},
        )
    add(
        ("check", "s.yaml"),
        2,
        "no_progress",
        "expect: an unknown kind lists the known kinds",
        {"s.yaml": _expect("[admission_undercount, bogus]")},
    )
    add(
        ("check", "s.yaml"),
        2,
        "s.yaml: expect.violations: unknown violation kind 'nonee'",
        "expect: a misspelt none",
        {"s.yaml": _expect("nonee")},
    )
    add(
        ("check", "s.yaml"),
        2,
        "expect.violations: expected none, any or a list",
        "expect: a mapping of kinds",
        {"s.yaml": _expect("{leaked_blocks: 1}")},
    )
    # hardware.gpu is reported under hardware.gpu, whichever section uses it first.
    for label, text in (
        ("linear steps", ON_GPU),
        ("measured steps", ON_GPU_MEASURED),
        ("derived blocks", ON_GPU_DERIVED),
    ):
        add(
            ("check", "s.yaml"),
            2,
            "s.yaml: hardware.gpu: unknown GPU 'bogus-gpu'",
            f"hardware.gpu unknown ({label}) is named as hardware.gpu",
            {"s.yaml": text.replace("GPU}", "bogus-gpu}")},
        )
    add(
        ("run", "s.yaml", "--no-plots", "--set", "hardware.gpu=bogus-gpu"),
        2,
        "hardware.gpu: unknown GPU 'bogus-gpu'",
        "run --set hardware.gpu unknown",
        {"s.yaml": ON_GPU_DERIVED.replace("GPU}", "h100-sxm}")},
    )
    add(
        ("check", "s.yaml"),
        0,
        "1 passed",
        "hardware.gpu: catalog names are case-insensitive",
        {"s.yaml": ON_GPU.replace("GPU}", "H100-SXM}")},
    )
    # cache.block_size: true is block_size's fault, not max_model_len's.
    for value in ("true", "false"):
        add(
            ("check", "s.yaml"),
            2,
            "cache.block_size",
            f"cache.block_size {value} is named as block_size",
            {"s.yaml": tiny().replace("block_size: 16", f"block_size: {value}")},
        )
    add(
        ("run", "s.yaml", "--no-plots", "--set", "cache.block_size=true"),
        2,
        "cache.block_size",
        "run --set cache.block_size=true is named as block_size",
        {"s.yaml": tiny()},
    )
    # Resolution errors name the scenario file as well as the field.
    add(
        ("check", "s.yaml"),
        2,
        "s.yaml: scheduler.max_model_len",
        "resolution: a pool too small names the file",
        {"s.yaml": tiny().replace("num_gpu_blocks: 64", "num_gpu_blocks: 4")},
    )
    add(
        ("run", "s.yaml", "--no-plots"),
        2,
        "s.yaml: model: unknown model 'bogus-model'",
        "resolution: an unknown model names the file",
        {"s.yaml": tiny().replace("model: null", "model: bogus-model")},
    )
    add(
        ("run", "sub/s.yaml", "--no-plots"),
        2,
        "s.yaml: scheduler.max_model_len",
        "resolution: run names the file",
        {"sub/s.yaml": tiny().replace("num_gpu_blocks: 64", "num_gpu_blocks: 4")},
    )
    small_synth = {"s.yaml": SYNTH.replace("num_gpu_blocks: 64", "num_gpu_blocks: 4")}
    add(
        _cc("--rate", "1", "--max-gpus", "1"),
        2,
        "s.yaml: scheduler.max_model_len",
        "resolution: cluster-capacity names the file",
        small_synth,
    )
    add(
        ("shrink", "s.yaml", "-o", "min.yaml"),
        2,
        "s.yaml: scheduler.max_model_len",
        "resolution: shrink names the file",
        {"s.yaml": tiny().replace("num_gpu_blocks: 64", "num_gpu_blocks: 4")},
    )
    add(
        ("run", "s.yaml", "--no-plots", "--set", "bogus=1"),
        2,
        "error: --set bogus=1: unknown key",
        "a --set error is about the command line: not prefixed with the file",
        {"s.yaml": tiny()},
    )
    # verify: an input error is not hidden behind the vLLM-install check.
    add(
        ("verify", "--design", "v0-fixed", "--num-ops", "10"),
        2,
        "v0-fixed has no vLLM counterpart",
        "verify --design v0-fixed says it is not verifiable, not 'not installed'",
    )
    add(
        ("verify", "--design", "v0-fixed", "--vllm-version", "99.0"),
        2,
        "no vLLM counterpart",
        "verify --design v0-fixed with a version",
    )
    add(
        ("verify", "--design", "bogus"),
        2,
        "--design 'bogus'",
        "verify --design unknown",
    )
    add(
        ("verify", "--vllm-version", "99.0", "--num-ops", "10"),
        2,
        "99.0 is not a release kvsim pins",
        "verify --vllm-version 99.0 is not a release",
    )
    add(
        ("verify", "--vllm-version", "99.0"),
        2,
        "0.5.4",
        "verify --vllm-version 99.0 lists the pins",
    )
    add(
        ("verify", "--scheduler", "--vllm-version", "99.0"),
        2,
        "not a release kvsim pins",
        "verify --scheduler --vllm-version 99.0",
    )
    # kvsim step / calibrate: the option typed.
    add(
        ("step", "--model", "llama-3.1-8b", "--gpu", "bogus", "--decode", "4x100"),
        2,
        "--gpu 'bogus': unknown GPU",
        "step --gpu unknown names --gpu",
    )
    add(
        ("step", "--model", "bogus", "--gpu", "h100-sxm", "--decode", "4x100"),
        2,
        "--model 'bogus': unknown model",
        "step --model unknown names --model",
    )
    for option in ("--gpu", "--model"):
        add(
            ("calibrate", option, "bogus", "--budget", "1", "-o", "p.json"),
            2,
            f"{option} 'bogus': unknown",
            f"calibrate {option} unknown names {option}, before any timing",
        )
    # typer's own usage errors stay a short box (no help text dump).
    add(("run", "--bogus-option"), 2, "No such option", "usage: an unknown option")
    return cases


CASES: list[Case] = _cases()
