"""Block records, refcounts and the naive (non-caching) v0 V2 block allocator.

Models `vllm/core/block/naive_block.py` and `common.py` (RefCounter, CoW tracker) of the vLLM
0.5.4 wheel (spec section 3.1). Free ids live in a `deque`: allocation pops from the
left (`naive_block.py:L129-135`) and a block whose refcount reaches 0 is pushed back on the
left (`L137-145`), so reuse is LIFO of the most recently freed id.

Worked example (ids 0..3)::

    a = alloc.allocate_block_id()    # 0, free deque [1, 2, 3]
    b = alloc.allocate_block_id()    # 1, free deque [2, 3]
    alloc.free(Block(a)); alloc.free(Block(b))   # deque [1, 0, 2, 3]
    alloc.allocate_block_id()        # 1 again: the last freed comes back first

`allocate_immutable_blocks` pops every id it needs *before* building blocks
(`L85-106`); if the deque runs dry part-way the ids already popped keep refcount 1 and no
table owns them. We record them in `leaked_blocks` so a continuing simulation can recover
them; real vLLM never does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from sim.kv.types import ContentKey, DoubleFreeError, NoFreeBlocksError, NullBlockWriteError, cdiv


@dataclass(slots=True, eq=False)
class Block:
    """One logical block object (vLLM `NaiveBlock` / `PrefixCachingBlock`).

    Several objects may share one physical `block_id` (fork, prefix-cache hits). `prev`
    links the chain used for hashing; `content_hash` is set once the block is full and its
    chain is hashable (prefix caching only). `num_tokens_total` is the prefix length
    through this block (the LRU evictor's tie-break).
    """

    block_id: int | None
    prev: Block | None = None
    num_tokens: int = 0
    content_hash: int | None = None
    num_tokens_total: int = 0
    #: True only for the manager's null block (vLLM `NullBlock`), which must never change.
    is_null: bool = False


class RefCounter:
    """Refcount per physical id; also counts ids with a positive refcount in O(1)."""

    __slots__ = ("_refcounts", "num_positive")

    def __init__(self, refcounts: dict[int, int]) -> None:
        #: The owning allocator's dict (id -> count), shared: its bulk loops update it inline.
        self._refcounts = refcounts
        self.num_positive = sum(1 for count in refcounts.values() if count > 0)

    def incr(self, block_id: int) -> int:
        """Upstream: `vllm/core/block/common.py:L40-48 (0.5.4)`."""
        count = self._refcounts[block_id] + 1
        self._refcounts[block_id] = count
        if count == 1:
            self.num_positive += 1
        return count

    def decr(self, block_id: int) -> int:
        """Upstream: `vllm/core/block/common.py:L50-59 (0.5.4)`."""
        count = self._refcounts[block_id]
        if count <= 0:
            raise DoubleFreeError(f"block {block_id} freed with refcount 0")
        count -= 1
        self._refcounts[block_id] = count
        if count == 0:
            self.num_positive -= 1
        return count

    def incr_many(self, block_ids: list[int]) -> None:
        """`incr` each id in order, in one loop (a prompt's ids are taken in bulk).

        kvsim's own (no upstream counterpart).
        """
        refcounts = self._refcounts
        num_new_positive = 0
        for block_id in block_ids:
            count = refcounts[block_id] + 1
            refcounts[block_id] = count
            if count == 1:
                num_new_positive += 1
        self.num_positive += num_new_positive

    def get(self, block_id: int) -> int:
        """Upstream: `vllm/core/block/common.py:L61-63 (0.5.4)`."""
        return self._refcounts[block_id]

    def positive(self) -> dict[int, int]:
        """Whether `block_id`'s refcount is above 0 (kvsim's own (no upstream counterpart))."""
        return {i: c for i, c in self._refcounts.items() if c > 0}


class NaiveBlockAllocator:
    """One device's pool of ids without prefix caching (vLLM `NaiveBlockAllocator`)."""

    #: Whether the allocator needs each full block's content key (only prefix caching).
    uses_content_keys = False

    def __init__(self, block_ids: list[int], block_size: int) -> None:
        self.block_size = block_size
        self.all_block_ids = tuple(sorted(block_ids))
        self._free_block_ids: deque[int] = deque(block_ids)
        #: Id -> refcount, read and updated inline by the hot loops below and counted by
        #: `refcounter` (the same dict for the allocator's whole life).
        self._refcounts = dict.fromkeys(block_ids, 0)
        self.refcounter = RefCounter(self._refcounts)
        self._copy_on_writes: list[tuple[int, int]] = []
        self.leaked_blocks: list[Block] = []

    @property
    def refcounts(self) -> Mapping[int, int]:
        """Id -> refcount, live: block tables read refcounts here without a call per block.

        kvsim's own (no upstream counterpart).
        """
        return self._refcounts

    # -- ids ---------------------------------------------------------------------------
    def allocate_block_id(self) -> int:
        """Pop the next free id (NoFreeBlocksError when none is left).

        Upstream `_allocate_block_id`: `vllm/core/block/naive_block.py:L129-135 (0.5.4)`.
        """
        if not self._free_block_ids:
            raise NoFreeBlocksError()
        block_id = self._free_block_ids.popleft()
        self.refcounter.incr(block_id)
        return block_id

    def free_block_id(self, block: Block) -> None:
        """Drop one reference to `block`'s id; at 0 the id goes back to the free deque.

        Upstream `_free_block_id`: `vllm/core/block/naive_block.py:L137-145 (0.5.4)`.
        """
        assert block.block_id is not None, "freeing a block without an id"
        if self.refcounter.decr(block.block_id) == 0:
            self._free_block_ids.appendleft(block.block_id)
        if block.is_null:
            # vLLM's NullBlock refuses `block_id = None` only *after* the id went back to
            # the free list (naive_block.py:L137-145, cpu_gpu_block_allocator.py:L359-361).
            raise NullBlockWriteError("null block should not be modified")
        block.block_id = None

    # -- blocks ------------------------------------------------------------------------
    def allocate_mutable_block(self, prev: Block | None) -> Block:
        """Upstream: `vllm/core/block/naive_block.py:L108-127 (0.5.4)`."""
        total = prev.num_tokens_total if prev is not None else 0
        return Block(self.allocate_block_id(), prev, num_tokens_total=total)

    def allocate_immutable_block(
        self, prev: Block | None, key: ContentKey | None, content_hash: int | None = None
    ) -> Block:
        """Upstream: `vllm/core/block/naive_block.py:L64-83 (0.5.4)`."""
        block = self.allocate_mutable_block(prev)
        self.append_tokens(block, self.block_size, key)
        return block

    def allocate_immutable_blocks(
        self, prev: Block | None, keys: list[ContentKey | None]
    ) -> list[Block]:
        """Pop every id first, then build the blocks (`vllm/core/block/naive_block.py:L85-106 (0.5.4)`).

        Same effect as `allocate_block_id` once per key, in bulk: a prompt takes hundreds of
        blocks. If the deque holds fewer ids than keys, vLLM pops them all and then raises.
        """
        free_ids = self._free_block_ids
        popleft = free_ids.popleft
        block_ids = [popleft() for _ in range(min(len(keys), len(free_ids)))]
        self.refcounter.incr_many(block_ids)
        if len(block_ids) < len(keys):
            # The real code drops these ids on the floor: refcount 1, owned by no table.
            self.leaked_blocks.extend(Block(i) for i in block_ids)
            raise NoFreeBlocksError()
        bs = self.block_size
        total = prev.num_tokens_total if prev is not None else 0
        blocks: list[Block] = []
        append = blocks.append
        for block_id in block_ids:
            total += bs
            prev = Block(block_id, prev, bs, None, total)
            append(prev)
        return blocks

    def append_tokens(self, block: Block, num_tokens: int, key: ContentKey | None) -> None:
        """Write `num_tokens` into `block`, copying it first if it is shared.

        Even an empty append runs the CoW check (naive_block.py:L384-396).
        """
        if block.is_null:
            raise NullBlockWriteError("null block should not be modified")
        assert block.num_tokens + num_tokens <= self.block_size, "block overflow"
        block.num_tokens += num_tokens
        block.num_tokens_total += num_tokens
        block_id = block.block_id
        # `cow_block_if_not_appendable` keeps the id of an unshared block: only ask it (the
        # rare case) when the block is shared.
        if block_id is not None and self._refcounts[block_id] > 1:
            block.block_id = self.cow_block_if_not_appendable(block)

    def cow_block_if_not_appendable(self, block: Block) -> int:
        """Upstream: `vllm/core/block/naive_block.py:L215-238 (0.5.4)`."""
        src_id = block.block_id
        assert src_id is not None
        if self.refcounter.get(src_id) <= 1:
            return src_id
        self.free_block_id(block)
        dst_id = self.allocate_block_id()
        self._copy_on_writes.append((src_id, dst_id))
        return dst_id

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Upstream: `vllm/core/block/naive_block.py:L240-247 (0.5.4)`."""
        cows = self._copy_on_writes
        if not cows:  # fast path: almost every append copies nothing
            return []
        self._copy_on_writes = []
        return cows

    def allocate_decode_block(self, prev: Block) -> Block:
        """`allocate_mutable_block(prev)` and `append_tokens(block, 1)`: a decode's token
        crossing into a new block (the commonest allocation of a replay without caching).

        fast path: the id is popped and counted here (`allocate_block_id`), not through the
        refcounter's frames. The new block is unshared (refcount 1), so no copy on write,
        unless the pool was corrupt (a free id still referenced): then it is copied, as
        `append_tokens` would. Example (bs=16): prev holds 16 of 32 tokens total -> a block
        with 1 token, 33 total.

        kvsim's own (no upstream counterpart).
        """
        free_ids = self._free_block_ids
        if not free_ids:
            raise NoFreeBlocksError()
        block_id = free_ids.popleft()
        refcounts = self._refcounts
        count = refcounts[block_id] + 1
        refcounts[block_id] = count
        if count == 1:
            self.refcounter.num_positive += 1
        block = Block(block_id, prev, 1, None, prev.num_tokens_total + 1)
        if count > 1:
            block.block_id = self.cow_block_if_not_appendable(block)
        return block

    def free(self, block: Block) -> None:
        """Upstream: `vllm/core/block/naive_block.py:L147-153 (0.5.4)`."""
        self.free_block_id(block)

    def free_run(self, blocks: list[Block], start: int) -> int:
        """Free ``blocks[start:]`` in order, up to the first block whose id is not in this
        pool (another device's, or None); return that block's index, else ``len(blocks)``.

        Null blocks are skipped, as `CpuGpuBlockAllocator.free` skips them; each other block
        goes through `free_block_id`. Example: GPU ids 0..9, blocks with ids [null, 3, 4, 12]
        and start 0: frees 3 and 4, returns 3 (12 is a CPU id).

        kvsim's own (no upstream counterpart).
        """
        refcounts = self._refcounts
        for idx in range(start, len(blocks)):
            block = blocks[idx]
            if block.is_null:
                continue
            if block.block_id not in refcounts:
                return idx
            self.free_block_id(block)
        return len(blocks)

    def fork(self, blocks: list[Block]) -> list[Block]:
        """New block objects sharing every id of `blocks` (refcount +1 each).

        Upstream: `vllm/core/block/naive_block.py:L155-186 (0.5.4)`.
        """
        return fork_blocks(self.refcounter, blocks)

    # -- counts ------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """None.

        Upstream `NaiveBlockAllocator.get_num_free_blocks`: `vllm/core/block/naive_block.py:L188-189
        (0.5.4)`.
        """
        return len(self._free_block_ids)

    def count_free_blocks(self) -> int:
        """`num_free_blocks` as a call (the managers read it several times per engine step).

        kvsim's own (no upstream counterpart).
        """
        return len(self._free_block_ids)

    @property
    def num_total_blocks(self) -> int:
        """None.

        Upstream `NaiveBlockAllocator.get_num_total_blocks`:
        `vllm/core/block/naive_block.py:L191-192 (0.5.4)`.
        """
        return len(self.all_block_ids)

    #: Never any without caching; a constant, not a property: `pool_stats` reads it per step.
    num_evictable_blocks = 0

    def free_block_ids(self) -> list[int]:
        """The free deque, front first (for tests). kvsim's own (no upstream counterpart)."""
        return list(self._free_block_ids)

    def get_num_blocks_touched(self, blocks: list[Block], num_lookahead_slots: int = 0) -> int:
        """Distinct ids, except partial blocks when lookahead is asked (naive_block.py:L285-318)."""
        distinct_ids: set[int | None] = set()
        num_new = 0
        for block in blocks:
            empty = self.block_size - block.num_tokens
            if empty > 0 and num_lookahead_slots != 0:
                num_new += (
                    1
                    if empty >= num_lookahead_slots
                    else cdiv(num_lookahead_slots - empty, self.block_size)
                )
            else:
                distinct_ids.add(block.block_id)
        return num_new + len(distinct_ids)

    # -- swap ----------------------------------------------------------------------------
    def swap_out(self, blocks: list[Block]) -> None:
        """Upstream: `vllm/core/block/naive_block.py:L321-323 (0.5.4)`."""
        for block in blocks:
            self.free_block_id(block)

    def swap_in(self, blocks: list[Block]) -> None:
        """Give every block object a fresh id here: sharing between objects is lost.

        Upstream: `vllm/core/block/naive_block.py:L325-343 (0.5.4)`.
        """
        for block in blocks:
            block.block_id = self.allocate_block_id()

    # -- leaks ---------------------------------------------------------------------------
    def recover_leaked_blocks(self) -> int:
        """Free leaked blocks newest first, which restores the deque's pre-failure order.

        kvsim's own (no upstream counterpart).
        """
        num = len(self.leaked_blocks)
        for block in reversed(self.leaked_blocks):
            self.free(block)
        self.leaked_blocks.clear()
        return num

    # -- prefix-caching hooks (no-ops without caching) ----------------------------------
    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """Upstream: `vllm/core/block/naive_block.py:L249-256 (0.5.4)`."""
        return None

    def get_computed_block_ids(
        self, prev_ids: list[int], block_ids: list[int], skip_last: bool
    ) -> list[int]:
        """Upstream: `vllm/core/block/naive_block.py:L266-271 (0.5.4)`."""
        return []

    def get_common_computed_block_ids(self, per_seq_ids: list[list[int]]) -> list[int]:
        """Upstream: `vllm/core/block/naive_block.py:L273-280 (0.5.4)`."""
        return []


def fork_blocks(refcounter: RefCounter, blocks: list[Block]) -> list[Block]:
    """A chain of new block objects sharing every id of `blocks`, each id's refcount +1
    (both allocators' `fork`, `vllm/core/block/naive_block.py:L155-186`, `prefix_caching_block.py:L346-378 (0.5.4)`).

    kvsim's own (no upstream counterpart).
    """
    forked: list[Block] = []
    prev = None
    for block in blocks:
        assert block.block_id is not None
        # The increment outside the assert: `python -O` drops asserts, never the fork's count.
        refcount = refcounter.incr(block.block_id)
        assert refcount != 1, "can't fork a freed block"
        prev = Block(
            block.block_id, prev, block.num_tokens, block.content_hash, block.num_tokens_total
        )
        forked.append(prev)
    return forked
