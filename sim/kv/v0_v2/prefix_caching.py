"""The v0 V2 prefix-caching allocator (`vllm/core/block/prefix_caching_block.py:L46-627 (0.5.4)`).

A full block's hash is ``chain_hash(parent_hash, content_key)`` (NONE_HASH for the first
block), standing in for vLLM's ``hash((is_first, prev_hash, *token_ids))`` (`L813-834`).
`_cached_blocks` maps hash -> id for every promoted block, including refcount-0 blocks in
the evictor (`L73-75`). Ids come from the hashless free deque first, then by evicting
(`L263-276`). Free count = hashless free + evictor size (`L380-385`).

Worked example (4 ids, bs=16, nothing cached):

* seq A, 32 tokens of key 7: blocks 0, 1 miss -> ids 0, 1 promoted (hashes h0, h1).
* seq B, same 32 tokens: both hit -> ids 0, 1 at refcount 2; no id consumed.
* free A and B: ids 0, 1 go to the evictor, still in `_cached_blocks`; free count stays 4.
* A later 32-token prompt of key 9 takes hashless ids 2, 3; the next miss evicts.

`promote_to_immutable_block` dedupes (`L413-450`): a mutable block that fills up with a
hash already cached releases its own id and switches to the cached one.
"""

from __future__ import annotations

from dataclasses import dataclass
from os.path import commonprefix

from sim.kv.types import (
    NONE_HASH,
    ContentKey,
    NoFreeBlocksError,
    NullBlockWriteError,
    cdiv,
    chain_hash,
)
from sim.kv.v0_v2.evictor import LRUEvictor
from sim.kv.v0_v2.naive import Block, NaiveBlockAllocator, fork_blocks

#: vLLM's "never accessed" time (prefix_caching_block.py:L19).
DEFAULT_LAST_ACCESSED_S = -1.0


@dataclass(slots=True)
class BlockTracker:
    """Per physical id: in use (`active`), last access time and whether its KV is computed."""

    active: bool = False
    last_accessed: float = DEFAULT_LAST_ACCESSED_S
    computed: bool = False


class PrefixCachingBlockAllocator:
    """One device's pool with content-hash reuse and an LRU evictor."""

    uses_content_keys = True

    def __init__(self, block_ids: list[int], block_size: int) -> None:
        self.block_size = block_size
        self._hashless = NaiveBlockAllocator(block_ids, block_size)
        self.refcounter = self._hashless.refcounter
        #: Id -> refcount, live (the hashless allocator's; see `NaiveBlockAllocator.refcounts`).
        self.refcounts = self._hashless.refcounts
        self.all_block_ids = self._hashless.all_block_ids
        self._cached_blocks: dict[int, int] = {}
        self._trackers = {i: BlockTracker() for i in block_ids}
        self.evictor = LRUEvictor()
        self._copy_on_writes: list[tuple[int, int]] = []
        self.leaked_blocks: list[Block] = []

    # -- tracking ------------------------------------------------------------------------
    def _track(self, block_id: int, computed: bool) -> None:
        tracker = self._trackers[block_id]
        assert not tracker.active
        self._trackers[block_id] = BlockTracker(True, DEFAULT_LAST_ACCESSED_S, computed)

    def _untrack(self, block_id: int) -> None:
        assert self._trackers[block_id].active
        self._trackers[block_id] = BlockTracker()

    # -- ids -----------------------------------------------------------------------------
    def _allocate_block_id(self) -> int:
        if self._hashless.num_free_blocks > 0:
            block_id = self._hashless.allocate_block_id()
            self._track(block_id, computed=False)
            return block_id
        if self.evictor.num_blocks > 0:
            block_id, evicted_hash = self.evictor.evict()
            assert self._cached_blocks.get(evicted_hash) == block_id
            del self._cached_blocks[evicted_hash]
            self.refcounter.incr(block_id)
            self._track(block_id, computed=False)
            return block_id
        raise NoFreeBlocksError()

    def _incr_refcount_cached_block(self, block: Block) -> None:
        assert block.block_id is not None
        if self.refcounter.incr(block.block_id) == 1:
            if block.block_id in self.evictor:
                self.evictor.remove(block.block_id)
            self._track(block.block_id, computed=True)

    def _decr_refcount_cached_block(self, block: Block) -> None:
        block_id = block.block_id
        assert block_id is not None and block.content_hash is not None
        if self.refcounter.decr(block_id) == 0:
            assert block.content_hash in self._cached_blocks
            self.evictor.add(
                block_id,
                block.content_hash,
                block.num_tokens_total,
                self._trackers[block_id].last_accessed,
            )
            self._untrack(block_id)
        block.block_id = None

    def _decr_refcount_hashless_block(self, block: Block) -> None:
        assert block.block_id is not None
        if self.refcounter.get(block.block_id) == 1:
            self._untrack(block.block_id)
        self._hashless.free_block_id(block)

    def free_block_id(self, block: Block) -> None:
        """Drop one reference to `block`'s id; at 0 a cached id goes to the evictor, others
        to the free pool.

        Upstream `_free_block_id`: `vllm/core/block/prefix_caching_block.py:L314-334 (0.5.4)`.
        """
        if block.content_hash is not None:
            self._decr_refcount_cached_block(block)
        else:
            self._decr_refcount_hashless_block(block)

    def free(self, block: Block) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L336-344 (0.5.4)`."""
        self.free_block_id(block)

    def free_run(self, blocks: list[Block], start: int) -> int:
        """Free ``blocks[start:]`` in order up to the first block whose id is not in this pool
        (another device's, or None); return its index, else ``len(blocks)``. Null blocks are
        skipped (see `NaiveBlockAllocator.free_run`); each other block goes through
        `free_block_id` (a cached block enters the evictor).

        kvsim's own (no upstream counterpart).
        """
        owned = self._trackers  # one entry per id of this pool
        for idx in range(start, len(blocks)):
            block = blocks[idx]
            if block.is_null:
                continue
            if block.block_id not in owned:
                return idx
            self.free_block_id(block)
        return len(blocks)

    # -- blocks --------------------------------------------------------------------------
    def _hash_of(self, prev: Block | None, key: ContentKey) -> int | None:
        if prev is None:
            return chain_hash(NONE_HASH, key)
        if prev.content_hash is None:
            return None
        return chain_hash(prev.content_hash, key)

    def allocate_mutable_block(self, prev: Block | None) -> Block:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L181-204 (0.5.4)`."""
        total = prev.num_tokens_total if prev is not None else 0
        return Block(self._allocate_block_id(), prev, num_tokens_total=total)

    def allocate_immutable_block(
        self, prev: Block | None, key: ContentKey | None, content_hash: int | None = None
    ) -> Block:
        """Reuse the cached id of this content, else allocate and promote (L132-166).

        Upstream: `vllm/core/block/prefix_caching_block.py:L132-166 (0.5.4)`.
        """
        if content_hash is None:
            assert key is not None, "a full block needs its content key"
            content_hash = self._hash_of(prev, key)
        assert content_hash is not None
        cached_id = self._cached_blocks.get(content_hash)
        if cached_id is not None:
            total = (prev.num_tokens_total if prev is not None else 0) + self.block_size
            block = Block(cached_id, prev, self.block_size, content_hash, total)
            self._incr_refcount_cached_block(block)
            return block
        block = self.allocate_mutable_block(prev)
        self.append_tokens(block, self.block_size, key, content_hash)
        return block

    def allocate_immutable_blocks(
        self, prev: Block | None, keys: list[ContentKey | None]
    ) -> list[Block]:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L168-179 (0.5.4)`."""
        blocks: list[Block] = []
        try:
            for key in keys:
                prev = self.allocate_immutable_block(prev, key)
                blocks.append(prev)
        except NoFreeBlocksError:
            self.leaked_blocks.extend(blocks)
            raise
        return blocks

    def append_tokens(
        self, block: Block, num_tokens: int, key: ContentKey | None, content_hash: int | None = None
    ) -> None:
        """Write tokens (CoW if shared); a block that fills up is promoted (L721-746).

        kvsim's own (no upstream counterpart).
        """
        if block.is_null:
            raise NullBlockWriteError("null block should not be modified")
        assert block.content_hash is None, "appending to an immutable block"
        if num_tokens == 0:
            return
        assert block.num_tokens + num_tokens <= self.block_size, "block overflow"
        block.num_tokens += num_tokens
        # Recomputed from the predecessor, not incremented: a block allocated empty behind
        # another still-empty block (two blocks ensured at once) carried the predecessor's
        # total from before it was written (`_update_num_tokens_total`, L690-702, runs on
        # every append, L740). Example, bs=1, 5 tokens, append 2: the new blocks hold totals 6
        # and 7, not 6 and 6; the evictor's tie-break reads them.
        block.num_tokens_total = (
            block.prev.num_tokens_total if block.prev is not None else 0
        ) + block.num_tokens
        if block.block_id is not None:
            block.block_id = self.cow_block_if_not_appendable(block)
        if block.num_tokens == self.block_size:
            if content_hash is None:
                assert key is not None, "a block that fills up needs its content key"
                content_hash = self._hash_of(block.prev, key)
            if content_hash is not None:
                block.content_hash = content_hash
                block.block_id = self.promote_to_immutable_block(block)

    def promote_to_immutable_block(self, block: Block) -> int:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L413-450 (0.5.4)`."""
        assert block.content_hash is not None and block.block_id is not None
        cached_id = self._cached_blocks.get(block.content_hash)
        if cached_id is None:
            self._cached_blocks[block.content_hash] = block.block_id
            return block.block_id
        # Dedupe: give back our id and share the cached one (the table's id changes).
        self._decr_refcount_hashless_block(block)
        block.block_id = cached_id
        self._incr_refcount_cached_block(block)
        return cached_id

    def cow_block_if_not_appendable(self, block: Block) -> int:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L452-475 (0.5.4)`."""
        src_id = block.block_id
        assert src_id is not None
        if self.refcounter.get(src_id) <= 1:
            return src_id
        self.free_block_id(block)
        dst_id = self._allocate_block_id()
        self._copy_on_writes.append((src_id, dst_id))
        return dst_id

    def clear_copy_on_writes(self) -> list[tuple[int, int]]:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L477-484 (0.5.4)`."""
        cows = self._copy_on_writes
        if not cows:  # fast path: almost every append copies nothing
            return []
        self._copy_on_writes = []
        return cows

    def fork(self, blocks: list[Block]) -> list[Block]:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L346-378 (0.5.4)`."""
        return fork_blocks(self.refcounter, blocks)

    # -- counts --------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """None.

        Upstream `PrefixCachingBlockAllocator.get_num_free_blocks`:
        `vllm/core/block/prefix_caching_block.py:L380-385 (0.5.4)`.
        """
        return self._hashless.num_free_blocks + self.evictor.num_blocks

    def count_free_blocks(self) -> int:
        """`num_free_blocks` as a call, as `NaiveBlockAllocator.count_free_blocks`.

        kvsim's own (no upstream counterpart).
        """
        return self._hashless.num_free_blocks + self.evictor.num_blocks

    @property
    def num_total_blocks(self) -> int:
        """None.

        Upstream `PrefixCachingBlockAllocator.get_num_total_blocks`:
        `vllm/core/block/prefix_caching_block.py:L387-388 (0.5.4)`.
        """
        return self._hashless.num_total_blocks

    @property
    def num_evictable_blocks(self) -> int:
        """Blocks with refcount 0 whose content is cached (the evictor's).

        kvsim's own (no upstream counterpart).
        """
        return self.evictor.num_blocks

    def free_block_ids(self) -> list[int]:
        """The hashless free deque, front first (for tests).

        kvsim's own (no upstream counterpart).
        """
        return self._hashless.free_block_ids()

    def is_block_cached(self, block: Block) -> bool:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L407-411 (0.5.4)`."""
        assert block.content_hash is not None
        return block.content_hash in self._cached_blocks

    def cached_block_id(self, content_hash: int) -> int | None:
        """The id cached under `content_hash` (active or in the evictor), else None.

        Read-only; vLLM has no such query. Used by kvsim's corrected design to count swaps.

        kvsim's own (no upstream counterpart).
        """
        return self._cached_blocks.get(content_hash)

    def get_num_blocks_touched(self, blocks: list[Block], num_lookahead_slots: int = 0) -> int:
        """Partial blocks as naive; a full block counts 1 unless its hash is cached here,
        active *or in the evictor* (prefix_caching_block.py:L563-594, the 0.5.4 release; #6849,
        already at 00c3d68, counts a block cached in the evictor as 1: not modelled)."""
        num_touched = 0
        for block in blocks:
            empty = self.block_size - block.num_tokens
            if empty > 0:
                num_touched += (
                    1
                    if empty >= num_lookahead_slots
                    else cdiv(num_lookahead_slots - empty, self.block_size)
                )
            elif not self.is_block_cached(block):
                num_touched += 1
        return num_touched

    # -- swap ----------------------------------------------------------------------------
    def swap_out(self, blocks: list[Block]) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L593-601 (0.5.4)`."""
        for block in blocks:
            self.free_block_id(block)

    def swap_in(self, blocks: list[Block]) -> None:
        """Full blocks go through the cache (identical content is shared again).

        Upstream: `vllm/core/block/prefix_caching_block.py:L603-627 (0.5.4)`.
        """
        for block in blocks:
            if block.num_tokens == self.block_size:
                tmp = self.allocate_immutable_block(block.prev, None, block.content_hash)
            else:
                tmp = self.allocate_mutable_block(block.prev)
                self.append_tokens(tmp, block.num_tokens, None)
            block.block_id = tmp.block_id

    # -- access / computed ---------------------------------------------------------------
    def mark_blocks_as_accessed(self, block_ids: list[int], now: float) -> None:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L486-501 (0.5.4)`."""
        for block_id in block_ids:
            if self._trackers[block_id].active:
                self._trackers[block_id].last_accessed = now
            elif block_id in self.evictor:
                self.evictor.update(block_id, now)
            else:
                raise ValueError("Mark block as accessed which is not belonged to GPU")

    def block_is_computed(self, block_id: int) -> bool:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L516-520 (0.5.4)`."""
        tracker = self._trackers[block_id]
        return tracker.computed if tracker.active else block_id in self.evictor

    def get_computed_block_ids(
        self, prev_ids: list[int], block_ids: list[int], skip_last: bool
    ) -> list[int]:
        """Extend `prev_ids` in place with computed ids (gaps are skipped, not a stop).

        Upstream: `vllm/core/block/prefix_caching_block.py:L522-540 (0.5.4)`.
        """
        cur_size = len(block_ids) - (1 if skip_last else 0)
        assert 0 <= len(prev_ids) <= cur_size
        for block_id in block_ids[len(prev_ids) : cur_size]:
            if self.block_is_computed(block_id):
                prev_ids.append(block_id)
        return prev_ids

    def get_common_computed_block_ids(self, per_seq_ids: list[list[int]]) -> list[int]:
        """Upstream: `vllm/core/block/prefix_caching_block.py:L542-561 (0.5.4)`."""
        if len(per_seq_ids) == 1:
            return per_seq_ids[0]
        common = commonprefix([ids for ids in per_seq_ids if ids])
        return list(common) if common else []

    def recover_leaked_blocks(self) -> int:
        """Give back ids popped by a failed `allocate` (the real engine has crashed there).

        kvsim's own (no upstream counterpart).
        """
        num = len(self.leaked_blocks)
        for block in reversed(self.leaked_blocks):
            self.free(block)
        self.leaked_blocks.clear()
        return num
