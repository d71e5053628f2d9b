"""The pool-level queries every V1 manager answers the same way, single group or hybrid.

Both `KVCacheManager` and `HybridKVCacheManager` hold one `BlockPool` (upstream: the
coordinator's `block_pool`, shared by every KV-cache group) and read free counts, usage and
refcounts from it alone, so the answers live here once.
"""

from __future__ import annotations

from mypy_extensions import trait

from sim.kv.protocol import PoolStats
from sim.kv.v1_engine.block_pool import BlockPool


@trait  # a mixin of KVCacheManager: mypyc compiles mixins as traits
class PoolQueries:
    """Read-only views of `self.block_pool` (set by the manager's constructor)."""

    block_pool: BlockPool

    @property
    def num_free_blocks(self) -> int:
        """Blocks in the free queue.

        Upstream `get_num_free_blocks`: `vllm/v1/core/block_pool.py:L385-391 (0.11.0)`.
        """
        return len(self.block_pool.free_block_queue)

    @property
    def usage(self) -> float:
        """Fraction of the pool not in the free queue (the null block always counts as used).

        Upstream `BlockPool.get_usage`: `vllm/v1/core/block_pool.py:L393-404 (0.11.0)`.
        """
        return 1.0 - self.num_free_blocks / self.block_pool.num_gpu_blocks

    @property
    def num_reserved_blocks(self) -> int:
        """Blocks held for good but in no request's table: the null block and a sink group's
        sink blocks (`BlockPool.reserve_blocks`). kvsim's own (no upstream counterpart)."""
        return self.block_pool.num_reserved_blocks

    def pool_stats(self) -> PoolStats:
        """Free, used and cached block counts of the pool (`sim.kv.protocol.PoolStats`).

        kvsim's own (no upstream counterpart).
        """
        pool = self.block_pool  # positional: called several times per engine step
        return PoolStats(
            pool.num_gpu_blocks,
            len(pool.free_block_queue),
            pool.num_held_blocks,
            pool.num_evictable_blocks,
        )

    def pool_is_conserved(self) -> bool:
        """`pool_stats().is_conserved` without building the stats: the auditor asks after
        every call. Example: 10 blocks, 4 free (1 evictable) and 6 held -> True.

        kvsim's own (no upstream counterpart).
        """
        pool = self.block_pool
        num_free = len(pool.free_block_queue)
        return (
            num_free + pool.num_held_blocks == pool.num_gpu_blocks
            and pool.num_evictable_blocks <= num_free
        )

    def block_refcounts(self) -> dict[int, int]:
        """Block id -> refcount for held blocks; the null block (0) always reads 1.

        kvsim's own (no upstream counterpart).
        """
        return {b.block_id: b.ref_cnt for b in self.block_pool.blocks if b.ref_cnt > 0}
