"""vLLM 0.33.0's sparse prefix-cache retention for sliding-window groups, as one strategy.

`prefix_cache_retention_interval` (`vllm/config/cache.py:L275-281 @0.33.0`: `vllm serve`
defaults it to 0; the `KVCacheConfig` dataclass field to None, dense) reaches every group
through `KVCacheCoordinator.cache_blocks` (`kv_cache_coordinator.py:L358-381`), which passes it
with the replay boundaries (`replay_boundaries`, `L65-86`: without EAGLE one, ``P - 1``, P the
prompt length) to each manager's `cache_blocks` (`single_type_kv_cache_manager.py:L477-542`).
That adds the request's shared-prefix junction J when set (`Request.shared_prefix_boundary`,
which the scheduler takes from `get_computed_blocks`' third value, `kv_cache_manager.py:
L318-328`: the full-attention hit less the final hit, plus the final hit, 0 when they agree)
and asks `reachable_block_mask` which of the newly full blocks get a hash; the others are
skipped by `BlockPool.cache_full_blocks` (`block_pool.py:L277-282`) exactly as null blocks are,
so they are never found by a lookup and, when freed, go to the head of the free queue as
uncached blocks (`block_pool.py:L836-845`, `free_order.UncachedFirst`).

Only `SlidingWindowManager` and `MambaManager` override the mask (`L1067-1146`, `L1549-1606`);
full attention, chunked-local attention (and sinks, R-SWA, circular buffers) keep the base
``None``: they cache densely whatever the interval (`_validate_prefix_cache_retention_
interval`, `kv_cache_coordinator.py:L33-62`, says so). The Mamba half is
`sim.kv.v1_engine.mamba_checkpoint`; this module is the sliding-window half. Lookups
(`SlidingWindowManager.find_longest_cache_hit`, `L969-1065`) and frees
(`remove_skipped_blocks`, `L682-720`) are unchanged: the mask only decides which blocks are
findable.

`SlidingWindowManager.reachable_block_mask` with kvsim's one block size bs (the hit alignment
is bs, so the sub-block fallback to dense never applies) and no EAGLE (shift 0); a hit needs
``n = cdiv(W - 1, bs)`` contiguous cached blocks (`_contiguous_blocks_for_hit`, `L956-967`):

* interval None (dense): one segment per block; ``n >= 1`` keeps every block (None), ``n = 0``
  (W = 1) none -- kvsim's `SlidingWindowManager._caches_nothing`, 0.25.1 on;
* interval 0: no segment tails; only the ``n`` blocks ending at each boundary floored to bs,
  ``[b // bs - n, b // bs)``, keep their hash (this module);
* a positive interval adds a tail per segment: refused (`KVCacheConfig`), as for Mamba.

Worked example (bs=4, W=9 so n = cdiv(8, 4) = 2; a 30-token prompt, no junction; the boundary
is P - 1 = 29, floored to 28, block 7): a prefill of all 30 tokens fills blocks 0..6, of which
only blocks 5 and 6 are cached; under dense retention all seven are. A later request with the
same 30-token prompt finds blocks 5 and 6 from the right (`find_longest_cache_hit` within
``29 // 4 = 7`` blocks) and hits 28 tokens, [null x5, b5, b6], as it would densely; a request
sharing only the first 20 tokens hits nothing (densely: blocks 3 and 4, 20 tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.kv.types import BlockHash
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock


@dataclass(frozen=True, slots=True)
class SparseWindowRetention:
    """`prefix_cache_retention_interval == 0` for one sliding-window group (module docstring)."""

    block_size: int
    #: Contiguous cached blocks a hit needs: ``cdiv(W - 1, bs)`` (0 when W = 1).
    num_contiguous_blocks: int

    def retained_mask(
        self, start_block: int, end_block: int, boundaries: tuple[int, ...]
    ) -> list[bool]:
        """Which of the blocks [start_block, end_block) keep their hash: for each boundary b
        (0 is no boundary) the ``n`` blocks ``[b // bs - n, b // bs)``. Example (bs=4, n=2,
        boundaries (29, 0)): blocks 5 and 6 -> for [0, 7): [F, F, F, F, F, T, T]; for [6, 8):
        [T, F].

        Upstream `SlidingWindowManager.reachable_block_mask`, part (2) with
        `retention_interval=0` (part (1), the segment tails, is off):
        `vllm/v1/core/single_type_kv_cache_manager.py:L1067-1146 (0.33.0)`; the boundaries
        from `SingleTypeKVCacheManager.cache_blocks`, `L505-520`.
        """
        mask = [False] * (end_block - start_block)
        need = self.num_contiguous_blocks
        for boundary in boundaries:
            if boundary <= 0:
                continue  # upstream appends the junction only when it is set
            end = boundary // self.block_size
            for index in range(max(start_block, end - need), min(end_block, end)):
                mask[index - start_block] = True
        return mask


def cache_masked_blocks(
    block_pool: BlockPool,
    table: list[KVCacheBlock],
    block_hashes: list[BlockHash],
    start_block: int,
    mask: list[bool],
) -> None:
    """Give a hash to the blocks of `table` from `start_block` on whose mask entry is True
    (null entries stay skipped by the pool), one run of consecutive kept blocks at a time.
    Example: start 5, mask [T, T, F, T] caches blocks 5-6, then 8.

    Upstream: the masked skip in `BlockPool.cache_full_blocks`,
    `vllm/v1/core/block_pool.py:L277-282 (0.33.0)`.
    """
    index = 0
    while index < len(mask):
        if not mask[index]:
            index += 1
            continue
        run_end = index
        while run_end < len(mask) and mask[run_end]:
            run_end += 1
        block_pool.cache_full_blocks(
            table, block_hashes, start_block + index, start_block + run_end
        )
        index = run_end
