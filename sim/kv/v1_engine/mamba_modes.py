"""Mamba's prefix-caching modes, "align" and "all", and the hit rule they share.

`sim.kv.v1_engine.mamba` models `MambaManager` (its mode "none", without prefix caching, is
described there); this module describes the two modes with prefix caching, whose branches
that manager carries method by method, and holds their hit (`mamba_align_hit`), which the
manager and the hybrid coordinator both call.

Mode "align" (prefix caching on; `mamba_align=True`), 0.19.1 `L769-1041`, 0.20.0
`L790-1062`, 0.25.1 `L1026-1367`, 0.26.0 `L1227-1686`, and 0.33.0 `L1428-2136` with the
additions of `sim.kv.v1_engine.mamba_checkpoint` (`checkpoints`, set there only). The group's block size is the
attention block size (`mamba_block_size = block_size`, `HybridAttentionMambaModelConfig`,
`model_executor/models/config.py:L286-291 (0.19.1)`), and a request's table is mostly null:
only the running state (its last entry) and, until the next step frees it, the previous
one are real blocks; each real block whose end a step reached is cached as the state after
``(i + 1) * bs`` tokens (the scheduler ends prefill chunks on block boundaries,
`sim.scheduler.v1.mamba_align`, so the state there is exact). Per method:

* `find_longest_cache_hit` (`mamba_align_hit`, `L785-830 @0.19.1`): scan right to left
  for the *last* index i whose block every Mamba group has cached; the hit is
  ``[null] * i + [block]``, ``(i + 1) * bs`` tokens (one state suffices, no run of blocks).
* `get_num_blocks_to_allocate` (`L868-931`): ``num_gpu_blocks + 1`` (never fits) when the
  last hit block was cached this step (its state is written by this step's forward);
  else on the main model's tokens T (no lookahead): 1 block if ``cdiv(T, bs) - hits -
  len(table) > 0``, else 0, plus the evictable hits.
* `allocate_new_blocks` (`L933-1009`): nothing if ``cdiv(T, bs) == len(table)`` (0.25.1 on:
  ``<=``; 0.19.1 and 0.20.0 assert ``>``); else remember the previous state block's index
  (`last_state_block_idx`: the last entry, or a hit's block for a new request), pad the
  table with nulls to ``cdiv(T, bs) - 1`` entries and append one new block.
* `remove_skipped_blocks` (`L832-860`): the shared walk-back free on ``C - 1`` skipped
  tokens, then the previous state block once ``last_state_block_idx < cdiv(C, bs) - 1``
  (its state was copied into the running block by the step that allocated it).
* `cache_blocks` (`L1025-1036`): the shared caching, each newly cached real block's hash
  recorded as cached this step; `new_step_starts` (`L1038-1039`, called by the scheduler at
  the start of every `schedule()`) forgets them. `free` (`L1011-1015`) drops the indices.

Worked example ("align", bs=4, groups [full, mamba], caching on): request A, 10 tokens,
``allocate_slots(A, 8)`` (an aligned chunk): the Mamba table is [null, m1] (cdiv(8, 4) = 2
entries, one real), block m1 cached as the state after 8 tokens. Next chunk, 2 tokens
(C=8): nothing skipped yet ((8 - 1) // 4 = 1 block, index 0 is null); the table grows to
[null, m1, m2] with last_state_block_idx = 1. Decode at C=10: (10 - 1) // 4 = 2, the walk
back from index 1 frees m1 (it stays cached, evictable). Request B with the same first 9
tokens then hits [null, m1]: 8 tokens, its table starts with m1 and its first allocation
records last_state_block_idx = 1.

What "align" leaves out: the state copies themselves (`mamba_utils` copy kernels moving a
state from the previous block to the new one, and a hit's state into the running block:
data movement on the GPU that kvsim's step time does not time), speculative blocks
(`num_speculative_blocks`, MTP / EAGLE), KV connectors, 0.26.0's fine-grained hash lookup
and partial-tail copy-on-write (only with a prefix-match unit below the block size, which
kvsim refuses), sparse retention (0.33.0 only, in `mamba_checkpoint`), a hit across
several attention types other than full + Mamba. 0.33.0's "align" is this mode plus
`sim.kv.v1_engine.mamba_checkpoint` (prefill checkpoint blocks, retired-block ranges; its
docstring lists the differences from 0.26.0 and what stays out).

Mode "all" (0.19.1-0.26.0, the default for models with `supports_mamba_prefix_caching`,
`sim.scenario.vllm_defaults.mamba`; `mamba_all=True`): the Mamba kernels write a state at
every block boundary, so upstream's "all" branches are the shared ones, on the attention
block size (`mamba_block_size`, a multiple of the kernel's chunk size,
`model_executor/models/config.py:L244-270 @0.19.1`): the table grows like attention's
(`cdiv(T, bs)` entries, all real), each full block is cached, a step at C frees the blocks
before ``(C - 1) // bs`` (the shared walk-back; nulls stay a prefix, as a sliding window's),
the count is the shared one, and a hit is the last cached state (`mamba_align_hit`, the same
method). The same-step refusal and the cached-this-step set apply in both modes
(`L852-859`, `L1025-1036 @0.19.1`); the scheduler does not split chunks in "all". Example
(bs=4): 8 tokens -> Mamba [m0, m1], both cached; the next step at C=8 frees m0 -> [null, m1].
Left out in "all": the kernel chunk size that sets the block size (a scenario gives
`cache.block_size`) and `max_memory_usage_bytes`' page per block is the startup check's
(`sim.scenario.resolve`).
"""

from __future__ import annotations

from sim.kv.types import BlockHash
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock


def mamba_align_hit(
    block_pool: BlockPool, hashes: list[list[BlockHash]], max_length: int, block_size: int
) -> list[list[KVCacheBlock]]:
    """The Mamba groups' hit in "align" mode: the last index i below ``max_length // bs``
    whose block every group has cached -> per group ``[null] * i + [block]``; none: [].
    Example (bs=4, max_length 11): cached h0 and h1 -> i = 1: [null, b(h1)], 8 tokens.

    Upstream `MambaManager.find_longest_cache_hit` (one attention type's groups; with one
    block size the alignment check never skips):
    `vllm/v1/core/single_type_kv_cache_manager.py:L785-830 (0.19.1)`.
    """
    null = block_pool.null_block
    for index in range(max_length // block_size - 1, -1, -1):
        found: list[KVCacheBlock] = []
        for group_hashes in hashes:
            block = block_pool.get_cached_block(group_hashes[index])
            if block is None:
                break
            found.append(block)
        else:
            return [[null] * index + [block] for block in found]
    return [[] for _ in hashes]
