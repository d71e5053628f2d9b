"""The V1 engine's hybrid coordinator: two or more KV-cache groups over one pool.

Models `HybridKVCacheCoordinator` (vLLM 0.11.0 `vllm/v1/core/kv_cache_coordinator.py:L268-415`;
4ac7713 matches, spec §6.4) on the shared `coordinator.KVCacheCoordinator`. The one-group case
is `coordinator.UnitaryKVCacheCoordinator`.

A request holds one block table per group; `allocate_slots` frees the blocks that left every
sliding group's window, then needs the sum over groups of ``cdiv(T, bs) - len(table_g)``
blocks (plus evictable hits), all or nothing. Worked example (bs=4, 9 blocks, group 0
sliding W=4, group 1 full, no caching)::

    A, 8 tokens: allocate_slots(A, 8)     -> group 0 [1, 2], group 1 [3, 4]; free 4
    A (C=8, 9 tokens): allocate_slots(A, 1)
        remove_skipped_blocks(8): first useful block (8 - 4 + 1) // 4 = 1, so group 0
        frees block 1 (-> free queue tail) and its table is [NULL, 2];
        then 1 new block per group: group 0 takes 5, group 1 takes 6; free 3 ([7, 8, 1])
    B, 8 tokens: allocate_slots(B, 8)     -> needs 4 > 3: None
    free(A)                               -> group 0 frees 5, 2; group 1 frees 6, 4, 3

kvsim adds per-group held-block counts (the summary's per-group peaks): a block belongs to one
group while held and groups change the pool one at a time, so the pool's held-count change
during a group's operation is that group's change.

Prefix caching keys a block by (hash, group id) (`kv_cache_utils.py:L40-60`): the same
token prefix is cached once per group. kvsim keeps group 0's key the plain chained hash
(as the one-group manager does) and keys group g > 0 by ``hash((h, g))``, an int as
collision-free as the chain itself. A lookup over several groups of one type hits only if
every group has the block (`block_pool.py:L163-186`).

With a Mamba group (`sim.kv.v1_engine.mamba`) and prefix caching off, upstream builds
`KVCacheCoordinatorNoPrefixCache` (`kv_cache_coordinator.py:L480-527 (0.33.0)`, any mix of
groups, no hit rule): full + Mamba (+ sliding) groups are taken in any order, each Mamba
table holds one block of the group's own block size (max_model_len). With caching on
(`mamba_cache_mode` "align" or "all", 0.19.1-0.33.0) kvsim takes full + Mamba groups only,
in any order: upstream's fixed-point hit (`L453-521 @0.19.1`) is then a
"simple hybrid" of two attention types, full first, one pass -- the steps below with the
Mamba hit (`mamba_modes.mamba_align_hit`, both modes) as the other type's; an "align" Mamba group
counts and grows on the main model's tokens (no lookahead slots), and the scheduler's
`new_step_starts` reaches the managers of both modes. A sink, R-SWA or circular-buffer
group (`sim.kv.v1_engine.full_variants`) is taken in any order with caching off; with
caching on, `sim.kv.v1_engine.variant_caching` sorts the groups for the hit (sink and R-SWA
hit with the full groups, a circular buffer takes no part).

The hybrid cache hit (`L352-415`) supports exactly two attention types, one of them full
attention (the other: one sliding window, or one chunk size of chunked-local attention,
`chunked_local.chunked_local_hit`), and the group ids of the two types must not interleave
(`L289-350`):

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
from sim.kv.types import NONE_HASH, BlockHash, Sequence, cdiv, chain_hash
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.chunked_local import ChunkedLocalAttentionManager, chunked_local_hit
from sim.kv.v1_engine.coordinator import GroupBlocks, KVCacheCoordinator
from sim.kv.v1_engine.full_variants import RSWAManager
from sim.kv.v1_engine.mamba import MambaManager
from sim.kv.v1_engine.mamba_modes import mamba_align_hit
from sim.kv.v1_engine.single_type import SlidingWindowManager
from sim.kv.v1_engine.variant_caching import split_variant_groups


def _describe(group: KVCacheGroupSpec) -> str:
    """'full', 'sliding 4096', 'chunked 8192', 'mamba', ... (for the one-line error)."""
    return group.kind


def group_block_hash(block_hash: BlockHash, group_id: int) -> BlockHash:
    """The cache key of a block of group `group_id` (group 0: the plain hash).

    kvsim's own (no upstream counterpart).
    """
    if group_id == 0:
        return block_hash
    return BlockHash(hash((block_hash, group_id)))


class HybridKVCacheCoordinator(KVCacheCoordinator[list[list[BlockHash]]]):
    """Per-group managers over one pool; see the module docstring."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        groups: tuple[KVCacheGroupSpec, ...],
        *,
        only_reachable_cached: bool = False,
        mamba_block_size: int | None = None,
        mamba_cache_mode: str = "none",
    ) -> None:
        if len(groups) < 2:
            raise ValueError(
                f"the hybrid coordinator needs >= 2 KV-cache groups, got {len(groups)}"
            )
        super().__init__(
            block_pool,
            block_size,
            groups,
            only_reachable_cached=only_reachable_cached,
            mamba_block_size=mamba_block_size,
        )
        self.groups = groups
        self.num_groups = len(groups)
        #: Per group: distinct blocks its live tables hold now, and the most ever.
        self.num_held_blocks = [0] * len(groups)
        self.peak_held_blocks = [0] * len(groups)
        self.full_group_ids = [i for i, g in enumerate(groups) if g.is_full_attention]
        self.other_group_ids = [i for i, g in enumerate(groups) if not g.is_full_attention]
        #: Groups that take no part in a cache hit (0.33.0's circular buffers: not
        #: `prefix_cacheable`); their share of every hit is empty (`variant_caching`).
        self.uncached_group_ids: list[int] = []
        #: Whether a group is Mamba: then prefix caching is off (the manager refuses it) and
        #: upstream builds `KVCacheCoordinatorNoPrefixCache`, which takes any mix of groups
        #: (`kv_cache_coordinator.py:L480-527 (0.33.0)`): no hit rule to verify.
        self.has_mamba_group = any(g.mamba for g in groups)
        #: The same for a sink, R-SWA or circular-buffer group (`full_variants`) with caching
        #: off; with caching on, `variant_caching.split_variant_groups` sorts them.
        has_variant = any(g.is_full_variant for g in groups)
        self.caching_off_only = self.has_mamba_group or (
            has_variant and not block_pool.enable_caching
        )
        if has_variant and block_pool.enable_caching and not self.has_mamba_group:
            self.full_group_ids, self.other_group_ids, self.uncached_group_ids = (
                split_variant_groups(groups)
            )
        other_specs = {groups[i] for i in self.other_group_ids}
        self.other_window: int | None = None
        self.other_chunk_size: int | None = None
        self.full_attn_first = True
        #: The Mamba managers in mode "align" (prefix caching on); empty otherwise.
        self.align_mamba_managers: list[MambaManager] = []
        #: The Mamba managers with prefix caching, mode "align" or "all"; empty otherwise.
        self.caching_mamba_managers: list[MambaManager] = []
        #: The last hit's full-attention length less its final length ("align" only).
        self.num_uncached_common_prefix_tokens = 0
        self.mamba_group_ids = [i for i, g in enumerate(groups) if g.mamba]
        if self.has_mamba_group and mamba_cache_mode in ("align", "all"):
            if not self.full_group_ids or len(self.full_group_ids) + len(
                self.mamba_group_ids
            ) != len(groups):
                raise ValueError(
                    "prefix caching with Mamba groups is modelled for full attention plus "
                    "Mamba groups only; got " + ", ".join(_describe(g) for g in groups)
                )
            for group_id in self.mamba_group_ids:
                manager = self.managers[group_id]
                assert isinstance(manager, MambaManager)
                self.caching_mamba_managers.append(manager)
                if mamba_cache_mode == "all":
                    manager.mamba_all = True
                else:
                    manager.mamba_align = True
                    self.align_mamba_managers.append(manager)
            return
        if self.caching_off_only:
            return
        if has_variant and not self.other_group_ids:
            return  # full-type groups (and circular buffers): one full-attention hit
        # `verify_and_split_kv_cache_groups` asserts these (L289-350).
        if not self.full_group_ids or len(other_specs) != 1:
            raise ValueError(
                "the hybrid coordinator supports full attention plus exactly one sliding "
                "window or one chunk size; got " + ", ".join(_describe(g) for g in groups)
            )
        (other_spec,) = other_specs
        #: The other type's window (None: chunked-local) and chunk size (None: sliding).
        self.other_window = other_spec.sliding_window
        self.other_chunk_size = other_spec.attention_chunk_size
        if max(self.full_group_ids) < min(self.other_group_ids):
            self.full_attn_first = True
        elif max(self.other_group_ids) < min(self.full_group_ids):
            self.full_attn_first = False
        else:
            raise ValueError("full-attention and sliding-window group ids must not interleave")

    def group_peak_held_blocks(self) -> list[int]:
        """Peak blocks held by each group's manager (kvsim's own (no upstream counterpart))."""
        return list(self.peak_held_blocks)

    # ------------------------------------------------------------------------ hashing
    def block_hashes(self, request: Sequence, num_blocks: int) -> list[list[BlockHash]]:
        """Each group's keys, extended to at least `num_blocks` full blocks (group 0's are
        the plain chain, as with one group).

        kvsim's own (no upstream counterpart).
        """
        per_group = self.req_to_block_hashes.setdefault(
            request.seq_id, [[] for _ in range(self.num_groups)]
        )
        base = per_group[0]
        parent = base[-1] if base else NONE_HASH
        for index in range(len(base), num_blocks):
            parent = chain_hash(parent, request.content.block_key(index, self.block_size))
            base.append(parent)
        for group_id in range(1, self.num_groups):
            keys = per_group[group_id]
            keys.extend(group_block_hash(h, group_id) for h in base[len(keys) :])
        return per_group

    def num_hashed_blocks(self, request_id: int) -> int | None:
        """Full blocks of `seq` whose hash has been computed (every group shares it).

        kvsim's own (no upstream counterpart).
        """
        hashes = self.req_to_block_hashes.get(request_id)
        return None if hashes is None else len(hashes[0])

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

    def _other_hit(
        self, hashes: list[list[BlockHash]], max_length: int
    ) -> list[list[KVCacheBlock]]:
        """The other type's `find_longest_cache_hit` over all its groups."""
        if self.other_chunk_size is not None:
            return chunked_local_hit(
                self.block_pool,
                [hashes[i] for i in self.other_group_ids],
                max_length,
                self.block_size,
                self.other_chunk_size,
            )
        return self._sliding_hit(hashes, max_length)

    def _sliding_hit(
        self, hashes: list[list[BlockHash]], max_length: int
    ) -> list[list[KVCacheBlock]]:
        """`SlidingWindowManager.find_longest_cache_hit` over all sliding groups."""
        assert self.other_window is not None  # the other groups are the sliding ones
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

    def find_longest_cache_hit(self, request: Sequence, max_length: int) -> tuple[GroupBlocks, int]:
        """Per-group hit blocks and the hit length in tokens (the three steps above, `L352-415`),
        over each group's cache keys (`group_block_hash`) of the request's full blocks.

        Upstream: `vllm/v1/core/kv_cache_coordinator.py:L352-414 (0.11.0)`.
        """
        if self.caching_off_only and not self.caching_mamba_managers:
            raise ValueError(
                "prefix caching over a sink, R-SWA or circular-buffer group, or a Mamba group "
                "with caching off, is not modelled"
            )
        hashes = self.block_hashes(request, request.num_tokens // self.block_size)
        full_hits = self._full_hit(hashes, max_length)
        hit_length = len(full_hits[0]) * self.block_size
        other_hits: list[list[KVCacheBlock]] = []
        num_hit_blocks = len(full_hits[0])
        if not self.other_group_ids:
            pass  # full-type groups only (circular buffers take no part: `variant_caching`)
        elif self.caching_mamba_managers:
            # `L453-521 @0.19.1`, a simple hybrid: the Mamba hit within the full hit.
            other_hits = mamba_align_hit(
                self.block_pool,
                [hashes[i] for i in self.other_group_ids],
                hit_length,
                self.block_size,
            )
        else:
            other_hits = self._other_hit(hashes, hit_length)
        if other_hits:
            num_hit_blocks = len(other_hits[0])
        if self.caching_mamba_managers or self.other_window is not None:
            # (`L737 @0.25.1`; 0.33.0 `L934-937` for a sliding group too, whose sparse
            # retention keeps the junction, `sliding_retention`)
            self.num_uncached_common_prefix_tokens = hit_length - num_hit_blocks * self.block_size
        per_group: list[list[KVCacheBlock]] = [[] for _ in self.groups]
        for group_id, group_hits in zip(self.full_group_ids, full_hits, strict=True):
            per_group[group_id] = group_hits[:num_hit_blocks]
        for group_id, group_hits in zip(self.other_group_ids, other_hits, strict=True):
            per_group[group_id] = group_hits
        return tuple(per_group), num_hit_blocks * self.block_size

    def split_hits(self, blocks: list[KVCacheBlock], num_hit_tokens: int) -> GroupBlocks:
        """A hit has the same number H of blocks in every group: ``num_groups * H`` ids.

        kvsim's own (no upstream counterpart).
        """
        num_hit_blocks = num_hit_tokens // self.block_size
        num_hit_groups = self.num_groups - len(self.uncached_group_ids)
        if num_hit_tokens % self.block_size or len(blocks) != num_hit_blocks * num_hit_groups:
            raise ValueError(
                f"num_new_computed_tokens={num_hit_tokens} does not match "
                f"{len(blocks)} hit blocks over {num_hit_groups} groups of "
                f"{self.block_size}-token blocks"
            )
        per_group: list[list[KVCacheBlock]] = []
        start = 0
        for group_id in range(self.num_groups):
            if group_id in self.uncached_group_ids:  # a circular buffer: no share
                per_group.append([])
                continue
            per_group.append(blocks[start : start + num_hit_blocks])
            start += num_hit_blocks
        return tuple(per_group)

    # ------------------------------------------------------------------ per-group steps
    def _count(self, group_id: int, num_held_before: int) -> None:
        held = self.num_held_blocks[group_id] + self.block_pool.num_held_blocks - num_held_before
        self.num_held_blocks[group_id] = held
        if held > self.peak_held_blocks[group_id]:
            self.peak_held_blocks[group_id] = held

    def remove_skipped_blocks(
        self, request_id: int, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """None (an R-SWA group also reads the prompt length, `full_variants`).

        Upstream `KVCacheCoordinator.remove_skipped_blocks`:
        `vllm/v1/core/kv_cache_coordinator.py:L163-174 (0.11.0)`, `L433-454 (0.33.0)`.
        """
        for group_id, manager in enumerate(self.managers):
            if isinstance(
                manager, (SlidingWindowManager, ChunkedLocalAttentionManager, MambaManager)
            ):
                before = self.block_pool.num_held_blocks
                manager.remove_skipped_blocks(request_id, num_computed_tokens)
                self._count(group_id, before)
            elif isinstance(manager, RSWAManager):
                before = self.block_pool.num_held_blocks
                manager.remove_skipped_blocks(request_id, num_computed_tokens, num_prompt_tokens)
                self._count(group_id, before)

    def get_num_blocks_to_allocate(
        self,
        request_id: int,
        num_tokens: int,
        hits: GroupBlocks,
        num_tokens_main_model: int | None = None,
        query_start: int = 0,
        prefill_end: int = 0,
    ) -> int:
        """The sum over groups; a Mamba group in "align" mode counts on
        `num_tokens_main_model` (no lookahead slots; None: `num_tokens`), and on 0.33.0 from
        `query_start` (tokens computed plus hits: its prefill checkpoint, `mamba_checkpoint`).

        Upstream `KVCacheCoordinator.get_num_blocks_to_allocate`:
        `vllm/v1/core/kv_cache_coordinator.py:L71-115 (0.19.1)`.
        """
        if not self.align_mamba_managers:
            return super().get_num_blocks_to_allocate(request_id, num_tokens, hits)
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        total = 0
        for manager, group_hits in zip(self.managers, hits, strict=True):
            if isinstance(manager, MambaManager) and manager.mamba_align:
                total += manager.get_num_blocks_to_allocate(
                    request_id, main, group_hits, query_start=query_start, prefill_end=prefill_end
                )
                continue
            count = manager.get_num_blocks_to_allocate(request_id, num_tokens, group_hits)
            if request_id in manager.num_cached_block and count < 0:
                # 0.19.1 on floor a running request's count at 0 (`L108-114 @0.19.1`): a
                # table grown for lookahead slots the "align" Mamba group did not count
                # must not lend it blocks (found by the lockstep, bs=1, lookahead 2).
                count = 0
            total += count
        return total

    def new_step_starts(self) -> None:
        """Each Mamba group with caching forgets the blocks cached last step.

        Upstream `KVCacheCoordinator.new_step_starts`:
        `vllm/v1/core/kv_cache_coordinator.py:L250-253 (0.19.1)`.
        """
        for manager in self.caching_mamba_managers:
            manager.new_step_starts()

    def table_touch_len(self, request_id: int) -> int | None:
        """The shared touch length, and for an "align" Mamba group the first decode that may
        free one of its real blocks (`MambaManager.align_freeing_decode_len`).

        kvsim's own (no upstream counterpart).
        """
        touch_len = super().table_touch_len(request_id)
        if touch_len is None:
            return None
        for manager in self.align_mamba_managers:
            free_len = manager.align_freeing_decode_len(request_id)
            if free_len is not None and free_len < touch_len:
                touch_len = free_len
        return touch_len

    def num_seq_blocks(self, request_id: int) -> int:
        """Non-null blocks over all groups ("align" Mamba tables have nulls anywhere).

        kvsim's own (no upstream counterpart).
        """
        if not self.align_mamba_managers:
            return super().num_seq_blocks(request_id)
        total = 0
        for manager in self.managers:
            table = manager.req_to_blocks.get(request_id) or []
            total += sum(1 for block in table if not block.is_null)
        return total

    def touch(self, hits: GroupBlocks) -> None:
        """Touch each group's hit blocks (refcount up, out of the free queue).

        Upstream: `BlockPool.touch` per group, `vllm/v1/core/block_pool.py:L322-336 (0.11.0)`.
        """
        for group_id, group_hits in enumerate(hits):
            before = self.block_pool.num_held_blocks
            self.block_pool.touch(group_hits)
            self._count(group_id, before)

    def allocate_new_blocks(
        self, request_id: int, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> GroupBlocks:
        """None; an "align" Mamba group grows on `num_tokens_main_model` (None: `num_tokens`).

        Upstream `KVCacheCoordinator.allocate_new_blocks`:
        `vllm/v1/core/kv_cache_coordinator.py:L93-116 (0.11.0)`, `L143-176 (0.19.1)`.
        """
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        new_blocks = []
        for group_id, manager in enumerate(self.managers):
            before = self.block_pool.num_held_blocks
            if isinstance(manager, MambaManager) and manager.mamba_align:
                new_blocks.append(manager.allocate_new_blocks(request_id, main))
            else:
                new_blocks.append(manager.allocate_new_blocks(request_id, num_tokens))
            self._count(group_id, before)
        return tuple(new_blocks)

    def allocate_new_block_ids(
        self, request_id: int, num_tokens: int, num_tokens_main_model: int | None = None
    ) -> list[int]:
        """`allocate_new_blocks`, flat as ids (what `allocate_slots` answers).

        kvsim's own (no upstream counterpart).
        """
        return [
            block.block_id
            for group_blocks in self.allocate_new_blocks(
                request_id, num_tokens, num_tokens_main_model
            )
            for block in group_blocks
        ]

    def cache_blocks(self, request: Sequence, num_tokens: int) -> None:
        """None.

        Upstream `KVCacheCoordinator.cache_blocks`: `vllm/v1/core/kv_cache_coordinator.py:L118-129
        (0.11.0)`.
        """
        hashes = self.block_hashes(request, num_tokens // self.block_size)
        # 0.33.0's sparse retention keeps a Mamba state (`mamba_checkpoint`), or a sliding
        # window's last blocks (`sliding_retention`), at these.
        reachable = (request.prompt_len - 1, request.shared_prefix_boundary)
        for manager, group_hashes in zip(self.managers, hashes, strict=True):
            if (isinstance(manager, MambaManager) and manager.checkpoints is not None) or (
                isinstance(manager, SlidingWindowManager) and manager.retention is not None
            ):
                manager.cache_blocks(request.seq_id, group_hashes, num_tokens, reachable)
            else:
                manager.cache_blocks(request.seq_id, group_hashes, num_tokens)

    def free(self, request_id: int) -> None:
        """Each group frees its table, tail first, in group-id order (`L131-139`), counting each.

        Upstream `KVCacheCoordinator.free`: `vllm/v1/core/kv_cache_coordinator.py:L131-139
        (0.11.0)`.
        """
        for group_id, manager in enumerate(self.managers):
            before = self.block_pool.num_held_blocks
            manager.free(request_id)
            self._count(group_id, before)
