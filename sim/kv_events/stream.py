"""Where the V1 block pool's KV events go: the sink seam, the recorder, and the wiring.

`BlockPool.event_sink` is None unless a run records KV events (`engine.kv_events`) or a
router consumes them (`prefix_cache_aware`); then the pool calls `stored` when it caches full
blocks and `removed` when it evicts a cached block, where vLLM's pool queues its events
(`sim.kv_events.events`). The sink is

* the router's feed for the replica (`sim.routing.cache_index.ReplicaFeed`) when only the
  router consumes the events: no event objects are built on the hot path;
* a `KVEventStream` when the run records them: it keeps each event, stamped with the
  simulated time, in `history` (the `kv_events` table) and forwards the call to the router's
  feed, if any.

Only the single-group V1 pool emits: vLLM 0.11.0 turns the hybrid KV cache manager off when
KV events are on (`vllm/config/__init__.py:L509-511`), and kvsim models no such fallback, so
a hybrid replica (and every v0 design) emits nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sim.kv.types import BlockHash
from sim.kv_events.events import AllBlocksCleared, BlockRemoved, BlockStored, TimedEvent


class KVEventSink(Protocol):
    """Receives one replica's KV events as the block pool emits them."""

    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        """Blocks `block_hashes` (in order, the first one's parent `parent`) were cached."""
        ...

    def removed(self, block_hash: BlockHash) -> None:
        """One cached block with `block_hash` was evicted."""
        ...

    def cleared(self) -> None:
        """The whole prefix cache was dropped."""
        ...


class KVEventStream:
    """Records one replica's KV events (vLLM format, simulated time) and forwards them."""

    __slots__ = ("replica", "block_size", "_clock", "history", "forward")

    def __init__(
        self,
        replica: int,
        block_size: int,
        clock: Callable[[], float],
        forward: KVEventSink | None = None,
    ) -> None:
        self.replica = replica
        self.block_size = block_size
        self._clock = clock
        self.history: list[TimedEvent] = []
        self.forward = forward

    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        hashes = tuple(block_hashes)
        event = BlockStored(hashes, parent, len(hashes) * self.block_size, self.block_size)
        self.history.append(TimedEvent(self._clock(), self.replica, event))
        if self.forward is not None:
            self.forward.stored(hashes, parent)

    def removed(self, block_hash: BlockHash) -> None:
        self.history.append(TimedEvent(self._clock(), self.replica, BlockRemoved((block_hash,))))
        if self.forward is not None:
            self.forward.removed(block_hash)

    def cleared(self) -> None:
        self.history.append(TimedEvent(self._clock(), self.replica, AllBlocksCleared()))
        if self.forward is not None:
            self.forward.cleared()


def attach_streams(
    replicas: Sequence[Any],
    block_size: int,
    clock: Callable[[], float],
    feeds: Sequence[KVEventSink] | None,
    record: bool,
) -> list[KVEventStream | None]:
    """Connect each replica's single-group V1 pool to `feeds[i]` (the router's feed, if a
    router consumes events) and, with `record`, to a recording `KVEventStream`.

    Returns the recording streams (None for a replica that emits nothing, or without
    `record`).
    """
    from sim.kv.v1_engine.block_pool import BlockPool

    streams: list[KVEventStream | None] = []
    for i, replica in enumerate(replicas):
        pool = getattr(replica.manager, "block_pool", None)
        hybrid = getattr(replica.manager, "coordinator", None) is not None
        stream = None
        if isinstance(pool, BlockPool) and not hybrid:
            feed = feeds[i] if feeds is not None else None
            if record:
                stream = KVEventStream(replica.index, block_size, clock, feed)
            pool.event_sink = stream if stream is not None else feed
        streams.append(stream)
    return streams
