"""Class 3, values: strict types, finite numbers, positive sizes, 64-bit integers, times that
resolve a millisecond, zero-time step models, unknown pool routers, corrupt tables, --set twice.

Every scenario section gets the same hostile values: YAML `true`/`false` where a number goes,
a float (16.5) or a string ("16") where an integer goes, `.inf` / `.nan` / `1.0e999` where a
float goes, 0 or negative sizes, 2**70 where an integer goes. A scenario is written from the
tiny V1 one by `scenario(path, raw)`: `path` is the dotted key, `raw` its YAML text as typed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.hostile.harness import Case, tiny

_MARK = "@@VALUE@@"
HUGE = str(2**70)  # an integer beyond 64 bits


def _base() -> dict[str, Any]:
    return yaml.safe_load(tiny("values"))


def scenario(path: str, raw: str, base: dict[str, Any] | None = None) -> str:
    """The tiny scenario with `path` (dotted; list items by index) set to the YAML text `raw`."""
    data = base if base is not None else _base()
    parts = path.split(".")
    node: Any = data
    for part in parts[:-1]:
        key: Any = int(part) if part.isdigit() else part
        if isinstance(node, dict) and key not in node:
            node[key] = {}
        node = node[key]
    last: Any = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
    node[last] = _MARK
    return yaml.safe_dump(data, sort_keys=False).replace(f"'{_MARK}'", raw)


def _with(section: str, value: dict[str, Any]) -> dict[str, Any]:
    data = _base()
    data[section] = value
    return data


_SYNTHETIC = {
    "kind": "synthetic",
    "num_requests": 5,
    "seed": 1,
    "arrival": {"process": "poisson", "rate_per_s": 10.0},
    "lengths": {
        "prompt": {"kind": "fixed", "value": 32},
        "output": {"kind": "fixed", "value": 4},
    },
}
_SESSIONS = {
    "kind": "sessions",
    "seed": 1,
    "sessions": {
        "source": "synthetic",
        "num_sessions": 2,
        "arrival": {"process": "poisson", "rate_per_s": 2.0},
        "turns": {"min": 1, "max": 2},
        "first_prompt": {"kind": "fixed", "value": 32},
        "new_tokens": {"kind": "fixed", "value": 8},
        "output": {"kind": "fixed", "value": 4},
        "think_s": {"kind": "fixed", "mean_s": 0.5},
    },
}
_MODEL = {
    "name": "my-model",
    "num_layers": 2,
    "hidden_size": 256,
    "num_attention_heads": 4,
    "num_kv_heads": 4,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 1000,
    "max_position_embeddings": 4096,
}
_GPU = {
    "name": "my-gpu",
    "memory_gb": 80.0,
    "hbm_bandwidth_GBps": 3000.0,
    "bf16_tflops": 900.0,
    "fp16_tflops": 900.0,
    "interconnect_GBps": 400.0,
    "source": "mine",
}
_DISAGG = {
    "mode": "disaggregated",
    "prefill": {"replicas": 1},
    "decode": {"replicas": 1},
    "link": "rdma-400g",
}
_LINK = {"bandwidth_Gbps": 400.0, "efficiency": 0.9, "latency_us": 10.0}


def _flow(fields: dict[str, Any], **raw: str) -> str:
    """A YAML flow mapping of `fields`, with `raw` values written as typed."""
    items = [f"{k}: {raw.get(k, v)}" for k, v in {**fields, **raw}.items()]
    return "{" + ", ".join(items) + "}"


def _synthetic() -> dict[str, Any]:
    return _with("workload", yaml.safe_load(yaml.safe_dump(_SYNTHETIC)))


def _sessions() -> dict[str, Any]:
    return _with("workload", yaml.safe_load(yaml.safe_dump(_SESSIONS)))


def _measured_model(**model: Any) -> dict[str, Any]:
    data = _base()
    data["model"] = {**_MODEL, **model}
    data["step_time"] = {"roofline": {}}
    return data


def _disagg(**cluster: Any) -> dict[str, Any]:
    data = _base()
    data["model"] = "llama-3.1-8b"
    data["cluster"] = {**_DISAGG, **cluster}
    return data


def _bad(
    path: str, raw: str, fragment: str, base=None, name: str = "", command="run", sub=None
) -> Case:
    """`kvsim run` (or `check`) of the tiny scenario with `path: raw`: exit 2 naming it."""
    argv = ("run", "s.yaml", "--no-plots", "-o", "out") if command == "run" else (command, "s.yaml")
    base_copy = yaml.safe_load(yaml.safe_dump(base)) if base is not None else None
    return Case(
        "values",
        argv,
        2,
        fragment,
        files={"s.yaml": scenario(path, raw, base_copy)},
        outputs=("out",),
        name=name or f"{command} {path}: {raw}",
        # A huge or zero size may allocate or spin on a regression: bound it in a subprocess.
        subprocess=(raw == HUGE or raw.lstrip("-").isdigit()) if sub is None else sub,
    )


# -------------------------------------------------------------------------- strict types
_TYPES = [
    _bad("cache.block_size", "true", "cache.block_size", name="block_size true is not 1"),
    _bad("cache.block_size", "16.5", "cache.block_size"),
    _bad("cache.block_size", "'16'", "cache.block_size"),
    _bad("cache.num_gpu_blocks", "true", "cache.num_gpu_blocks"),
    _bad("cache.num_gpu_blocks", "64.0", "cache.num_gpu_blocks"),
    _bad("cache.num_cpu_blocks", "false", "cache.num_cpu_blocks"),
    _bad("cache.sliding_window", "true", "cache.sliding_window"),
    _bad("cache.enable_prefix_caching", "1", "cache.enable_prefix_caching"),
    _bad("cache.cpu_offload_block_size", "true", "cache.cpu_offload_block_size"),
    _bad("scheduler.max_model_len", "true", "scheduler.max_model_len"),
    _bad("scheduler.max_num_seqs", "8.0", "scheduler.max_num_seqs"),
    _bad("scheduler.max_num_batched_tokens", "'512'", "scheduler.max_num_batched_tokens"),
    _bad("scheduler.long_prefill_token_threshold", "true", "long_prefill_token_threshold"),
    _bad("scheduler.enable_chunked_prefill", "0", "scheduler.enable_chunked_prefill"),
    _bad("scheduler.decode_fast_path", "'yes'", "scheduler.decode_fast_path"),
    _bad("engine.num_replicas", "true", "engine.num_replicas"),
    _bad("engine.kv_events", "1", "engine.kv_events"),
    _bad("engine.router_load_weight", "true", "engine.router_load_weight"),
    _bad("hardware.tensor_parallel_size", "true", "hardware.tensor_parallel_size"),
    _bad("seed", "true", "seed"),
    _bad("workload.requests.0.prompt_tokens", "true", "prompt_tokens"),
    _bad("workload.requests.0.output_tokens", "4.5", "output_tokens"),
    _bad("workload.requests.0.priority", "true", "priority"),
    _bad("workload.requests.0.arrival_s", "false", "arrival_s"),
    _bad("workload.num_requests", "true", "num_requests", base=_synthetic()),
    _bad("workload.lengths.prompt.value", "true", "value", base=_synthetic()),
    _bad("workload.lengths.output.value", "'4'", "value", base=_synthetic()),
    _bad("workload.seed", "true", "workload.seed", base=_synthetic()),
    _bad("workload.sessions.num_sessions", "true", "num_sessions", base=_sessions()),
    _bad("workload.sessions.turns.min", "1.5", "turns.min", base=_sessions()),
    _bad("step_time.linear.fixed_s", "true", "step_time.linear.fixed_s"),
    _bad("cluster.prefill.replicas", "true", "cluster.prefill.replicas", base=_disagg()),
    _bad("cluster.decode.tp", "2.0", "cluster.decode.tp", base=_disagg()),
    _bad("model.num_layers", "true", "num_layers", base=_measured_model()),
    _bad("expect.violations", "1", "expect.violations", command="check"),
]

# ------------------------------------------------------------------------ finite numbers
_FINITE = [
    _bad("step_time.linear.fixed_s", ".inf", "step_time.linear.fixed_s"),
    _bad("step_time.linear.per_prefill_token_s", ".nan", "per_prefill_token_s"),
    _bad("step_time.linear.per_decode_seq_s", "1.0e999", "per_decode_seq_s"),
    _bad("step_time.linear.per_context_token_s", ".inf", "per_context_token_s"),
    _bad("step_time", "{roofline: {overhead_s: .inf}}", "overhead_s", base=_measured_model()),
    _bad("step_time", "{roofline: {compute: .nan}}", "compute", base=_measured_model()),
    _bad(
        "step_time",
        "{roofline: {allreduce_latency_s: 1.0e999}}",
        "allreduce_latency_s",
        base=_measured_model(),
    ),
    _bad("step_time", "{calibrated: {profile: p.json, overhead_s: .inf}}", "overhead_s"),
    _bad("cache.swap_space_gib", ".inf", "cache.swap_space_gib"),
    _bad("cache.watermark", ".nan", "cache.watermark"),
    _bad("cache.gpu_memory_utilization", ".nan", "cache.gpu_memory_utilization"),
    _bad("cache.cpu_offload_gib", ".inf", "cache.cpu_offload_gib", name="offload size inf"),
    _bad("cache.cpu_offload_gib", "1.0e999", "cache.cpu_offload_gib"),
    _bad("engine.router_load_weight", ".inf", "router_load_weight", name="router weight inf"),
    _bad("engine.router_load_weight", ".nan", "router_load_weight"),
    _bad("engine.router_staleness_s", ".inf", "router_staleness_s"),
    _bad("engine.max_sim_time_s", ".inf", "max_sim_time_s"),
    _bad("hardware.gpu", _flow(_GPU, memory_gb=".inf"), "memory_gb"),
    _bad("hardware.gpu", _flow(_GPU, hbm_bandwidth_GBps=".nan"), "hbm_bandwidth_GBps"),
    _bad("workload.requests.0.arrival_s", ".inf", "arrival_s"),
    _bad("workload.arrival.rate_per_s", ".inf", "rate_per_s", base=_synthetic()),
    _bad("workload.arrival.cv", ".nan", "cv", base=_synthetic()),
    _bad("workload.rate_scale", ".inf", "rate_scale", base=_synthetic()),
    _bad("workload.time_range_s", "[0.0, .inf]", "time_range_s", base=_synthetic()),
    _bad("workload.sessions.think_s.mean_s", ".inf", "mean_s", base=_sessions()),
    _bad("workload.sessions.arrival.rate_per_s", ".nan", "rate_per_s", base=_sessions()),
    _bad("cluster.link", "{bandwidth_Gbps: .inf, efficiency: 0.9, latency_us: 1}", "bandwidth"),
    _bad(
        "cluster.link",
        "{bandwidth_Gbps: 400, efficiency: 0.9, latency_us: .inf}",
        "latency_us",
        base=_disagg(),
        name="link latency inf",
    ),
    _bad(
        "cluster.link",
        "{bandwidth_Gbps: 400, efficiency: .nan, latency_us: 1}",
        "efficiency",
        base=_disagg(),
    ),
    _bad("model.hidden_size", ".inf", "hidden_size", base=_measured_model()),
]

# ------------------------------------------------------ times that resolve a millisecond
_TIMES = [
    _bad(
        "workload.requests.1.arrival_s",
        "1.0e300",
        "arrival_s",
        name="inline arrival beyond a millisecond's resolution",
    ),
    _bad("engine.max_sim_time_s", "1.0e300", "max_sim_time_s"),
    _bad("engine.router_staleness_s", "1.0e300", "router_staleness_s"),
    _bad("workload.sessions.think_s.mean_s", "1.0e300", "mean_s", base=_sessions()),
    _bad("workload.time_range_s", "[0.0, 1.0e300]", "time_range_s", base=_synthetic()),
    _bad(
        "workload.arrival.rate_per_s",
        "1.0e-300",
        "arrival",
        base=_synthetic(),
        name="a rate so low the arrivals lose the millisecond",
    ),
    _bad(
        "workload.rate_scale",
        "1.0e-300",
        "rate_scale",
        base=_synthetic(),
        name="a rate scale so small the arrivals lose the millisecond",
    ),
    Case(
        "values",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        "arrival",
        files={
            "s.yaml": scenario("workload", "{kind: trace, path: t.csv}"),
            "t.csv": "arrival_s,prompt_tokens,output_tokens\n0.0,10,2\n1e300,10,2\n",
        },
        outputs=("out",),
        name="trace arrival beyond a millisecond's resolution",
    ),
]

# ------------------------------------------------------ zero-time steps, sizes, 64 bits
_SIZES = [
    _bad(
        "step_time.linear.fixed_s",
        "0.0",
        "0 s",
        name="a linear step time that can be 0 s",
    ),
    _bad("cache.num_gpu_blocks", "0", "cache.num_gpu_blocks"),
    _bad("cache.num_gpu_blocks", "-5", "cache.num_gpu_blocks"),
    _bad("cache.num_cpu_blocks", "-1", "cache.num_cpu_blocks"),
    _bad("cache.sliding_window", "0", "cache.sliding_window"),
    _bad("cache.sliding_window", "-8", "cache.sliding_window"),
    _bad("cache.block_size", "0", "cache.block_size"),
    _bad("cache.block_size", "-16", "cache.block_size"),
    _bad("cache.block_size", HUGE, "cache.block_size"),
    _bad("cache.num_gpu_blocks", HUGE, "cache.num_gpu_blocks"),
    _bad("cache.num_cpu_blocks", HUGE, "cache.num_cpu_blocks"),
    _bad("cache.sliding_window", HUGE, "cache.sliding_window"),
    _bad("cache.cpu_offload_block_size", HUGE, "cache.cpu_offload_block_size"),
    _bad("scheduler.max_model_len", HUGE, "scheduler.max_model_len"),
    _bad("scheduler.max_num_seqs", HUGE, "scheduler.max_num_seqs"),
    _bad("scheduler.max_num_batched_tokens", HUGE, "max_num_batched_tokens"),
    _bad("engine.num_replicas", HUGE, "engine.num_replicas"),
    _bad("hardware.tensor_parallel_size", HUGE, "hardware.tensor_parallel_size"),
    _bad("seed", HUGE, "seed"),
    _bad("workload.requests.0.prompt_tokens", HUGE, "prompt_tokens"),
    _bad("workload.requests.0.priority", HUGE, "priority"),
    _bad("workload.num_requests", HUGE, "num_requests", base=_synthetic()),
    _bad("workload.seed", HUGE, "workload.seed", base=_synthetic()),
    _bad("workload.hash_block_tokens", HUGE, "hash_block_tokens", base=_synthetic()),
    _bad("workload.first_n", HUGE, "first_n", base=_synthetic()),
    _bad("workload.lengths.prompt.value", HUGE, "value", base=_synthetic()),
    _bad("workload.sessions.turns.min", HUGE, "turns", base=_sessions()),
    _bad("cluster.decode.tp", HUGE, "cluster.decode.tp", base=_disagg()),
    _bad("cluster.prefill.replicas", HUGE, "cluster.prefill.replicas", base=_disagg()),
    _bad("model.num_layers", HUGE, "num_layers", base=_measured_model()),
    _bad(
        "cluster.prefill.router",
        "bogus",
        "round_robin",
        base=_disagg(),
        name="an unknown router in the prefill pool lists the known ones",
    ),
    _bad("cluster.decode.router", "bogus", "least_outstanding", base=_disagg()),
]


def _run_args(*extra: str) -> tuple[str, ...]:
    return ("run", "s.yaml", "--no-plots", "-o", "out", *extra)


def _ok(argv: tuple[str, ...], name: str) -> Case:
    return Case(
        "values", argv, 0, "", files={"s.yaml": tiny("values")}, outputs=("out",), name=name
    )


# ------------------------------------------------------------------------------ --set
_SETS = [
    _ok(_run_args("--set", "cache.block_size=32"), "--set cache.block_size=32 still works"),
    _ok(_run_args("--set", "step_time.linear.fixed_s=1e-3"), "--set a float without a dot"),
    _ok(_run_args("--set", "step_time.linear.fixed_s=1"), "--set an integer for a float"),
    Case(
        "values",
        _run_args("--set", "cache.block_size=true"),
        2,
        "cache.block_size",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
    ),
    Case(
        "values",
        _run_args("--set", "step_time.linear.fixed_s=.inf"),
        2,
        "fixed_s",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
    ),
    Case(
        "values",
        _run_args("--set", "cache.block_size=16", "--set", "cache.block_size=32"),
        2,
        "given twice",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
        name="run --set given twice for one key",
    ),
    Case(
        "values",
        (
            "capacity",
            "s.yaml",
            "--slo",
            "ttft_p99=1s",
            "--set",
            "cache.block_size=16",
            "--set",
            "cache.block_size=32",
            "-o",
            "out",
        ),
        2,
        "given twice",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
        name="capacity --set given twice for one key",
    ),
    Case(
        "values",
        (
            "compare-versions",
            "s.yaml",
            "--set",
            "cache.block_size=16",
            "--set",
            "cache.block_size=32",
            "-o",
            "out",
        ),
        2,
        "given twice",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
        name="compare-versions --set given twice for one key",
    ),
    Case(
        "values",
        ("sweep", "s.yaml", "--set", "cache.num_gpu_blocks=0,64", "-o", "out"),
        2,
        "cache.num_gpu_blocks",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
        name="sweep over a zero block count",
    ),
    Case(
        "values",
        ("sweep", "s.yaml", "--set", "cache.block_size=true,16", "-o", "out"),
        2,
        "cache.block_size",
        files={"s.yaml": tiny("values")},
        outputs=("out",),
        name="sweep over block_size true",
    ),
]


# ------------------------------------------------------------- corrupt tables under plot
def _run_folder(folder: Path, corrupt: str, how: str) -> None:
    """A run folder of small valid tables, then `corrupt` truncated or overwritten."""
    import pandas as pd

    run = folder / "r"
    run.mkdir()
    # Tables with the columns the plots read (`_REQUESTS`, `_STEPS`, below), so the corrupt one
    # is what is refused, whichever is read first.
    pd.DataFrame(_REQUESTS).to_parquet(run / "requests.parquet")
    pd.DataFrame(_STEPS).to_parquet(run / "steps.parquet")
    (run / "summary.json").write_text("{}")
    target = run / corrupt
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2] if how == "truncate" else b"not a table\n")


def _plot(corrupt: str, how: str) -> Case:
    return Case(
        "values",
        ("plot", "r"),
        2,
        corrupt,
        setup=lambda folder: _run_folder(folder, corrupt, how),
        outputs=("r",),
        name=f"plot with a {how}d {corrupt}",
    )


_PLOT = [
    _plot("requests.parquet", "truncate"),
    _plot("steps.parquet", "truncate"),
    _plot("requests.parquet", "overwrite"),
    _plot("summary.json", "truncate"),
]


def _other(command: str, path: str, raw: str, fragment: str, base=None) -> Case:
    """Another command than run on the tiny scenario with `path: raw`."""
    argv = {
        "check": ("check", "s.yaml"),
        "disagg": ("disagg", "s.yaml", "-o", "out"),
        "compare-versions": ("compare-versions", "s.yaml", "-o", "out"),
        "capacity": ("capacity", "s.yaml", "--slo", "ttft_p99=1s", "-o", "out"),
    }[command]
    base_copy = yaml.safe_load(yaml.safe_dump(base)) if base is not None else None
    return Case(
        "values",
        argv,
        2,
        fragment,
        files={"s.yaml": scenario(path, raw, base_copy)},
        outputs=("out",),
        name=f"{command} {path}: {raw}",
    )


def _capacity(*extra: str, fragment: str, name: str) -> Case:
    argv = ("capacity", "s.yaml", "--slo", "ttft_p99=1s", "-o", "out", *extra)
    return Case(
        "values", argv, 2, fragment, files={"s.yaml": tiny("values")}, outputs=("out",), name=name
    )


def _trace(name: str, text: str, fragment: str, case: str) -> Case:
    return Case(
        "values",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        2,
        fragment,
        files={"s.yaml": scenario("workload", f"{{kind: trace, path: {name}}}"), name: text},
        outputs=("out",),
        name=case,
    )


_HEADER = "arrival_s,prompt_tokens,output_tokens\n"
_TRACES = [
    _trace(
        "t.csv",
        f"{_HEADER}0.0,{2**70},2\n",
        "prompt_tokens",
        "a CSV trace's prompt_tokens beyond 64 bits (wrapped to 0)",
    ),
    _trace("t.csv", f"{_HEADER}0.0,10,{2**64}\n", "output_tokens", "trace output_tokens 2**64"),
    _trace(
        "t.jsonl",
        f'{{"arrival_s": 0.0, "prompt_tokens": {2**70}, "output_tokens": 2}}\n',
        "prompt_tokens",
        "a JSONL trace's prompt_tokens beyond 64 bits",
    ),
    _trace("t.csv", f"{_HEADER}0.0,10,2\n1.0e15,10,2\n", "arrival_s", "trace arrival at 1e15 s"),
]

_COMMANDS = [
    _other("check", "cache.block_size", "true", "cache.block_size"),
    _other("check", "step_time.linear.fixed_s", ".inf", "fixed_s"),
    _other("compare-versions", "cache.num_gpu_blocks", "0", "cache.num_gpu_blocks"),
    _other("capacity", "engine.router_load_weight", ".nan", "router_load_weight"),
    _other(
        "disagg",
        "cluster.link",
        "{bandwidth_Gbps: 400, efficiency: 0.9, latency_us: .inf}",
        "latency_us",
        base=_disagg(),
    ),
    _other("disagg", "cluster.decode.router", "bogus", "round_robin", base=_disagg()),
    _other("disagg", "cluster.prefill.replicas", "true", "replicas", base=_disagg()),
    _capacity("--target-rate", "inf", fragment="--target-rate", name="capacity --target-rate inf"),
    _capacity(
        "--step-time-band",
        "0.9,inf",
        fragment="--step-time-band",
        name="capacity --step-time-band with an infinite factor",
    ),
]

CASES: list[Case] = [*_TYPES, *_FINITE, *_TIMES, *_SIZES, *_SETS, *_PLOT, *_COMMANDS, *_TRACES]


# ------------------------------------------------------- foreign tables under plot
#: Columns each plotted table is read for (a subset of what kvsim writes), one row each.
_STEPS = {
    "replica": [0],
    "start_s": [0.0],
    "duration_s": [0.01],
    "num_used_blocks": [1],
    "num_free_blocks": [63],
    "num_cached_blocks": [0],
    "num_waiting": [0],
    "num_running": [1],
    "num_swapped": [0],
}
_REQUESTS = {"state": ["finished"], "ttft_s": [0.1], "tpot_s": [0.01], "e2e_s": [0.2]}
_FOREIGN = {"colour": ["red"], "weight": [3]}


def _foreign_folder(folder: Path, tables: dict[str, dict[str, list]]) -> None:
    """A folder `r` of the Parquet `tables` (name -> columns): they read fine."""
    import pandas as pd

    run = folder / "r"
    run.mkdir()
    for name, columns in tables.items():
        pd.DataFrame(columns).to_parquet(run / name)


def _foreign(tables: dict[str, dict[str, list]], fragment: str, what: str) -> Case:
    return Case(
        "values",
        ("plot", "r"),
        2,
        fragment,
        setup=lambda folder: _foreign_folder(folder, tables),
        outputs=("r",),
        name=f"plot with a foreign {what} (missing columns: KeyError)",
    )


_FOREIGN_PLOT = [
    _foreign(
        {"steps.parquet": _STEPS, "requests.parquet": _FOREIGN},
        "requests.parquet: missing columns e2e_s, state, tpot_s, ttft_s",
        "requests.parquet",
    ),
    _foreign(
        {"steps.parquet": _FOREIGN, "requests.parquet": _REQUESTS},
        "steps.parquet: missing columns duration_s",
        "steps.parquet",
    ),
    _foreign(
        {
            "steps.parquet": _STEPS,
            "requests.parquet": _REQUESTS,
            "violations.parquet": {"kind": ["x"]},
        },
        "violations.parquet: missing columns time_s",
        "violations.parquet",
    ),
    _foreign({"sweep.parquet": _FOREIGN}, "sweep.parquet: missing columns error", "sweep.parquet"),
    _foreign(
        {"capacity.parquet": _FOREIGN, "probes.parquet": _FOREIGN},
        "capacity.parquet: missing columns",
        "capacity.parquet",
    ),
    _foreign(
        {
            "capacity.parquet": {
                "slos": ["ttft_p99<=2s"],
                "config": [""],
                "capacity_rate_req_per_s": [1.0],
                "capacity_ci_low": [1.0],
                "capacity_ci_high": [1.0],
            },
            "probes.parquet": _FOREIGN,
        },
        "probes.parquet: missing columns config, offered_rate_req_per_s, replicate, ttft_p99_s",
        "probes.parquet",
    ),
]
CASES += _FOREIGN_PLOT
