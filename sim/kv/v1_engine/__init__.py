"""Model of vLLM's V1-engine KV cache (`vllm/v1/core/*` @ 4ac7713, about v0.10.0), with the
behaviours of 0.11.0 and 0.33.0 selectable by `KVCacheConfig.vllm_pin` (see `releases`)."""

from sim.kv.v1_engine.manager import KVCacheManager

__all__ = ["KVCacheManager"]
