"""Model of vLLM's V1-engine KV cache (`vllm/v1/core/*` @ 4ac7713, about v0.10.0)."""

from sim.kv.v1_engine.manager import KVCacheManager

__all__ = ["KVCacheManager"]
