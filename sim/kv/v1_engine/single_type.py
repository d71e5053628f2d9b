"""Per-attention-type block logic of the V1 engine: full attention and sliding window.

Models `SingleTypeKVCacheManager`, `FullAttentionManager` and `SlidingWindowManager`
(`vllm/v1/core/single_type_kv_cache_manager.py:L17-401 (0.11.0)`; written at 4ac7713, spec
§6.3). Each manager owns the block tables (`req_to_blocks`) of one KV group; all of them draw
from one `BlockPool`.

The block count a step needs and the blocks it then takes come from the same formula, so the
V1 engine cannot admit what it cannot allocate: with `T` tokens needing a slot and `H` prefix
hits, a step needs

    cdiv(T, bs) - H - len(table) + #{hits that are evictable (ref 0, not null)}

blocks, because touching an evictable hit takes it out of the free pool.

Each manager also answers the three questions the release code asks of its spec: how many
tokens the next token no longer reads (`num_skipped_tokens`, upstream
`get_num_skipped_tokens`), the per-request admission cap (`admission_cap_blocks`, upstream
`max_admission_blocks_per_request`), and, for the decode fast path, the first decode length at
which a block leaves what is read (`freeing_decode_len`). The chunked-local manager is
`sim.kv.v1_engine.chunked_local`.

Left out versus upstream (`vllm/v1/core/single_type_kv_cache_manager.py (0.11.0)`): the
cross-attention manager (`CrossAttentionManager`) and `get_num_common_prefix_blocks` of every
manager (cascade attention). The Mamba manager is `sim.kv.v1_engine.mamba`.
"""

from __future__ import annotations

import abc

from sim.kv.types import BlockHash, cdiv, num_leading_nulls
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.sliding_retention import SparseWindowRetention, cache_masked_blocks


def sliding_window_cap_blocks(
    sliding_window: int, block_size: int, max_in_flight_tokens: int, max_model_len: int | None
) -> int:
    """``cdiv(min(W - 1 + T, max_model_len), bs) + 1``. Example (bs=16, W=32, T=64): 7.

    Upstream `SlidingWindowSpec.max_admission_blocks_per_request`:
    `vllm/v1/kv_cache_interface.py:L918-944 (0.33.0)`.
    """
    num_tokens = sliding_window - 1 + max_in_flight_tokens
    if max_model_len is not None and max_model_len < num_tokens:
        num_tokens = max_model_len
    return cdiv(num_tokens, block_size) + 1


class SingleTypeManager(abc.ABC):
    """Block tables of one KV group; subclasses say what a cache hit is and what is skipped."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        self.block_pool = block_pool
        self.block_size = block_size
        self.req_to_blocks: dict[int, list[KVCacheBlock]] = {}
        #: Per request with any: the null entries at the front of its table (only sliding
        #: windows make them). Nulls are always a prefix (a hit's padding, then the skipped
        #: blocks), so a count says where they end: `num_leading_null_blocks` is a lookup,
        #: not a scan of the table.
        self.req_to_num_null_blocks: dict[int, int] = {}
        #: Leading table entries already cached (only for requests that got their first
        #: allocation; upstream uses its presence to tell a new request from a running one).
        self.num_cached_block: dict[int, int] = {}

    def blocks_of(self, request_id: int) -> list[KVCacheBlock]:
        """`request_id`'s block list (empty when it has none).

        kvsim's own (no upstream counterpart).
        """
        # Upstream's defaultdict creates an empty table on first access; so do we.
        return self.req_to_blocks.setdefault(request_id, [])

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """Blocks the free pool must supply to give `num_tokens` slots (`L58-85`).

        Example (bs=16): a running request with 2 blocks asking for 64 tokens needs
        ``cdiv(64, 16) - 0 - 2 = 2``; a new one with 3 hits, one of them evictable, asking for
        64 tokens needs ``4 - 3 - 0 + 1 = 2``.

        Upstream `SingleTypeKVCacheManager.get_num_blocks_to_allocate`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L59-86 (0.11.0)`.
        """
        num_required_blocks = cdiv(num_tokens, self.block_size)
        num_new_blocks = (
            num_required_blocks - len(new_computed_blocks) - len(self.blocks_of(request_id))
        )
        if not new_computed_blocks:
            return num_new_blocks  # the common case: no hits, so none is evictable
        num_evictable_hits = sum(1 for b in new_computed_blocks if b.ref_cnt == 0 and not b.is_null)
        return num_new_blocks + num_evictable_hits

    def save_new_computed_blocks(
        self, request_id: int, new_computed_blocks: list[KVCacheBlock]
    ) -> None:
        """Start a new request's table with its prefix hits (`L87-106`).

        Upstream `SingleTypeKVCacheManager.save_new_computed_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L88-107 (0.11.0)`.
        """
        if request_id not in self.num_cached_block:
            table = self.blocks_of(request_id)
            assert not table, f"request {request_id} has blocks but no cached count"
            table.extend(new_computed_blocks)
            self.num_cached_block[request_id] = len(new_computed_blocks)
            # A sliding or chunked hit's padding is a prefix of nulls (full hits have none).
            num_nulls = num_leading_nulls(new_computed_blocks) if new_computed_blocks else 0
            if num_nulls:
                self.req_to_num_null_blocks[request_id] = num_nulls
        elif new_computed_blocks:
            raise ValueError(f"request {request_id} is running; it cannot take new prefix hits")

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> list[KVCacheBlock]:
        """Grow the table to `cdiv(num_tokens, bs)` entries from the free pool (`L108-130`).

        Upstream `SingleTypeKVCacheManager.allocate_new_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L109-131 (0.11.0)`.
        """
        table = self.blocks_of(request_id)
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(table)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        table.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request_id: int, block_hashes: list[BlockHash], num_tokens: int) -> None:
        """Cache the blocks that `num_tokens` tokens fill completely (`L132-157`).

        Upstream `SingleTypeKVCacheManager.cache_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L133-154 (0.11.0)`.
        """
        num_cached_blocks = self.num_cached_block[request_id]
        num_full_blocks = num_tokens // self.block_size
        if num_full_blocks > num_cached_blocks:
            self.block_pool.cache_full_blocks(
                self.req_to_blocks[request_id], block_hashes, num_cached_blocks, num_full_blocks
            )
        # Upstream stores num_full_blocks unconditionally (it never shrinks in practice).
        self.num_cached_block[request_id] = num_full_blocks

    def free(self, request_id: int) -> None:
        """Release the whole table, tail first, so the tail is evicted first (`L159-174`).

        Upstream `SingleTypeKVCacheManager.free`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L156-171 (0.11.0)`.
        """
        table = self.req_to_blocks.pop(request_id, [])
        self.block_pool.free_blocks(reversed(table))
        self.num_cached_block.pop(request_id, None)
        self.req_to_num_null_blocks.pop(request_id, None)

    def _free_before(
        self, request_id: int, table: list[KVCacheBlock], first_useful_block: int
    ) -> None:
        """Null and free the table's entries before `first_useful_block`, walking back to the
        first null (earlier calls nulled everything before it); a no-op when nothing new left
        what is read. Shared by the sliding-window and chunked-local frees (upstream's loop,
        `vllm/v1/core/single_type_kv_cache_manager.py:L381-391 (0.11.0)`).

        kvsim's own (no upstream counterpart).
        """
        if first_useful_block <= self.req_to_num_null_blocks.get(request_id, 0):
            return  # nothing left the window since the last call (most calls)
        removed: list[KVCacheBlock] = []
        for index in range(first_useful_block - 1, -1, -1):
            if table[index].is_null:
                break
            removed.append(table[index])
            table[index] = self.block_pool.null_block
        # Everything before the first useful block is null now.
        self.req_to_num_null_blocks[request_id] = first_useful_block
        self.block_pool.free_blocks(removed)

    def num_leading_null_blocks(self, request_id: int) -> int:
        """Null entries at the front of the request's table (kvsim's query, for the footprint
        bound and the decode fast path). Example (bs=16, W=24): after
        `remove_skipped_blocks(r, 112)` blocks 0..4 are null -> 5; full attention: 0.

        kvsim's own (no upstream counterpart).
        """
        return self.req_to_num_null_blocks.get(request_id, 0)

    # Per-request forms of the queries below, for a type whose answer depends on more than
    # the leading nulls and C (R-SWA's gap needs the prompt length; a circular buffer's table
    # never grows past one block: `sim.kv.v1_engine.full_variants`).
    def num_null_blocks(self, request_id: int) -> int:
        """Null entries anywhere in the request's table (every type but R-SWA: the leading
        ones). kvsim's own (no upstream counterpart)."""
        return self.num_leading_null_blocks(request_id)

    def num_required_blocks(self, num_tokens: int) -> int:
        """Table entries `num_tokens` slots need: ``cdiv(T, bs)`` (a circular buffer: 1).
        kvsim's own (no upstream counterpart)."""
        return cdiv(num_tokens, self.block_size)

    def next_growth_decode_len(self, table_len: int) -> int | None:
        """The first decode length at which a table of `table_len` entries takes a block:
        ``table_len * bs + 1``; None: never. kvsim's own (no upstream counterpart)."""
        return table_len * self.block_size + 1

    def next_freeing_decode_len(self, request_id: int) -> int | None:
        """`freeing_decode_len` of the request's table. kvsim's own (no upstream
        counterpart)."""
        return self.freeing_decode_len(self.num_leading_null_blocks(request_id))

    def num_freed_blocks_of(self, request_id: int, num_computed_tokens: int) -> int:
        """`num_freed_blocks_at_least` for the request. kvsim's own (no upstream
        counterpart)."""
        return self.num_freed_blocks_at_least(num_computed_tokens)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the token at position `num_computed_tokens` (full
        attention: none).

        Upstream `SingleTypeKVCacheManager.get_num_skipped_tokens`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L424-435 (0.20.0)`.
        """
        return 0

    def num_freed_blocks_at_least(self, num_computed_tokens: int) -> int:
        """Leading blocks `remove_skipped_blocks(r, C)` is sure to have freed (the footprint
        bound): ``num_skipped_tokens(C) // bs``. Example (bs=16, W=24, C=112): 5.

        kvsim's own (no upstream counterpart).
        """
        return self.num_skipped_tokens(num_computed_tokens) // self.block_size

    def admission_cap_blocks(
        self, max_in_flight_tokens: int, max_model_len: int | None
    ) -> int | None:
        """The per-request admission cap in blocks; None: no cap (full attention).

        Upstream: the spec's `max_admission_blocks_per_request` (full attention has none),
        `vllm/v1/core/single_type_kv_cache_manager.py:L2636-2651 (0.33.0)`.
        """
        return None

    def freeing_decode_len(self, num_null_blocks: int) -> int | None:
        """The first decode length X (``C = X - 1``) at which `remove_skipped_blocks` frees a
        block of a table whose first `num_null_blocks` entries are null; None: never.

        kvsim's own (no upstream counterpart).
        """
        return None

    @abc.abstractmethod
    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """The longest prefix-cache hit for these hashes (each attention type has its rule).

        Upstream `SingleTypeKVCacheManager.find_longest_cache_hit`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L194-232 (0.11.0)`.
        """

    @abc.abstractmethod
    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """Free blocks no future token attends to (none for full attention).

        Upstream `SingleTypeKVCacheManager.remove_skipped_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L235-246 (0.11.0)`.
        """


class FullAttentionManager(SingleTypeManager):
    """Full attention: a hit is the longest cached chain prefix; nothing is ever skipped."""

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """Cached blocks for the longest prefix of at most `max_length // bs` blocks (`L250-277`).

        Hashes are chained, so the first miss ends the search. Example (bs=16): 64 tokens all
        cached, max_length = 63 -> 3 blocks (the last block is recomputed).

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L252-285 (0.11.0)`.
        """
        hits: list[KVCacheBlock] = []
        for block_hash in block_hashes[: max_length // self.block_size]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L287-290 (0.11.0)`."""
        return None


class SlidingWindowManager(SingleTypeManager):
    """Sliding-window attention of `sliding_window` tokens (`L299-394`).

    A token at position p attends to positions [p - W + 1, p]. Once C tokens are computed the
    next token is at C, so only tokens [C - W + 1, C] matter; blocks wholly before that are
    freed and replaced by the null block (block 0) in the table.
    """

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        sliding_window: int,
        *,
        only_reachable_cached: bool = False,
    ) -> None:
        super().__init__(block_pool, block_size)
        if sliding_window <= 0:
            raise ValueError(f"sliding_window must be positive, got {sliding_window}")
        self.sliding_window = sliding_window
        #: 0.33.0 caches a window block only if a hit can reach it: a hit ending at a block
        #: boundary needs the `cdiv(W - 1, bs)` blocks before it, so with W = 1 (none needed)
        #: no block of this group is ever cached (`reachable_block_mask`, all False). For
        #: W > 1 and one block size every block is reachable, as at 4ac7713.
        self._caches_nothing = only_reachable_cached and cdiv(sliding_window - 1, block_size) == 0
        #: 0.19.1 on cap the skipped blocks at the table's length (a window that moved past
        #: blocks not yet allocated, `L404-410 @0.20.0`); 0.11.0 indexes past it (kvsim:
        #: ValueError). Set by the manager from its pin (`VllmPin.clamps_skipped_to_table`).
        self.clamps_skipped_to_table = False
        #: 0.33.0 with `prefix_cache_retention_interval` 0: only the blocks ending at the
        #: replay boundary and the junction keep a hash (`sliding_retention`); None: dense.
        self.retention: SparseWindowRetention | None = None

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``max(0, C - W + 1)``: the token at C reads [C - W + 1, C]. Example (W=24,
        C=112): 89.

        Upstream `SlidingWindowManager.get_num_skipped_tokens`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L602-628 (0.20.0)`.
        """
        return max(0, num_computed_tokens - self.sliding_window + 1)

    def admission_cap_blocks(
        self, max_in_flight_tokens: int, max_model_len: int | None
    ) -> int | None:
        """``cdiv(min(W - 1 + T, max_model_len), bs) + 1``: a window that starts mid-block
        spans one block more than its tokens fill (`sim.kv.v1_engine.admission`).

        Upstream `SlidingWindowSpec.max_admission_blocks_per_request`:
        `vllm/v1/kv_cache_interface.py:L918-944 (0.33.0)`.
        """
        return sliding_window_cap_blocks(
            self.sliding_window, self.block_size, max_in_flight_tokens, max_model_len
        )

    def freeing_decode_len(self, num_null_blocks: int) -> int | None:
        """``(nulls + 1) * bs + W``: the first X whose first useful block ``(X - W) // bs``
        passes the nulls. Example (bs=16, W=24, 5 nulls): 120.

        kvsim's own (no upstream counterpart).
        """
        return (num_null_blocks + 1) * self.block_size + self.sliding_window

    def cache_blocks(
        self,
        request_id: int,
        block_hashes: list[BlockHash],
        num_tokens: int,
        reachable: tuple[int, ...] = (),
    ) -> None:
        """None; under sparse retention only the blocks a hit at a `reachable` boundary (the
        replay boundary, the junction) reads get a hash (`sliding_retention`).

        Upstream `SingleTypeKVCacheManager.cache_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L133-154 (0.11.0)`, `L477-542 (0.33.0)`.
        """
        if self.retention is not None:
            before = self.num_cached_block[request_id]
            num_full_blocks = num_tokens // self.block_size
            if num_full_blocks > before:
                mask = self.retention.retained_mask(before, num_full_blocks, reachable)
                table = self.req_to_blocks[request_id]
                cache_masked_blocks(self.block_pool, table, block_hashes, before, mask)
                self.num_cached_block[request_id] = num_full_blocks
            return
        if self._caches_nothing:
            # The cached count still advances (upstream stores it after an all-False mask).
            self.num_cached_block[request_id] = max(
                self.num_cached_block[request_id], num_tokens // self.block_size
            )
            return
        super().cache_blocks(request_id, block_hashes, num_tokens)

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """A hit needs `cdiv(W - 1, bs)` contiguous cached blocks, nulls before them.

        Scan right to left; the first run of `cdiv(W-1, bs)` cached blocks ends the search, the
        blocks before the run become null and those after it are dropped. Without such a run,
        only the run of hits starting at block 0 counts.

        Example (bs=4, W=8, so 2 contiguous blocks; max_length 19 -> 4 blocks considered):
        cached = {h0: 3, h2: 7, h3: 8} -> [NULL, NULL, 7, 8], i.e. 16 tokens computed
        (upstream's docstring example). cached = {h0: 3, h2: 7} -> [3] (the leading run).

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L313-373 (0.11.0)`.
        """
        num_contiguous_needed = cdiv(self.sliding_window - 1, self.block_size)
        max_num_blocks = max_length // self.block_size
        null = self.block_pool.null_block
        hits: list[KVCacheBlock] = [null] * max_num_blocks
        num_contiguous = 0
        for index in range(max_num_blocks - 1, -1, -1):
            block = self.block_pool.get_cached_block(block_hashes[index])
            if block is None:
                num_contiguous = 0
                continue
            hits[index] = block
            num_contiguous += 1
            if num_contiguous >= num_contiguous_needed:
                return hits[: index + num_contiguous]
        # No full run: the scan ended at block 0, so num_contiguous is the leading run.
        return hits[:num_contiguous]

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """Free the blocks before `floor((C - W + 1) / bs)`, walking back to the first null.

        Example (bs=16, W=16, C=112): the first useful block is floor(97 / 16) = 6, so blocks
        5, 4, ..., 0 are freed (in that order) and become null. With W=24 it is
        floor(89 / 16) = 5: blocks 4..0 are freed.

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L375-391 (0.11.0)`.
        """
        first_useful_block = (num_computed_tokens - self.sliding_window + 1) // self.block_size
        table = self.req_to_blocks.get(request_id)
        if table is None:  # `blocks_of`, with get: no empty list is built per call
            table = self.req_to_blocks[request_id] = []
        if first_useful_block > len(table) and self.clamps_skipped_to_table:
            first_useful_block = len(table)
        if first_useful_block > len(table):
            raise ValueError(
                f"request {request_id}: {num_computed_tokens} computed tokens but only "
                f"{len(table)} blocks in its table"
            )
        self._free_before(request_id, table, first_useful_block)
