"""Mamba / linear-attention state groups (Qwen3.5-style hybrids, Nemotron-H, Jamba).

Models `MambaManager` in vLLM's Mamba cache mode without prefix caching:
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
  caching on switches the mode to "align", which kvsim does not model).

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

Left out: the "align" and "all" modes (prefix caching over Mamba states, 0.33.0 `L1453-1468`,
`L1713-1925`, `L2028-2136`: checkpoint blocks, copy-on-write of partial tails, the
same-step refusal), speculative blocks (`num_speculative_blocks`, MTP / EAGLE on Mamba
layers), and KV connectors' external tokens.
"""

from __future__ import annotations

from sim.kv.types import BlockHash, cdiv
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.single_type import SingleTypeManager


class MambaManager(SingleTypeManager):
    """One Mamba state group with prefix caching off (module docstring): `block_size` is the
    group's own, `max_model_len` tokens, not the attention groups'."""

    def __init__(self, block_pool: BlockPool, block_size: int) -> None:
        super().__init__(block_pool, block_size)

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``C - 1``: only the state after the last computed token is needed. Example:
        C=40 -> 39; C=0 -> -1 (upstream returns it as is; nothing reads it as a count).

        Upstream `MambaManager.get_num_skipped_tokens`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1971-1976 (0.33.0)`.
        """
        return num_computed_tokens - 1

    def num_freed_blocks_at_least(self, num_computed_tokens: int) -> int:
        """``max(0, (C - 1) // bs)``: 0 for every C <= max_model_len (the state block stays).
        Example (bs=4,096): C=0 -> 0 (not -1), C=4,096 -> 0.

        kvsim's own (no upstream counterpart).
        """
        return max(0, self.num_skipped_tokens(num_computed_tokens) // self.block_size)

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """The shared count with the running-request floor: ``max(cdiv(T, bs) - len(table),
        0)``. Example (bs = max_model_len = 4,096): a new request needs 1, a running one 0.

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L1692-1725, L176-262
        (0.33.0)`; `L562-593 (0.11.0)`.
        """
        if new_computed_blocks:
            raise ValueError("a Mamba group has no prefix-cache hits with caching off")
        table = self.blocks_of(request_id)
        return max(cdiv(num_tokens, self.block_size) - len(table), 0)

    def admission_cap_blocks(
        self, max_in_flight_tokens: int, max_model_len: int | None
    ) -> int | None:
        """None: `MambaSpec` has no admission cap; its count is already 1 block.

        Upstream `get_manager_for_kv_cache_spec`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L2608-2651 (0.33.0)`.
        """
        return None

    def freeing_decode_len(self, num_null_blocks: int) -> int | None:
        """The first X (``C = X - 1``) with ``(C - 1) // bs > nulls``: ``(nulls + 1) * bs +
        2``. Example (bs = max_model_len = 4,096, no nulls): 4,098, past max_model_len, so a
        decode never frees the state block.

        kvsim's own (no upstream counterpart).
        """
        return (num_null_blocks + 1) * self.block_size + 2

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """Refused: prefix caching over Mamba states is the "align" mode, not modelled.

        Upstream `MambaManager.find_longest_cache_hit`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1470-1547 (0.33.0)`; `L532-550
        (0.11.0)` (no hits).
        """
        raise ValueError(
            "prefix caching over a Mamba group (mamba_cache_mode 'align') is not modelled"
        )

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """The shared free on ``C - 1`` skipped tokens: the table's first
        ``min((C - 1) // bs, len(table))`` blocks, walking back to the first null. Example
        (bs = max_model_len = 4,096): C=4,096 -> 4,095 // 4,096 = 0 blocks, nothing freed.

        Upstream `MambaManager.remove_skipped_blocks` (mode "none": the shared free only):
        `vllm/v1/core/single_type_kv_cache_manager.py:L1629-1657, L682-720 (0.33.0)`;
        0.11.0's is a no-op (`L552-556`), the same decision for every C <= bs.
        """
        num_skipped_tokens = self.num_skipped_tokens(num_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        table = self.blocks_of(request_id)
        first_useful_block = min(num_skipped_tokens // self.block_size, len(table))
        self._free_before(request_id, table, first_useful_block)
