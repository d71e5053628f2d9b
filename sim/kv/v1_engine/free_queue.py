"""The V1 engine's LRU free-block queue, keyed by block id.

Models `FreeKVCacheBlockQueue` (`vllm/v1/core/kv_cache_utils.py:L193-395 @4ac7713`). Upstream
keeps an intrusive doubly linked list threaded through the blocks; an `OrderedDict` gives the
same operations in O(1) (pop from the head, append at the tail, remove from the middle) with
no pointers to keep consistent.

Order is eviction order, head first. It starts in id order; freed blocks go to the tail, so the
head is the least recently freed block. Worked example (5 blocks)::

    q = FreeBlockQueue(range(5))   # [0, 1, 2, 3, 4]
    q.popleft_n(1)                 # [0]      -> queue [1, 2, 3, 4]   (the null block)
    q.popleft_n(2)                 # [1, 2]   -> queue [3, 4]
    q.append_n([2, 1])             # a request freed in reverse -> [3, 4, 2, 1]
    q.remove(2)                    # a prefix-cache hit on block 2 -> [3, 4, 1]
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable
from itertools import islice, repeat
from typing import Protocol


class FreeBlockQueue(OrderedDict[int, None]):
    """Free block ids in eviction order (head = evicted first).

    The queue *is* the ordered dict of its ids (values unused), so `len(q)` and `id in q` run
    in C: the free count is read several times per engine step. Change it only through the
    methods below, which keep upstream's order and checks.
    """

    __slots__ = ()

    def __init__(self, block_ids: Iterable[int]) -> None:
        # (id, None) pairs straight in: half the time of filling a dict first and copying it
        # (a V1 pool on an H200 is ~5*10^4 blocks, built once per simulated run).
        super().__init__(zip(block_ids, repeat(None)))

    def popleft(self) -> int:
        """Pop one id from the head (a decode crossing into a new block).

        Upstream `FreeKVCacheBlockQueue.popleft`: `vllm/v1/core/kv_cache_utils.py:L268-299
        (0.11.0)`.
        """
        return self.popitem(False)[0]

    def popleft_n(self, num_blocks: int) -> list[int]:
        """Pop `num_blocks` ids from the head (the least recently freed first).

        Upstream `FreeKVCacheBlockQueue.popleft_n`: `vllm/v1/core/kv_cache_utils.py:L301-332
        (0.11.0)`.
        """
        if num_blocks > len(self):
            # Upstream asserts here; callers check the free count first.
            raise ValueError(f"cannot pop {num_blocks} blocks from a queue of {len(self)}")
        if num_blocks == 1:
            return [self.popitem(False)[0]]  # a decode crossing into a new block
        # Read the head ids, then delete them: cheaper than `popitem(last=False)` per id.
        block_ids = list(islice(self, num_blocks))
        for block_id in block_ids:
            del self[block_id]
        return block_ids

    def remove(self, block_id: int) -> None:
        """Take a block out of the middle (a cache hit on an evictable block).

        Upstream `FreeKVCacheBlockQueue.remove`: `vllm/v1/core/kv_cache_utils.py:L334-352 (0.11.0)`.
        """
        if block_id not in self:
            raise ValueError(f"block {block_id} is not in the free queue")
        del self[block_id]

    def append_n(self, block_ids: Iterable[int]) -> None:
        """Put blocks back at the tail, in the given order (first given = evicted first).

        Upstream `FreeKVCacheBlockQueue.append_n`: `vllm/v1/core/kv_cache_utils.py:L376-398
        (0.11.0)`.
        """
        for block_id in block_ids:
            assert block_id not in self, f"block {block_id} appended to the free queue twice"
            self[block_id] = None

    def prepend_n(self, block_ids: list[int]) -> None:
        """Put blocks at the head, in the given order (first given = popped first).

        Models `FreeKVCacheBlockQueue.prepend_n` (`kv_cache_utils.py:L438-457 @0.33.0`), used
        from 0.33.0 on for freed blocks without a cached hash. Example: queue [3, 4],
        ``prepend_n([2, 1])`` -> [2, 1, 3, 4].
        """
        for block_id in reversed(block_ids):
            assert block_id not in self, f"block {block_id} prepended to the free queue twice"
            self[block_id] = None
            self.move_to_end(block_id, last=False)

    def ids(self) -> list[int]:
        """All free ids, head first (O(n); for tests and audits).

        kvsim's own (no upstream counterpart).
        """
        return list(self)


class UncachedFreeBlockQueue(deque[int]):
    """The free queue of a pool without prefix caching: a deque of ids.

    Without caching nothing is ever taken out of the middle of the queue (only a prefix-cache
    hit is, `BlockPool.touch`), so the head pops and the tail and head pushes of
    `FreeBlockQueue` are all it needs, and a deque does them in C: freeing a request's table
    is one `extend` or `extendleft`, not a dict insert (and a move) per block. Same order,
    same ids as `FreeBlockQueue`; tests/kv/test_kv_representation.py replays both side by side.
    Example: ``UncachedFreeBlockQueue([3, 4]).prepend_n([2, 1])`` -> [2, 1, 3, 4].
    """

    __slots__ = ()

    def popleft_n(self, num_blocks: int) -> list[int]:
        """None.

        Upstream `FreeKVCacheBlockQueue.popleft_n`: `vllm/v1/core/kv_cache_utils.py:L301-332
        (0.11.0)`.
        """
        if num_blocks > len(self):
            raise ValueError(f"cannot pop {num_blocks} blocks from a queue of {len(self)}")
        popleft = self.popleft
        return [popleft() for _ in range(num_blocks)]

    def remove(self, block_id: int) -> None:
        """None.

        Upstream `FreeKVCacheBlockQueue.remove`: `vllm/v1/core/kv_cache_utils.py:L334-352 (0.11.0)`.
        """
        raise ValueError(f"block {block_id}: a pool without prefix caching has no hits to touch")

    def append_n(self, block_ids: Iterable[int]) -> None:
        """None.

        Upstream `FreeKVCacheBlockQueue.append_n`: `vllm/v1/core/kv_cache_utils.py:L376-398
        (0.11.0)`.
        """
        # No double-append check here: `BlockPool.free_blocks` refuses a block whose refcount
        # is already 0, so a block is queued once per release.
        self.extend(block_ids)

    def prepend_n(self, block_ids: list[int]) -> None:
        """Put `block_ids` at the head of the queue, in the order given (0.33.0's free order).

        kvsim's own (no upstream counterpart).
        """
        self.extendleft(reversed(block_ids))

    def ids(self) -> list[int]:
        """The queued ids, head first (kvsim's own (no upstream counterpart))."""
        return list(self)


class FreeQueue(Protocol):
    """What `BlockPool` and `FreeOrder` use of a free queue (either class above)."""

    def __len__(self) -> int: ...

    def popleft(self) -> int: ...

    def popleft_n(self, num_blocks: int) -> list[int]: ...

    def remove(self, block_id: int) -> None: ...

    def append_n(self, block_ids: Iterable[int]) -> None: ...

    def prepend_n(self, block_ids: list[int]) -> None: ...

    def ids(self) -> list[int]: ...
