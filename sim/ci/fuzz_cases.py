"""The cases `kvsim fuzz` runs: one valid scenario per case seed (a pure function of it).

The case seeds come from the master seed (`case_seed(master, i)`), so a fuzz run is a
deterministic sequence of cases.

What a case varies (all small, so a case runs in milliseconds with the full audit):

* cache: block size (2..16 tokens), pool (6..48 blocks), CPU blocks, watermark, sliding window
  (none, or 1..6 blocks' worth of tokens), prefix caching;
* scheduler: chunked prefill and its token budget, max_num_seqs, max_model_len, preemption
  mode (v0: auto / recompute / swap), FCFS or priority;
* workload: 2..24 inline requests, bursty or spread arrivals, prompts up to a little over
  max_model_len (some get ignored), outputs up to 3 blocks, shared prefixes.

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

from sim.kv.config import Design
from sim.scenario import Scenario, scenario_from_dict

#: Simple step costs: enough to order events, cheap to compute.
FUZZ_STEP_TIME = {
    "linear": {"fixed_s": 0.005, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 1e-4}
}


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
    # `sim.runner._check_cache_fits`.
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


def generate_case(design: str | Design, seed: int, allow_swap: bool = True) -> Scenario:
    """The valid scenario that case seed `seed` stands for on `design` (a pure function).

    `allow_swap=False` turns swap preemption off (recompute only, no CPU blocks) and changes
    nothing else of the case.
    """
    design = Design(design)
    rng = np.random.default_rng(seed)
    cache, scheduler = _cache_and_scheduler(rng, design, allow_swap)
    requests = _requests(rng, cache, scheduler)
    model = None
    offload_gib = _offload(seed, design, cache)
    if offload_gib:
        cache["cpu_offload_gib"] = offload_gib
        model = _OFFLOAD_MODEL
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
        },
        "workload": {"kind": "inline", "requests": requests},
        "step_time": FUZZ_STEP_TIME,
        "expect": {"violations": "none"},
    }
    return scenario_from_dict(data, f"fuzz case {seed}")


def generate_disagg_case(seed: int) -> Scenario:
    """A disaggregated (prefill/decode) V1-engine case for `seed` (a pure function of it).

    The cache, scheduler and requests are drawn as for a v1-engine case; then 1-2 prefill and
    1-2 decode replicas and a link: a catalog link, or one whose latency (up to 50 ms) is long
    next to a step, so transfers overlap steps and each other. The model is only there for
    the KV bytes a transfer moves (the step time stays the fuzzer's linear one).

    A case may end in `no_progress` (and aborted requests): with pools this small the decode
    replica's blocks, allocated for prompts still in transfer, can starve its own running
    requests while the prefill pool holds blocks for KV it cannot send, a deadlock vLLM
    0.11.0's queue order shares (`sim.cluster.disagg.DisaggEngine._deadlock`). Any other
    violation is a finding.
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
