"""Block allocators of vLLM v0 `BlockSpaceManagerV1` (its LRU evictor: `v0_v1_evictor`).

Models `vllm/core/block_manager_v1.py:L21-210 (0.5.4)` (our own code, same behaviour).

* `UncachedBlockAllocator`: blocks 0..N-1 exist from the start in a Python list used as a
  stack. `allocate` pops from the end, so a fresh pool hands out N-1, N-2, ... and a freed
  block is the next one reused (LIFO). Example, N=10: allocate -> 9, allocate -> 8,
  free(9), allocate -> 9.
* `CachedBlockAllocator` (prefix caching): blocks are created lazily, numbered in creation
  order 0, 1, ...; every live block is keyed by a hash (content hash, or a per-allocator
  counter for blocks that have none yet). A block whose refcount drops to 0 goes to the
  `LRUEvictor` still keyed by its hash, so a later request with the same hash revives it.
  Free blocks = never-created blocks + evictor entries.

Every refcount change goes through the allocator so it can keep `num_held_blocks` (blocks with
refcount > 0) as an O(1) counter independent of the free list; `PoolStats` conservation is
then a real check, not a tautology.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from sim.kv.types import DoubleFreeError, NoFreeBlocksError
from sim.kv.v0_v1.evictor import LRUEvictor

#: vLLM `vllm/block.py:L6 (0.5.4)`: a block never accessed has last_accessed == -1.
DEFAULT_LAST_ACCESSED_S = -1.0

OUT_OF_BLOCKS_MSG = "Out of memory! No free blocks are available."


class Device(enum.Enum):
    GPU = "gpu"
    CPU = "cpu"


@dataclass(slots=True, eq=False)
class PhysicalBlock:
    """One KV block (vLLM `PhysicalTokenBlock`). Identity-hashed, like the original, so a
    swap mapping keyed by block objects preserves sharing."""

    device: Device
    block_id: int
    #: The content hash of a cached block; None for a block of the uncached allocator
    #: (vLLM stores -1 there).
    block_hash: int | None
    num_hashed_tokens: int
    ref_count: int = 0
    last_accessed: float = DEFAULT_LAST_ACCESSED_S
    #: The tick of the access that wrote `last_accessed` (kvsim's, `sim.kv.v0_v1.access`).
    access_tick: int = 0
    computed: bool = False
    #: ``(device value, block number)`` as vLLM's ``utils.Device`` numbers them (GPU = 1,
    #: CPU = 2): the key that orders a freed table like upstream's ``set`` of blocks (see
    #: `v0_v1_hashing.set_order`). Device and number never change, so it is built once, here.
    set_key: tuple[int, int] = field(init=False)

    def __post_init__(self) -> None:
        self.set_key = (1 if self.device is Device.GPU else 2, self.block_id)

    def __repr__(self) -> str:
        return (
            f"PhysicalBlock({self.device.value}:{self.block_id}, ref_count={self.ref_count}, "
            f"num_hashed_tokens={self.num_hashed_tokens}, computed={self.computed})"
        )


#: A sequence's block table: its physical blocks in token order (a ring repeats them).
BlockTable = list[PhysicalBlock]


class _RefCounting:
    """Refcount bookkeeping shared by both allocators; keeps `num_held_blocks` in O(1)."""

    device: Device
    num_blocks: int
    num_held_blocks: int

    def _check_owned(self, block: PhysicalBlock) -> None:
        assert block.device is self.device, (
            f"{block} freed/referenced on the {self.device.value} allocator"
        )

    def incref(self, block: PhysicalBlock) -> None:
        """One more owner of a block (fork, swap mapping hit).

        vLLM increments without looking (`block.ref_count += 1`, `vllm/core/block_manager_v1.py:L484-485
        (0.5.4)`). A table can still name a block that went back to the free list or the
        evictor through another v0 bug (a multi-sequence allocate with caching gives shared
        blocks one reference); forking it revives the count while the block stays free, which
        the auditor then reports as a conservation breach, as in the real code.
        """
        self._check_owned(block)
        if block.ref_count == 0:
            self.num_held_blocks += 1
        block.ref_count += 1

    def set_ref(self, block: PhysicalBlock, ref_count: int) -> None:
        """vLLM assigns `ref_count` directly in `_allocate_sequence` (not an increment)."""
        self._check_owned(block)
        assert ref_count > 0 and block.ref_count > 0, f"set_ref({ref_count}) on {block}"
        block.ref_count = ref_count

    def _take(self, block: PhysicalBlock, *, increment: bool = False) -> None:
        """A block leaves the free list / evictor: refcount set to 1, or +1 (`increment`).

        Normally the count was 0. A fork of a block that is already free (see `incref`)
        leaves a positive count on a free block; upstream then assigns 1 (uncached
        `allocate`, `vllm/core/block_manager_v1.py:L187-188 (0.5.4)`) or increments (a cached block
        taken by creation or eviction, L116-120), without checking, and so do we. Such a
        block was counted held by `incref` already.
        """
        if block.ref_count == 0:
            self.num_held_blocks += 1
        block.ref_count = block.ref_count + 1 if increment else 1

    def _released(self, blocks: Iterable[PhysicalBlock]) -> Iterator[PhysicalBlock]:
        """`_drop` for each block in order, yielding those that became free (the bulk free
        of a finished table). Raises where `_drop` would, after the earlier ones."""
        device = self.device
        for block in blocks:
            if block.device is not device:
                self._check_owned(block)  # the usual AssertionError
            ref_count = block.ref_count
            if ref_count == 0:
                raise DoubleFreeError(f"Double free! {block} is already freed.")
            block.ref_count = ref_count - 1
            if ref_count == 1:
                self.num_held_blocks -= 1
                yield block

    def _drop(self, block: PhysicalBlock) -> bool:
        """Decrement; True when the block became free. Raises on a double free."""
        self._check_owned(block)
        if block.ref_count == 0:
            raise DoubleFreeError(f"Double free! {block} is already freed.")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.num_held_blocks -= 1
            return True
        return False


class UncachedBlockAllocator(_RefCounting):
    """LIFO free list over blocks 0..num_blocks-1 (vLLM `block_manager_v1.py:L154-210`).

    Running dry raises `NoFreeBlocksError`, a ValueError subclass; the real code raises a
    plain `ValueError` with the same message.
    """

    def __init__(self, device: Device, num_blocks: int) -> None:
        self.device = device
        self.num_blocks = num_blocks
        self.num_held_blocks = 0
        self._all_blocks = [PhysicalBlock(device, i, None, 0) for i in range(num_blocks)]
        # A stack: allocate pops the end, free pushes it back (LIFO reuse).
        self._free_blocks = list(self._all_blocks)

    #: Nothing is evictable without prefix caching (a constant, read by every `pool_stats`).
    num_evictable_blocks = 0

    def allocate(self, block_hash: int | None = None, num_hashed_tokens: int = 0) -> PhysicalBlock:
        """Hash arguments are accepted and ignored, as upstream (swap passes them).

        Upstream: `vllm/core/block_manager_v1.py:L182-189 (0.5.4)`.
        """
        free_blocks = self._free_blocks
        if not free_blocks:
            raise NoFreeBlocksError(OUT_OF_BLOCKS_MSG)
        block = free_blocks.pop()
        self._take(block)
        return block

    def allocate_n(self, num_blocks: int, ref_count: int) -> list[PhysicalBlock]:
        """`num_blocks` calls of `allocate()`, each followed by `set_ref(block, ref_count)`,
        in one pass (a prompt's table); stops early, without raising, when the list runs dry.

        Same blocks, order (LIFO pops) and counts as the calls; the caller raises
        `NoFreeBlocksError` when it gets fewer blocks than it asked for.

        kvsim's own (no upstream counterpart).
        """
        assert ref_count > 0, f"allocate_n with ref_count {ref_count}"
        free_blocks = self._free_blocks
        num_taken = min(num_blocks, len(free_blocks))
        if num_taken <= 0:
            return []
        blocks = free_blocks[-num_taken:]
        del free_blocks[-num_taken:]
        blocks.reverse()  # pop() order: the top of the stack first
        num_newly_held = 0
        for block in blocks:
            # `_take` then `set_ref`: a block already counted held (see `_take`) is not again.
            if block.ref_count == 0:
                num_newly_held += 1
            block.ref_count = ref_count
        self.num_held_blocks += num_newly_held
        return blocks

    def free(self, block: PhysicalBlock) -> None:
        """Upstream: `vllm/core/block_manager_v1.py:L191-196 (0.5.4)`."""
        if self._drop(block):
            self._free_blocks.append(block)

    def free_n(self, blocks: Iterable[PhysicalBlock]) -> None:
        """`free(block)` for each block in order (a finished table): same checks, same
        DoubleFreeError at the same block, with every earlier free done.

        kvsim's own (no upstream counterpart).
        """
        self._free_blocks.extend(self._released(blocks))

    @property
    def num_free_blocks(self) -> int:
        """Upstream `get_num_free_blocks`: `vllm/core/block_manager_v1.py:L198-199 (0.5.4)`."""
        return len(self._free_blocks)

    def count_free_blocks(self) -> int:
        """`num_free_blocks` as a plain call (read several times per engine step).

        kvsim's own (no upstream counterpart).
        """
        return len(self._free_blocks)

    def blocks(self) -> Iterator[PhysicalBlock]:
        """Every block object of the pool, by block number.

        kvsim's own (no upstream counterpart).
        """
        return iter(self._all_blocks)

    def free_block_ids(self) -> list[int]:
        """Free list bottom to top: the last id is the next one `allocate` returns.

        kvsim's own (no upstream counterpart).
        """
        return [b.block_id for b in self._free_blocks]


class CachedBlockAllocator(_RefCounting):
    """Hash-keyed allocator with lazy block creation and LRU eviction
    (vLLM `block_manager_v1.py:L64-151`).

    `allocate(h)`: revive `h` from the evictor (ref 0 -> 1); else share the live block keyed
    `h` (ref += 1); else create block `current_num_blocks` or, when all exist, evict one and
    re-key it to `h`. `allocate()` without a hash uses the next value of this allocator's own
    counter 0, 1, 2, ... (upstream does the same, so a counter value could in principle equal a
    content hash; with 64-bit hashes we accept that, as upstream does).

    Eviction with an empty evictor raises `NoFreeBlocksError("No usable cache memory left")`;
    upstream raises a plain ValueError with that message from the evictor.
    """

    def __init__(self, device: Device, num_blocks: int) -> None:
        self.device = device
        self.num_blocks = num_blocks
        self.num_held_blocks = 0
        self._created: list[PhysicalBlock] = []
        self.hash_to_block: dict[int, PhysicalBlock] = {}  # live blocks (vLLM `cached_blocks`)
        self.evictor = LRUEvictor()
        self._unhashed_counter = itertools.count()

    def _new_or_evicted_block(self, block_hash: int, num_hashed_tokens: int) -> PhysicalBlock:
        if len(self._created) == self.num_blocks:
            block = self.evictor.evict()
            block.block_hash = block_hash
            block.num_hashed_tokens = num_hashed_tokens
            return block
        block = PhysicalBlock(self.device, len(self._created), block_hash, num_hashed_tokens)
        self._created.append(block)
        return block

    def allocate(self, block_hash: int | None = None, num_hashed_tokens: int = 0) -> PhysicalBlock:
        """Upstream: `vllm/core/block_manager_v1.py:L103-122 (0.5.4)`."""
        if block_hash is None:
            block_hash = next(self._unhashed_counter)
        if block_hash in self.evictor:
            assert block_hash not in self.hash_to_block
            block = self.evictor.remove(block_hash)
            assert block.ref_count == 0, f"{block} revived from the evictor"  # as upstream
            self.hash_to_block[block_hash] = block
            self._take(block)
            return block
        cached = self.hash_to_block.get(block_hash)
        if cached is not None:
            cached.ref_count += 1
            assert cached.block_hash == block_hash
            return cached
        block = self._new_or_evicted_block(block_hash, num_hashed_tokens)
        self.hash_to_block[block_hash] = block
        self._take(block, increment=True)
        return block

    def free(self, block: PhysicalBlock) -> None:
        """Upstream: `vllm/core/block_manager_v1.py:L124-133 (0.5.4)`."""
        if self._drop(block):
            self.evictor.add(block)
            assert block.block_hash is not None  # a cached allocator's block
            del self.hash_to_block[block.block_hash]

    def free_n(self, blocks: Iterable[PhysicalBlock]) -> None:
        """`free(block)` for each block in order (a finished table): same checks, same
        DoubleFreeError at the same block, with every earlier free done.

        kvsim's own (no upstream counterpart).
        """
        evictor = self.evictor
        hash_to_block = self.hash_to_block
        for block in self._released(blocks):
            evictor.add(block)
            assert block.block_hash is not None  # a cached allocator's block
            del hash_to_block[block.block_hash]

    def contains_block(self, block_hash: int) -> bool:
        """Upstream: `vllm/core/block_manager_v1.py:L142-143 (0.5.4)`."""
        return block_hash in self.hash_to_block or block_hash in self.evictor

    def update_hash(self, block_hash: int, block: PhysicalBlock) -> None:
        """Re-key a live block (promotion of a block that just became full).

        Upstream: `vllm/core/block_manager_v1.py:L145-151 (0.5.4)`.
        """
        assert not self.contains_block(block_hash), f"hash {block_hash} already cached"
        assert block.block_hash is not None  # a cached allocator's block
        del self.hash_to_block[block.block_hash]
        block.block_hash = block_hash
        self.hash_to_block[block_hash] = block

    @property
    def num_free_blocks(self) -> int:
        """Upstream `get_num_free_blocks`: `vllm/core/block_manager_v1.py:L135-137 (0.5.4)`."""
        return self.num_blocks - len(self._created) + len(self.evictor)

    def count_free_blocks(self) -> int:
        """`num_free_blocks` as a plain call, as `UncachedBlockAllocator.count_free_blocks`.

        kvsim's own (no upstream counterpart).
        """
        return self.num_blocks - len(self._created) + len(self.evictor)

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks with refcount 0 that the evictor holds (kvsim's own (no upstream counterpart))."""
        return len(self.evictor)

    def blocks(self) -> Iterator[PhysicalBlock]:
        """Every block object handed out so far, by block number.

        kvsim's own (no upstream counterpart).
        """
        return iter(self._created)


BlockAllocator = UncachedBlockAllocator | CachedBlockAllocator
