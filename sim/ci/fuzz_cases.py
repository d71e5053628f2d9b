"""The cases `kvsim fuzz` runs: one valid scenario per case seed (a pure function of it).

The case seeds come from the master seed (`case_seed(master, i)`), so a fuzz run is a
deterministic sequence of cases.

What a case varies (all small, so a case runs in milliseconds with the full audit):

* cache: block size (2..16 tokens), pool (6..48 blocks), CPU blocks, watermark, sliding window
  (none, or 1..6 blocks' worth of tokens), prefix caching;
* scheduler: chunked prefill and its token budget, max_num_seqs, max_model_len, preemption
  mode (v0: auto / recompute / swap), FCFS or priority;
* workload: 2..24 inline requests, bursty or spread arrivals, prompts up to a little over
  max_model_len (some get ignored), outputs up to 3 blocks, shared prefixes; or, in about one
  case in `SESSIONS_ONE_IN`, 1..4 closed-loop multi-turn sessions (`sim.workload.sessions`)
  whose growing prompts share the conversation so far and may outgrow max_model_len (which
  ends the session). Whether a case has sessions is drawn from a stream of its own, so the
  other cases are the same as without sessions;
* cluster (one case in `MULTI_REPLICA_SHARE`): 2..4 replicas, each with its own audited
  manager, behind a router drawn from every `engine.router` (prefix-aware sometimes with a
  stale event index), sometimes recording KV events. Drawn from a stream of its own, so the
  rest of a case is the same with or without it.

V1-engine cases: one in `DISAGG_ONE_IN` (decided from a stream of its own, so every other case
seed stands for the same case as before) is a prefill/decode disaggregated case instead
(`generate_disagg_case`, `draw_case`).

V1-engine cases with one full-attention KV group also draw, from their own stream (so every
other draw of a case seed is unchanged), a CPU offloading tier of 1..100 blocks
(`sim.kv_connector`; it needs a model for the KV bytes, so such a case names Llama-3.1-8B,
which changes nothing else with the given pool and linear step times).

Only combinations the real engine accepts are drawn: on v0 designs a sliding window excludes
prefix caching and chunked prefill (vLLM 0.5.4 raises for both, spec section 1), and the
V1 engine only recomputes.
"""

from __future__ import annotations

import numpy as np

from sim.ci.fuzz_variant import BASE_CASES, CaseVariant, apply_variant
from sim.kv.config import Design
from sim.scenario.schema import Scenario, scenario_from_dict
from sim.workload.config import SessionsConfig
from sim.workload.sessions import synthetic_sessions

#: Simple step costs: enough to order events, cheap to compute.
FUZZ_STEP_TIME = {
    "linear": {"fixed_s": 0.005, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 1e-4}
}


#: About one case in this many gets a sessions workload instead of inline requests.
SESSIONS_ONE_IN = 5
#: The spawn key of the stream that decides (and draws) a case's sessions: the first key under
#: which every case seed that a regression test pinned before sessions existed still stands
#: for its inline case (`PINNED_INLINE_CASES`).
_SESSIONS_STREAM = 4
#: Case seeds of past findings, kept as regression tests (tests/scheduler/test_v0_fatal_manager_errors.py,
#: tests/ci/test_shrink.py, tests/ci/test_fuzz.py, tests/engine/test_engine.py).
PINNED_INLINE_CASES = (673228719, 3212736091, 1562480905, 725510040, 23012616, 3644697408)
#: About one V1-engine case in this many is disaggregated (`draw_case`).
DISAGG_ONE_IN = 8
#: The spawn key of the stream that decides whether a case is disaggregated: the first key
#: under which no case seed in `PINNED_INLINE_CASES` is drawn disaggregated.
_DISAGG_STREAM = 5
#: The share of cases that run on several replicas behind a router (`_cluster`).
MULTI_REPLICA_SHARE = 0.25
#: Every `engine.router`: a multi-replica case draws one.
FUZZ_ROUTERS = (
    "round_robin",
    "least_outstanding",
    "least_kv_usage",
    "prefix_cache_aware",
    "session_affinity",
)


def case_seed(master_seed: int, index: int) -> int:
    """The seed of case `index` of a fuzz run (a uint32, independent of every other case).

    >>> case_seed(0, 0) == case_seed(0, 0) and case_seed(0, 0) != case_seed(0, 1)
    True
    """
    sequence = np.random.SeedSequence(entropy=master_seed, spawn_key=(index,))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """Uniform integer in [low, high] (both ends included)."""
    return int(rng.integers(low, high + 1))


def _cache_and_scheduler(
    rng: np.random.Generator, design: Design, allow_swap: bool = True
) -> tuple[dict, dict]:
    block_size = int(rng.choice([2, 4, 8, 16]))
    num_gpu_blocks = _int(rng, 6, 48)
    sliding_window = _int(rng, 1, 6 * block_size) if rng.random() < 0.6 else None
    is_v0 = design.api == "v0"
    # vLLM 0.5.4 rejects a sliding window together with prefix caching or chunked prefill.
    prefix_caching = bool(rng.random() < 0.4) and not (is_v0 and sliding_window is not None)
    chunked = bool(rng.random() < 0.4) and not (is_v0 and sliding_window is not None)
    if is_v0:
        preemption_mode = str(rng.choice(["auto", "recompute", "swap"]))
    else:
        preemption_mode = "recompute"  # the V1 engine has no swapping
    num_cpu_blocks = _int(rng, 0, 2 * num_gpu_blocks)
    if preemption_mode == "recompute":
        num_cpu_blocks = 0
    if not allow_swap:
        # Drawn above all the same, so a case seed stands for the same case otherwise.
        preemption_mode, num_cpu_blocks = "recompute", 0
    watermark = float(rng.choice([0.0, 0.01, 0.01, 0.05, 0.1]))
    # vLLM refuses to start unless one max-length request fits the pool (v0: G blocks; V1
    # engine: G - 1, block 0 being the null block, and one more with a sliding window); see
    # `sim.scenario.startup.check_cache_fits`.
    usable_blocks = num_gpu_blocks if is_v0 else num_gpu_blocks - 2
    max_model_len = _int(rng, 2 * block_size, usable_blocks * block_size)
    max_num_seqs = _int(rng, 1, 8)
    cache = {
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
        "num_cpu_blocks": num_cpu_blocks,
        "sliding_window": sliding_window,
        "enable_prefix_caching": prefix_caching,
        "watermark": watermark,
    }
    scheduler = {
        "design": design.value,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "enable_chunked_prefill": chunked,
        "policy": "priority" if rng.random() < 0.2 else "fcfs",
        "preemption_mode": preemption_mode,
    }
    if chunked and rng.random() < 0.7:
        # A small token budget makes prompts arrive in several chunks (vLLM: >= max_num_seqs).
        low = max(max_num_seqs, block_size)
        scheduler["max_num_batched_tokens"] = _int(rng, low, max(low, max_model_len))
    if not is_v0 and rng.random() < 0.3:
        scheduler["long_prefill_token_threshold"] = _int(rng, 1, max_model_len)
    return cache, scheduler


def _requests(rng: np.random.Generator, cache: dict, scheduler: dict) -> list[dict]:
    block_size = cache["block_size"]
    max_model_len = scheduler["max_model_len"]
    num_requests = _int(rng, 2, 24)
    mean_gap_s = float(rng.choice([0.0, 0.002, 0.01, 0.05]))
    num_prefixes = _int(rng, 1, 3)
    prefix_tokens = [_int(rng, 1, max(1, max_model_len // 2)) for _ in range(num_prefixes)]
    share_prob = 0.6 if cache["enable_prefix_caching"] else 0.2
    requests = []
    arrival_s = 0.0
    for _ in range(num_requests):
        if mean_gap_s > 0:
            arrival_s += float(rng.exponential(mean_gap_s))
        # Mostly within max_model_len; a few beyond it exercise the "ignored" path.
        prompt = _int(rng, 1, max_model_len + block_size if rng.random() < 0.1 else max_model_len)
        request = {
            "arrival_s": round(arrival_s, 6),
            "prompt_tokens": prompt,
            "output_tokens": _int(rng, 1, 3 * block_size),
        }
        if scheduler["policy"] == "priority":
            request["priority"] = _int(rng, 0, 3)
        if rng.random() < share_prob:
            k = _int(rng, 0, num_prefixes - 1)
            request["prefix_id"] = k
            request["prefix_tokens"] = min(prompt, prefix_tokens[k])
        requests.append(request)
    return requests


def _sessions(seed: int, cache: dict, scheduler: dict) -> dict | None:
    """A sessions workload for case `seed`, or None (most cases): from its own stream."""
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_SESSIONS_STREAM,)))
    if rng.integers(SESSIONS_ONE_IN) != 0:
        return None
    block_size = cache["block_size"]
    max_model_len = scheduler["max_model_len"]
    min_turns = _int(rng, 1, 2)
    think_s = (
        {"kind": "fixed", "mean_s": 0.0}
        if rng.random() < 0.5
        else {"kind": "exponential", "mean_s": 0.01}
    )
    return {
        "kind": "sessions",
        "seed": seed,
        "sessions": {
            "source": "synthetic",
            "num_sessions": _int(rng, 1, 4),
            "arrival": {"rate_per_s": float(rng.choice([20.0, 100.0, 1000.0]))},
            "turns": {"min": min_turns, "max": _int(rng, min_turns, 4)},
            "first_prompt": {"kind": "uniform", "max_tokens": max(1, max_model_len // 2)},
            "new_tokens": {"kind": "uniform", "max_tokens": 2 * block_size},
            "output": {"kind": "uniform", "max_tokens": 2 * block_size},
            "think_s": think_s,
        },
    }


def _session_requests(workload: dict) -> list[dict]:
    """The turns of a sessions workload as `sim_time_limit_s` reads them (arrival lower bounds)."""
    specs = synthetic_sessions(SessionsConfig(**workload["sessions"]), workload["seed"])
    return [
        {
            "arrival_s": s.arrival_s,
            "prompt_tokens": s.prompt_tokens,
            "output_tokens": s.output_tokens,
        }
        for s in specs
    ]


def _cluster(seed: int, design: Design, cache: dict) -> dict:
    """The engine keys of a multi-replica case, or {} for one replica.

    A generator of its own (seeded with (seed, 1)): drawing the cluster changes none of the
    case's other draws. A V1-engine case routed prefix_cache_aware gets `cache`'s prefix
    caching turned on (set in place): without it the router would do nothing.
    """
    rng = np.random.default_rng([seed, 1])
    if rng.random() >= MULTI_REPLICA_SHARE:
        return {}
    engine: dict = {"num_replicas": _int(rng, 2, 4), "router": str(rng.choice(FUZZ_ROUTERS))}
    if engine["router"] == "prefix_cache_aware" and rng.random() < 0.5:
        engine["router_staleness_s"] = float(rng.choice([0.005, 0.05]))
    if rng.random() < 0.5:
        engine["kv_events"] = True
    # Drawn above all the same (a case seed stands for the same draws), then fitted to what
    # does something, since kvsim refuses the rest (`sim.scenario.no_effect`): the v0 engine emits no
    # KV events and so has no prefix-cache router (least outstanding is what it would route
    # by); on the V1 engine that router comes with the prefix cache it routes by.
    if design is not Design.V1_ENGINE:
        engine.pop("kv_events", None)
        if engine["router"] == "prefix_cache_aware":
            engine["router"] = "least_outstanding"
            engine.pop("router_staleness_s", None)
    elif engine["router"] == "prefix_cache_aware":
        cache["enable_prefix_caching"] = True
    return engine


def sim_time_limit_s(requests: list[dict]) -> float:
    """A simulated-time cap: 3x the time to serve the requests one by one, plus the arrivals.

    A pool too small for one sequence's next block makes v0 preempt and recompute it forever,
    as vLLM does; the cap ends such a livelock (the run reports `stopped_early`, which is not
    a violation). Serving one request alone takes at most one step per prompt token (the
    smallest chunk) plus one per output token, each of at most fixed + per-token cost.
    Example: 2 requests of 10 prompt + 5 output tokens arriving at 0 s ->
    3 * 30 steps * 0.0052 s + 0 + 1 = 1.468 s.
    """
    linear = FUZZ_STEP_TIME["linear"]
    step_s = linear["fixed_s"] + linear["per_prefill_token_s"] + linear["per_decode_seq_s"]
    num_steps = sum(r["prompt_tokens"] + r["output_tokens"] for r in requests)
    last_arrival_s = max(r["arrival_s"] for r in requests)
    return round(3 * num_steps * step_s + last_arrival_s + 1.0, 6)


#: Llama-3.1-8B bf16: KV bytes per token of one block (2 MiB for 16 tokens).
_OFFLOAD_MODEL = "llama-3.1-8b"
_OFFLOAD_BYTES_PER_TOKEN = 131072


def _offload(seed: int, design: Design, cache: dict) -> float:
    """GiB of CPU offloading for a case (0: none), drawn from a stream of its own.

    Example: block size 16 and a 10-block tier: 10 * 16 * 131072 / 2**30 = 0.01953125 GiB.
    """
    if design is not Design.V1_ENGINE or cache["sliding_window"] is not None:
        return 0.0
    rng = np.random.default_rng([seed, 1])
    if rng.random() >= 0.4:
        return 0.0
    num_cpu_blocks = _int(rng, 1, 100)
    return num_cpu_blocks * cache["block_size"] * _OFFLOAD_BYTES_PER_TOKEN / 2**30


def generate_case(
    design: str | Design,
    seed: int,
    allow_swap: bool = True,
    variant: CaseVariant = BASE_CASES,
) -> Scenario:
    """The valid scenario that case seed `seed` stands for on `design` (a pure function).

    `allow_swap=False` turns swap preemption off (recompute only, no CPU blocks) and changes
    nothing else of the case; `variant` changes what it names (`sim.ci.fuzz_variant`).
    """
    design = Design(design)
    rng = np.random.default_rng(seed)
    cache, scheduler = _cache_and_scheduler(rng, design, allow_swap)
    requests = _requests(rng, cache, scheduler)
    workload: dict = {"kind": "inline", "requests": requests}
    sessions = _sessions(seed, cache, scheduler)
    if sessions is not None:
        # A closed-loop turn arrives after the turns before it: at most their serial time
        # later than its lower bound, which the limit's 3x the serial time covers.
        workload, requests = sessions, _session_requests(sessions)
    model = None
    offload_gib = _offload(seed, design, cache)
    if offload_gib:
        cache["cpu_offload_gib"] = offload_gib
        model = _OFFLOAD_MODEL
    cluster = _cluster(seed, design, cache)  # may turn the prefix cache on for its router
    data = {
        "name": f"fuzz-{design.value}-{seed}",
        "description": f"kvsim fuzz case seed {seed} on {design.value}",
        "seed": seed,
        "model": model,
        "cache": cache,
        "scheduler": scheduler,
        "engine": {
            "audit_level": "full",
            "violation_policy": "record",
            "max_sim_time_s": sim_time_limit_s(requests),
            **cluster,
        },
        "workload": workload,
        "step_time": FUZZ_STEP_TIME,
        "expect": {"violations": "none"},
    }
    apply_variant(data, design, seed, variant)
    return scenario_from_dict(data, f"fuzz case {seed}")


def generate_disagg_case(seed: int) -> Scenario:
    """A disaggregated (prefill/decode) V1-engine case for `seed` (a pure function of it).

    The cache, scheduler and requests are drawn as for a v1-engine case; then 1-2 prefill and
    1-2 decode replicas and a link: a catalog link, or one whose latency (up to 50 ms) is long
    next to a step, so transfers overlap steps and each other. The model is only there for
    the KV bytes a transfer moves (the step time stays the fuzzer's linear one).

    A case may end in `no_progress` (and aborted requests), as vLLM 0.11.0 would hang: with
    pools this small a decode request preempted for want of a block goes back to the head of
    the waiting queue needing more blocks than the requests parked behind it (their KV read
    or being read, their blocks allocated) leave free, and the waiting loop stops at the head
    (tests/vllm_real/test_vllm_pd_deadlock.py: vLLM's own scheduler and NIXL connector do this). `kvsim
    fuzz` reports it, as every violation of such a case, as a finding keyed `disagg:<kind>`.
    """
    rng = np.random.default_rng(seed)
    cache, scheduler = _cache_and_scheduler(rng, Design.V1_ENGINE, allow_swap=False)
    requests = _requests(rng, cache, scheduler)
    if rng.random() < 0.5:
        link: str | dict = str(rng.choice(["nvlink-4", "rdma-400g", "tcp-25g"]))
    else:
        link = {"bandwidth_Gbps": 100.0, "efficiency": 0.5, "latency_us": _int(rng, 0, 50_000)}
    data = {
        "name": f"fuzz-disagg-{seed}",
        "description": f"kvsim fuzz case seed {seed}, disaggregated",
        "seed": seed,
        "model": "llama-3.1-8b",
        "cache": {**cache, "num_cpu_blocks": 0},
        # The NIXL connector's flow as vLLM 0.11.0 has it (`sim.cluster.pd_connector`).
        "scheduler": {**scheduler, "vllm_version": "0.11.0"},
        "engine": {
            "audit_level": "full",
            "violation_policy": "record",
            # A prompt of max_model_len tokens never takes its token (as in vLLM): cut off.
            # Each request may also wait for one transfer of up to 50 ms.
            "max_sim_time_s": round(sim_time_limit_s(requests) + 0.05 * len(requests), 6),
        },
        "cluster": {
            "mode": "disaggregated",
            "prefill": {"replicas": _int(rng, 1, 2)},
            "decode": {"replicas": _int(rng, 1, 2)},
            "link": link,
        },
        "workload": {"kind": "inline", "requests": requests},
        "step_time": FUZZ_STEP_TIME,
    }
    return scenario_from_dict(data, f"fuzz disaggregated case {seed}")


def is_disagg_case(design: Design, seed: int) -> bool:
    """Whether case seed `seed` on `design` is a disaggregated case (V1 engine only; about
    one in `DISAGG_ONE_IN`), decided from a stream of its own."""
    if design is not Design.V1_ENGINE:
        return False
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(_DISAGG_STREAM,)))
    return bool(rng.integers(DISAGG_ONE_IN) == 0)


def draw_case(
    design: str | Design, seed: int, allow_swap: bool = True, variant: CaseVariant = BASE_CASES
) -> Scenario:
    """The case `kvsim fuzz` runs for case seed `seed`: `generate_disagg_case(seed)` when
    `is_disagg_case` (never with a variant's `vllm_version`: the P/D flow is 0.11.0's), else
    `generate_case(design, seed, allow_swap, variant)`."""
    design = Design(design)
    if variant.vllm_version is None and is_disagg_case(design, seed):
        return generate_disagg_case(seed)
    return generate_case(design, seed, allow_swap, variant)
