"""Paged KV-cache block managers: faithful, version-pinned models of vLLM's designs."""

from sim.kv.config import Design, KVCacheConfig, make_manager
from sim.kv.types import AllocStatus, NoFreeBlocksError, Sequence, SequenceGroup, SequenceStatus

__all__ = [
    "AllocStatus",
    "Design",
    "KVCacheConfig",
    "NoFreeBlocksError",
    "Sequence",
    "SequenceGroup",
    "SequenceStatus",
    "make_manager",
]
