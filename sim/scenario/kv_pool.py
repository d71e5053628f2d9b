"""The KV pool a scenario runs: its block count (given, or derived by `sim.memory` as the
scenario's engine would size it), its KV-cache groups and the Mamba cache mode (`kv_config`).

`sim.scenario.resolve` calls `kv_config` once per run, after the scheduler is resolved; every
number it settles is recorded in the run's `inputs` (`num_gpu_blocks` and its source, the
memory terms, the groups, the sliding window).
"""

from __future__ import annotations

from dataclasses import replace

from sim.catalog import ModelSpec, get_gpu
from sim.errors import InputError
from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from sim.kv.pins import V1_BASELINE, VllmPin, resolve_pin
from sim.kv.v1_engine.hybrid_layout import HybridLayout
from sim.memory.derive import KvLayout, given_num_gpu_blocks, hybrid_layout_of
from sim.memory.hybrid_pool import HybridPool
from sim.memory.terms import VllmEngine
from sim.scenario.catalog_layout import (
    catalog_pool,
    group_rows,
    pool_num_blocks,
    uses_catalog_layout,
)
from sim.scenario.configs import (
    derive_budget,
    explicit_kv_cache_groups,
    kv_cache_config_of,
    kv_dtype_of,
    kv_layout_of,
    num_cpu_blocks_of,
    sliding_window_of,
)
from sim.scenario.full_variants import check_full_variant_groups
from sim.scenario.release_defaults import applied
from sim.scenario.retention import with_serve_retention
from sim.scenario.schema import CacheSection, Scenario, ScenarioError
from sim.scenario.vllm_defaults.mamba import (
    mamba_prefill_checkpoint_blocks,
    resolve_mamba_cache_mode,
)

#: The groups a pool is cut into, with where they came from: the layout name vLLM reports,
#: the groups, and the catalog's hybrid layout or release pool when one made them.
_Groups = tuple[KvLayout, tuple[KVCacheGroupSpec, ...], HybridLayout | None, HybridPool | None]


def kv_config(
    scenario: Scenario,
    model: ModelSpec | None,
    token_budget: int,
    max_model_len: int,
    inputs: dict,
) -> KVCacheConfig:
    """The KV pool: given, or derived by `sim.memory` as the scenario's engine would size it.

    The V1 engine gives a model with both sliding-window and full layers (Gemma-2) the hybrid
    layout: `num_gpu_blocks` blocks of `group_size` layers, shared by the KV-cache groups, each
    request holding one table per group (`sim.kv.v1_engine.hybrid_coordinator`). The manager gets
    vLLM's own block count and the groups (`inputs["kv_cache_groups"]`). Example: Gemma-2-9B,
    42 layers -> 2 groups of 21 layers; 20,000 blocks, which vLLM reports as
    20,000 // 2 * 16 = 160,000 tokens. A scenario that sets `cache.sliding_window` itself
    overrides the model's layers: one group, and `num_gpu_blocks // num_kv_groups` blocks (the
    token capacity vLLM reports) for a derived pool.
    """
    cache = scenario.cache
    engine = VllmEngine(scenario.scheduler.design.api)
    kv_layout, groups, layout, pool = _groups_of(scenario, model, max_model_len, engine)
    num_gpu_blocks = _num_gpu_blocks(scenario, model, token_budget, layout, inputs, pool)
    inputs["kv_layout"] = kv_layout
    num_cpu_blocks = num_cpu_blocks_of(cache, engine, model, scenario.hardware.tensor_parallel_size)
    window = sliding_window_of(cache, model)
    config = kv_cache_config_of(
        cache,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        sliding_window=window,
        max_model_len=max_model_len,
        vllm_pin=scenario.scheduler.resolved_vllm_version,
        kv_cache_groups=groups,
        max_num_batched_tokens=token_budget,
    )
    if pool is not None:  # the release's unified block size (a Mamba hybrid's is raised)
        config = replace(config, block_size=pool.block_size)
    _record_groups(inputs, groups, layout, pool)
    if config.has_mamba_group:
        config = _with_mamba_cache_mode(config, cache, inputs, model)
    config = with_serve_retention(config, inputs)  # 0.33.0's sliding windows
    check_mamba_groups(config)
    check_full_variant_groups(config)  # `sim.scenario.full_variants`
    inputs["num_gpu_blocks"] = num_gpu_blocks
    inputs["num_cpu_blocks"] = num_cpu_blocks
    inputs["sliding_window"] = window
    return config


def _groups_of(
    scenario: Scenario, model: ModelSpec | None, max_model_len: int, engine: VllmEngine
) -> _Groups:
    """The KV-cache groups the pool is cut into, first match wins: the scenario's own
    `cache.kv_cache_groups`; a catalog model's groups as its pinned release builds them
    (`catalog_layout`, one full group being the uniform layout); the Gemma-2-style hybrid
    layout of a model with both window and full layers, unless the scenario overrides the
    model's windows; else none (one uniform group)."""
    cache = scenario.cache
    kv_layout = kv_layout_of(model, engine)
    groups = explicit_kv_cache_groups(
        cache, scenario.scheduler.design, scenario.scheduler.resolved_vllm_version
    )
    if groups:
        return "hybrid", groups, None, None
    if model is not None and uses_catalog_layout(scenario, model):
        pool = catalog_pool(scenario, model, max_model_len)
        groups = pool.groups
        if len(groups) == 1 and groups[0].is_full_attention:  # one full group: uniform
            groups = ()
        return ("hybrid" if groups else "uniform"), groups, None, pool
    if model is not None and kv_layout == "hybrid" and cache.sliding_window == "model":
        layout = hybrid_layout_of(model)
        return kv_layout, layout.groups, layout, None
    return kv_layout, groups, None, None


def _record_groups(
    inputs: dict,
    groups: tuple[KVCacheGroupSpec, ...],
    layout: HybridLayout | None,
    pool: HybridPool | None,
) -> None:
    """`inputs["kv_cache_groups"]`, one row per group, in the terms its source gives: a
    release pool's rows (and the pool itself), a hand-given group's spec, or a hybrid
    layout's window and layer count."""
    if pool is not None:
        inputs["kv_cache_groups"] = group_rows(pool)
        inputs["hybrid_pool"] = pool.as_dict()
    elif groups and layout is None:
        inputs["kv_cache_groups"] = [
            {
                "group_id": group_id,
                "sliding_window": group.sliding_window,
                "attention_chunk_size": group.attention_chunk_size,
                "mamba": group.mamba,
                "sink_len": group.sink_len,
                "rswa_window": group.rswa_window,
                "circular_buffer": group.circular_buffer,
            }
            for group_id, group in enumerate(groups)
        ]
    if layout is not None:
        inputs["kv_cache_groups"] = [
            {
                "group_id": group_id,
                "sliding_window": group.sliding_window,
                "num_layers": len(layers),
            }
            for group_id, (group, layers) in enumerate(
                zip(layout.groups, layout.group_layers, strict=True)
            )
        ]


def _with_mamba_cache_mode(
    config: KVCacheConfig, cache: CacheSection, inputs: dict, model: ModelSpec | None
) -> KVCacheConfig:
    """`config` with the Mamba cache mode its release runs (`vllm_defaults.mamba`), recorded
    in `inputs`. A catalog model's state kind says whether its vLLM class declares
    `SupportsMambaPrefixCaching`: the Mamba2-kernel family does (Nemotron-H, 0.25.1
    `nemotron_h.py:L776-787`), the gated-delta-net hybrids do not (`qwen3_next.py`); an
    abstract model (groups given by hand) runs "align" unless the scenario says "all"."""
    pin = VllmPin(config.vllm_pin) if config.vllm_pin is not None else V1_BASELINE
    state = model.mamba_state if model is not None else None
    supports_all = None if state is None else state.kind == "mamba2"
    try:
        mode = resolve_mamba_cache_mode(
            pin, config.enable_prefix_caching, cache.mamba_cache_mode, supports_all
        )
    except InputError as exc:
        raise ScenarioError(f"cache.{exc}") from None
    inputs["mamba_cache_mode"] = mode.value
    if mode.value == "none":
        return config
    checkpoint = mamba_prefill_checkpoint_blocks(
        pin, mode.value, None if state is None else state.kind
    )
    inputs["mamba_prefill_checkpoint_blocks"] = checkpoint.value
    # `vllm serve`'s sparse retention on 0.33.0 (`config/cache.py:L275`: 0), which kvsim
    # models for full + Mamba layouts (`mamba_checkpoint`); no such setting before.
    retention = 0 if pin.mamba_align_has_checkpoints and mode.value == "align" else None
    inputs["prefix_cache_retention_interval"] = retention
    return replace(
        config,
        mamba_cache_mode=mode.value,
        mamba_prefill_checkpoint_blocks=checkpoint.value,
        prefix_cache_retention_interval=retention,
    )


def check_mamba_groups(config: KVCacheConfig) -> None:
    """A Mamba group (`cache.kv_cache_groups`) with prefix caching runs vLLM's Mamba cache
    mode "align" or "all" (`MambaModelConfig.verify_and_update_config`,
    `model_executor/models/config.py:L423-481 @0.19.1`; `vllm serve` turns caching on by
    default for generative hybrid models, `sim.scenario.vllm_defaults.mamba`), which kvsim
    models on 0.19.1 to 0.33.0 for full + Mamba layouts (`sim.kv.v1_engine.mamba`, 0.33.0's
    checkpoint blocks `sim.kv.v1_engine.mamba_checkpoint`). 0.11.0 turns caching off for
    Mamba models (`L290-297 @0.11.0`), which a catalog hybrid gets from its release defaults
    (`vllm_defaults.v1.resolve_v011`). Refused, one line each: caching with hand-given Mamba
    groups on a release without "align" (no model class to say what vLLM would do), and
    caching with a sliding-window or chunked-local group beside the Mamba ones."""
    if not (config.has_mamba_group and config.enable_prefix_caching):
        return
    pin = VllmPin(config.vllm_pin) if config.vllm_pin is not None else V1_BASELINE
    if not pin.models_mamba_align:
        raise ScenarioError(
            "cache.enable_prefix_caching: a Mamba group with prefix caching runs vLLM's "
            f"'align' Mamba mode, which kvsim models on 0.19.1 to 0.33.0, not {pin.value}; "
            "set cache.enable_prefix_caching: false"
        )
    if any(not (g.is_full_attention or g.mamba) for g in config.kv_cache_groups):
        raise ScenarioError(
            "cache.enable_prefix_caching: Mamba prefix caching is modelled for full-attention "
            "plus Mamba groups only; drop the sliding or chunked group or turn caching off"
        )


def _num_gpu_blocks(
    scenario: Scenario,
    model: ModelSpec | None,
    token_budget: int,
    layout: HybridLayout | None,
    inputs: dict,
    pool: HybridPool | None = None,
) -> int:
    """The pool's block count, given or derived (`_derived_num_gpu_blocks`); what it amounts
    to in memory goes to `inputs["memory"]` (every term) when there is a model."""
    cache, hw = scenario.cache, scenario.hardware
    if cache.num_gpu_blocks == "derive":
        assert model is not None
        return _derived_num_gpu_blocks(scenario, model, token_budget, layout, inputs, pool)
    inputs["num_gpu_blocks_source"] = "given"
    if model is not None and pool is None:  # what the given blocks amount to, for the record
        budget = given_num_gpu_blocks(
            cache.num_gpu_blocks,
            model,
            tp=hw.tensor_parallel_size,
            block_size=applied(cache.block_size, "cache.block_size"),
            kv_dtype=kv_dtype_of(cache),
            kv_layout="hybrid" if layout is not None else "uniform",
        )
        inputs["memory"] = budget.as_dict()
    return cache.num_gpu_blocks


def _derived_num_gpu_blocks(
    scenario: Scenario,
    model: ModelSpec,
    token_budget: int,
    layout: HybridLayout | None,
    inputs: dict,
    pool: HybridPool | None,
) -> int:
    """The block count the scenario's engine would derive from the GPU's memory
    (`configs.derive_budget`; a catalog model's release pool re-cuts the memory left,
    `catalog_layout.pool_num_blocks`). A uniform pool is `num_gpu_blocks // num_kv_groups`
    blocks: the token capacity vLLM reports when the scenario overrides the model's windows."""
    cache, hw = scenario.cache, scenario.hardware
    try:
        budget = derive_budget(
            model,
            get_gpu(hw.gpu),
            VllmEngine(scenario.scheduler.design.api),
            tp=hw.tensor_parallel_size,
            block_size=applied(cache.block_size, "cache.block_size"),
            gpu_memory_utilization=applied(
                cache.gpu_memory_utilization, "cache.gpu_memory_utilization"
            ),
            kv_dtype=kv_dtype_of(cache),
            weight_dtype=scenario.model_dtype,
            max_num_batched_tokens=token_budget,
            max_num_seqs=applied(scenario.scheduler.max_num_seqs, "scheduler.max_num_seqs"),
            # the release's profiling run decides which sampler's peak is subtracted
            vllm_release=resolve_pin(
                scenario.scheduler.design, scenario.scheduler.resolved_vllm_version
            ).value,
        )
    except InputError as error:
        raise ScenarioError(f"cache.num_gpu_blocks: {error}") from None
    if pool is not None:
        budget = pool_num_blocks(pool, model, budget)
    num_gpu_blocks = budget.num_gpu_blocks
    if layout is None and pool is None:
        num_gpu_blocks //= budget.num_kv_groups
    inputs["memory"] = budget.as_dict()
    inputs["num_gpu_blocks_source"] = "derived"
    return num_gpu_blocks
