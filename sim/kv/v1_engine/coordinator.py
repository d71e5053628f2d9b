"""The V1 engine's KV-cache coordinators: one block table per KV-cache group, one shared pool.

Models `KVCacheCoordinator` and `UnitaryKVCacheCoordinator` (vLLM 0.11.0
`vllm/v1/core/kv_cache_coordinator.py:L15-191, L226-265`; 4ac7713 matches, spec §6.4). The
hybrid coordinator (two or more groups) is `hybrid_coordinator.HybridKVCacheCoordinator`;
`make_coordinator` picks one as `get_kv_cache_coordinator` does (`L390-413`). kvsim has no
separate no-prefix-cache coordinator (`L193-223`): with caching off the manager never asks
for a hit, which is all that class changes.

Each group has its own `SingleTypeManager` (full attention or sliding window) over the same
`BlockPool`. Every per-request operation runs group by group in group-id order, so block ids
are handed out to group 0 first (`allocate_new_blocks`, `L93-116`), and the count a step
needs is the sum over groups (`get_num_blocks_to_allocate`, `L47-76`).

kvsim keeps each request's block hashes here (upstream: `Request.block_hashes`, read by the
coordinator through the request), extended incrementally so a long decode never rehashes its
history. Their shape is the coordinator's: one chain for one group; for several groups one
key list per group (`hybrid_coordinator.group_block_hash`).

Speed-ups live inside the methods they speed up, each under its name (`# fast path: ...`):
the unitary coordinator's count and allocation without hits skip the per-group loop, and a
sliding table's leading nulls are a kept count (`SlidingWindowManager.req_to_num_null_blocks`),
not a scan.
"""

from __future__ import annotations

import abc
from typing import Generic, TypeVar

from sim.kv.config import KVCacheGroupSpec
from sim.kv.types import NONE_HASH, BlockHash, Sequence, chain_hash
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.chunked_local import ChunkedLocalAttentionManager
from sim.kv.v1_engine.full_variants import RSWAManager, make_full_variant_manager
from sim.kv.v1_engine.mamba import MambaManager
from sim.kv.v1_engine.single_type import (
    FullAttentionManager,
    SingleTypeManager,
    SlidingWindowManager,
)

#: Per-group lists, indexed by group id (upstream `tuple[list[KVCacheBlock], ...]`).
GroupBlocks = tuple[list[KVCacheBlock], ...]

#: A request's block hashes as a coordinator keeps them.
HashesT = TypeVar("HashesT")


def make_single_type_manager(
    block_pool: BlockPool,
    block_size: int,
    group: KVCacheGroupSpec,
    *,
    only_reachable_cached: bool,
    mamba_block_size: int | None = None,
) -> SingleTypeManager:
    """`get_manager_for_kv_cache_spec` (`single_type_kv_cache_manager.py @0.11.0`) for the
    group types kvsim models: full, sliding window, chunked-local, Mamba (whose block size
    is its own, `mamba_block_size`: max_model_len with caching off, `sim.kv.v1_engine.mamba`).

    kvsim's own (no upstream counterpart).
    """
    if group.mamba:
        if mamba_block_size is None:
            raise ValueError("a Mamba KV-cache group needs max_model_len (its block size)")
        return MambaManager(block_pool, mamba_block_size)
    if group.is_full_variant:  # sink, R-SWA, circular buffer (`full_variants`)
        return make_full_variant_manager(block_pool, block_size, group)
    if group.attention_chunk_size is not None:
        return ChunkedLocalAttentionManager(block_pool, block_size, group.attention_chunk_size)
    if group.sliding_window is None:
        return FullAttentionManager(block_pool, block_size)
    return SlidingWindowManager(
        block_pool, block_size, group.sliding_window, only_reachable_cached=only_reachable_cached
    )


class KVCacheCoordinator(abc.ABC, Generic[HashesT]):
    """Per-group managers over one pool (`KVCacheCoordinator`, `L15-191`)."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        groups: tuple[KVCacheGroupSpec, ...],
        *,
        only_reachable_cached: bool = False,
        mamba_block_size: int | None = None,
    ) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        #: Each group's sliding window in tokens (None: full or chunked-local), by group id.
        self.windows = tuple(group.sliding_window for group in groups)
        #: Whether any group frees blocks a running request no longer reads (sliding window,
        #: chunked-local); full attention alone never does.
        self.has_skipping_group = any(not group.is_full_attention for group in groups)
        self.managers: tuple[SingleTypeManager, ...] = tuple(
            make_single_type_manager(
                block_pool,
                block_size,
                group,
                only_reachable_cached=only_reachable_cached,
                mamba_block_size=mamba_block_size,
            )
            for group in groups
        )
        #: Per request: its full blocks' hashes, extended as tokens are appended.
        self.req_to_block_hashes: dict[int, HashesT] = {}
        #: The hits of a call without any (read only: no caller mutates hit lists).
        self.no_hits: GroupBlocks = tuple([] for _ in groups)

    # ------------------------------------------------------------------- held blocks
    @abc.abstractmethod
    def group_peak_held_blocks(self) -> list[int]:
        """Per group: the most blocks its tables ever held at once.

        kvsim's own (no upstream counterpart).
        """

    # ------------------------------------------------------------------------ hashing
    @abc.abstractmethod
    def block_hashes(self, request: Sequence, num_blocks: int) -> HashesT:
        """The request's hashes, extended to at least `num_blocks` full blocks.

        kvsim's own (no upstream counterpart).
        """

    @abc.abstractmethod
    def num_hashed_blocks(self, request_id: int) -> int | None:
        """Full blocks hashed so far for the request; None when it has no hash list.

        kvsim's own (no upstream counterpart).
        """

    def free_block_hashes(self, request_id: int) -> None:
        """Drop `request_id`'s block hashes (it has finished).

        kvsim's own (no upstream counterpart).
        """
        self.req_to_block_hashes.pop(request_id, None)

    # ---------------------------------------------------------------------- cache hits
    @abc.abstractmethod
    def find_longest_cache_hit(self, request: Sequence, max_length: int) -> tuple[GroupBlocks, int]:
        """Per-group hit blocks and the hit length in tokens (`L185-190`).

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L185-190 (0.11.0)`.
        """

    @abc.abstractmethod
    def split_hits(self, blocks: list[KVCacheBlock], num_hit_tokens: int) -> GroupBlocks:
        """A flat hit list (group 0's blocks, then group 1's...) as per-group lists; raises
        ValueError when the list does not match `num_hit_tokens`.

        kvsim's own (no upstream counterpart).
        """

    # ------------------------------------------------------------------ per-group steps
    def remove_skipped_blocks(
        self, request_id: int, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """`L163-174`: each group frees what left its window (full attention: nothing); an
        R-SWA group also reads the prompt length (0.25.1 on, `full_variants`).

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L163-174 (0.11.0)`, `L433-454
        (0.33.0)`.
        """
        for manager in self.managers:
            if isinstance(manager, RSWAManager):
                manager.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)
            else:
                manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, hits: GroupBlocks
    ) -> int:
        """`L47-76`: the sum over groups.

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L47-76 (0.11.0)`.
        """
        return sum(
            manager.get_num_blocks_to_allocate(request_id, num_tokens, group_hits)
            for manager, group_hits in zip(self.managers, hits, strict=True)
        )

    def touch(self, hits: GroupBlocks) -> None:
        """Take a reference on every group's hits (upstream: the manager's
        `block_pool.touch(new_computed_blocks.blocks)`, `kv_cache_manager.py:L270-272`)."""
        for group_hits in hits:
            self.block_pool.touch(group_hits)

    def save_new_computed_blocks(self, request_id: int, hits: GroupBlocks) -> None:
        """`L78-91`. Upstream: `vllm/v1/core/kv_cache_coordinator.py:L78-91 (0.11.0)`."""
        for manager, group_hits in zip(self.managers, hits, strict=True):
            manager.save_new_computed_blocks(request_id, group_hits)

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> GroupBlocks:
        """`L93-116`: every group's table grows to `cdiv(num_tokens, bs)` entries.

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L93-116 (0.11.0)`.
        """
        return tuple(
            manager.allocate_new_blocks(request_id, num_tokens) for manager in self.managers
        )

    def allocate_new_block_ids(self, request_id: int, num_tokens: int) -> list[int]:
        """`allocate_new_blocks`, flat as ids (what `allocate_slots` answers).

        kvsim's own (no upstream counterpart).
        """
        return [
            block.block_id
            for group_blocks in self.allocate_new_blocks(request_id, num_tokens)
            for block in group_blocks
        ]

    @abc.abstractmethod
    def cache_blocks(self, request: Sequence, num_tokens: int) -> None:
        """`L118-129`: each group caches the blocks `num_tokens` tokens fill.

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L118-129 (0.11.0)`.
        """

    def free(self, request_id: int) -> None:
        """`L131-139`: each group frees its table, tail first, in group-id order.

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L131-139 (0.11.0)`.
        """
        for manager in self.managers:
            manager.free(request_id)

    def get_blocks(self, request_id: int) -> GroupBlocks:
        """`L176-182`. Upstream: `vllm/v1/core/kv_cache_coordinator.py:L176-182 (0.11.0)`."""
        return tuple(manager.req_to_blocks.get(request_id) or [] for manager in self.managers)

    # ------------------------------------------------------- kvsim's queries over tables
    def num_cached_blocks(self, request_id: int) -> int:
        """Leading table entries cached, the fewest over groups (equal in practice).

        kvsim's own (no upstream counterpart).
        """
        return min(manager.num_cached_block[request_id] for manager in self.managers)

    def table_touch_len(self, request_id: int) -> int | None:
        """The first decode length at which a group's table changes: a new block
        (``len(table) * bs + 1``) or, per sliding or chunked-local group, a block leaving
        what is read (`SingleTypeManager.freeing_decode_len`). None when the request has not started (no
        allocation yet).

        Example (bs=16, one group, W=24): a table of 8 entries, 0..4 null -> min(129, 120) = 120.

        kvsim's own (no upstream counterpart).
        """
        tables = self.get_blocks(request_id)
        if not tables[0] or request_id not in self.managers[0].num_cached_block:
            return None
        # Each table grows at its own group's block size (a Mamba group's is max_model_len).
        # (a circular buffer's never grows: `next_growth_decode_len` None).
        touch_lens = [
            manager.next_growth_decode_len(len(table))
            for table, manager in zip(tables, self.managers, strict=True)
        ]
        touch_lens += [manager.next_freeing_decode_len(request_id) for manager in self.managers]
        return min((n for n in touch_lens if n is not None), default=None)

    def num_seq_blocks(self, request_id: int) -> int:
        """Non-null blocks over all groups (null entries are a kept count per table, and a
        block is never in two of a request's tables).

        kvsim's own (no upstream counterpart).
        """
        total = 0
        for manager in self.managers:
            table = manager.req_to_blocks.get(request_id)
            if table:
                total += len(table) - manager.num_null_blocks(request_id)
        return total


class UnitaryKVCacheCoordinator(KVCacheCoordinator[list[BlockHash]]):
    """One KV-cache group: all layers full attention, or all sliding (`L226-265`)."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        sliding_window: int | None,
        *,
        only_reachable_cached: bool = False,
    ) -> None:
        super().__init__(
            block_pool,
            block_size,
            (KVCacheGroupSpec(sliding_window=sliding_window),),
            only_reachable_cached=only_reachable_cached,
        )
        (self.manager,) = self.managers

    def group_peak_held_blocks(self) -> list[int]:
        """The pool's peak held blocks, as the one group's.

        kvsim's own (no upstream counterpart).
        """
        return [self.block_pool.peak_num_held_blocks - 1]

    def block_hashes(self, request: Sequence, num_blocks: int) -> list[BlockHash]:
        """Same values as `request.content.block_hashes(bs, n)` (parent of block 0 =
        NONE_HASH), computed from the last hash kept.

        kvsim's own (no upstream counterpart).
        """
        hashes = self.req_to_block_hashes.setdefault(request.seq_id, [])
        parent = hashes[-1] if hashes else NONE_HASH
        for index in range(len(hashes), num_blocks):
            parent = chain_hash(parent, request.content.block_key(index, self.block_size))
            hashes.append(BlockHash(parent))
        return hashes

    def num_hashed_blocks(self, request_id: int) -> int | None:
        """Full blocks of `seq` whose hash has been computed.

        kvsim's own (no upstream counterpart).
        """
        hashes = self.req_to_block_hashes.get(request_id)
        return None if hashes is None else len(hashes)

    def find_longest_cache_hit(self, request: Sequence, max_length: int) -> tuple[GroupBlocks, int]:
        """Upstream: `vllm/v1/core/kv_cache_coordinator.py:L251-265 (0.11.0)`."""
        hashes = self.block_hashes(request, request.num_tokens // self.block_size)
        hits = self.manager.find_longest_cache_hit(hashes, max_length)
        return (hits,), len(hits) * self.block_size

    def split_hits(self, blocks: list[KVCacheBlock], num_hit_tokens: int) -> GroupBlocks:
        """One group: the hits are the group's (kvsim's own (no upstream counterpart))."""
        if num_hit_tokens != len(blocks) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens={num_hit_tokens} does not match "
                f"{len(blocks)} hit blocks of {self.block_size} tokens"
            )
        return (blocks,)

    def remove_skipped_blocks(
        self, request_id: int, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """None (one group is never R-SWA: the prompt length is not read).

        Upstream `KVCacheCoordinator.remove_skipped_blocks`:
        `vllm/v1/core/kv_cache_coordinator.py:L163-174 (0.11.0)`.
        """
        if self.has_skipping_group:  # fast path: full attention skips nothing
            self.manager.remove_skipped_blocks(request_id, num_computed_tokens)

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, hits: GroupBlocks
    ) -> int:
        """None.

        Upstream `KVCacheCoordinator.get_num_blocks_to_allocate`:
        `vllm/v1/core/kv_cache_coordinator.py:L47-76 (0.11.0)`.
        """
        if hits[0]:
            return self.manager.get_num_blocks_to_allocate(request_id, num_tokens, hits[0])
        # fast path: no hits (every call but a new request's first), so none is evictable and
        # the count is `cdiv(num_tokens, bs) - len(table)` (`get_num_blocks_to_allocate`).
        # `blocks_of`, with get: no empty list is built per call.
        table = self.manager.req_to_blocks.get(request_id)
        if table is None:
            table = self.manager.req_to_blocks[request_id] = []
        return -(-num_tokens // self.block_size) - len(table)

    def save_new_computed_blocks(self, request_id: int, hits: GroupBlocks) -> None:
        """None.

        Upstream `KVCacheCoordinator.save_new_computed_blocks`:
        `vllm/v1/core/kv_cache_coordinator.py:L78-91 (0.11.0)`.
        """
        manager = self.manager
        # fast path: a running request without hits has nothing to save (most calls).
        if hits[0] or request_id not in manager.num_cached_block:
            manager.save_new_computed_blocks(request_id, hits[0])

    def allocate_new_block_ids(self, request_id: int, num_tokens: int) -> list[int]:
        """`allocate_new_blocks`, returning the new ids (kvsim's own (no upstream counterpart))."""
        # fast path: the pool appends straight to the table and returns the ids it popped,
        # with no per-group tuple and no second pass over the blocks.
        table = self.manager.req_to_blocks[request_id]  # get_num_blocks_to_allocate made it
        num_new_blocks = -(-num_tokens // self.block_size) - len(table)
        if num_new_blocks <= 0:
            return []
        return self.block_pool.get_new_blocks_into(num_new_blocks, table)

    def cache_blocks(self, request: Sequence, num_tokens: int) -> None:
        """None.

        Upstream `KVCacheCoordinator.cache_blocks`: `vllm/v1/core/kv_cache_coordinator.py:L118-129
        (0.11.0)`.
        """
        hashes = self.block_hashes(request, num_tokens // self.block_size)
        manager = self.manager
        if isinstance(manager, SlidingWindowManager) and manager.retention is not None:
            # 0.33.0's sparse retention: the replay boundary (one group: no junction,
            # `sliding_retention`; `kv_cache_coordinator.py:L358-381 @0.33.0`).
            manager.cache_blocks(request.seq_id, hashes, num_tokens, (request.prompt_len - 1,))
            return
        manager.cache_blocks(request.seq_id, hashes, num_tokens)

    def free(self, request_id: int) -> None:
        """None.

        Upstream `KVCacheCoordinator.free`: `vllm/v1/core/kv_cache_coordinator.py:L131-139
        (0.11.0)`.
        """
        self.manager.free(request_id)

    def num_cached_blocks(self, request_id: int) -> int:
        """Blocks of `request_id` cached so far (kvsim's own (no upstream counterpart))."""
        return self.manager.num_cached_block[request_id]

    def table_touch_len(self, request_id: int) -> int | None:
        """Tokens the next decode step may write before it needs a block.

        kvsim's own (no upstream counterpart).
        """
        # fast path: `KVCacheCoordinator.table_touch_len` for one table (called after every
        # real decode call), with no per-group tuple.
        manager = self.manager
        table = manager.req_to_blocks.get(request_id)
        if not table or request_id not in manager.num_cached_block:
            return None
        bs = self.block_size
        touch_len = len(table) * bs + 1
        window = self.windows[0]
        if window is not None:
            num_nulls = manager.req_to_num_null_blocks.get(request_id, 0)
            window_touch_len = (num_nulls + 1) * bs + window
            if window_touch_len < touch_len:
                touch_len = window_touch_len
        return touch_len

    def num_seq_blocks(self, request_id: int) -> int:
        """Entries of `seq`'s table, null entries included.

        kvsim's own (no upstream counterpart).
        """
        table = self.manager.req_to_blocks.get(request_id)
        if not table:
            return 0
        return len(table) - self.manager.req_to_num_null_blocks.get(request_id, 0)
