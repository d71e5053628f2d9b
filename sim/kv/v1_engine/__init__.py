"""Model of vLLM's V1-engine KV cache (`vllm/v1/core/*` @ 4ac7713, about v0.10.0), with the
behaviours of 0.11.0 and 0.33.0 selectable by `KVCacheConfig.vllm_pin` (see `sim.kv.pins`): one
`KVCacheManager` over a unitary or a hybrid coordinator (models with full and sliding-window
layers), as upstream 0.11.0 has it."""

from dataclasses import replace

from sim.kv.config import KVCacheConfig
from sim.kv.v1_engine.manager import KVCacheManager

#: The manager over a `HybridKVCacheCoordinator`: the same class (upstream has one manager).
HybridKVCacheManager = KVCacheManager


def make_kv_cache_manager(config: KVCacheConfig) -> KVCacheManager:
    """The manager over the unitary coordinator, or over the hybrid one when the config has
    several KV-cache groups, as `get_kv_cache_coordinator` picks
    (`vllm/v1/core/kv_cache_coordinator.py:L417-440 (0.11.0)`). One explicit group is the unitary
    coordinator with that group's window."""
    groups = config.kv_cache_groups
    if len(groups) > 1:
        return KVCacheManager.hybrid(config)
    if groups:
        if groups[0].is_full_variant:
            raise ValueError(
                f"kv_cache_groups: a model of '{groups[0].kind}' layers alone (one KV-cache "
                "group) is not modelled; kvsim models these groups beside other groups"
            )
        if groups[0].mamba:
            raise ValueError(
                "kv_cache_groups: a model of Mamba layers alone (one Mamba group) is not "
                "modelled; kvsim models Mamba groups beside attention groups"
            )
        window = groups[0].sliding_window
        if config.sliding_window not in (None, window):
            raise ValueError("sliding_window disagrees with the one KV-cache group's window")
        config = replace(config, sliding_window=window, kv_cache_groups=())
    return KVCacheManager(config)


__all__ = ["HybridKVCacheManager", "KVCacheManager", "make_kv_cache_manager"]
