"""Faithful model of vLLM v0 BlockSpaceManagerV2 (vLLM 0.5.4 @ 00c3d68e45)."""

from sim.kv.v0_v2.manager import BlockSpaceManagerV2

__all__ = ["BlockSpaceManagerV2"]
