"""Mamba / linear-attention state groups (Qwen3.5-style hybrids, Nemotron-H, Jamba).

Models `MambaManager` in vLLM's three Mamba cache modes: "align" and "all" (prefix caching on;
below, after the mode "none") and, first, the mode without prefix caching:
`vllm/v1/core/single_type_kv_cache_manager.py:L1428-2136 (0.33.0)` with
`mamba_cache_mode="none"` (the `CacheConfig` field's default, `vllm/config/cache.py:L304-311
(0.33.0)`), the same mode of 0.19.1 (`L769-1041`), 0.20.0 (`L790-1062`), 0.25.1
(`L1026-1367`) and 0.26.0 (`L1227-1686`), and `L529-603 (0.11.0)`, which has no modes and no
prefix caching for Mamba at all (it turns caching off for Mamba models,
`model_executor/models/config.py:L290-297 (0.11.0)`).

Which mode a server runs: from 0.19.1 `MambaModelConfig.verify_and_update_config` derives it
from `enable_prefix_caching` ("none" when off; "align", or 0.19.1-0.26.0's "all" where the
model supports it, when on: `model_executor/models/config.py:L436-480 (0.19.1)`,
`L762-787 (0.33.0)`), and `vllm serve` turns prefix caching on by default for generative
hybrid models (`ModelConfig.is_prefix_caching_supported`, `config/model.py:L2239-2291
(0.33.0)`). So "none" is what `--no-enable-prefix-caching` runs on 0.19.1 on, and what
0.11.0 always runs.

A Mamba layer keeps one fixed-size recurrent state per request, not a K/V entry per token.
vLLM still gives it a block table from the shared pool: the state is one page, and the
group's block size is `max_model_len` tokens (`MambaModelConfig.verify_and_update_config`,
`vllm/model_executor/models/config.py:L777-787 (0.33.0)`: `mamba_block_size` defaults to
max_model_len when prefix caching is off; 0.11.0 builds the spec with
`block_size=max_model_len`, `L355-362`). So a request holds exactly one block per Mamba
group from its first allocation to its free: ``cdiv(T, max_model_len) = 1`` for every
``1 <= T <= max_model_len`` (the manager clamps T there).

Per method, in this mode:

* `get_num_blocks_to_allocate` is the shared count (`L176-262 @0.33.0`, `L562-593 @0.11.0`):
  1 for a request's first call, 0 after. No hits exist (caching is off).
* `allocate_new_blocks` is the shared growth to ``cdiv(T, bs)`` entries (`L1797-1808`,
  `L370-411 @0.33.0`; `L595-603 @0.11.0`): one block, once.
* `remove_skipped_blocks`: 0.33.0 runs the shared free on ``get_num_skipped_tokens(C) =
  C - 1`` (`L1629-1657`, `L682-733`): ``(C - 1) // max_model_len = 0`` blocks while
  ``C <= max_model_len``, so nothing is ever freed; 0.11.0's is a no-op (`L552-556`). Same
  decisions, so one model serves both.
* `find_longest_cache_hit`: refused (0.11.0 returns no hits; 0.33.0 asserts
  ``mamba_cache_mode == "align" or not enable_caching``, `L1442-1444`, and turning prefix
  caching on switches the mode to "align", modelled below).

The five later releases differ from 0.33.0 in this mode only in code kvsim leaves out
(speculative blocks, KV connectors): 0.19.1 subtracts `num_speculative_blocks` from C before
the free, 0.25.1 on count them into "all" mode's start-up charge.
* admission cap: none. `MambaSpec` has no `max_admission_blocks_per_request`
  (`vllm/v1/kv_cache_interface.py:L1094-1166 (0.33.0)`; `get_manager_for_kv_cache_spec`
  passes a cap only to sliding-window, chunked-local and HiSparse specs, `L2608-2651`), so
  the full-sequence gate charges ``cdiv(min(T, max_model_len), max_model_len) = 1`` block.
  Start-up sizing charges one page too: `max_memory_usage_bytes` is
  ``page_size * (1 + num_speculative_blocks)`` outside "align" (`L1135-1141 @0.33.0`;
  ``page_size`` at 0.11.0, `L235-238`).

Worked example (bs=16, max_model_len 4,096, groups [full, mamba], 10 blocks, no caching):
a 40-token prompt takes blocks 1, 2, 3 for the full group and block 4 for the Mamba group
(``cdiv(40, 4096) = 1``); each decode asks the Mamba group for 0 blocks; at 49 tokens the
full group takes block 5 and the Mamba group still holds block 4 alone. Freed: group 0 frees
5, 3, 2, 1 (tail first), then group 1 frees 4.

The prefix-caching modes, "align" (with 0.33.0's additions, `sim.kv.v1_engine.mamba_checkpoint`)
and "all" (0.19.1-0.26.0), and their shared hit rule (`mamba_align_hit`) are described in
`sim.kv.v1_engine.mamba_modes`; `MambaManager` below carries their per-method branches
(`mamba_align`, `mamba_all`).
"""

from __future__ import annotations

from sim.kv.types import BlockHash, cdiv
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.mamba_checkpoint import AlignCheckpoints
from sim.kv.v1_engine.mamba_modes import mamba_align_hit
from sim.kv.v1_engine.single_type import SingleTypeManager


class MambaManager(SingleTypeManager):
    """One Mamba state group (module docstring): `block_size` is the group's own,
    `max_model_len` tokens with caching off, the attention block size in "align" mode
    (`mamba_align`, set by the coordinator)."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        super().__init__(block_pool, block_size)
        #: Mamba cache mode "align" (prefix caching on); False: mode "none" or "all".
        self.mamba_align = False
        #: Mamba cache mode "all" (0.19.1-0.26.0, prefix caching on): mode "none"'s code
        #: paths on the attention block size, with hits and the same-step refusal.
        self.mamba_all = False
        #: 0.25.1 on return [] when the table is already longer than needed; 0.19.1 and
        #: 0.20.0 assert it is not (`L933-1009 @0.19.1`, `L1253-1262 @0.25.1`).
        self.tolerates_longer_table = True
        #: "align": hashes of the blocks cached this step (`cached_blocks_this_step`).
        self.cached_blocks_this_step: set[BlockHash] = set()
        #: "align": per request, the index of the state block of the previous allocation.
        self.last_state_block_idx: dict[int, int] = {}
        #: "align": requests that have had an allocation (`_allocated_block_reqs`).
        self.allocated_block_reqs: set[int] = set()
        #: "align" on 0.33.0: prefill checkpoint blocks and retired ranges
        #: (`sim.kv.v1_engine.mamba_checkpoint`); None on 0.19.1-0.26.0.
        self.checkpoints: AlignCheckpoints | None = None

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``C - 1``: only the state after the last computed token is needed. Example:
        C=40 -> 39; C=0 -> -1 (upstream returns it as is; nothing reads it as a count).

        Upstream `MambaManager.get_num_skipped_tokens`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1971-1976 (0.33.0)`.
        """
        return num_computed_tokens - 1

    def num_freed_blocks_at_least(self, num_computed_tokens: int) -> int:
        """``max(0, (C - 1) // bs)``: 0 for every C <= max_model_len with caching off (the
        state block stays). Example (bs=4,096): C=0 -> 0 (not -1), C=4,096 -> 0. In "align"
        mode (bs=16) C=40 -> 2: entries 0 and 1 are null or freed.

        kvsim's own (no upstream counterpart).
        """
        return max(0, self.num_skipped_tokens(num_computed_tokens) // self.block_size)

    def get_num_blocks_to_allocate(
        self,
        request_id: int,
        num_tokens: int,
        new_computed_blocks: list[KVCacheBlock],
        *,
        query_start: int = 0,
        record: bool = True,
        prefill_end: int = 0,
    ) -> int:
        """Mode "none": the shared count with the running-request floor, ``max(cdiv(T, bs)
        - len(table), 0)`` (bs = max_model_len = 4,096: a new request needs 1, a running one
        0). Mode "align" (T: the main model's tokens, no lookahead): never fits when the last
        hit was cached this step; else 1 if ``cdiv(T, bs) - len(hits) - len(table) > 0``,
        plus the evictable hits. Example (bs=4): a new request with hits [null, b] (b
        evictable) and T=10 needs ``cdiv(10, 4) - 2 - 0 = 1 -> 1``, plus 1 for b: 2. On 0.33.0
        the cap is ``1 + c`` with c the checkpoint block of a chunk from `query_start` (the
        tokens computed plus hits) to T; `record` False for the full-sequence gate
        (`mamba_checkpoint`).

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L868-931 (0.19.1)`,
        `L1692-1725, L176-262 (0.33.0)`; `L562-593 (0.11.0)`.
        """
        if (
            new_computed_blocks
            and new_computed_blocks[-1].block_hash in self.cached_blocks_this_step
        ):
            # Its state is written by this step's forward: wait for the next step.
            return self.block_pool.num_gpu_blocks + 1
        if self.mamba_all:  # the shared count (hits' skipped entries are nulls already)
            return super().get_num_blocks_to_allocate(request_id, num_tokens, new_computed_blocks)
        if not self.mamba_align:
            if new_computed_blocks:
                raise ValueError("a Mamba group has no prefix-cache hits with caching off")
            table = self.blocks_of(request_id)
            return max(cdiv(num_tokens, self.block_size) - len(table), 0)
        num_new_blocks = (
            cdiv(num_tokens, self.block_size)
            - len(new_computed_blocks)
            - len(self.blocks_of(request_id))
        )
        # The running state block only (no speculative blocks): one, first call or not;
        # on 0.33.0 plus a prefill checkpoint block (`L1755-1790 @0.33.0`).
        cap = 1
        if self.checkpoints is not None:
            table = self.req_to_blocks.get(request_id, [])
            cap += self.checkpoints.num_checkpoint_blocks_for(
                request_id, table, query_start, num_tokens, record=record, prefill_end=prefill_end
            )
        num_new_blocks = min(num_new_blocks, cap) if num_new_blocks > 0 else num_new_blocks
        num_evictable = sum(
            1 for block in new_computed_blocks if block.ref_cnt == 0 and not block.is_null
        )
        return num_new_blocks + num_evictable

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> list[KVCacheBlock]:
        """Mode "none": the shared growth. Mode "align" (T: the main model's tokens): pad
        with nulls to ``cdiv(T, bs) - 1`` entries and append one block, remembering where
        the previous state is. Example (bs=4): a table [null, m1] asked for T=10 becomes
        [null, m1, m2], last_state_block_idx 1; asked for T=8 it is unchanged.

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L933-1009 (0.19.1)`,
        `L1253-1327 (0.25.1)`.
        """
        if not self.mamba_align:
            return super().allocate_new_blocks(request_id, num_tokens)
        table = self.blocks_of(request_id)
        num_required_blocks = cdiv(num_tokens, self.block_size)
        checkpoint = 0
        if self.checkpoints is not None:  # (`L1822-1834 @0.33.0`)
            checkpoint = int(request_id in self.checkpoints.checkpoints)
        if not checkpoint and (
            num_required_blocks == len(table)
            or (num_required_blocks < len(table) and self.tolerates_longer_table)
        ):
            return []
        if num_required_blocks < len(table):
            raise AssertionError(
                f"num_required_blocks {num_required_blocks} < len(req_blocks) {len(table)}"
            )
        prev_block_len = len(table)
        if request_id in self.allocated_block_reqs or prev_block_len > 0:
            # The running state (or, for a new request, the hit's state) is the last entry.
            self.last_state_block_idx[request_id] = prev_block_len - 1
        num_skipped_blocks = num_required_blocks - 1
        if prev_block_len < num_skipped_blocks:
            # 0.33.0 leaves the checkpoint's entry for a new block (`L1851-1861 @0.33.0`).
            null_end = num_skipped_blocks - checkpoint
            table.extend([self.block_pool.null_block] * max(null_end - prev_block_len, 0))
        num_new_blocks = max(num_required_blocks - len(table), 0)
        if num_new_blocks > 1 + checkpoint:
            raise AssertionError(f"{num_new_blocks} new Mamba blocks > {1 + checkpoint}")
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        table.extend(new_blocks)
        self.allocated_block_reqs.add(request_id)
        return table[prev_block_len:]

    def admission_cap_blocks(
        self, max_in_flight_tokens: int, max_model_len: int | None
    ) -> int | None:
        """None: `MambaSpec` has no admission cap; its count is already 1 block.

        Upstream `get_manager_for_kv_cache_spec`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L2608-2651 (0.33.0)`.
        """
        return None

    def freeing_decode_len(self, num_null_blocks: int) -> int | None:
        """Mode "none": the first X (``C = X - 1``) with ``(C - 1) // bs > nulls``:
        ``(nulls + 1) * bs + 2``. Example (bs = max_model_len = 4,096, no nulls): 4,098,
        past max_model_len, so a decode never frees the state block. Mode "align": None
        here (its nulls are not a prefix); `align_freeing_decode_len` answers.

        kvsim's own (no upstream counterpart).
        """
        if self.mamba_align:
            return None
        return (num_null_blocks + 1) * self.block_size + 2

    def align_freeing_decode_len(self, request_id: int) -> int | None:
        """Mode "align": the first decode length X (``C = X - 1``) at which
        `remove_skipped_blocks` may free a block: the smallest ``(i + 1) * bs + 2`` over the
        table's real blocks at index i (the walk-back reaches i once ``(C - 1) // bs > i``,
        and the previous-state rule once ``i < cdiv(C, bs) - 1``: the same C). Example
        (bs=4): [null, m1, m2] -> 2 * 4 + 2 = 10. None: no real block.

        kvsim's own (no upstream counterpart).
        """
        table = self.req_to_blocks.get(request_id)
        if not table:
            return None
        for index, block in enumerate(table):
            if not block.is_null:
                return (index + 1) * self.block_size + 2
        return None

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """Mode "align": `mamba_align_hit` over this one group. Mode "none": refused (no
        hits exist with caching off).

        Upstream `MambaManager.find_longest_cache_hit`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L785-830 (0.19.1)`; `L532-550
        (0.11.0)` (no hits).
        """
        if not (self.mamba_align or self.mamba_all):
            raise ValueError("a Mamba group has no prefix-cache hits with caching off")
        (hits,) = mamba_align_hit(self.block_pool, [block_hashes], max_length, self.block_size)
        return hits

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """The shared free on ``C - 1`` skipped tokens: the table's first
        ``min((C - 1) // bs, len(table))`` blocks, walking back to the first null; in
        "align" mode then the previous state block once ``last < cdiv(C, bs) - 1``.
        Example (bs = max_model_len = 4,096): C=4,096 -> 4,095 // 4,096 = 0 blocks, nothing
        freed. "align" (bs=4, [null, m1, m2], last 1): C=10 -> the walk back from index 1
        frees m1.

        Upstream `MambaManager.remove_skipped_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L832-860, L358-399 (0.19.1)`;
        `L1629-1657, L682-720 (0.33.0)`; 0.11.0's is a no-op (`L552-556`), the same
        decision for every C <= bs.
        """
        num_skipped_tokens = self.num_skipped_tokens(num_computed_tokens)
        if not self.mamba_align:
            if num_skipped_tokens <= 0:
                return
            table = self.blocks_of(request_id)
            first_useful_block = min(num_skipped_tokens // self.block_size, len(table))
            self._free_before(request_id, table, first_useful_block)
            return
        table = self.blocks_of(request_id)
        null = self.block_pool.null_block
        if num_skipped_tokens > 0 and self.checkpoints is not None:
            # 0.33.0: the retired-range free (`mamba_checkpoint`, `L1608-1627 @0.33.0`).
            end = min(num_skipped_tokens // self.block_size, len(table))
            self.checkpoints.remove_in_range(self.block_pool, request_id, table, end)
        elif num_skipped_tokens > 0:
            # Upstream's walk back (nulls here are not a prefix: no kept count).
            removed: list[KVCacheBlock] = []
            for index in range(min(num_skipped_tokens // self.block_size, len(table)) - 1, -1, -1):
                if table[index].is_null:
                    break
                removed.append(table[index])
                table[index] = null
            if removed:
                self.block_pool.free_blocks(removed)
        last = self.last_state_block_idx.get(request_id)
        if (
            last is not None
            and last < cdiv(num_computed_tokens, self.block_size) - 1
            and not table[last].is_null
        ):
            self.block_pool.free_blocks([table[last]])
            table[last] = null

    def cache_blocks(
        self,
        request_id: int,
        block_hashes: list[BlockHash],
        num_tokens: int,
        reachable: tuple[int, ...] = (),
    ) -> None:
        """The shared caching; in "align" mode each newly cached real block's hash is noted
        as cached this step (a hit on it waits for the next step). On 0.33.0 under sparse
        retention only the blocks ending at the `reachable` boundaries (the replay boundary,
        the junction) are keyed (`mamba_checkpoint.AlignCheckpoints.retained_mask`).

        Upstream `MambaManager.cache_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1025-1036 (0.19.1)`, `L1978-2023`,
        `L477-530 (0.33.0)`.
        """
        before = self.num_cached_block.get(request_id, 0)
        mask = None
        if self.checkpoints is not None:
            mask = self.checkpoints.retained_mask(before, num_tokens // self.block_size, reachable)
        if mask is None:
            super().cache_blocks(request_id, block_hashes, num_tokens)
        else:  # only the retained blocks get a key; the count moves past the others
            table = self.req_to_blocks[request_id]
            for offset, keep in enumerate(mask):
                if keep:
                    index = before + offset
                    self.block_pool.cache_full_blocks(table, block_hashes, index, index + 1)
            self.num_cached_block[request_id] = num_tokens // self.block_size
        if not (self.mamba_align or self.mamba_all):
            return
        after = self.num_cached_block.get(request_id, 0)
        for block in self.req_to_blocks[request_id][before:after]:
            if not block.is_null and block.block_hash is not None:
                self.cached_blocks_this_step.add(block.block_hash)

    def new_step_starts(self) -> None:
        """Forget the blocks cached last step.

        Upstream `MambaManager.new_step_starts`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1038-1039 (0.19.1)`.
        """
        self.cached_blocks_this_step.clear()

    def free(self, request_id: int) -> None:
        """ "align": drop the request's indices; then the shared free.

        Upstream `MambaManager.free`: `vllm/v1/core/single_type_kv_cache_manager.py:L1011-1015
        (0.19.1)` (`pop_blocks_for_free` from 0.25.1).
        """
        self.allocated_block_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        if self.checkpoints is not None:
            self.checkpoints.forget(request_id)
        super().free(request_id)
