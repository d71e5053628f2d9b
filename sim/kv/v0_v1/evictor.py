"""The LRU evictor of vLLM v0 `BlockSpaceManagerV1`: upstream's victims, without its full scan.

Models `vllm/core/evictor_v1.py:L53-99 (0.5.4)`
(our own code, same behaviour). Upstream keeps freed cached blocks in an OrderedDict keyed by
hash, in insertion order, and `evict` scans it:

    victim = first entry
    for entry in insertion order:
        if victim.last_accessed < entry.last_accessed: stop
        if victim.num_hashed_tokens < entry.num_hashed_tokens: victim = entry
    remove victim

That scan reads every entry when no stop fires, and kvsim's v0 scheduler never stamps access
times (every block keeps ``last_accessed == -1``), so each eviction read the whole pool of tens
of thousands of blocks: a Mooncake replay was quadratic.

Representation: the entries, in insertion order, are cut into *runs* of consecutive entries
with the same `last_accessed`; each run has a heap keyed ``(-num_hashed_tokens, insertion
seq)`` whose top is the run's first entry with the most tokens. Why the scan over runs picks
upstream's victim:

* Inside a run every time equals the run's time T. The stop fires at the run's first entry
  (``victim time < T``) or at none of them, because the victim's time never grows: a switch
  goes to an entry with time T <= the victim's time (else the stop would have fired first).
* If the stop does not fire, the victim changes only on strictly more tokens, so it ends on the
  first entry holding the run's maximum if that maximum beats the victim's count, else stays:
  exactly the heap top, compared with ``<`` on the count.
* The first run starts with the very first entry as victim; its heap top is that entry or a
  later one with strictly more tokens, so the top is the victim after the first run.

Worked example, entries in insertion order as (name, last_accessed, num_hashed_tokens):
A(5, 16) B(1, 32) C(1, 48) D(3, 64) E(9, 64) -> runs [A] t=5, [B C] t=1, [D] t=3, [E] t=9.
Upstream: victim A; B: no stop (5 < 1 false), 32 > 16 -> B; C: 48 > 32 -> C; D: 1 < 3 stop.
Runs: [A] top A (16); run t=1: 5 < 1 false, top C has 48 > 16 -> C, time 1; run t=3: 1 < 3
stop. Victim C, after reading 3 runs where upstream reads 4 entries. With all times equal
(kvsim's case) there is one run and `evict` is one heap pop, O(log n); in general it costs
O(runs read x log n), and the runs read are at most the entries upstream reads.

Removed entries (`remove`, a block revived by a cache hit) stay in their run's heap and are
skipped when they reach the top (their insertion seq no longer matches); a run left empty is
unlinked. Two runs with the same time may end up adjacent after that; the scan visits them in
turn with the same result as one run. A heap with more stale items than live ones is rebuilt,
so memory stays proportional to the entries.

A block's `last_accessed` can change while it sits here: a table can still name a free block
(see `CachedBlockAllocator.incref`) and `access_all_blocks_in_seq` stamps every block of the
table. Whoever writes it calls `on_last_accessed_changed`; if the time differs from the run's,
the runs are dropped and rebuilt from the insertion order at the next `evict` (O(n), as
upstream's scan). `num_hashed_tokens` only changes on a block after it was evicted.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from typing import TYPE_CHECKING

from sim.kv.types import NoFreeBlocksError

if TYPE_CHECKING:
    from sim.kv.v0_v1.alloc import PhysicalBlock

EVICTOR_EMPTY_MSG = "No usable cache memory left"

#: A heap item: (-num_hashed_tokens, insertion seq, block hash). The smallest is the run's
#: first entry (lowest seq) among those with the most tokens.
_HeapItem = tuple[int, int, int]


class _Run:
    """Consecutive evictor entries (insertion order) sharing one `last_accessed`."""

    __slots__ = ("heap", "last_accessed", "next", "num_entries", "prev")

    def __init__(self, last_accessed: float, prev: _Run | None) -> None:
        self.last_accessed = last_accessed
        self.heap: list[_HeapItem] = []
        self.num_entries = 0
        self.prev: _Run | None = prev
        self.next: _Run | None = None


class LRUEvictor:
    """Freed cached blocks, keyed by hash in insertion order (vLLM `evictor_v1.LRUEvictor`).

    `evict` picks upstream's front-scan victim (module docstring). This is the true LRU only
    while entries sit in timestamp order. Example: entries [A(t=5, n=16), B(t=1, n=16)] never
    trigger the stop, nothing beats A's 16 tokens, so A (not the older B) is evicted.

    `hash_to_block` is the upstream table (hash -> block, insertion order), read-only for
    callers. `num_runs_visited` counts the runs `evict` has read, in total (its work; the run
    that stops the scan included).
    """

    def __init__(self) -> None:
        self.hash_to_block: OrderedDict[int, PhysicalBlock] = OrderedDict()
        self.num_runs_visited = 0
        #: hash -> (its run, its insertion seq); empty while `_runs_valid` is False.
        self._where: dict[int, tuple[_Run, int]] = {}
        self._head: _Run | None = None
        self._tail: _Run | None = None
        #: False after an entry's time changed in place: rebuild the runs before the next scan.
        self._runs_valid = True
        self._seq = itertools.count()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self.hash_to_block

    def __len__(self) -> int:
        return len(self.hash_to_block)

    def add(self, block: PhysicalBlock) -> None:
        """Upstream: `vllm/core/evictor_v1.py:L86-87 (0.5.4)`."""
        block_hash = block.block_hash
        assert block_hash is not None, f"{block} has no hash: it is not a cached block"
        assert block_hash not in self.hash_to_block, f"hash of {block} already in the evictor"
        self.hash_to_block[block_hash] = block
        if self._runs_valid:
            self._append(block_hash, block)

    def remove(self, block_hash: int) -> PhysicalBlock:
        """Upstream: `vllm/core/evictor_v1.py:L89-95 (0.5.4)`."""
        if block_hash not in self.hash_to_block:
            raise ValueError("Attempting to remove block that's not in the evictor")
        if self._runs_valid:
            run, _ = self._where.pop(block_hash)
            self._shrink(run)
        return self.hash_to_block.pop(block_hash)

    def evict(self) -> PhysicalBlock:
        """Upstream: `vllm/core/evictor_v1.py:L67-84 (0.5.4)`."""
        if not self.hash_to_block:
            raise NoFreeBlocksError(EVICTOR_EMPTY_MSG)
        if not self._runs_valid:
            self._rebuild_runs()
        run = self._head
        assert run is not None  # entries exist, so runs do
        victim_run = run
        victim_item = self._top(run)
        victim_time = run.last_accessed
        num_visited = 1
        run = run.next
        while run is not None:
            num_visited += 1
            # The stop, tested on the run's first entry (see the module docstring).
            if victim_time < run.last_accessed:
                break
            item = self._top(run)
            if item[0] < victim_item[0]:  # strictly more hashed tokens
                victim_run, victim_item, victim_time = run, item, run.last_accessed
            run = run.next
        self.num_runs_visited += num_visited
        heapq.heappop(victim_run.heap)  # the victim is its run's (clean) top
        victim_hash = victim_item[2]
        del self._where[victim_hash]
        self._shrink(victim_run)
        victim = self.hash_to_block.pop(victim_hash)
        victim.computed = False
        return victim

    def on_last_accessed_changed(self, block: PhysicalBlock) -> None:
        """`block.last_accessed` was just written; if the block is an entry of ours with a new
        time, its run no longer holds (the runs are rebuilt before the next `evict`).

        kvsim's own (no upstream counterpart).
        """
        block_hash = block.block_hash
        if block_hash is None or not self._runs_valid:
            return
        if self.hash_to_block.get(block_hash) is not block:
            return  # not an entry (the usual case: a held block)
        run, _ = self._where[block_hash]
        if run.last_accessed != block.last_accessed:
            self._runs_valid = False
            self._where.clear()
            self._head = self._tail = None

    # ------------------------------------------------------------------ runs
    def _append(self, block_hash: int, block: PhysicalBlock) -> None:
        tail = self._tail
        if tail is None or tail.last_accessed != block.last_accessed:
            tail = _Run(block.last_accessed, tail)
            if self._tail is None:
                self._head = tail
            else:
                self._tail.next = tail
            self._tail = tail
        seq = next(self._seq)
        heapq.heappush(tail.heap, (-block.num_hashed_tokens, seq, block_hash))
        tail.num_entries += 1
        self._where[block_hash] = (tail, seq)

    def _rebuild_runs(self) -> None:
        self._where.clear()
        self._head = self._tail = None
        for block_hash, block in self.hash_to_block.items():
            self._append(block_hash, block)
        self._runs_valid = True

    def _is_live(self, item: _HeapItem) -> bool:
        where = self._where.get(item[2])
        return where is not None and where[1] == item[1]

    def _top(self, run: _Run) -> _HeapItem:
        """The run's live top, popping items of removed entries off first."""
        heap = run.heap
        while not self._is_live(heap[0]):
            heapq.heappop(heap)
        return heap[0]

    def _shrink(self, run: _Run) -> None:
        """One entry of `run` is gone (its heap item may stay, stale)."""
        run.num_entries -= 1
        if run.num_entries == 0:
            self._unlink(run)
        elif len(run.heap) > 2 * run.num_entries + 16:
            run.heap = [item for item in run.heap if self._is_live(item)]
            heapq.heapify(run.heap)

    def _unlink(self, run: _Run) -> None:
        if run.prev is None:
            self._head = run.next
        else:
            run.prev.next = run.next
        if run.next is None:
            self._tail = run.prev
        else:
            run.next.prev = run.prev
