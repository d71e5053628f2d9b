"""LRU evictor of the v0 V2 prefix-caching allocator (`vllm/core/evictor_v2.py`, vLLM 0.5.4 release).

Blocks enter at refcount 0 and stay in insertion order. `evict` scans *every* entry and keeps
the one with the smallest `last_accessed`; on a tie, the larger `num_hashed_tokens` (the
block's prefix length) wins; on a full tie the earliest inserted wins (the scan only
replaces on a strict improvement). `update` changes the time in place and does not move
the entry. This is the 0.5.4 release's evictor; main at 00c3d68 already had #7193, whose scan
stops at the first later entry and whose `update` moves the entry to the end, which kvsim
does not model (`sim.kv.v0_versions`).

Worked example::

    ev.add(5, h5, num_hashed_tokens=16, last_accessed=1.0)
    ev.add(6, h6, num_hashed_tokens=32, last_accessed=1.0)
    ev.add(7, h7, num_hashed_tokens=48, last_accessed=2.0)
    ev.evict() == (6, h6)    # oldest time 1.0; of 5 and 6 the longer prefix goes first
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(slots=True)
class EvictorEntry:
    content_hash: int
    num_hashed_tokens: int
    last_accessed: float


class LRUEvictor:
    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: OrderedDict[int, EvictorEntry] = OrderedDict()

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entries

    @property
    def num_blocks(self) -> int:
        return len(self._entries)

    def add(
        self, block_id: int, content_hash: int, num_hashed_tokens: int, last_accessed: float
    ) -> None:
        self._entries[block_id] = EvictorEntry(content_hash, num_hashed_tokens, last_accessed)

    def update(self, block_id: int, last_accessed: float) -> None:
        self._entries[block_id].last_accessed = last_accessed

    def remove(self, block_id: int) -> None:
        if block_id not in self._entries:
            raise ValueError("Attempting to remove block that's not in the evictor")
        del self._entries[block_id]

    def evict(self) -> tuple[int, int]:
        """(block id, content hash) of the victim, removed from the evictor."""
        if not self._entries:
            raise ValueError("No usable cache memory left")
        best_id = None
        best: EvictorEntry | None = None
        for block_id, entry in self._entries.items():
            if (
                best is None
                or entry.last_accessed < best.last_accessed
                or (
                    entry.last_accessed == best.last_accessed
                    and entry.num_hashed_tokens > best.num_hashed_tokens
                )
            ):
                best_id, best = block_id, entry
        assert best_id is not None and best is not None
        del self._entries[best_id]
        return best_id, best.content_hash

    def block_ids(self) -> list[int]:
        return list(self._entries)
