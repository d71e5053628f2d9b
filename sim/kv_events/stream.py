"""The per-replica event sink the V1 block pool writes to.

`BlockPool.event_sink` is None unless a run asks for KV events (`engine.kv_events`) or a
router consumes them (`prefix_cache_aware`); then the pool calls `stored` when it caches full
blocks and `removed` when it evicts a cached block, as vLLM's pool queues its events
(`sim.kv_events.events`). The stream stamps each event with the simulated time and keeps it

* in `pending` (when a router consumes the stream), which the router's index drains as the
  events become visible to it (`sim.routing.cache_index`), and
* in `history` (when the run writes the `kv_events` table), in emission order.

Only the single-group V1 pool emits: vLLM 0.11.0 turns the hybrid KV cache manager off when
KV events are on (`vllm/config/__init__.py:L509-511`), and kvsim models no such fallback, so
a hybrid replica (and every v0 design) emits nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from sim.kv.types import BlockHash
from sim.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, TimedEvent


class KVEventStream:
    """The KV events of one replica, stamped with the simulated time (`clock()`)."""

    __slots__ = ("replica", "block_size", "_clock", "pending", "history")

    def __init__(
        self,
        replica: int,
        block_size: int,
        clock: Callable[[], float],
        feed_router: bool,
        keep_history: bool,
    ) -> None:
        self.replica = replica
        self.block_size = block_size
        self._clock = clock
        self.pending: deque[TimedEvent] | None = deque() if feed_router else None
        self.history: list[TimedEvent] | None = [] if keep_history else None

    def _emit(self, event: Any) -> None:
        timed = TimedEvent(self._clock(), self.replica, event)
        if self.pending is not None:
            self.pending.append(timed)
        if self.history is not None:
            self.history.append(timed)

    # ------------------------------------------------------------- the block pool's calls
    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        """Blocks `block_hashes` (in order, the first one's parent `parent`) were cached."""
        hashes = tuple(block_hashes)
        self._emit(BlockStored(hashes, parent, len(hashes) * self.block_size, self.block_size))

    def removed(self, block_hash: BlockHash) -> None:
        """One cached block with `block_hash` was evicted."""
        self._emit(BlockRemoved((block_hash,)))

    def cleared(self) -> None:
        """The whole prefix cache was dropped."""
        self._emit(AllBlocksCleared())


def attach_streams(
    replicas: Sequence[Any],
    block_size: int,
    clock: Callable[[], float],
    feed_router: bool,
    keep_history: bool,
) -> list[KVEventStream | None]:
    """A stream on each replica whose manager has a single-group V1 block pool (None for the
    others), set as that pool's `event_sink`."""
    from sim.kv.v1_engine.block_pool import BlockPool

    streams: list[KVEventStream | None] = []
    for replica in replicas:
        pool = getattr(replica.manager, "block_pool", None)
        hybrid = getattr(replica.manager, "coordinator", None) is not None
        if not isinstance(pool, BlockPool) or hybrid:
            streams.append(None)
            continue
        stream = KVEventStream(replica.index, block_size, clock, feed_router, keep_history)
        pool.event_sink = stream
        streams.append(stream)
    return streams
