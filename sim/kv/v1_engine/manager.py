"""The V1 engine's `KVCacheManager`: prefix-cache lookup, per-step slot allocation, free.

Pinned per release by `config.vllm_pin` (`releases.py`): the free order of the block pool
(`free_order.py`) and the full-sequence admission count (`admission.py`) differ by release;
the rest follows 4ac7713, which 0.11.0 and 0.33.0 match for one KV group (docs/vllm-v1-changes.md).

Models `KVCacheManager` (`vllm/v1/core/kv_cache_manager.py:L67-410 @4ac7713`) together with the
unitary and no-prefix-cache coordinators (`kv_cache_coordinator.py:L14-236 @4ac7713`), for one
KV group: full attention, or all layers sliding-window when `config.sliding_window` is set
(spec §6.2-6.4). Several groups (a hybrid model): `hybrid_manager.HybridKVCacheManager`.

There is no admission query. `allocate_slots` counts the blocks a step needs and takes them
with the same arithmetic, and returns None (changing nothing but the sliding-window frees of
step 1) when the free queue is short. Order of one call (spec §6.2):

1. `remove_skipped_blocks(req, C)` (SWA frees blocks outside the window; runs even on failure);
2. `need = min(C + hits_tokens + n + lookahead, max_model_len)`;
3. `k = get_num_blocks_to_allocate(req, need, hits)`; if `k > free`: return None;
4. touch the hits, start the table with them, allocate `cdiv(need, bs) - len(table)` blocks;
5. with caching, cache the blocks filled by `min(C + hits_tokens + n, num_tokens)` tokens.

Worked example (spec vector 6: 11 blocks, bs=16, W=16, no caching)::

    A: allocate_slots(A, 112)          -> blocks 1..7, free 3
    B: allocate_slots(B, 64)           -> None (4 > 3)
    B: allocate_slots(B, 32)           -> [8, 9], free 1
    B (C=32): allocate_slots(B, 32)    -> frees block 8 (outside the window) to the tail
                                          of the queue [10], then takes [10, 8]; free 0
    A (C=112, 113 tokens): allocate_slots(A, 1) -> frees 6 blocks, takes 1; A holds 2

The request is a `Sequence`: its id is `seq_id`, its length `num_tokens`, and C is
`num_computed_tokens`, which the scheduler advances after each step.
"""

from __future__ import annotations

from sim.kv.config import KVCacheConfig
from sim.kv.types import NONE_HASH, BlockHash, Sequence, chain_hash, num_leading_nulls
from sim.kv.v1_engine.admission import admission_cap_blocks, num_blocks_to_admit
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.free_order import free_order_for
from sim.kv.v1_engine.pool_queries import PoolQueries
from sim.kv.v1_engine.releases import resolve_release
from sim.kv.v1_engine.single_type import (
    FullAttentionManager,
    SingleTypeManager,
    SlidingWindowManager,
)


class KVCacheManager(PoolQueries):
    """vLLM ~0.10 V1-engine KV cache manager over one KV group (see module docstring)."""

    def __init__(self, config: KVCacheConfig) -> None:
        if config.max_model_len is not None and config.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {config.max_model_len}")
        if config.kv_cache_groups:
            raise ValueError("KV-cache groups given: build with make_kv_cache_manager")
        self.config = config
        self.block_size = config.block_size
        #: The V1 engine has no watermark (spec §6.1).
        self.watermark_blocks = 0
        self.enable_caching = config.enable_prefix_caching
        self.max_model_len = config.max_model_len
        self.sliding_window = config.sliding_window
        #: The pinned release (`releases.py`); None in the config is 4ac7713.
        self.vllm_release = resolve_release(config.vllm_pin)
        self.block_pool = BlockPool(
            config.num_gpu_blocks, self.enable_caching, free_order_for(self.vllm_release)
        )
        self.single_type_manager: SingleTypeManager
        if config.sliding_window is None:
            self.single_type_manager = FullAttentionManager(self.block_pool, self.block_size)
        else:
            self.single_type_manager = SlidingWindowManager(
                self.block_pool,
                self.block_size,
                config.sliding_window,
                only_reachable_cached=self.vllm_release.caches_only_reachable_window_blocks,
            )
        #: Chained hashes of each request's full blocks, extended as tokens are appended.
        self.req_to_block_hashes: dict[int, list[BlockHash]] = {}
        # For the sliding-window footprint bound: the C of the last remove_skipped_blocks call
        # and the largest slot count ever allocated, per request holding blocks.
        self._req_to_skip_tokens: dict[int, int] = {}
        self._req_to_max_need_tokens: dict[int, int] = {}

    # ------------------------------------------------------------------------------ hashing
    def _block_hashes(self, request: Sequence, num_blocks: int) -> list[BlockHash]:
        """The request's hash list, extended to at least `num_blocks` full blocks.

        Same values as `request.content.block_hashes(bs, n)` (parent of block 0 = NONE_HASH),
        computed incrementally so a long decode does not rehash its whole history.
        """
        hashes = self.req_to_block_hashes.setdefault(request.seq_id, [])
        parent = hashes[-1] if hashes else NONE_HASH
        for index in range(len(hashes), num_blocks):
            parent = chain_hash(parent, request.content.block_key(index, self.block_size))
            hashes.append(BlockHash(parent))
        return hashes

    # ------------------------------------------------------------------------------ V1 API
    def get_computed_blocks(self, request: Sequence) -> tuple[list[int], int]:
        """Prefix-cache hit as (block ids, computed tokens); ([], 0) with caching off.

        The last token is always recomputed (its logits are needed), so the hit covers at most
        `num_tokens - 1` tokens; hits are whole blocks, so a fully cached 64-token prompt
        (bs=16) hits 3 blocks and recomputes the 4th (`kv_cache_manager.py:L144-193`).
        Sliding-window hits may start with null blocks (id 0).
        """
        if not self.enable_caching:
            return [], 0
        num_full_blocks = request.num_tokens // self.block_size
        block_hashes = self._block_hashes(request, num_full_blocks)
        hits = self.single_type_manager.find_longest_cache_hit(block_hashes, request.num_tokens - 1)
        return [b.block_id for b in hits], len(hits) * self.block_size

    def allocate_slots(
        self,
        request: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: list[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Give the request slots for this step; the new block ids, or None if the pool is short.

        Example (bs=16, 11 blocks, full attention): a fresh 112-token request takes blocks
        1..7 (`cdiv(112, 16) = 7`), leaving 3 free; another asking for 64 tokens then needs 4
        and gets None, with nothing changed.
        """
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be greater than 0, got {num_new_tokens}")
        if num_new_computed_tokens < 0 or num_lookahead_tokens < 0:
            raise ValueError("num_new_computed_tokens and num_lookahead_tokens must be >= 0")
        # Only a new request's first call can bring prefix hits; every other call skips the
        # checks and the hit handling below (each is a no-op without hits).
        if new_computed_block_ids or num_new_computed_tokens:
            hits = self._resolve_hits(new_computed_block_ids or [], num_new_computed_tokens)
        else:
            hits = None
        request_id = request.seq_id
        manager = self.single_type_manager
        block_size = self.block_size
        num_skip_tokens = request.num_computed_tokens
        # `blocks_of`, inlined (hot): get, not setdefault, so no list is built per call.
        table = manager.req_to_blocks.get(request_id)
        if table is None:
            table = manager.req_to_blocks[request_id] = []

        # Step 1: free out-of-window blocks first, so fewer cached blocks get evicted; this
        # stands even when the step then fails (`kv_cache_manager.py:L258-266`). Full
        # attention skips nothing. With a window, `remove_skipped_blocks` runs only when it
        # has work: a block left the window since the last call (the entry before the first
        # useful block is not null yet), or C runs past the table (it raises). That is its
        # own opening test, inlined here because most calls free nothing.
        sliding_window = self.sliding_window
        if sliding_window is not None:
            first_useful_block = (num_skip_tokens - sliding_window + 1) // block_size
            if first_useful_block > 0 and (
                first_useful_block > len(table) or not table[first_useful_block - 1].is_null
            ):
                manager.remove_skipped_blocks(request_id, num_skip_tokens)
        self._req_to_skip_tokens[request_id] = num_skip_tokens

        # Steps 2-4: count and check with the arithmetic the allocation then uses.
        num_computed_tokens = num_skip_tokens + num_new_computed_tokens
        num_tokens_need_slot = num_computed_tokens + num_new_tokens + num_lookahead_tokens
        if self.max_model_len is not None and num_tokens_need_slot > self.max_model_len:
            num_tokens_need_slot = self.max_model_len
        block_pool = self.block_pool
        if hits:
            num_blocks_to_allocate = manager.get_num_blocks_to_allocate(
                request_id, num_tokens_need_slot, hits
            )
        else:
            # `get_num_blocks_to_allocate` without hits (cdiv inlined).
            num_blocks_to_allocate = -(-num_tokens_need_slot // block_size) - len(table)
        if num_blocks_to_allocate > len(block_pool.free_block_queue):
            return None

        if hits:
            block_pool.touch(hits)
            manager.save_new_computed_blocks(request_id, hits)
            new_block_ids = [
                b.block_id for b in manager.allocate_new_blocks(request_id, num_tokens_need_slot)
            ]
        else:
            if request_id not in manager.num_cached_block:
                # A new request without hits: touching none is a no-op; this starts the
                # (empty) table and its cached count.
                manager.save_new_computed_blocks(request_id, [])
            if num_blocks_to_allocate > 0:
                # `allocate_new_blocks` without hits: the table grows by exactly the count above.
                new_block_ids = block_pool.get_new_blocks_into(num_blocks_to_allocate, table)
            else:
                new_block_ids = []
        if num_tokens_need_slot > self._req_to_max_need_tokens.get(request_id, 0):
            self._req_to_max_need_tokens[request_id] = num_tokens_need_slot

        # Step 5: cache blocks that this step's scheduled tokens fill, but never lookahead
        # (draft) slots: the cap at num_tokens keeps unfinalised tokens out of the cache.
        if self.enable_caching:
            num_tokens_to_cache = min(num_computed_tokens + num_new_tokens, request.num_tokens)
            block_hashes = self._block_hashes(request, num_tokens_to_cache // block_size)
            manager.cache_blocks(request_id, block_hashes, num_tokens_to_cache)
        return new_block_ids

    def num_blocks_to_admit(
        self, request: Sequence, new_computed_block_ids: list[int], max_in_flight_tokens: int
    ) -> int:
        """0.33.0's full-sequence count for a waiting request (`sim.kv.v1_engine.admission`);
        a pure query. Example (bs=16, no hits): a 200-token prompt needs 13."""
        num_tokens = request.num_tokens
        if self.max_model_len is not None:
            num_tokens = min(num_tokens, self.max_model_len)
        hits = [self.block_pool.blocks[i] for i in new_computed_block_ids]
        return num_blocks_to_admit(
            self.single_type_manager,
            request.seq_id,
            num_tokens,
            hits,
            request.num_computed_tokens + len(hits) * self.block_size,
            self.sliding_window,
            admission_cap_blocks(
                self.sliding_window, self.block_size, max_in_flight_tokens, self.max_model_len
            ),
        )

    def _resolve_hits(
        self, block_ids: list[int], num_new_computed_tokens: int
    ) -> list[KVCacheBlock]:
        if block_ids and not self.enable_caching:
            raise ValueError("new_computed_block_ids given but prefix caching is disabled")
        if num_new_computed_tokens != len(block_ids) * self.block_size:
            raise ValueError(
                f"num_new_computed_tokens={num_new_computed_tokens} does not match "
                f"{len(block_ids)} hit blocks of {self.block_size} tokens"
            )
        for block_id in block_ids:
            if not 0 <= block_id < self.block_pool.num_gpu_blocks:
                raise ValueError(
                    f"hit block id {block_id} outside 0..{self.block_pool.num_gpu_blocks - 1}"
                )
        return [self.block_pool.blocks[block_id] for block_id in block_ids]

    def free(self, request: Sequence) -> None:
        """Free the request's table in reverse order, so its tail is evicted first.

        The request's block hashes are dropped too (upstream keeps them across preemption
        and drops them in `free_block_hashes` at finish); they are a pure function of the
        token content, so recomputing them later yields the same values.
        """
        request_id = request.seq_id
        self.single_type_manager.free(request_id)
        self.req_to_block_hashes.pop(request_id, None)  # `free_block_hashes`, inlined
        self._req_to_skip_tokens.pop(request_id, None)
        self._req_to_max_need_tokens.pop(request_id, None)

    def free_block_hashes(self, request: Sequence) -> None:
        self.req_to_block_hashes.pop(request.seq_id, None)

    def get_block_ids(self, request_id: int) -> list[int]:
        return [b.block_id for b in self.single_type_manager.req_to_blocks.get(request_id, [])]

    # --------------------------------------------------------------------- decode fast path
    def decode_touch_len(self, request: Sequence) -> int | None:
        """The first decode length X (``C = X - 1``) at which `allocate_slots(request, 1)` may
        change anything; below it the call returns [] and changes nothing but the per-request
        counters that `sync_decode` replays.

        Touch points: ``len(table) * bs + 1`` (a new block); with a window, the first X whose
        first useful block ``(X - W) // bs`` passes the leading null entries (a free); with
        caching, ``(num_cached + 1) * bs`` (a block fills and is cached).

        Example (bs=16, W=24, no caching): after the decode at X=113 the table has 8 entries,
        0..4 null. Candidates 8*16 + 1 = 129 and (5 + 1)*16 + 24 = 120: decodes 114..119 are
        quiet, 120 is returned (block 5 leaves the window). None when the request holds no
        table or used lookahead slots.
        """
        request_id = request.seq_id
        manager = self.single_type_manager
        table = manager.req_to_blocks.get(request_id)
        max_need_tokens = self._req_to_max_need_tokens.get(request_id)
        if not table or max_need_tokens is None or request_id not in manager.num_cached_block:
            return None
        num_tokens = request.content.num_tokens
        if max_need_tokens > num_tokens:
            return None  # lookahead slots: not a plain decode
        bs = self.block_size
        touch_len = len(table) * bs + 1
        if self.enable_caching:
            num_cached = manager.num_cached_block[request_id]
            hashes = self.req_to_block_hashes.get(request_id)
            if hashes is None or len(hashes) < num_cached or num_cached * bs > num_tokens:
                return num_tokens
            touch_len = min(touch_len, (num_cached + 1) * bs)
        sliding_window = self.sliding_window
        if sliding_window is not None:
            # The leading-null count of `num_seq_blocks`, inlined (hot: after every real call).
            num_leading_null = (
                self._req_to_skip_tokens.get(request_id, 0) - sliding_window + 1
            ) // bs
            if num_leading_null < 0:
                num_leading_null = 0
            if not (
                num_leading_null < len(table)
                and not table[num_leading_null].is_null
                and (num_leading_null == 0 or table[num_leading_null - 1].is_null)
            ):
                num_leading_null = num_leading_nulls(table)
            window_touch_len = (num_leading_null + 1) * bs + sliding_window
            if window_touch_len < touch_len:
                touch_len = window_touch_len
        return touch_len if touch_len > num_tokens else num_tokens

    def sync_decode(self, request: Sequence) -> None:
        """Replay the per-request counters of skipped quiet one-token steps.

        A quiet step at C computed tokens sets the skip mark to C and the largest slot count to
        ``min(C + 1, max_model_len)``; nothing else. The last real call covered ``T`` slots
        (its largest slot count) and the scheduler advanced C to T; each skipped step advanced
        C by one more. So with C now above T, the last skipped step ran at ``C - 1``.
        Example (bs=16): last call at X=21 (T=21, skip 20), decodes 22..25 skipped, sync at
        L=26 (C=25) -> T=25, skip 24. A no-op when ``C <= T`` (nothing was skipped, e.g.
        between prefill chunks or after a failed call).
        """
        request_id = request.seq_id
        max_need_tokens = self._req_to_max_need_tokens.get(request_id)
        num_computed_tokens = request.num_computed_tokens
        if max_need_tokens is None or num_computed_tokens <= max_need_tokens:
            return
        # T = max(T, min(C, max_model_len)), with conditionals rather than builtin calls (hot).
        need_tokens = num_computed_tokens
        if self.max_model_len is not None and self.max_model_len < need_tokens:
            need_tokens = self.max_model_len
        if need_tokens > max_need_tokens:
            self._req_to_max_need_tokens[request_id] = need_tokens
        self._req_to_skip_tokens[request_id] = num_computed_tokens - 1

    # ---------------------------------------------------------------------- introspection

    def seq_block_ids(self, seq_id: int) -> list[int]:
        return self.get_block_ids(seq_id)

    def num_seq_blocks(self, seq_id: int) -> int:
        """Non-null blocks in the table, in O(1) when the window's last cut is the boundary.

        A table never repeats a block and its null entries are a prefix (skipped blocks, or the
        padding of a sliding-window cache hit), so this is ``len(table)`` less the leading
        nulls, not a set. After `remove_skipped_blocks(C)` the nulls end at
        ``(C - W + 1) // bs`` unless a cache hit padded further; the two entries around that
        index confirm the guess, otherwise a binary search decides (`num_leading_nulls`). Full
        attention never skips, so its guess is 0, confirmed by a non-null ``table[0]``.
        `decode_touch_len` inlines the same count.
        """
        table = self.single_type_manager.req_to_blocks.get(seq_id)
        if not table:
            return 0
        num_leading_null = 0
        if self.sliding_window is not None:
            num_leading_null = (
                self._req_to_skip_tokens.get(seq_id, 0) - self.sliding_window + 1
            ) // self.block_size
            if num_leading_null < 0:
                num_leading_null = 0
        num_blocks = len(table)
        if (
            num_leading_null < num_blocks
            and not table[num_leading_null].is_null
            and (num_leading_null == 0 or table[num_leading_null - 1].is_null)
        ):
            return num_blocks - num_leading_null
        return num_blocks - num_leading_nulls(table)

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """Sliding window: the per-step live-block bound of spec §6.3; None for full attention.

        Returns ``cdiv(T, bs) - floor(max(0, C - W + 1) / bs)`` where C is the
        `num_computed_tokens` of the request's last `allocate_slots` call (what
        `remove_skipped_blocks` used) and T the largest slot count it was ever given (its table
        length in blocks is `cdiv(T, bs)`). It is exact after a step without prefix hits
        (hits' null padding makes it loose). In decode (T = C + 1) it never exceeds
        `cdiv(W - 1, bs) + 1`; e.g. bs=16, W=24, C=112: cdiv(113, 16) - floor(89 / 16) = 3.
        A request that holds nothing gets 0.
        """
        sliding_window = self.sliding_window
        if sliding_window is None:
            return None
        request_id = seq.seq_id
        need_tokens = self._req_to_max_need_tokens.get(request_id)
        if need_tokens is None:
            return 0
        # Read after every allocation that took blocks: cdiv and both max(0, .) inlined.
        bs = self.block_size
        num_skipped_tokens = self._req_to_skip_tokens[request_id] - sliding_window + 1
        num_skipped_blocks = num_skipped_tokens // bs if num_skipped_tokens > 0 else 0
        footprint = -(-need_tokens // bs) - num_skipped_blocks
        return footprint if footprint > 0 else 0

    def recover_leaked_blocks(self) -> int:
        """Never leaks: a failed `allocate_slots` takes nothing."""
        return 0
