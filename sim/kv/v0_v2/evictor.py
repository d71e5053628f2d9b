"""LRU evictor of the v0 V2 prefix-caching allocator (`vllm/core/evictor_v2.py`, vLLM 0.5.4 release).

The upstream rule (`evictor_v2.py:L84-117`): blocks enter at refcount 0 into an OrderedDict
and stay in insertion order. `evict` scans *every* entry and keeps the one with the smallest
`last_accessed`; on a tie, the larger `num_hashed_tokens` (the block's prefix length) wins; on
a full tie the earliest inserted wins (the scan only replaces on a strict improvement).
`update` changes the time in place and does not move the entry; `add` over an id already in
the table replaces its data and keeps its place. This is the 0.5.4 release's evictor; main at
00c3d68 already had #7193, whose scan stops at the first later entry and whose `update` moves
the entry to the end, which kvsim does not model (`sim.kv.pins`).

Worked example::

    ev.add(5, h5, num_hashed_tokens=16, last_accessed=1.0)
    ev.add(6, h6, num_hashed_tokens=32, last_accessed=1.0)
    ev.add(7, h7, num_hashed_tokens=48, last_accessed=2.0)
    ev.evict() == (6, h6)    # oldest time 1.0; of 5 and 6 the longer prefix goes first

Why a heap picks the same victim. The scan replaces its pick only when an entry is strictly
better, so it returns the *first* entry (in table order) that is minimal under "time ascending,
then prefix length descending": that is the minimum of the key
``(last_accessed, -num_hashed_tokens, position)``, where `position` is the entry's place in the
table (a counter taken when the id enters; `update` and `add` over a live id keep it, as the
OrderedDict keeps the slot). Positions are distinct, so the key is a total order with one
minimum, and a binary heap on it pops exactly that entry in O(log n) instead of visiting all n
(a pool of tens of thousands of blocks made the scan quadratic on real traces). In the example
the keys are (1.0, -16, 0), (1.0, -32, 1), (2.0, -48, 2); the smallest is (1.0, -32, 1): id 6.

The heap is not edited in place: `update`, `remove` and `add` over a live id leave the old heap
item behind (stale) and push a new one. Each entry records the `version` of its current item;
`evict` pops and drops items whose id is gone or whose version is not the entry's. E.g. after
``ev.update(5, 3.0)`` the heap still holds (1.0, -16, 0, v0, 5) but entry 5 now says version v3,
so that item is skipped and (3.0, -16, 0, v3, 5) stands for it. Stale items are bounded: when
they outnumber the live entries twice over (plus a small floor), the heap is rebuilt from the
table, which is O(n) once per >= 2n operations.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

#: A stale item count below this never triggers a rebuild (rebuilding a tiny heap often would
#: cost more than the few stale items it drops).
_STALE_FLOOR = 64

#: (last_accessed, -num_hashed_tokens, position, version, block_id): tuple order is the
#: eviction order; `version` is unique, so a comparison never reaches `block_id`.
HeapItem = tuple[float, int, int, int, int]


@dataclass(slots=True)
class EvictorEntry:
    content_hash: int
    num_hashed_tokens: int
    last_accessed: float
    position: int  # place in the table: the scan's final tie-break
    version: int  # the heap item that currently stands for this entry


class LRUEvictor:
    __slots__ = ("_entries", "_heap", "_counter", "items_examined")

    def __init__(self) -> None:
        # Plain dict: insertion order, and assigning to a present key keeps its slot, as the
        # upstream OrderedDict (`block_ids` reports this order).
        self._entries: dict[int, EvictorEntry] = {}
        self._heap: list[HeapItem] = []
        # One counter hands out both positions and versions: both only need to be increasing.
        self._counter = 0
        #: Heap items popped by `evict`, live or stale: the work done (the upstream scan visits
        #: every entry on every eviction).
        self.items_examined = 0

    def __contains__(self, block_id: int) -> bool:
        return block_id in self._entries

    @property
    def num_blocks(self) -> int:
        """Upstream: `vllm/core/evictor_v2.py:L120-121 (0.5.4)`."""
        return len(self._entries)

    @property
    def num_heap_items(self) -> int:
        """Live plus stale heap items; at most 3 x `num_blocks` + the floor (64).

        kvsim's own (no upstream counterpart).
        """
        return len(self._heap)

    def add(
        self, block_id: int, content_hash: int, num_hashed_tokens: int, last_accessed: float
    ) -> None:
        """Upstream: `vllm/core/evictor_v2.py:L104-108 (0.5.4)`."""
        version = self._counter
        self._counter += 1
        entry = self._entries.get(block_id)
        if entry is None:
            entry = EvictorEntry(content_hash, num_hashed_tokens, last_accessed, version, version)
            self._entries[block_id] = entry
        else:
            # Upstream replaces the data of a present id in its slot: keep the position.
            entry.content_hash = content_hash
            entry.num_hashed_tokens = num_hashed_tokens
            entry.last_accessed = last_accessed
            entry.version = version
        self._push(block_id, entry)

    def update(self, block_id: int, last_accessed: float) -> None:
        """Upstream: `vllm/core/evictor_v2.py:L110-111 (0.5.4)`."""
        entry = self._entries[block_id]  # KeyError on an absent id, as upstream
        entry.last_accessed = last_accessed
        entry.version = self._counter
        self._counter += 1
        self._push(block_id, entry)

    def remove(self, block_id: int) -> None:
        """Upstream: `vllm/core/evictor_v2.py:L113-117 (0.5.4)`."""
        if block_id not in self._entries:
            raise ValueError("Attempting to remove block that's not in the evictor")
        del self._entries[block_id]
        self._compact_if_stale()

    def evict(self) -> tuple[int, int]:
        """(block id, content hash) of the victim, removed from the evictor.

        Upstream: `vllm/core/evictor_v2.py:L84-102 (0.5.4)`.
        """
        if not self._entries:
            raise ValueError("No usable cache memory left")
        heap = self._heap
        entries = self._entries
        # Every live entry has exactly one current item in the heap, so this ends.
        while True:
            item = heapq.heappop(heap)
            self.items_examined += 1
            block_id = item[4]
            entry = entries.get(block_id)
            if entry is not None and entry.version == item[3]:
                del entries[block_id]
                self._compact_if_stale()
                return block_id, entry.content_hash

    def block_ids(self) -> list[int]:
        """The ids the evictor holds, for the auditor (kvsim's own (no upstream counterpart))."""
        return list(self._entries)

    def _push(self, block_id: int, entry: EvictorEntry) -> None:
        heapq.heappush(
            self._heap,
            (
                entry.last_accessed,
                -entry.num_hashed_tokens,
                entry.position,
                entry.version,
                block_id,
            ),
        )
        self._compact_if_stale()

    def _compact_if_stale(self) -> None:
        """Rebuild the heap from the live entries once stale items exceed 2 x live + floor."""
        num_live = len(self._entries)
        if len(self._heap) - num_live <= 2 * num_live + _STALE_FLOOR:
            return
        heap: list[HeapItem] = [
            (e.last_accessed, -e.num_hashed_tokens, e.position, e.version, block_id)
            for block_id, e in self._entries.items()
        ]
        heapq.heapify(heap)
        self._heap = heap
