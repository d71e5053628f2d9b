"""Faithful model of vLLM v0 BlockSpaceManagerV2: the vLLM 0.5.4 release, or 0.5.4 + #7380 by
`KVCacheConfig.vllm_pin` (`sim.kv.pins` says which behaviours follow which)."""

from sim.kv.v0_v2.manager import BlockSpaceManagerV2

__all__ = ["BlockSpaceManagerV2"]
