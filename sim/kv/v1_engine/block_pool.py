"""The V1 engine's block pool: blocks, the LRU free queue, and the prefix-cache index.

Models `BlockPool` (`vllm/v1/core/block_pool.py @4ac7713`, spec §6.1):

* Block 0 is the **null block**. It is popped from the free queue at init and is never freed,
  counted free or cached (`L63-67`). Sliding-window tables use it as a placeholder for blocks
  that fell out of the window. Upstream does not maintain its refcount (`touch` raises it,
  `free_blocks` lowers it, neither matters); we pin it at 1 so it reads as held.
* The free queue holds every block with refcount 0, including *evictable* cached blocks that
  still carry a hash. `get_new_blocks` pops from the head and evicts such a block's hash
  (`L202-263`); `touch` pulls a cache hit out of the middle (`L265-279`); `free_blocks`
  appends blocks that reach refcount 0 to the tail in the order given (`L281-296`).
* `cached_block_hash_to_block[hash] -> {block_id: block}` allows duplicates: two blocks with the
  same content both stay cached and a lookup returns the first inserted (`L51-61, L71-92`).
  Upstream keys by (hash, group id); kvsim keys group 0 by the hash alone and other groups of
  a hybrid model by `coordinator.group_block_hash`.

Worked example (5 blocks, caching on)::

    pool = BlockPool(5, enable_caching=True)   # free queue [1, 2, 3, 4]; block 0 is null
    a = pool.get_new_blocks(2)                 # blocks 1, 2; free [3, 4]
    pool.cache_full_blocks(a, [h1, h2], 0, 2)  # both full: cached, still held
    pool.free_blocks(reversed(a))              # free [3, 4, 2, 1]; 2 evictable
    pool.touch([pool.get_cached_block(h1)])    # hit on block 1: free [3, 4, 2]
    pool.get_new_blocks(3)                     # 3, 4, 2; block 2's hash h2 is evicted
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from sim.kv.types import BlockHash, NoFreeBlocksError
from sim.kv.v1_engine.free_order import AppendInFreeOrder, FreeOrder
from sim.kv.v1_engine.free_queue import FreeBlockQueue, FreeQueue, UncachedFreeBlockQueue

NULL_BLOCK_ID = 0


class KVEventSink(Protocol):
    """Receives the pool's KV cache events (`sim.kv_events`)."""

    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None: ...

    def removed(self, block_hash: BlockHash) -> None: ...


@dataclass(slots=True, eq=False)
class KVCacheBlock:
    """One GPU block's metadata (upstream `KVCacheBlock`, `kv_cache_utils.py:L137-190`)."""

    block_id: int
    ref_cnt: int = 0
    #: Set when the block becomes full and is cached; cleared when it is evicted.
    block_hash: BlockHash | None = None
    is_null: bool = False


class BlockPool:
    """Blocks 0..num_gpu_blocks-1, the free queue, and the prefix-cache index."""

    def __init__(
        self, num_gpu_blocks: int, enable_caching: bool, free_order: FreeOrder | None = None
    ) -> None:
        if num_gpu_blocks < 1:
            raise ValueError(
                f"num_gpu_blocks must be >= 1 (block 0 is the null block), got {num_gpu_blocks}"
            )
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        #: Where freed blocks re-enter the queue: the release's rule (`free_order.py`).
        self.free_order = free_order if free_order is not None else AppendInFreeOrder()
        #: Blocks 0..len-1, built as the free queue first hands an id out (`block`), not all
        #: up front: an H200's pool is ~5*10^4 blocks, each a GC-tracked object, and a pool
        #: dies with its engine only at a full collection (the engine's objects refer to each
        #: other), which then walked every one of them: more than a short run took. Built: up
        #: to the highest id the queue has handed out (its never-used ids leave in id order).
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(NULL_BLOCK_ID)]
        #: Without caching no block leaves the middle of the queue: a deque of ids does.
        self.free_block_queue: FreeQueue = (
            FreeBlockQueue(range(num_gpu_blocks))
            if enable_caching
            else UncachedFreeBlockQueue(range(num_gpu_blocks))
        )
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        (null_id,) = self.free_block_queue.popleft_n(1)
        assert null_id == NULL_BLOCK_ID
        self.null_block = self.blocks[null_id]
        self.null_block.is_null = True
        self.null_block.ref_cnt = 1
        # Running counts so pool_stats is O(1) and independent of the free-queue length. Plain
        # attributes (read by the manager several times per step); only the pool writes them.
        #: Distinct blocks with a positive refcount, the null block included.
        self.num_held_blocks = 1
        #: Free blocks that still carry a hash (cached, evicted when popped).
        self.num_evictable_blocks = 0
        #: The most blocks ever held at once, the null block included.
        self.peak_num_held_blocks = 1
        #: Blocks taken out of the queue for good, the null block included (and a sink
        #: group's sink blocks, `reserve_blocks`): held, but in no request's table.
        self.num_reserved_blocks = 1
        #: Where KV cache events go (`sim.kv_events.KVEventStream`); None: none are emitted.
        self.event_sink: KVEventSink | None = None

    def block(self, block_id: int) -> KVCacheBlock:
        """Block `block_id` (0 <= id < num_gpu_blocks), built if no one has had it yet.

        kvsim's own (upstream builds every `KVCacheBlock` in `BlockPool.__init__`).
        """
        if block_id >= len(self.blocks):
            if block_id >= self.num_gpu_blocks:
                raise IndexError(f"block {block_id} outside 0..{self.num_gpu_blocks - 1}")
            self._build_blocks_to(block_id)
        return self.blocks[block_id]

    def _build_blocks_to(self, block_id: int) -> None:
        """Build the blocks up to `block_id`: fresh (refcount 0, no hash), as upstream's start."""
        blocks = self.blocks
        blocks.extend(map(KVCacheBlock, range(len(blocks), block_id + 1)))

    # ----------------------------------------------------------------------------- queries
    def get_num_free_blocks(self) -> int:
        """Upstream: `vllm/v1/core/block_pool.py:L385-391 (0.11.0)`."""
        return len(self.free_block_queue)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """The first cached block with `block_hash`, or None (a cache miss).

        Upstream: `vllm/v1/core/block_pool.py:L163-186 (0.11.0)`.
        """
        blocks_by_id = self.cached_block_hash_to_block.get(block_hash)
        if not blocks_by_id:
            return None
        return next(iter(blocks_by_id.values()))

    # ----------------------------------------------------------------------------- commands
    def reserve_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take `num_blocks` blocks from the head of the free queue for good, as the null
        block is taken: held (refcount 1, never freed), in no request's table. A sink group's
        sink blocks (`full_variants.SinkFullAttentionManager`). Example: a fresh 10-block
        pool reserving 2 -> blocks 1 and 2, 7 free.

        Upstream: `free_block_queue.popleft_n(num_sink_block)` in the sink manager's
        constructor, `vllm/v1/core/single_type_kv_cache_manager.py:L1109-1112 (0.19.1)`
        (upstream leaves their refcount 0; nothing reads it).
        """
        if num_blocks > len(self.free_block_queue):
            raise ValueError(
                f"cannot reserve {num_blocks} blocks: only {len(self.free_block_queue)} free"
            )
        block_ids = self.free_block_queue.popleft_n(num_blocks)
        reserved = [self.block(block_id) for block_id in block_ids]
        for block in reserved:
            block.ref_cnt = 1
        self.num_held_blocks += num_blocks
        self.num_reserved_blocks += num_blocks
        if self.num_held_blocks > self.peak_num_held_blocks:
            self.peak_num_held_blocks = self.num_held_blocks
        return reserved

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` blocks from the head of the free queue, evicting their hashes.

        Upstream: `vllm/v1/core/block_pool.py:L257-284 (0.11.0)`.
        """
        new_blocks: list[KVCacheBlock] = []
        self.get_new_blocks_into(num_blocks, new_blocks)
        return new_blocks

    def get_new_blocks_into(self, num_blocks: int, table: list[KVCacheBlock]) -> list[int]:
        """`table.extend(get_new_blocks(num_blocks))`, returning the new blocks' ids.

        The manager's allocation path: `allocate_slots` answers with the ids, which the queue
        hands out anyway, so no second pass over the blocks is needed to collect them.

        kvsim's own (no upstream counterpart).
        """
        queue = self.free_block_queue
        if num_blocks > len(queue):
            # vLLM's ValueError; as `NoFreeBlocksError` (a ValueError) the auditor records
            # it as the count that promised the blocks being short (vllm #45856 at 0.20.0).
            raise NoFreeBlocksError(f"Cannot get {num_blocks} free blocks from the pool")
        if num_blocks == 1:
            # A decode crossing into a new block (most calls): the loop below for one block,
            # without `popleft_n`'s frame or a list built and thrown away.
            block_id = queue.popleft()
            if block_id >= len(self.blocks):
                self._build_blocks_to(block_id)
            block = self.blocks[block_id]
            assert block.ref_cnt == 0, f"free block {block_id} has ref_cnt {block.ref_cnt}"
            if block.block_hash is not None:
                self.num_evictable_blocks -= 1
                self._evict_cached_block(block)
            block.ref_cnt = 1
            self.num_held_blocks += 1
            if self.num_held_blocks > self.peak_num_held_blocks:
                self.peak_num_held_blocks = self.num_held_blocks
            table.append(block)
            return [block_id]
        block_ids = queue.popleft_n(num_blocks)
        blocks = self.blocks
        if block_ids and max(block_ids) >= len(blocks):
            self._build_blocks_to(max(block_ids))
        new_blocks = [blocks[i] for i in block_ids]
        for block in new_blocks:
            assert block.ref_cnt == 0, f"free block {block.block_id} has ref_cnt {block.ref_cnt}"
            if block.block_hash is not None:
                self.num_evictable_blocks -= 1
                self._evict_cached_block(block)
            block.ref_cnt = 1
        self.num_held_blocks += len(new_blocks)
        if self.num_held_blocks > self.peak_num_held_blocks:
            self.peak_num_held_blocks = self.num_held_blocks
        table.extend(new_blocks)
        return block_ids

    def _evict_cached_block(self, block: KVCacheBlock) -> None:
        assert block.block_hash is not None
        blocks_by_id = self.cached_block_hash_to_block[block.block_hash]
        del blocks_by_id[block.block_id]
        if not blocks_by_id:
            del self.cached_block_hash_to_block[block.block_hash]
        if self.event_sink is not None:  # vLLM 0.11.0 block_pool.py:L310-319
            self.event_sink.removed(block.block_hash)
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take a reference on prefix-cache hits; an evictable hit leaves the free queue.

        Upstream: `vllm/v1/core/block_pool.py:L322-336 (0.11.0)`.
        """
        for block in blocks:
            if block.is_null:
                continue  # upstream bumps it, but never reads the null block's refcount
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block.block_id)
                self.num_held_blocks += 1
                if self.num_held_blocks > self.peak_num_held_blocks:
                    self.peak_num_held_blocks = self.num_held_blocks
                if block.block_hash is not None:
                    self.num_evictable_blocks -= 1
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block; those reaching 0 re-enter the free queue.

        Where they go is the release's `FreeOrder`; at 4ac7713 all join the tail in this
        order. The first block given is evicted first, which is why a request frees its table
        in reverse: its tail block (longest hash chain, least likely to be shared) goes first.
        A double free raises with the blocks before it decremented (and counted) but none
        of them queued, as it always has.

        Upstream: `vllm/v1/core/block_pool.py:L338-353 (0.11.0)`.
        """
        # The hot loop of a request's end (every block of its table): counts are kept in
        # locals and applied once, the queue is appended to once.
        released: list[KVCacheBlock] = []
        num_newly_evictable = 0
        for block in ordered_blocks:
            if block.is_null:
                continue
            ref_cnt = block.ref_cnt
            if ref_cnt <= 0:
                self.num_held_blocks -= len(released)
                self.num_evictable_blocks += num_newly_evictable
                raise AssertionError(f"double free of block {block.block_id} (ref_cnt {ref_cnt})")
            ref_cnt -= 1
            block.ref_cnt = ref_cnt
            if ref_cnt == 0:
                released.append(block)
                if block.block_hash is not None:
                    num_newly_evictable += 1
        if released:
            self.num_held_blocks -= len(released)
            self.num_evictable_blocks += num_newly_evictable
            self.free_order.requeue(self.free_block_queue, released, self.enable_caching)

    def cache_full_blocks(
        self,
        blocks: list[KVCacheBlock],
        block_hashes: list[BlockHash],
        num_cached_blocks: int,
        num_full_blocks: int,
    ) -> None:
        """Cache `blocks[num_cached_blocks:num_full_blocks]` under their chained hashes.

        Blocks are cached as soon as they are full of scheduled tokens, before their KV is
        computed (`block_pool.py:L96-200`). Duplicates of an already cached hash are added
        alongside it, never merged, so block tables stay append-only.
        """
        assert len(block_hashes) >= num_full_blocks, "block hashes not extended far enough"
        for index in range(num_cached_blocks, num_full_blocks):
            block = blocks[index]
            if block.is_null:
                # 0.19.1 on skip it (`block_pool.py:L259-263 @0.20.0`): a window that moved
                # past blocks never allocated (a capped count, `clamps_skipped_to_table`)
                # leaves nulls above the cached boundary. Up to 0.11.0 none lies there.
                continue
            assert block.block_hash is None, f"block {block.block_id} already has a hash"
            block_hash = block_hashes[index]
            block.block_hash = block_hash
            self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block
        if self.event_sink is not None and num_full_blocks > num_cached_blocks:
            # vLLM 0.11.0 block_pool.py:L235-255: one BlockStored for the newly full blocks.
            parent = block_hashes[num_cached_blocks - 1] if num_cached_blocks else None
            self.event_sink.stored(block_hashes[num_cached_blocks:num_full_blocks], parent)
