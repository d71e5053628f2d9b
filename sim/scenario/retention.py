"""`vllm serve`'s sparse prefix-cache retention for a scenario's sliding-window groups (0.33.0).

`CacheConfig.prefix_cache_retention_interval` defaults to 0 (`vllm/config/cache.py:L275-281
@0.33.0`), which `kv_cache_planning.py:L665` passes to the engine's `KVCacheConfig`: a
sliding-window group then caches only the window a replay of the prompt or a shared-prefix
junction reads (`sim.kv.v1_engine.sliding_retention`). No earlier release has the setting.
The Mamba "align" half is set where the Mamba cache mode is (`kv_pool._with_mamba_cache_mode`);
full and chunked-local groups ignore it, so a layout without a sliding or Mamba group keeps
None (the same caching either way). Example: Gemma-3-27B (full + sliding groups) on 0.33.0
with caching -> 0; on 0.26.0, or with caching off -> None.
"""

from __future__ import annotations

from dataclasses import replace

from sim.kv.config import KVCacheConfig
from sim.kv.pins import VllmPin


def with_serve_retention(config: KVCacheConfig, inputs: dict) -> KVCacheConfig:
    """`config` with retention interval 0 where `vllm serve` sparsifies a sliding window (0.33.0,
    prefix caching on, a sliding group or `sliding_window`), recorded in `inputs`; else as is.

    kvsim's own (no upstream counterpart).
    """
    if config.vllm_pin is None or not VllmPin(config.vllm_pin).has_prefix_cache_retention:
        return config
    has_window = config.sliding_window is not None or any(
        group.sliding_window is not None for group in config.kv_cache_groups
    )
    if not (config.enable_prefix_caching and has_window) or config.has_mamba_group:
        return config
    inputs["prefix_cache_retention_interval"] = 0
    return replace(config, prefix_cache_retention_interval=0)
