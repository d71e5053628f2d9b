"""The CPU tier of vLLM 0.11.0's KV offloading: an LRU set of block hashes over a fixed pool.

Models `LRUOffloadingManager` (`vllm/v1/kv_offload/lru_manager.py:L13-132 @0.11.0`) over
`CPUBackend` (`vllm/v1/kv_offload/backends/cpu.py`): `num_blocks` slots of the offloaded block
size, keyed by block hash. A block's `ref_cnt` is -1 while its store runs (not ready: lookups
stop at it and it cannot be evicted), then the number of loads reading it. Eviction takes the
least recently used blocks with `ref_cnt == 0`; if too few exist the whole store is refused.

Worked example (2 slots)::

    prepare_store([a, b]) -> stores a, b (not ready)      lookup([a]) == 0
    complete_store([a, b])                                lookup([a, b, c]) == 2
    touch([a])            -> LRU order b, a
    prepare_store([c])    -> evicts b, stores c           lookup([a]) == 1, lookup([b]) == 0
    prepare_load([a]); prepare_store([d]) -> None (a is being read, c's store is running)
    complete_load([a]); prepare_store([d]) -> evicts a

KV events (vLLM 0.11.0 `lru_manager.py`, with `kv_events_config.enable_kv_cache_events`,
`cpu.py:L37-46`): when `event_sink` is set, the tier reports the blocks a `prepare_store` evicts
as one removal (L84-89) and the blocks a `complete_store` makes ready as one store (L108-127),
both with medium "CPU" (`mediums.py:L35-39`) and the offloaded block size. A block is reported
stored only once its copy is done, so the events name exactly the ready blocks (those
`lookup` can hit). In the example above: stored [a, b] at `complete_store([a, b])`, removed
[b] at `prepare_store([c])`, removed [a] at the last `prepare_store([d])`.

Invariants, checked on every change (an internal error, not user input): no more blocks than
slots; a load reads only ready blocks (every loaded block was stored).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sim.kv.types import BlockHash

#: The medium of the tier's KV events (`vllm/v1/kv_offload/mediums.py:L35-39 @0.11.0`). Defined
#: here, not in `sim.kv_events` (which re-exports it), so that the tier and the router's index
#: import no pandas.
MEDIUM_CPU = "CPU"

#: `ref_cnt` of a block whose store has not completed (`backend.py:L25-33`).
NOT_READY = -1


class TierEventSink(Protocol):
    """Receives the tier's KV events (`sim.kv_events`): the same sink as the GPU pool's."""

    def tier_stored(
        self, block_hashes: Sequence[BlockHash], medium: str, block_size: int
    ) -> None: ...

    def tier_removed(self, block_hashes: Sequence[BlockHash], medium: str) -> None: ...


@dataclass(frozen=True, slots=True)
class StorePlan:
    """`prepare_store`'s answer: the hashes to copy (not already held) and those evicted."""

    block_hashes_to_store: list[BlockHash]
    block_hashes_evicted: list[BlockHash]


@dataclass(slots=True)
class TierStats:
    num_stored_blocks: int = 0
    num_loaded_blocks: int = 0
    num_evicted_blocks: int = 0
    #: Stores refused because no block could be evicted (vLLM logs "Cannot store").
    num_refused_stores: int = 0


class LRUCpuTier:
    """CPU-memory blocks keyed by hash, evicted least recently used (see module docstring)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the CPU tier needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        #: Tokens per block (the offloaded block size), reported with stored blocks.
        self.block_size = block_size
        #: Where the KV events go; None: no one consumes or records them.
        self.event_sink: TierEventSink | None = None
        #: hash -> ref_cnt, least recently used first.
        self.blocks: OrderedDict[BlockHash, int] = OrderedDict()
        self.stats = TierStats()

    @property
    def num_free_blocks(self) -> int:
        return self.num_blocks - len(self.blocks)

    def lookup(self, block_hashes: Iterable[BlockHash]) -> int:
        """How many leading blocks are held and ready."""
        num_hits = 0
        for block_hash in block_hashes:
            ref_cnt = self.blocks.get(block_hash)
            if ref_cnt is None or ref_cnt == NOT_READY:
                break
            num_hits += 1
        return num_hits

    def touch(self, block_hashes: Iterable[BlockHash]) -> None:
        """Mark as most recently used, the first block last (so it is evicted last)."""
        blocks = self.blocks
        # The loop in C (map / filter drained by a zero-length deque): a running request
        # touches its whole prefix on every step that stores a block.
        deque(map(blocks.move_to_end, filter(blocks.__contains__, reversed(list(block_hashes)))), 0)

    def prepare_load(self, block_hashes: Iterable[BlockHash]) -> int:
        """Pin the blocks for a load; returns how many."""
        count = 0
        for block_hash in block_hashes:
            ref_cnt = self.blocks.get(block_hash)
            if ref_cnt is None or ref_cnt == NOT_READY:
                raise AssertionError(
                    f"CPU tier invariant violated: a load reads block {block_hash}, "
                    "which was never stored or whose store has not completed"
                )
            self.blocks[block_hash] = ref_cnt + 1
            count += 1
        self.stats.num_loaded_blocks += count
        return count

    def complete_load(self, block_hashes: Iterable[BlockHash]) -> None:
        for block_hash in block_hashes:
            ref_cnt = self.blocks[block_hash]
            assert ref_cnt > 0, f"complete_load of block {block_hash} with ref_cnt {ref_cnt}"
            self.blocks[block_hash] = ref_cnt - 1

    def prepare_store(self, block_hashes: Iterable[BlockHash]) -> StorePlan | None:
        """Take slots for the blocks not yet held, evicting LRU ready blocks that no load
        reads; None (nothing changed) when too few can be evicted."""
        to_store = [h for h in block_hashes if h not in self.blocks]
        num_to_evict = len(to_store) - self.num_free_blocks
        evicted: list[BlockHash] = []
        if num_to_evict > 0:
            for block_hash, ref_cnt in self.blocks.items():
                if ref_cnt == 0:
                    evicted.append(block_hash)
                    if len(evicted) == num_to_evict:
                        break
            else:
                self.stats.num_refused_stores += 1
                return None
        for block_hash in evicted:
            del self.blocks[block_hash]
        if evicted and self.event_sink is not None:  # lru_manager.py:L84-89
            self.event_sink.tier_removed(evicted, MEDIUM_CPU)
        for block_hash in to_store:
            self.blocks[block_hash] = NOT_READY
        if len(self.blocks) > self.num_blocks:
            raise AssertionError(
                f"CPU tier invariant violated: {len(self.blocks)} blocks held in "
                f"{self.num_blocks} slots"
            )
        self.stats.num_stored_blocks += len(to_store)
        self.stats.num_evicted_blocks += len(evicted)
        return StorePlan(to_store, evicted)

    def complete_store(self, block_hashes: Iterable[BlockHash]) -> None:
        """The copies are done: the blocks become ready (lookups can hit them)."""
        ready: list[BlockHash] = []
        for block_hash in block_hashes:
            if self.blocks[block_hash] == NOT_READY:
                self.blocks[block_hash] = 0
                ready.append(block_hash)
        if ready and self.event_sink is not None:  # lru_manager.py:L122-127
            self.event_sink.tier_stored(ready, MEDIUM_CPU, self.block_size)
