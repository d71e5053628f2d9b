"""The V1 engine's hybrid coordinator: one block table per KV-cache group, one shared pool.

Models `KVCacheCoordinator` and `HybridKVCacheCoordinator` (vLLM 0.11.0
`vllm/v1/core/kv_cache_coordinator.py:L15-176, L252-387`; 4ac7713 matches, spec §6.4). The
one-group case (the unitary and no-prefix-cache coordinators) is inlined in
`sim.kv.v1_engine.manager.KVCacheManager`; this module is used only with two or more groups.

Each group has its own `SingleTypeManager` (full attention or sliding window) over the same
`BlockPool`. Every per-request operation runs group by group in group-id order, so block ids
are handed out to group 0 first (`allocate_new_blocks`, `L91-109`), and the count a step
needs is the sum over groups (`get_num_blocks_to_allocate`, `L41-71`).

Prefix caching keys a block by (hash, group id) (`kv_cache_utils.py:L40-60`): the same
token prefix is cached once per group. kvsim keeps group 0's key the plain chained hash
(as the one-group manager does) and keys group g > 0 by ``hash((h, g))``, an int as
collision-free as the chain itself. A lookup over several groups of one type hits only if
every group has the block (`block_pool.py:L163-186`).

The hybrid cache hit (`L330-387`) supports exactly two attention types, one of them full
attention, and the group ids of the two types must not interleave (`L270-327`):

1. the full-attention hit, at most `max_length` tokens;
2. the other type's hit within that length;
3. the full-attention hit truncated to the other type's length.

Worked example (bs=4, W=8, group 0 sliding, group 1 full, max_length 15 -> 3 blocks): the
full groups have h0, h1, h2 cached, the sliding group only h1 and h2 (h0 was freed when it
left a window). Full hit: 3 blocks (12 tokens). Sliding hit within 12 tokens needs
``cdiv(8 - 1, 4) = 2`` contiguous blocks: the scan from the right finds h2, h1 -> [NULL,
b(h1), b(h2)]: 12 tokens. Both groups hit 3 blocks; the sliding group's first is the null
block.
"""

from __future__ import annotations

from sim.kv.config import KVCacheGroupSpec
from sim.kv.types import BlockHash, cdiv
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.single_type import (
    FullAttentionManager,
    SingleTypeManager,
    SlidingWindowManager,
)

#: Per-group lists, indexed by group id.
GroupBlocks = tuple[list[KVCacheBlock], ...]


def group_block_hash(block_hash: BlockHash, group_id: int) -> BlockHash:
    """The cache key of a block of group `group_id` (group 0: the plain hash)."""
    if group_id == 0:
        return block_hash
    return BlockHash(hash((block_hash, group_id)))


class HybridCoordinator:
    """Per-group managers over one pool; see the module docstring."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        groups: tuple[KVCacheGroupSpec, ...],
        *,
        only_reachable_cached: bool = False,
    ) -> None:
        if len(groups) < 2:
            raise ValueError(
                f"the hybrid coordinator needs >= 2 KV-cache groups, got {len(groups)}"
            )
        self.block_pool = block_pool
        self.block_size = block_size
        self.groups = groups
        self.managers: tuple[SingleTypeManager, ...] = tuple(
            FullAttentionManager(block_pool, block_size)
            if group.sliding_window is None
            else SlidingWindowManager(
                block_pool,
                block_size,
                group.sliding_window,
                only_reachable_cached=only_reachable_cached,
            )
            for group in groups
        )
        #: Per group: distinct blocks its live tables hold now, and the most ever. A block
        #: belongs to one group while held and groups change the pool one at a time, so the
        #: pool's held-count change during a group's operation is that group's change.
        self.num_held_blocks = [0] * len(groups)
        self.peak_held_blocks = [0] * len(groups)
        self.full_group_ids = [i for i, g in enumerate(groups) if g.sliding_window is None]
        self.other_group_ids = [i for i, g in enumerate(groups) if g.sliding_window is not None]
        windows = {groups[i].sliding_window for i in self.other_group_ids}
        # `verify_and_split_kv_cache_groups` asserts these (L270-327).
        if not self.full_group_ids or len(windows) != 1:
            raise ValueError(
                "the hybrid coordinator supports full attention plus exactly one sliding "
                f"window; got windows {[g.sliding_window for g in groups]}"
            )
        (other_window,) = windows
        assert other_window is not None  # the other groups are the sliding ones
        self.other_window: int = other_window
        if max(self.full_group_ids) < min(self.other_group_ids):
            self.full_attn_first = True
        elif max(self.other_group_ids) < min(self.full_group_ids):
            self.full_attn_first = False
        else:
            raise ValueError("full-attention and sliding-window group ids must not interleave")

    # ------------------------------------------------------------------------ cache hits
    def _lookup(
        self, group_ids: list[int], hashes: list[list[BlockHash]], index: int
    ) -> list[KVCacheBlock] | None:
        """The cached block of every group at `index`, or None if any group misses."""
        found: list[KVCacheBlock] = []
        for group_id in group_ids:
            block = self.block_pool.get_cached_block(hashes[group_id][index])
            if block is None:
                return None
            found.append(block)
        return found

    def _full_hit(self, hashes: list[list[BlockHash]], max_length: int) -> list[list[KVCacheBlock]]:
        """`FullAttentionManager.find_longest_cache_hit` over all full groups."""
        hits: list[list[KVCacheBlock]] = [[] for _ in self.full_group_ids]
        for index in range(max_length // self.block_size):
            found = self._lookup(self.full_group_ids, hashes, index)
            if found is None:
                break
            for group_hits, block in zip(hits, found, strict=True):
                group_hits.append(block)
        return hits

    def _sliding_hit(
        self, hashes: list[list[BlockHash]], max_length: int
    ) -> list[list[KVCacheBlock]]:
        """`SlidingWindowManager.find_longest_cache_hit` over all sliding groups."""
        num_contiguous_needed = cdiv(self.other_window - 1, self.block_size)
        max_num_blocks = max_length // self.block_size
        null = self.block_pool.null_block
        hits = [[null] * max_num_blocks for _ in self.other_group_ids]
        num_contiguous = 0
        for index in range(max_num_blocks - 1, -1, -1):
            found = self._lookup(self.other_group_ids, hashes, index)
            if found is None:
                num_contiguous = 0
                continue
            for group_hits, block in zip(hits, found, strict=True):
                group_hits[index] = block
            num_contiguous += 1
            if num_contiguous >= num_contiguous_needed:
                return [group_hits[: index + num_contiguous] for group_hits in hits]
        return [group_hits[:num_contiguous] for group_hits in hits]

    def find_longest_cache_hit(
        self, hashes: list[list[BlockHash]], max_length: int
    ) -> tuple[GroupBlocks, int]:
        """Per-group hit blocks and the hit length in tokens (the three steps above).

        `hashes[g]` are group g's cache keys (`group_block_hash`) of the request's full blocks.
        """
        full_hits = self._full_hit(hashes, max_length)
        hit_length = len(full_hits[0]) * self.block_size
        other_hits = self._sliding_hit(hashes, hit_length)
        num_hit_blocks = len(other_hits[0])
        per_group: list[list[KVCacheBlock]] = [[] for _ in self.groups]
        for group_id, group_hits in zip(self.full_group_ids, full_hits, strict=True):
            per_group[group_id] = group_hits[:num_hit_blocks]
        for group_id, group_hits in zip(self.other_group_ids, other_hits, strict=True):
            per_group[group_id] = group_hits
        return tuple(per_group), num_hit_blocks * self.block_size

    # ------------------------------------------------------------------ per-group steps
    def _count(self, group_id: int, num_held_before: int) -> None:
        held = self.num_held_blocks[group_id] + self.block_pool.num_held_blocks - num_held_before
        self.num_held_blocks[group_id] = held
        if held > self.peak_held_blocks[group_id]:
            self.peak_held_blocks[group_id] = held

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        for group_id, manager in enumerate(self.managers):
            if isinstance(manager, SlidingWindowManager):
                before = self.block_pool.num_held_blocks
                manager.remove_skipped_blocks(request_id, num_computed_tokens)
                self._count(group_id, before)

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, hits: GroupBlocks
    ) -> int:
        return sum(
            manager.get_num_blocks_to_allocate(request_id, num_tokens, group_hits)
            for manager, group_hits in zip(self.managers, hits, strict=True)
        )

    def touch(self, hits: GroupBlocks) -> None:
        for group_id, group_hits in enumerate(hits):
            before = self.block_pool.num_held_blocks
            self.block_pool.touch(group_hits)
            self._count(group_id, before)

    def save_new_computed_blocks(self, request_id: int, hits: GroupBlocks) -> None:
        for manager, group_hits in zip(self.managers, hits, strict=True):
            manager.save_new_computed_blocks(request_id, group_hits)

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> GroupBlocks:
        new_blocks = []
        for group_id, manager in enumerate(self.managers):
            before = self.block_pool.num_held_blocks
            new_blocks.append(manager.allocate_new_blocks(request_id, num_tokens))
            self._count(group_id, before)
        return tuple(new_blocks)

    def cache_blocks(self, request_id: int, hashes: list[list[BlockHash]], num_tokens: int) -> None:
        for manager, group_hashes in zip(self.managers, hashes, strict=True):
            manager.cache_blocks(request_id, group_hashes, num_tokens)

    def free(self, request_id: int) -> None:
        """Each group frees its table, tail first, in group-id order (`L127-135`)."""
        for group_id, manager in enumerate(self.managers):
            before = self.block_pool.num_held_blocks
            manager.free(request_id)
            self._count(group_id, before)

    def get_blocks(self, request_id: int) -> GroupBlocks:
        return tuple(manager.req_to_blocks.get(request_id) or [] for manager in self.managers)
