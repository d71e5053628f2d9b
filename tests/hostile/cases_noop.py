"""Class 5, options that would do nothing are refused, not accepted.

Each case sets something that has no effect where it is set (KV events on an engine that emits
none, a prefix-cache router with no prefix cache, a gate over zero operations, a sweep point
that cannot start) and expects one line, exit 2, before anything runs or is written.
"""

from __future__ import annotations

from tests.hostile.harness import Case, tiny

RUN = ("run", "s.yaml", "--no-plots", "-o", "out")


def with_engine(engine: str, design: str = "v1-engine", prefix_caching: bool = False) -> str:
    """The tiny scenario on `design` with an `engine:` flow mapping, prefix caching set on or
    off (V1 releases turn it on when unset)."""
    text = tiny(design=design).replace("expect:", f"engine: {engine}\nexpect:")
    return text.replace(
        "sliding_window: null}",
        f"sliding_window: null, enable_prefix_caching: {str(prefix_caching).lower()}}}",
    )


def with_scheduler(extra: str, design: str = "v1-engine") -> str:
    """The tiny scenario on `design` with more scheduler fields (`extra`: 'key: value, ...')."""
    return tiny(design=design).replace("max_model_len: 256}", f"max_model_len: 256, {extra}}}")


def with_cache(extra: str, design: str = "v1-engine") -> str:
    """The tiny scenario on `design` with more cache fields."""
    return tiny(design=design).replace("sliding_window: null}", f"sliding_window: null, {extra}}}")


#: Disaggregated: the tiny scenario on a model (the KV bytes a transfer moves).
DISAGG = (
    tiny()
    .replace("model: null", "model: llama-3.1-8b")
    .replace("num_gpu_blocks: 64", "num_gpu_blocks: 20000")
    + "cluster: {mode: disaggregated, prefill: {replicas: 1}, decode: {replicas: 1}}\n"
)

SESSIONS = """\
  kind: sessions
  seed: 1
  sessions:
    source: synthetic
    num_sessions: 2
    arrival: {rate_per_s: 10.0}
    turns: {min: 2, max: 2}
    first_prompt: {kind: uniform, max_tokens: 40}
    new_tokens: {kind: uniform, max_tokens: 10}
    output: {kind: uniform, max_tokens: 5}
    think_s: {kind: fixed, mean_s: 0.0}
"""
_INLINE = """\
  kind: inline
  requests:
    - {arrival_s: 0.0, prompt_tokens: 40, output_tokens: 4}
    - {arrival_s: 0.01, prompt_tokens: 20, output_tokens: 3}
"""

#: No design can start it: one max-length request needs more blocks than the pool has.
NOBODY_STARTS = tiny().replace("max_model_len: 256", "max_model_len: 100000")

CASES: list[Case] = [
    *(
        Case(
            "noop",
            RUN,
            2,
            "kv_events",
            files={"s.yaml": with_engine("{kv_events: true}", design=design)},
            outputs=("out",),
            name=f"engine.kv_events on {design} (an empty table)",
        )
        for design in ("v0-v1", "v0-v2", "v0-fixed")
    ),
    Case(
        "noop",
        ("check", "s.yaml"),
        2,
        "kv_events",
        files={"s.yaml": with_engine("{kv_events: true}", design="v0-v2")},
        name="check engine.kv_events on v0-v2",
    ),
    Case(
        "noop",
        (*RUN, "--set", "engine.kv_events=true", "--set", "scheduler.design=v0-v2"),
        2,
        "kv_events",
        files={"s.yaml": tiny()},
        outputs=("out",),
        name="run --set engine.kv_events=true on v0-v2",
    ),
    Case(
        "noop",
        ("disagg", "s.yaml", "-o", "out"),
        2,
        "kv_events",
        files={"s.yaml": DISAGG.replace("expect:", "engine: {kv_events: true}\nexpect:")},
        outputs=("out",),
        name="disagg with engine.kv_events (no kv_events table)",
    ),
    Case(
        "noop",
        ("disagg", "s.yaml", "-o", "out"),
        2,
        "sessions",
        files={"s.yaml": DISAGG.replace(_INLINE, SESSIONS)},
        outputs=("out",),
        name="disagg with a sessions workload (no sessions table)",
    ),
    Case(
        "noop",
        RUN,
        2,
        "prefix_cache_aware",
        files={
            "s.yaml": with_engine("{num_replicas: 2, router: prefix_cache_aware}", design="v0-v2")
        },
        outputs=("out",),
        name="prefix_cache_aware routing on v0-v2 (no KV events to route by)",
    ),
    Case(
        "noop",
        RUN,
        2,
        "enable_prefix_caching",
        files={"s.yaml": with_engine("{num_replicas: 2, router: prefix_cache_aware}")},
        outputs=("out",),
        name="prefix_cache_aware routing with prefix caching off",
    ),
    Case(
        "noop",
        (*RUN, "--set", "engine.router=prefix_cache_aware", "--set", "engine.num_replicas=2"),
        2,
        "prefix_cache_aware",
        files={"s.yaml": with_cache("enable_prefix_caching: false")},
        outputs=("out",),
        name="run --set engine.router=prefix_cache_aware with prefix caching off",
    ),
    Case(
        "noop",
        ("disagg", "s.yaml", "-o", "out"),
        2,
        "prefix_cache_aware",
        files={
            "s.yaml": DISAGG.replace(
                "decode: {replicas: 1}", "decode: {replicas: 2, router: prefix_cache_aware}"
            ).replace(
                "sliding_window: null}", "sliding_window: null, enable_prefix_caching: false}"
            )
        },
        outputs=("out",),
        name="disagg pool router prefix_cache_aware with prefix caching off",
    ),
    Case(
        "noop",
        RUN,
        0,
        "outputs",
        files={
            "s.yaml": with_engine(
                "{num_replicas: 2, router: prefix_cache_aware}", prefix_caching=True
            )
        },
        outputs=("out",),
        name="prefix_cache_aware routing with prefix caching on runs",
    ),
    Case(
        "noop",
        RUN,
        2,
        "router_staleness_s",
        files={"s.yaml": with_engine("{num_replicas: 2, router_staleness_s: 0.5}")},
        outputs=("out",),
        name="engine.router_staleness_s under round_robin",
    ),
    Case(
        "noop",
        RUN,
        2,
        "router_load_weight",
        files={
            "s.yaml": with_engine(
                "{num_replicas: 2, router: least_outstanding, router_load_weight: 3}"
            )
        },
        outputs=("out",),
        name="engine.router_load_weight under least_outstanding",
    ),
    Case(
        "noop",
        RUN,
        2,
        "long_prefill_token_threshold",
        files={"s.yaml": with_scheduler("long_prefill_token_threshold: 16", design="v0-v2")},
        outputs=("out",),
        name="long_prefill_token_threshold on v0-v2 (a V1-engine setting)",
    ),
    Case(
        "noop",
        RUN,
        2,
        "preemption_mode",
        files={"s.yaml": with_scheduler("preemption_mode: swap")},
        outputs=("out",),
        name="preemption_mode swap on v1-engine (recompute only)",
    ),
    Case(
        "noop",
        RUN,
        2,
        "num_cpu_blocks",
        files={"s.yaml": tiny().replace("num_cpu_blocks: 0", "num_cpu_blocks: 32")},
        outputs=("out",),
        name="cache.num_cpu_blocks on v1-engine (no swap space)",
    ),
    Case(
        "noop",
        RUN,
        2,
        "swap_space_gib",
        files={"s.yaml": with_cache("swap_space_gib: 8")},
        outputs=("out",),
        name="cache.swap_space_gib on v1-engine (no swap space)",
    ),
    Case(
        "noop",
        ("compare-versions", "s.yaml", "--no-plots", "-j", "1", "-o", "out"),
        2,
        "every design",
        files={"s.yaml": NOBODY_STARTS},
        name="compare-versions on a scenario every design refuses",
    ),
    Case(
        "noop",
        (
            "sweep",
            "s.yaml",
            "--no-plots",
            "-j",
            "1",
            "-o",
            "out",
            "--set",
            "scheduler.max_model_len=256,100000",
        ),
        2,
        "100000",
        files={"s.yaml": tiny()},
        name="sweep with a point whose max_model_len cannot fit",
    ),
    Case(
        "noop",
        (
            "sweep",
            "s.yaml",
            "--no-plots",
            "-j",
            "1",
            "-o",
            "out",
            "--set",
            "scheduler.max_num_batched_tokens=100,2048",
        ),
        2,
        "max_num_batched_tokens",
        files={"s.yaml": with_scheduler("enable_chunked_prefill: false")},
        name="sweep with a point whose budget vLLM refuses",
    ),
    Case(
        "noop",
        (
            "sweep",
            "s.yaml",
            "--no-plots",
            "-j",
            "1",
            "-o",
            "out",
            "--set",
            "scheduler.design=v1-engine,v0-v2",
        ),
        2,
        "kv_events",
        files={"s.yaml": with_engine("{kv_events: true}")},
        name="sweep over designs with engine.kv_events (the v0 point records none)",
    ),
    Case(
        "noop",
        (
            "sweep",
            "s.yaml",
            "--no-plots",
            "-j",
            "1",
            "-o",
            "out",
            "--set",
            "engine.max_sim_time_s=5,10",
        ),
        2,
        "disagg",
        files={"s.yaml": DISAGG},
        name="sweep of a disaggregated scenario (every point an error row)",
    ),
    Case(
        "noop",
        ("verify", "--num-ops", "0"),
        2,
        "--num-ops",
        name="verify --num-ops 0 (identical over 0 operations)",
    ),
    Case("noop", ("verify", "--num-ops", "-5"), 2, "--num-ops", name="verify --num-ops -5"),
    Case(
        "noop",
        ("verify", "--ops-per-workload", "0"),
        2,
        "--ops-per-workload",
        name="verify --ops-per-workload 0",
    ),
    Case(
        "noop",
        ("verify", "--num-workloads", "5"),
        2,
        "--scheduler",
        name="verify --num-workloads without --scheduler",
    ),
    Case(
        "noop",
        ("verify", "--fast-path"),
        2,
        "--scheduler",
        name="verify --fast-path without --scheduler",
    ),
    Case(
        "noop",
        ("verify", "--pin", "0.11.0"),
        2,
        "--scheduler",
        name="verify --pin without --scheduler",
    ),
    Case(
        "noop",
        ("verify", "--trace", "t.jsonl"),
        2,
        "--scheduler",
        files={"t.jsonl": ""},
        name="verify --trace without --scheduler",
    ),
    Case(
        "noop",
        ("verify", "--scheduler", "--hybrid", "--trace", "t.jsonl"),
        2,
        "--hybrid",
        files={"t.jsonl": ""},
        name="verify --scheduler --hybrid --trace (the trace's windows draw no groups)",
    ),
    Case(
        "noop",
        ("verify", "--scheduler", "--num-ops", "100"),
        2,
        "--num-ops",
        name="verify --scheduler --num-ops (counts workloads, not operations)",
    ),
    Case(
        "noop",
        ("calibrate", "--budget", "-1", "-o", "p.json"),
        2,
        "--budget",
        name="calibrate --budget -1",
    ),
    Case(
        "noop",
        ("calibrate", "--budget", "0", "-o", "p.json"),
        2,
        "--budget",
        name="calibrate --budget 0",
    ),
    Case(
        "noop",
        ("calibrate", "--budget", "nan", "-o", "p.json"),
        2,
        "--budget",
        name="calibrate --budget nan",
    ),
    Case(
        "noop",
        (
            "capacity",
            "s.yaml",
            "--slo",
            "ttft_p99=2s",
            "--no-band",
            "--step-time-band",
            "0.9,1.3",
            "-o",
            "out",
            "--no-plots",
        ),
        2,
        "--step-time-band",
        files={"s.yaml": tiny()},
        name="capacity --step-time-band with --no-band",
    ),
]


# ------------------------------------- planning commands: the workload's files, up front
def _fifo_at(rel: str):
    """A setup making a FIFO at `rel` (a trace reader would block on it)."""
    import os

    def setup(folder) -> None:
        os.mkfifo(folder / rel)

    return setup


def _workload(workload: str) -> str:
    """The tiny scenario with the `workload:` flow mapping `workload`."""
    text = tiny()
    start = text.index("workload:")
    end = text.index("step_time:")
    return text[:start] + f"workload: {workload}\n" + text[end:]


_TRACE = _workload("{kind: trace, path: t.csv}")
_LENGTHS = _workload(
    "{kind: synthetic, num_requests: 4, seed: 1, arrival: {process: poisson, rate_per_s: 10.0},"
    " lengths: {prompt: {kind: trace, path: p.csv, format: lengths},"
    " output: {kind: fixed, value: 4}}}"
)
_MOONCAKE = _workload("{kind: sessions, sessions: {source: mooncake, path: m.jsonl}}")
_PLANNERS = {
    "sweep": ("sweep", "s.yaml", "--no-plots", "-j", "1", "-o", "out")
    + ("--set", "workload.rate_scale=1,2"),
    "capacity": ("capacity", "s.yaml", "--slo", "ttft_p99=2s", "--no-band", "-o", "out")
    + ("--no-plots",),
    "compare-versions": ("compare-versions", "s.yaml", "--no-plots", "-j", "1", "-o", "out"),
}


def _unreadable(command: str, text: str, rel: str, fifo: bool) -> Case:
    what = "a FIFO" if fifo else "a missing file"
    return Case(
        "noop",
        _PLANNERS[command],
        2,
        "not a regular file" if fifo else "no such file",
        files={"s.yaml": text},
        setup=_fifo_at(rel) if fifo else None,
        subprocess=fifo,
        timeout_s=30.0,
        outputs=("out",),
        name=f"{command} on a workload whose {rel} is {what} (error rows, exit 0/1)",
    )


CASES += [_unreadable(c, _TRACE, "t.csv", fifo) for c in _PLANNERS for fifo in (True, False)]
CASES += [
    _unreadable("sweep", _LENGTHS, "p.csv", True),
    _unreadable("capacity", _LENGTHS, "p.csv", False),
    _unreadable("sweep", _MOONCAKE, "m.jsonl", True),
    _unreadable("compare-versions", _MOONCAKE, "m.jsonl", False),
]
