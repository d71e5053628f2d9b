"""The seeded random workloads of the scheduler lockstep (`sched_lockstep`).

A `Workload` is one `SchedCase` and a few requests, each added before a given step.
`random_workload` draws a small one (FCFS or PRIORITY, chunked or not, maybe a sliding window
or prefix caching; with `mamba`, in half of them a Mamba hybrid's groups,
`random_mamba_groups`); `random_mamba_align_workload` a full + Mamba hybrid with prefix
caching on; `random_workloads` the list `verify_scheduler` compares for a pin. Every draw
comes from the one `random.Random` passed in, in a fixed order: the same seed gives the same
workloads, and a change of order changes every lockstep summary.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from sim.kv.config import Design, KVCacheGroupSpec
from sim.kv.pins import resolve_pin
from sim.vllm_real.lockstep import full_variant_kinds
from sim.vllm_real.sched_case import RequestSpec, SchedCase


@dataclass(frozen=True, slots=True)
class Workload:
    case: SchedCase
    requests: tuple[RequestSpec, ...]


def random_mamba_groups(
    rng: random.Random, block_size: int, max_model_len: int, variants: tuple[str, ...] = ()
) -> tuple[tuple[KVCacheGroupSpec, ...], int]:
    """A Mamba hybrid's KV-cache groups (1-2 full, 1-3 Mamba state groups, in half of them a
    sliding group of 2-3 blocks' window too; with `variants`, in half of them one group of a
    kind the release has: sink, R-SWA or circular buffer, `sim.kv.v1_engine.full_variants`;
    any order) and the blocks one max_model_len request needs with the sink blocks: a full,
    sliding, sink or R-SWA group ``cdiv(max_model_len, bs)``, a Mamba group or a ring one."""
    groups = [KVCacheGroupSpec()] * rng.randint(1, 2)
    groups += [KVCacheGroupSpec(mamba=True)] * rng.randint(1, 3)
    if rng.random() < 0.5:
        groups.append(KVCacheGroupSpec(block_size * rng.choice([2, 3]) + rng.randint(0, 1)))
    if variants and rng.random() < 0.5:
        kind = rng.choice(variants)
        if kind == "sink":
            groups.append(KVCacheGroupSpec(sink_len=block_size * rng.randint(1, 2)))
        elif kind == "rswa":
            groups.append(KVCacheGroupSpec(rswa_window=rng.randint(1, 2 * block_size)))
        else:
            groups.append(KVCacheGroupSpec(circular_buffer=True))
    rng.shuffle(groups)
    need = sum(
        1 if g.mamba or g.circular_buffer else -(-max_model_len // block_size) for g in groups
    )
    need += sum((g.sink_len or 0) // block_size for g in groups)
    return tuple(groups), need


def _random_prompt(
    rng: random.Random,
    rid: int,
    max_model_len: int,
    shared_probability: float,
    shared_lens: tuple[int, ...],
) -> tuple[tuple[int, int], ...]:
    """Request `rid`'s prompt as (key, tokens) segments: with `shared_probability` a shared
    prefix first (one of 3 keys, a length from `shared_lens`: whole blocks or not), then a
    tail of its own of 1 to max_model_len // 2 tokens; one tail of max_model_len - 1 where
    the two would not leave room for a decoded token. Draws, in this order: the share, the
    prefix's key and length, the tail (both random workloads draw them so).

    Example: max_model_len 64, prefix (1, 20) drawn, tail 50 -> 70 > 63 -> ((1000 + rid, 63),).
    """
    prompt: list[tuple[int, int]] = []
    if rng.random() < shared_probability:
        prompt.append((rng.randint(0, 2), rng.choice(shared_lens)))
    prompt.append((1000 + rid, rng.randint(1, max_model_len // 2)))
    if sum(n for _, n in prompt) > max_model_len - 1:
        prompt = [(1000 + rid, max_model_len - 1)]
    return tuple(prompt)


def random_workload(
    rng: random.Random,
    *,
    ties: bool | None = None,
    mamba: bool = False,
    variants: tuple[str, ...] = (),
) -> Workload:
    """A small random workload; `ties` forces (or forbids) equal (priority, arrival_s) pairs;
    `mamba`: in half the workloads a Mamba hybrid's groups (`random_mamba_groups`), prefix
    caching off, as kvsim models them."""
    block_size = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 96, 128])
    min_blocks = -(-max_model_len // block_size) + 1  # one request alone always fits
    groups: tuple[KVCacheGroupSpec, ...] = ()
    if mamba and rng.random() < 0.5:
        groups, need = random_mamba_groups(rng, block_size, max_model_len, variants)
        min_blocks = need + 1
    chunked = rng.random() < 0.8
    max_num_seqs = rng.randint(2, 6)
    budget = rng.choice([16, 24, 32, 64, 128]) if chunked else max_model_len + rng.choice([0, 32])
    policy = rng.choice(["fcfs", "priority"])
    if ties is None:
        ties = policy == "priority" and rng.random() < 0.3
    case = SchedCase(
        num_blocks=min_blocks + rng.randint(0, min_blocks),
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=rng.random() < 0.5,
        sliding_window=rng.choice([None, None, block_size * 2, block_size * 3 + 1]),
        long_prefill_token_threshold=rng.choice([0, 0, 0, 12]),
        policy=policy,
    )
    if groups:
        case = replace(case, kv_cache_groups=groups, enable_prefix_caching=False)
        case = replace(case, sliding_window=None)
    tie_across = rng.random() < 0.5
    requests = []
    num_requests = rng.randint(3, 10)
    for rid in range(num_requests):
        prompt = _random_prompt(rng, rid, max_model_len, 0.5, (block_size, 2 * block_size, 20))
        arrival_step = rng.randint(0, 8)
        # Ties within a step (pushed together), or across steps (at most one still queued).
        arrival_s = (
            (0.0 if tie_across else float(arrival_step)) if ties else arrival_step + rid / 1000
        )
        priority = rng.choice([0, 1, 2]) if policy == "priority" and not ties else 0
        requests.append(
            RequestSpec(rid, prompt, rng.randint(1, 24), arrival_step, arrival_s, priority)
        )
    return Workload(case, tuple(requests))


def random_mamba_align_workload(rng: random.Random) -> Workload:
    """A full + Mamba hybrid (1-2 Mamba groups) with prefix caching on (vLLM's Mamba mode
    "align", a third of them "all") and chunked prefill, budgets that split prompts mid-block, and shared prefixes
    of whole blocks or not, so that the block-aligned split and Mamba hits both decide."""
    block_size = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 96, 128])
    num_groups = 1 + rng.randint(1, 2)
    min_blocks = num_groups * (-(-max_model_len // block_size) + 2)
    max_num_seqs = rng.randint(2, 6)
    budget = rng.choice([block_size // 2, block_size + 3, 24, 32, 64, 128])
    case = SchedCase(
        num_blocks=min_blocks + rng.randint(0, min_blocks),
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        long_prefill_token_threshold=rng.choice([0, 0, 0, 12]),
        mamba_groups=num_groups - 1,
        mamba_cache_mode=rng.choice(["align", "align", "all"]),
    )
    requests = []
    for rid in range(rng.randint(3, 10)):
        prompt = _random_prompt(rng, rid, max_model_len, 0.7, (block_size, 3 * block_size, 20, 41))
        arrival_step = rng.randint(0, 8)
        requests.append(
            RequestSpec(rid, prompt, rng.randint(1, 24), arrival_step, arrival_step + rid / 1000)
        )
    return Workload(case, tuple(requests))


def as_033_align(index: int, workload: Workload) -> Workload:
    """0.33.0 has no "all": every draw runs "align", two in three with a prefill checkpoint
    block, half with sparse retention (`sim.kv.v1_engine.mamba_checkpoint`); no rng draw, so
    other pins' walks stay."""
    case = replace(
        workload.case,
        mamba_cache_mode="align",
        mamba_prefill_checkpoint_blocks=int(index % 3 != 0),
        prefix_cache_retention_interval=0 if index % 2 else None,
    )
    return Workload(case, workload.requests)


def random_workloads(
    rng: random.Random, num_workloads: int, pin: str, *, mamba_align: bool, hybrid: bool
) -> list[Workload]:
    """`num_workloads` random workloads for kvsim's `pin`: full + Mamba hybrids with prefix
    caching (`mamba_align`; on 0.33.0 `as_033_align`'s), else `random_workload`'s (`hybrid`:
    Mamba hybrids where the pin models Mamba groups, 0.11.0 on, and the release's full-
    attention variants)."""
    if mamba_align:
        workloads = [random_mamba_align_workload(rng) for _ in range(num_workloads)]
        if resolve_pin(Design.V1_ENGINE, pin).mamba_align_has_checkpoints:
            workloads = [as_033_align(i, w) for i, w in enumerate(workloads)]
        return workloads
    release = resolve_pin(Design.V1_ENGINE, pin)
    mamba = hybrid and release.models_mamba_groups
    variants = full_variant_kinds(pin) if hybrid else ()
    return [random_workload(rng, mamba=mamba, variants=variants) for _ in range(num_workloads)]
