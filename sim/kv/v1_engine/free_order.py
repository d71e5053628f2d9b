"""Where blocks that a free releases (refcount 0) re-enter the V1 free queue, per release.

The free queue is also the eviction order: `get_new_blocks` pops from the head and evicts the
hash of a cached block it pops. So the place a freed block takes decides which cached prefix
survives the next allocation.

* `AppendInFreeOrder` (4ac7713 `block_pool.py:L281-296`; 0.11.0 `block_pool.py:L338-353`):
  every released block goes to the tail, in the order given (a request frees its table
  tail first).
* `UncachedFirst` (0.33.0 `block_pool.py:L816-849`): a released block without a hash (or any
  block when prefix caching is off) goes to the *head*, in the order given; cached blocks go
  to the tail as before. Uncached blocks are reused first, so cached ones are evicted later.

Worked example (caching on, blocks 1..4 of a request, 1-3 full and cached, 4 a partial tail;
queue before the free [5, 6]; the table is freed in reverse, [4, 3, 2, 1])::

    AppendInFreeOrder: [5, 6, 4, 3, 2, 1]   the next 3 new blocks are 5, 6, 4
    UncachedFirst:     [4, 5, 6, 3, 2, 1]   the next 3 new blocks are 4, 5, 6

With caching off `UncachedFirst` puts every freed block at the head: [4, 3, 2, 1, 5, 6].
Neither changes a count; with caching on `UncachedFirst` keeps cached blocks longer.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

from sim.kv.pins import VllmPin
from sim.kv.v1_engine.free_queue import FreeQueue

if TYPE_CHECKING:
    from sim.kv.v1_engine.block_pool import KVCacheBlock


class FreeOrder(abc.ABC):
    """Re-queues the blocks one `free_blocks` call released, in their eviction order."""

    @abc.abstractmethod
    def requeue(self, queue: FreeQueue, released: list[KVCacheBlock], enable_caching: bool) -> None:
        """Put `released` (refcount now 0, none null, in the caller's order) into `queue`.

        Upstream: `BlockPool.free_blocks`, `vllm/v1/core/block_pool.py:L338-353 (0.11.0)`.
        """


class AppendInFreeOrder(FreeOrder):
    """4ac7713 / 0.11.0: all released blocks to the tail (LRU over every free block)."""

    def requeue(self, queue: FreeQueue, released: list[KVCacheBlock], enable_caching: bool) -> None:
        """Append every released block to the tail, in the order given.

        Upstream: the tail append of `BlockPool.free_blocks`, `vllm/v1/core/block_pool.py:L338-353
        (0.11.0)`.
        """
        queue.append_n([block.block_id for block in released])


class UncachedFirst(FreeOrder):
    """0.33.0: blocks without a hash to the head (reused first), cached ones to the tail."""

    def requeue(self, queue: FreeQueue, released: list[KVCacheBlock], enable_caching: bool) -> None:
        """Uncached blocks to the head, cached ones to the tail (all to the head without caching).

        Upstream: `BlockPool.free_blocks`, `vllm/v1/core/block_pool.py:L816-849 (0.33.0)`.
        """
        if not enable_caching:
            queue.prepend_n([block.block_id for block in released])
            return
        uncached = [block.block_id for block in released if block.block_hash is None]
        if uncached:
            queue.prepend_n(uncached)
        if len(uncached) < len(released):
            queue.append_n([block.block_id for block in released if block.block_hash is not None])


def free_order_for(pin: VllmPin) -> FreeOrder:
    """The free-order strategy of a pin.

    Upstream: `BlockPool.free_blocks`, `vllm/v1/core/block_pool.py:L338-353 (0.11.0)` vs `L816-849
    (0.33.0)`.
    """
    return UncachedFirst() if pin.reuses_uncached_blocks_first else AppendInFreeOrder()
