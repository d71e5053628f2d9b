"""The V1 engine's `KVCacheManager` for a hybrid model: several KV-cache groups, one pool.

Same API and call order as `sim.kv.v1_engine.manager.KVCacheManager` (vLLM 0.11.0
`kv_cache_manager.py:L146-304`), with `HybridCoordinator` in place of the inlined one-group
coordinator. A request holds one block table per group; `allocate_slots` frees the blocks
that left every sliding group's window, then needs the sum over groups of
``cdiv(T, bs) - len(table_g)`` blocks (plus evictable hits), all or nothing.

Flat block ids at the API: `get_computed_blocks`, `get_block_ids` and the ids
`allocate_slots` returns list group 0's blocks, then group 1's, and so on. A prefix hit has
the same number H of blocks in every group, so its flat list has ``num_groups * H`` ids.

Decode fast path (`DecodeFastPath`): a one-token decode changes nothing until the first
touch point of any group: a new block (every group's table has the same length), a block
filling up with caching on, or, per sliding group, a block leaving its window. `sync_decode`
replays the per-request counters of the skipped steps, as the one-group manager does.

Worked example (bs=4, 9 blocks, group 0 sliding W=4, group 1 full, no caching)::

    A, 8 tokens: allocate_slots(A, 8)     -> group 0 [1, 2], group 1 [3, 4]; free 4
    A (C=8, 9 tokens): allocate_slots(A, 1)
        remove_skipped_blocks(8): first useful block (8 - 4 + 1) // 4 = 1, so group 0
        frees block 1 (-> free queue tail) and its table is [NULL, 2];
        then 1 new block per group: group 0 takes 5, group 1 takes 6; free 3 ([7, 8, 1])
    B, 8 tokens: allocate_slots(B, 8)     -> needs 4 > 3: None
    free(A)                               -> group 0 frees 5, 2; group 1 frees 6, 4, 3
"""

from __future__ import annotations

from sim.kv.config import KVCacheConfig
from sim.kv.types import NONE_HASH, BlockHash, Sequence, cdiv, chain_hash, num_leading_nulls
from sim.kv.v1_engine.admission import admission_cap_blocks, num_blocks_to_admit
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.coordinator import GroupBlocks, HybridCoordinator, group_block_hash
from sim.kv.v1_engine.free_order import free_order_for
from sim.kv.v1_engine.pool_queries import PoolQueries
from sim.kv.v1_engine.releases import resolve_release


class HybridKVCacheManager(PoolQueries):
    """V1-engine KV cache manager over two or more KV-cache groups (see module docstring)."""

    def __init__(self, config: KVCacheConfig) -> None:
        if config.max_model_len is not None and config.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {config.max_model_len}")
        if config.sliding_window is not None:
            raise ValueError("a hybrid config sets each group's window, not sliding_window")
        self.config = config
        self.block_size = config.block_size
        self.watermark_blocks = 0
        self.enable_caching = config.enable_prefix_caching
        self.max_model_len = config.max_model_len
        self.vllm_release = resolve_release(config.vllm_pin)
        self.block_pool = BlockPool(
            config.num_gpu_blocks, self.enable_caching, free_order_for(self.vllm_release)
        )
        self.coordinator = HybridCoordinator(
            self.block_pool,
            self.block_size,
            config.kv_cache_groups,
            only_reachable_cached=self.vllm_release.caches_only_reachable_window_blocks,
        )
        self.num_groups = len(config.kv_cache_groups)
        #: Per request, per group: cache keys of the request's full blocks (`group_block_hash`).
        self.req_to_block_hashes: dict[int, list[list[BlockHash]]] = {}
        #: Per request: the largest slot count allocated and the C of the last skip.
        self._req_to_max_need_tokens: dict[int, int] = {}
        self._req_to_skip_tokens: dict[int, int] = {}

    # ------------------------------------------------------------------------ hashing
    def _block_hashes(self, request: Sequence, num_blocks: int) -> list[list[BlockHash]]:
        """Each group's keys, extended to at least `num_blocks` full blocks."""
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

    # ------------------------------------------------------------------------- V1 API
    def get_computed_blocks(self, request: Sequence) -> tuple[list[int], int]:
        """The hybrid prefix hit (`find_longest_cache_hit`), flat, and its token count."""
        if not self.enable_caching:
            return [], 0
        hashes = self._block_hashes(request, request.num_tokens // self.block_size)
        hits, num_tokens = self.coordinator.find_longest_cache_hit(hashes, request.num_tokens - 1)
        return [block.block_id for group_hits in hits for block in group_hits], num_tokens

    def allocate_slots(
        self,
        request: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: list[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Slots for this step in every group; the new block ids (flat), or None if short."""
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be greater than 0, got {num_new_tokens}")
        if num_new_computed_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError("num_new_computed_tokens and num_lookahead_tokens must be >= 0")
        hits = self._resolve_hits(new_computed_block_ids or [], num_new_computed_tokens)
        request_id = request.seq_id
        coordinator = self.coordinator
        num_skip_tokens = request.num_computed_tokens
        # Frees stand even if the step then fails (`kv_cache_manager.py:L247-254 @0.11.0`).
        coordinator.remove_skipped_blocks(request_id, num_skip_tokens)
        self._req_to_skip_tokens[request_id] = num_skip_tokens

        num_computed_tokens = num_skip_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None:
            num_tokens_need_slot = min(num_tokens_need_slot, self.max_model_len)
        needed = coordinator.get_num_blocks_to_allocate(request_id, num_tokens_need_slot, hits)
        if needed > len(self.block_pool.free_block_queue):
            return None
        if self.enable_caching:
            coordinator.touch(hits)
        coordinator.save_new_computed_blocks(request_id, hits)
        new_blocks = coordinator.allocate_new_blocks(request_id, num_tokens_need_slot)
        if num_tokens_need_slot > self._req_to_max_need_tokens.get(request_id, 0):
            self._req_to_max_need_tokens[request_id] = num_tokens_need_slot
        if self.enable_caching:
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, request.num_tokens)
            hashes = self._block_hashes(request, num_tokens_to_cache // self.block_size)
            coordinator.cache_blocks(request_id, hashes, num_tokens_to_cache)
        return [block.block_id for group_blocks in new_blocks for block in group_blocks]

    def _resolve_hits(self, block_ids: list[int], num_new_computed_tokens: int) -> GroupBlocks:
        """Split a flat hit list into the groups' equal shares (see the module docstring)."""
        if block_ids and not self.enable_caching:
            raise ValueError("new_computed_block_ids given but prefix caching is disabled")
        num_hit_blocks = num_new_computed_tokens // self.block_size
        if (
            num_new_computed_tokens % self.block_size
            or len(block_ids) != num_hit_blocks * self.num_groups
        ):
            raise ValueError(
                f"num_new_computed_tokens={num_new_computed_tokens} does not match "
                f"{len(block_ids)} hit blocks over {self.num_groups} groups of "
                f"{self.block_size}-token blocks"
            )
        for block_id in block_ids:
            if not 0 <= block_id < self.block_pool.num_gpu_blocks:
                raise ValueError(
                    f"hit block id {block_id} outside 0..{self.block_pool.num_gpu_blocks - 1}"
                )
        blocks = [self.block_pool.blocks[block_id] for block_id in block_ids]
        return tuple(
            blocks[g * num_hit_blocks : (g + 1) * num_hit_blocks] for g in range(self.num_groups)
        )

    def num_blocks_to_admit(
        self, request: Sequence, new_computed_block_ids: list[int], max_in_flight_tokens: int
    ) -> int:
        """0.33.0's full-sequence count (`sim.kv.v1_engine.admission`), summed over groups as
        the coordinator's `get_num_blocks_to_allocate` sums them."""
        num_tokens = request.num_tokens
        if self.max_model_len is not None:
            num_tokens = min(num_tokens, self.max_model_len)
        hits = self._resolve_hits(
            new_computed_block_ids,
            len(new_computed_block_ids) // self.num_groups * self.block_size,
        )
        num_computed = request.num_computed_tokens + len(hits[0]) * self.block_size
        total = 0
        for group, manager, group_hits in zip(
            self.config.kv_cache_groups, self.coordinator.managers, hits, strict=True
        ):
            cap = admission_cap_blocks(
                group.sliding_window, self.block_size, max_in_flight_tokens, self.max_model_len
            )
            total += num_blocks_to_admit(
                manager,
                request.seq_id,
                num_tokens,
                group_hits,
                num_computed,
                group.sliding_window,
                cap,
            )
        return total

    def free(self, request: Sequence) -> None:
        """Free every group's table (group-id order, each tail first) and the hashes."""
        request_id = request.seq_id
        self.coordinator.free(request_id)
        self.req_to_block_hashes.pop(request_id, None)
        self._req_to_max_need_tokens.pop(request_id, None)
        self._req_to_skip_tokens.pop(request_id, None)

    def free_block_hashes(self, request: Sequence) -> None:
        self.req_to_block_hashes.pop(request.seq_id, None)

    # --------------------------------------------------------------- decode fast path
    def decode_touch_len(self, request: Sequence) -> int | None:
        """The first decode length at which `allocate_slots(request, 1)` may change anything
        (see `KVCacheManager.decode_touch_len`), the smallest over the groups.

        Example (bs=4, W=8 sliding + full, no caching): after a call at 10 tokens (tables of
        3 blocks, none null yet) the candidates are 3 * 4 + 1 = 13 (a new block) and
        (0 + 1) * 4 + 8 = 12 (block 0 leaves the window): 12.
        """
        request_id = request.seq_id
        tables = self.coordinator.get_blocks(request_id)
        max_need_tokens = self._req_to_max_need_tokens.get(request_id)
        first = self.coordinator.managers[0]
        if not tables[0] or max_need_tokens is None or request_id not in first.num_cached_block:
            return None
        num_tokens = request.content.num_tokens
        if max_need_tokens > num_tokens:
            return None  # lookahead slots: not a plain decode
        bs = self.block_size
        touch_len = min(len(table) for table in tables) * bs + 1
        if self.enable_caching:
            num_cached = min(m.num_cached_block[request_id] for m in self.coordinator.managers)
            hashes = self.req_to_block_hashes.get(request_id)
            if hashes is None or len(hashes[0]) < num_cached or num_cached * bs > num_tokens:
                return num_tokens
            touch_len = min(touch_len, (num_cached + 1) * bs)
        for group, table in zip(self.config.kv_cache_groups, tables, strict=True):
            if group.sliding_window is not None:
                window_touch_len = (num_leading_nulls(table) + 1) * bs + group.sliding_window
                touch_len = min(touch_len, window_touch_len)
        return max(touch_len, num_tokens)

    def sync_decode(self, request: Sequence) -> None:
        """Replay the per-request counters of skipped quiet decodes (as
        `KVCacheManager.sync_decode`): the last skipped step ran at ``C - 1``."""
        request_id = request.seq_id
        max_need_tokens = self._req_to_max_need_tokens.get(request_id)
        num_computed_tokens = request.num_computed_tokens
        if max_need_tokens is None or num_computed_tokens <= max_need_tokens:
            return
        need_tokens = num_computed_tokens
        if self.max_model_len is not None:
            need_tokens = min(need_tokens, self.max_model_len)
        self._req_to_max_need_tokens[request_id] = max(max_need_tokens, need_tokens)
        self._req_to_skip_tokens[request_id] = num_computed_tokens - 1

    # ------------------------------------------------------------------ introspection
    def group_block_ids(self, request_id: int) -> tuple[list[int], ...]:
        """The request's table in each group (null entries are block 0)."""
        return tuple(
            [block.block_id for block in table] for table in self.coordinator.get_blocks(request_id)
        )

    def get_block_ids(self, request_id: int) -> list[int]:
        return [block_id for table in self.group_block_ids(request_id) for block_id in table]

    def seq_block_ids(self, seq_id: int) -> list[int]:
        return self.get_block_ids(seq_id)

    def num_seq_blocks(self, seq_id: int) -> int:
        """Non-null blocks over all groups (a block is never in two of a request's tables)."""
        return sum(
            sum(1 for block in table if not block.is_null)
            for table in self.coordinator.get_blocks(seq_id)
        )

    def group_num_held_blocks(self) -> list[int]:
        """Non-null blocks in each group's live tables (a prefix-shared block counts once per
        group that holds it, however many requests share it)."""
        counts = []
        for manager in self.coordinator.managers:
            held: set[int] = set()
            for table in manager.req_to_blocks.values():
                held.update(block.block_id for block in table if not block.is_null)
            counts.append(len(held))
        return counts

    def group_peak_held_blocks(self) -> list[int]:
        """The most blocks each group's tables ever held at once (the summary's per-group
        block counts)."""
        return list(self.coordinator.peak_held_blocks)

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """Bound on `num_seq_blocks`: ``cdiv(T, bs)`` per full group plus, per sliding group,
        ``cdiv(T, bs) - floor(max(0, C - W + 1) / bs)`` (see `KVCacheManager.max_seq_footprint`).
        Example (bs=16, W=24, C=112, T=113, one group of each): 8 + 3 = 11."""
        need_tokens = self._req_to_max_need_tokens.get(seq.seq_id)
        if need_tokens is None:
            return 0
        num_table_blocks = cdiv(need_tokens, self.block_size)
        skip_tokens = self._req_to_skip_tokens.get(seq.seq_id, 0)
        bound = 0
        for group in self.config.kv_cache_groups:
            bound += num_table_blocks
            if group.sliding_window is not None:
                bound -= max(0, skip_tokens - group.sliding_window + 1) // self.block_size
        return bound

    def recover_leaked_blocks(self) -> int:
        """Never leaks: a failed `allocate_slots` takes nothing."""
        return 0
