"""The one translation of scenario settings into kvsim's configs and memory inputs.

`sim.scenario.resolve` builds a run's `SchedulerConfig` here and `sim.scenario.kv_pool` its
`KVCacheConfig` (after the scheduler's startup checks); the lockstep harnesses against real
vLLM (`sim.vllm_real`) build theirs here from the same sections, then translate the result into
vLLM's own config objects; the memory validation against vLLM's startup logs
(`sim.memory.validation`) derives its pool with `derive_budget`. No other module turns
settings into these configs.

Example: a V1-engine scheduler section with `max_num_seqs: 4`, no `max_model_len`, for a
model of 8,192 positions -> ``SchedulerConfig(max_model_len=8192, max_num_seqs=4, ...)``; a
cache section of `num_gpu_blocks: 20, sliding_window: 32` -> ``KVCacheConfig(20, 16,
num_cpu_blocks=0, sliding_window=32, ...)`` (the V1 engine has no swap space).
"""

from __future__ import annotations

from typing import TypedDict, Unpack

from sim.catalog import GpuSpec, ModelSpec
from sim.kv.config import Design, KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.memory.derive import (
    KvLayout,
    MemoryBudget,
    block_bytes,
    derive_num_gpu_blocks,
    is_hybrid_model,
)
from sim.memory.terms import VllmEngine
from sim.scenario.release_defaults import applied
from sim.scenario.schema import CacheSection, ScenarioError, SchedulerSection
from sim.scheduler import SchedulerConfig


def scheduler_config_of(section: SchedulerSection, max_model_len: int) -> SchedulerConfig:
    """The scheduler a scenario's `scheduler` section starts, its release's defaults applied
    (`sim.scenario.release_defaults`; `max_model_len` resolved)."""
    return SchedulerConfig(
        max_model_len=max_model_len,
        max_num_seqs=applied(section.max_num_seqs, "scheduler.max_num_seqs"),
        max_num_batched_tokens=section.max_num_batched_tokens,
        enable_chunked_prefill=applied(
            section.enable_chunked_prefill, "scheduler.enable_chunked_prefill"
        ),
        policy=section.policy,
        preemption_mode=section.preemption_mode,
        long_prefill_token_threshold=applied(
            section.long_prefill_token_threshold, "scheduler.long_prefill_token_threshold"
        ),
        decode_fast_path=section.decode_fast_path,
        decode_cohort=section.decode_cohort,
        async_scheduling=applied(section.async_scheduling, "scheduler.async_scheduling"),
    )


def kv_layout_of(model: ModelSpec | None, engine: VllmEngine) -> KvLayout:
    """The V1 engine groups a model with sliding and full layers (its hybrid allocator); the
    v0 engine never does. Example: Gemma-2 under V1 -> "hybrid", under v0 -> "uniform"."""
    hybrid = model is not None and engine is VllmEngine.V1 and is_hybrid_model(model)
    return "hybrid" if hybrid else "uniform"


class LaunchSettings(TypedDict, total=False):
    """The launch settings vLLM sizes its KV pool from (`derive_num_gpu_blocks`' keywords)."""

    tp: int
    block_size: int
    gpu_memory_utilization: float
    kv_dtype: str | None
    weight_dtype: str
    max_num_batched_tokens: int
    max_num_seqs: int
    flashinfer_sampler: bool | None
    vllm_release: str | None
    enforce_eager: bool
    estimate_cudagraphs: bool | None


def derive_budget(
    model: ModelSpec, gpu: GpuSpec, engine: VllmEngine, **launch: Unpack[LaunchSettings]
) -> MemoryBudget:
    """The KV pool vLLM would size at startup for these launch settings, every term kept
    (`sim.memory.derive`), in the layout `kv_layout_of` gives the model under `engine`."""
    layout = kv_layout_of(model, engine)
    return derive_num_gpu_blocks(model, gpu, kv_layout=layout, engine=engine, **launch)


def kv_dtype_of(cache: CacheSection) -> str | None:
    """The KV dtype a cache section names; None for "auto" (the model's own dtype)."""
    return None if cache.kv_cache_dtype == "auto" else cache.kv_cache_dtype


def num_cpu_blocks_of(
    cache: CacheSection, engine: VllmEngine, model: ModelSpec | None, tp: int
) -> int:
    """The swap pool: none under the V1 engine (`sim.scenario.no_effect`), else the section's
    count, else `swap_space_gib` in blocks of the model. Example: 4 GiB of 2 MiB blocks -> 2048."""
    if engine is VllmEngine.V1:
        return 0
    if cache.num_cpu_blocks is not None:
        return cache.num_cpu_blocks
    if model is None:
        return 0
    block_size = applied(cache.block_size, "cache.block_size")
    one_block = block_bytes(model, block_size=block_size, kv_dtype=kv_dtype_of(cache), tp=tp)
    return int(cache.swap_space_gib * 2**30 // one_block)


def sliding_window_of(cache: CacheSection, model: ModelSpec | None) -> int | None:
    """The section's window, or ("model") the model's when all its layers slide."""
    if cache.sliding_window != "model":
        return cache.sliding_window
    if model is not None and model.layer_pattern == "sliding":
        return model.sliding_window
    return None


def kv_cache_config_of(
    cache: CacheSection,
    *,
    num_gpu_blocks: int,
    num_cpu_blocks: int,
    sliding_window: int | None,
    max_model_len: int | None,
    vllm_pin: str | None,
    kv_cache_groups: tuple[KVCacheGroupSpec, ...] = (),
    max_num_batched_tokens: int | None = None,
) -> KVCacheConfig:
    """The KV pool a block manager is built from: the section's block size, prefix caching
    and watermark, with the pool sizes and window already resolved."""
    return KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=applied(cache.block_size, "cache.block_size"),
        num_cpu_blocks=num_cpu_blocks,
        sliding_window=sliding_window,
        enable_prefix_caching=applied(cache.enable_prefix_caching, "cache.enable_prefix_caching"),
        watermark=cache.watermark,
        max_model_len=max_model_len,
        vllm_pin=vllm_pin,
        kv_cache_groups=kv_cache_groups,
        max_num_batched_tokens=max_num_batched_tokens,
    )


def explicit_kv_cache_groups(
    cache: CacheSection, design: Design, vllm_pin: str | None
) -> tuple[KVCacheGroupSpec, ...]:
    """`cache.kv_cache_groups` as the manager's group specs (empty when not given), or the
    one-line error a layout vLLM's hybrid coordinator would refuse gets. Example:
    ``[{attention_chunk_size: 8192}] * 3 + [{}]`` -> Llama-4-Scout's four groups.
    """
    if not cache.kv_cache_groups:
        return ()
    field = "cache.kv_cache_groups"
    if design is not Design.V1_ENGINE:
        raise ScenarioError(f"{field}: KV-cache groups exist only in the V1 engine (v1-engine)")
    if cache.num_gpu_blocks == "derive":
        raise ScenarioError(f"{field}: give cache.num_gpu_blocks (the pool the groups share)")
    if cache.sliding_window not in ("model", None):
        raise ScenarioError(f"{field}: each group sets its window; drop cache.sliding_window")
    groups = tuple(g.group_spec() for g in cache.kv_cache_groups)
    try:
        make_manager(
            design,
            KVCacheConfig(
                num_gpu_blocks=cache.num_gpu_blocks,
                # A sink group's sink_len must be a multiple of it (`full_variants`).
                block_size=cache.block_size or 16,
                kv_cache_groups=groups,
                vllm_pin=vllm_pin,
                # The layout alone: max_model_len and caching are checked on the full config
                # (`kv_pool.check_mamba_groups`); a Mamba group needs some max_model_len here.
                max_model_len=1,
            ),
        )
    except ValueError as exc:
        # The manager names the field itself ("kv_cache_groups: ..."): say it once.
        raise ScenarioError(f"{field}: {str(exc).removeprefix('kv_cache_groups: ')}") from None
    return groups
