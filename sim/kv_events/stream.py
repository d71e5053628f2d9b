"""Where the V1 block pool's KV events go: the sink seam, the recorder, and the wiring.

`BlockPool.event_sink` is None unless a run records KV events (`engine.kv_events`) or a
router consumes them (`prefix_cache_aware`); then the pool calls `stored` when it caches full
blocks and `removed` when it evicts a cached block, where vLLM's pool queues its events
(`sim.kv_events.events`). The sink is

* the router's feed for the replica (`sim.routing.cache_index.ReplicaFeed`) when only the
  router consumes the events: no event objects are built on the hot path;
* a `KVEventStream` when the run records them: it keeps each event, stamped with the
  simulated time, as rows of the `kv_events` table and forwards the call to the router's
  feed, if any.

Only the single-group V1 pool emits: vLLM 0.11.0 turns the hybrid KV cache manager off when
KV events are on (`vllm/config/__init__.py:L509-511`), and kvsim models no such fallback, so
a hybrid replica (and every v0 design) emits nothing.
"""

from __future__ import annotations

import enum
from array import array
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from sim.kv.types import BlockHash
from sim.kv_events.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    TimedEvent,
)


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


class EventKind(enum.IntEnum):
    """A row's event type (the `kind` column names them as vLLM's classes)."""

    BLOCK_STORED = 0
    BLOCK_REMOVED = 1
    ALL_BLOCKS_CLEARED = 2


class KVEventStream:
    """Records one replica's KV events (vLLM format, simulated time) and forwards them.

    Recorded as the `kv_events` table's rows, one per block (`sim.kv_events.table`), in typed
    arrays: about 40 bytes a block where event objects would take a few hundred (a whole-trace
    replay emits millions). `events()` rebuilds the vLLM-format events.
    """

    __slots__ = (
        "replica",
        "block_size",
        "_clock",
        "forward",
        "num_events",
        "time_s",
        "event",
        "kind",
        "block_hash",
        "parent_block_hash",
        "has_parent",
        "position",
    )

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
        self.forward = forward
        self.num_events = 0
        # One entry per row (block); `has_parent` 0 where the parent is None.
        self.time_s = array("d")
        self.event = array("q")
        self.kind = array("b")
        self.block_hash = array("q")
        self.parent_block_hash = array("q")
        self.has_parent = array("b")
        self.position = array("i")

    def _row(
        self, time_s: float, kind: EventKind, block_hash: int, parent: int | None, position: int
    ) -> None:
        self.time_s.append(time_s)
        self.event.append(self.num_events)
        self.kind.append(kind)
        self.block_hash.append(block_hash)
        self.parent_block_hash.append(0 if parent is None else parent)
        self.has_parent.append(parent is not None)
        self.position.append(position)

    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        time_s = self._clock()
        previous: int | None = parent
        for position, block_hash in enumerate(block_hashes):
            self._row(time_s, EventKind.BLOCK_STORED, block_hash, previous, position)
            previous = block_hash
        self.num_events += 1
        if self.forward is not None:
            self.forward.stored(block_hashes, parent)

    def removed(self, block_hash: BlockHash) -> None:
        self._row(self._clock(), EventKind.BLOCK_REMOVED, block_hash, None, 0)
        self.num_events += 1
        if self.forward is not None:
            self.forward.removed(block_hash)

    def cleared(self) -> None:
        self._row(self._clock(), EventKind.ALL_BLOCKS_CLEARED, 0, None, 0)
        self.num_events += 1
        if self.forward is not None:
            self.forward.cleared()

    def events(self) -> list[TimedEvent]:
        """The recorded events in vLLM's format, in order."""
        out: list[TimedEvent] = []
        row = 0
        num_rows = len(self.event)
        while row < num_rows:
            end = row + 1
            while end < num_rows and self.event[end] == self.event[row]:
                end += 1
            kind = EventKind(self.kind[row])
            hashes = tuple(BlockHash(h) for h in self.block_hash[row:end])
            event: KVCacheEvent
            if kind is EventKind.BLOCK_STORED:
                parent = BlockHash(self.parent_block_hash[row]) if self.has_parent[row] else None
                event = BlockStored(hashes, parent, len(hashes) * self.block_size, self.block_size)
            elif kind is EventKind.BLOCK_REMOVED:
                event = BlockRemoved(hashes)
            else:
                event = AllBlocksCleared()
            out.append(TimedEvent(self.time_s[row], self.replica, event))
            row = end
        return out


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
        # Every V1 manager has a coordinator; a hybrid one has several KV-cache groups (vLLM
        # turns the hybrid manager off when KV events are on, so kvsim emits none there).
        hybrid = getattr(replica.manager, "num_kv_cache_groups", 1) > 1
        stream = None
        if isinstance(pool, BlockPool) and not hybrid:
            feed = feeds[i] if feeds is not None else None
            if record:
                stream = KVEventStream(replica.index, block_size, clock, feed)
            pool.event_sink = stream if stream is not None else feed
        streams.append(stream)
    return streams
