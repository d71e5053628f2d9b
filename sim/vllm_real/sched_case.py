"""One case of the scheduler lockstep in kvsim's terms: the configuration both schedulers get
(`SchedCase`), its requests (`RequestSpec`), what one step decided (`StepRecord`), and kvsim's
scheduler and KV pool for a case, resolved as a scenario's are (`case_configs`). Nothing here
imports vLLM; `v1_sched_adapter` builds the real scheduler from the same case.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from sim.kv.config import Design, KVCacheConfig, KVCacheGroupSpec
from sim.kv.types import TokenContent
from sim.memory.terms import VllmEngine
from sim.scenario.configs import (
    kv_cache_config_of,
    num_cpu_blocks_of,
    scheduler_config_of,
    sliding_window_of,
)
from sim.scenario.retention import with_serve_retention
from sim.scenario.schema import CacheSection, SchedulerSection
from sim.scheduler.config import Policy, SchedulerConfig


@dataclass(frozen=True, slots=True)
class SchedCase:
    """One scheduler configuration, the same numbers for vLLM and for kvsim."""

    num_blocks: int
    block_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False
    sliding_window: int | None = None
    long_prefill_token_threshold: int = 0
    policy: str = "fcfs"
    #: vLLM's `AsyncScheduler` behind the engine core's batch queue (`async_lockstep`).
    async_scheduling: bool = False
    #: Mamba state groups after one full-attention group (0: one group); with prefix caching
    #: on, vLLM's Mamba cache mode "align" (`sim.scheduler.v1.mamba_align`).
    mamba_groups: int = 0
    #: With Mamba groups and caching: "align" (None) or "all" (0.19.1-0.26.0).
    mamba_cache_mode: str | None = None
    #: 0.33.0 "align": the Mamba specs' prefill checkpoint blocks (0 or 1,
    #: `sim.kv.v1_engine.mamba_checkpoint`).
    mamba_prefill_checkpoint_blocks: int = 0
    #: 0.33.0 "align": `prefix_cache_retention_interval` (None dense, 0 sparse); a sliding
    #: window with caching gets `vllm serve`'s 0 as a scenario does (`with_serve_retention`).
    prefix_cache_retention_interval: int | None = None
    #: A hybrid model's KV-cache groups (`cache.kv_cache_groups`; empty: one group). With a
    #: Mamba group prefix caching is off, as kvsim models it (`sim.kv.v1_engine.mamba`).
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = ()

    @property
    def groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The KV-cache groups the case runs: `kv_cache_groups`, or one full group and
        `mamba_groups` Mamba groups."""
        if self.mamba_groups:
            return (KVCacheGroupSpec(),) + (KVCacheGroupSpec(mamba=True),) * self.mamba_groups
        return self.kv_cache_groups


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """One request of a lockstep workload; `arrival_step` is the step before which it is added."""

    request_id: int
    prompt: tuple[tuple[int, int], ...]  # (content key, tokens) segments
    output_len: int
    arrival_step: int
    arrival_s: float
    priority: int = 0

    def content(self) -> TokenContent:
        from sim.kv.types import Segment

        return TokenContent.from_segments([Segment(k, n) for k, n in self.prompt])


@dataclass(slots=True)
class StepRecord:
    """What one engine step decided, as comparable plain values."""

    scheduled: list[tuple[int, int]] = field(default_factory=list)  # (request id, tokens)
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    free_after_schedule: int = 0
    free_after_update: int = 0
    #: kvsim's decode cohort only: one-token decodes run in bulk, not listed in `scheduled`.
    bulk_decodes: int = 0
    #: kvsim only: the engine died in this step (`StepPlan.fatal_error`).
    fatal_error: str | None = None


def case_configs(
    case: SchedCase, pin: str | None = None, fast_path: bool = False
) -> tuple[SchedulerConfig, KVCacheConfig]:
    """kvsim's scheduler and KV pool for `case`, resolved as a scenario's are
    (`sim.scenario.configs`): a V1-engine scenario pinned to `pin` (None: the latest), with no
    model, the case's pool given. `fast_path` turns on the decode fast path and cohort.

    Example: ``case_configs(SchedCase(20, 16, 128, 4, 64), "0.11.0")`` -> a scheduler of
    max_model_len 128, 4 seqs, a 64-token budget, and a pool of 20 blocks of 16 tokens.
    """
    scheduler = SchedulerSection(
        design=Design.V1_ENGINE,
        vllm_version=pin,
        max_model_len=case.max_model_len,
        max_num_seqs=case.max_num_seqs,
        max_num_batched_tokens=case.max_num_batched_tokens,
        enable_chunked_prefill=case.enable_chunked_prefill,
        policy=Policy(case.policy),
        long_prefill_token_threshold=case.long_prefill_token_threshold,
        decode_fast_path=fast_path,
        decode_cohort=fast_path,
        async_scheduling=case.async_scheduling,
    )
    cache = CacheSection(
        num_gpu_blocks=case.num_blocks,
        block_size=case.block_size,
        sliding_window=case.sliding_window,
        enable_prefix_caching=case.enable_prefix_caching,
    )
    groups = case.groups
    kv = kv_cache_config_of(
        cache,
        num_gpu_blocks=case.num_blocks,
        num_cpu_blocks=num_cpu_blocks_of(cache, VllmEngine.V1, None, tp=1),
        sliding_window=sliding_window_of(cache, None),
        max_model_len=case.max_model_len,
        vllm_pin=scheduler.resolved_vllm_version,
        max_num_batched_tokens=case.max_num_batched_tokens,
        kv_cache_groups=groups,
    )
    if case.enable_prefix_caching and any(g.mamba for g in groups):
        kv = replace(
            kv,
            mamba_cache_mode=case.mamba_cache_mode or "align",
            mamba_prefill_checkpoint_blocks=case.mamba_prefill_checkpoint_blocks,
            prefix_cache_retention_interval=case.prefix_cache_retention_interval,
        )
    # `vllm serve`'s sparse retention of sliding windows (0.33.0), as a scenario resolves it.
    kv = with_serve_retention(kv, {})
    return scheduler_config_of(scheduler, case.max_model_len), kv
