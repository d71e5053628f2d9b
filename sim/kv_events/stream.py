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

With CPU offloading (`sim.kv_connector.offloading`) the replica's CPU tier writes to the same
sink (`tier_stored` / `tier_removed`, medium "CPU"), as vLLM's scheduler publishes the
connector's events in the pool's batch (`sim.kv_events.events`); without offloading no CPU
event exists.

A run that streams its tables to files (`kvsim run -o`) records with `spill`: every
`SPILL_ROWS` rows a stream appends its rows to a temporary file of its own and starts afresh,
so a run holds at most that many rows per replica in memory, however many events it emits;
`chunks()` reads them back, chunk by chunk, for the table (`sim.kv_events.table`).

Only the single-group V1 pool emits: vLLM 0.11.0 turns the hybrid KV cache manager off when
KV events are on (`vllm/config/__init__.py:L509-511`), and kvsim models no such fallback, so
a hybrid replica (and every v0 design) emits nothing.
"""

from __future__ import annotations

import enum
import tempfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, Protocol

import numpy as np

from sim.kv.types import BlockHash
from sim.kv_events.events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
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
        """The whole (GPU) prefix cache was dropped."""
        ...

    def tier_stored(self, block_hashes: Sequence[BlockHash], medium: str, block_size: int) -> None:
        """An offloading tier's copies of `block_hashes` completed (blocks of `block_size`
        tokens, not necessarily one chain: vLLM sends no parent)."""
        ...

    def tier_removed(self, block_hashes: Sequence[BlockHash], medium: str) -> None:
        """An offloading tier evicted `block_hashes`."""
        ...


#: The `medium` codes of the recorded rows (index into this tuple).
MEDIA = (MEDIUM_GPU, MEDIUM_CPU)


#: Rows a spilling stream keeps in memory before it appends them to its file (~2 MB).
SPILL_ROWS = 65_536
#: The recorded columns and their `array` type codes, in the order a spilled chunk stores them.
RAW_COLUMNS = (
    ("time_s", "d"),
    ("event", "q"),
    ("kind", "b"),
    ("block_hash", "q"),
    ("parent_block_hash", "q"),
    ("has_parent", "b"),
    ("position", "i"),
    ("medium", "b"),
)
#: One chunk of a stream's rows: column name -> values (`RAW_COLUMNS`).
RawRows = dict[str, np.ndarray]


class EventKind(enum.IntEnum):
    """A row's event type (the `kind` column names them as vLLM's classes)."""

    BLOCK_STORED = 0
    BLOCK_REMOVED = 1
    ALL_BLOCKS_CLEARED = 2


class KVEventStream:
    """Records one replica's KV events (vLLM format, simulated time) and forwards them.

    Recorded as the `kv_events` table's rows, one per block (`sim.kv_events.table`), in typed
    arrays: about 40 bytes a block where event objects would take a few hundred (a whole-trace
    replay emits millions). `events()` rebuilds the vLLM-format events. With `spill_rows`, the
    rows go to a temporary file once that many are in memory (at an event's end, so a chunk
    holds whole events); `chunks()` yields them back in order, then the rows still in memory.

    Example: spill_rows 3; a `stored` of 2 blocks, then one of 2 more -> 4 rows reach the
    file as one chunk; a `removed` then stays in memory: `chunks()` gives 4 rows, then 1.
    """

    __slots__ = (
        "replica",
        "block_size",
        "tier_block_size",
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
        "medium",
        "_spill_at",
        "_spill_file",
        "_spilled_rows",
    )

    def __init__(
        self,
        replica: int,
        block_size: int,
        clock: Callable[[], float],
        forward: KVEventSink | None = None,
        spill_rows: int | None = None,
    ) -> None:
        self.replica = replica
        self.block_size = block_size
        #: The offloading tier's block size, once it has reported a store (None: no CPU rows).
        self.tier_block_size: int | None = None
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
        #: Index into `MEDIA`: 0 (GPU) for the pool's rows, 1 (CPU) for the tier's.
        self.medium = array("b")
        if spill_rows is not None and spill_rows < 1:
            raise ValueError(f"spill_rows must be >= 1, got {spill_rows}")
        #: Spill when this many rows are in memory (None: never).
        self._spill_at = spill_rows
        self._spill_file: IO[bytes] | None = None
        #: The row count of each chunk in the spill file, in order.
        self._spilled_rows: list[int] = []

    @property
    def num_rows(self) -> int:
        return sum(self._spilled_rows) + len(self.event)

    def _event_done(self) -> None:
        """One more event is recorded; with `spill`, a full chunk goes to the file."""
        self.num_events += 1
        if self._spill_at is not None and len(self.event) >= self._spill_at:
            self._spill()

    def _spill(self) -> None:
        if self._spill_file is None:
            # Unnamed and removed by the OS when closed (or when the process ends); open
            # across calls, closed by `close()`.
            self._spill_file = tempfile.TemporaryFile(prefix="kvsim-kv-events-")  # noqa: SIM115
        self._spill_file.seek(0, 2)  # (after a `chunks()` read) append at the end
        self._spilled_rows.append(len(self.event))
        for name, typecode in RAW_COLUMNS:
            getattr(self, name).tofile(self._spill_file)
            setattr(self, name, array(typecode))

    def chunks(self) -> Iterator[RawRows]:
        """The recorded rows in order: each spilled chunk, then the rows in memory."""
        if self._spill_file is not None:
            spill = self._spill_file
            spill.flush()
            spill.seek(0)
            for num_rows in self._spilled_rows:
                chunk: RawRows = {}
                for name, typecode in RAW_COLUMNS:
                    dtype = np.dtype(typecode)
                    chunk[name] = np.frombuffer(spill.read(num_rows * dtype.itemsize), dtype)
                yield chunk
        if len(self.event) or not self._spilled_rows:
            yield {
                name: np.frombuffer(getattr(self, name), typecode) for name, typecode in RAW_COLUMNS
            }

    def close(self) -> None:
        """Release the spill file (its rows are gone; the rows in memory stay)."""
        if self._spill_file is not None:
            self._spill_file.close()
            self._spill_file = None
            self._spilled_rows = []

    def _row(
        self,
        time_s: float,
        kind: EventKind,
        block_hash: int,
        parent: int | None,
        position: int,
        medium: int = 0,
    ) -> None:
        self.time_s.append(time_s)
        self.event.append(self.num_events)
        self.kind.append(kind)
        self.block_hash.append(block_hash)
        self.parent_block_hash.append(0 if parent is None else parent)
        self.has_parent.append(parent is not None)
        self.position.append(position)
        self.medium.append(medium)

    def stored(self, block_hashes: Sequence[BlockHash], parent: BlockHash | None) -> None:
        time_s = self._clock()
        previous: int | None = parent
        for position, block_hash in enumerate(block_hashes):
            self._row(time_s, EventKind.BLOCK_STORED, block_hash, previous, position)
            previous = block_hash
        self._event_done()
        if self.forward is not None:
            self.forward.stored(block_hashes, parent)

    def removed(self, block_hash: BlockHash) -> None:
        self._row(self._clock(), EventKind.BLOCK_REMOVED, block_hash, None, 0)
        self._event_done()
        if self.forward is not None:
            self.forward.removed(block_hash)

    def cleared(self) -> None:
        self._row(self._clock(), EventKind.ALL_BLOCKS_CLEARED, 0, None, 0)
        self._event_done()
        if self.forward is not None:
            self.forward.cleared()

    def tier_stored(self, block_hashes: Sequence[BlockHash], medium: str, block_size: int) -> None:
        if self.tier_block_size not in (None, block_size):
            raise AssertionError(f"tier block size changed: {self.tier_block_size} -> {block_size}")
        self.tier_block_size = block_size
        self._tier_rows(EventKind.BLOCK_STORED, block_hashes, medium)
        if self.forward is not None:
            self.forward.tier_stored(block_hashes, medium, block_size)

    def tier_removed(self, block_hashes: Sequence[BlockHash], medium: str) -> None:
        self._tier_rows(EventKind.BLOCK_REMOVED, block_hashes, medium)
        if self.forward is not None:
            self.forward.tier_removed(block_hashes, medium)

    def _tier_rows(self, kind: EventKind, block_hashes: Sequence[BlockHash], medium: str) -> None:
        """One event of an offloading tier: a row per block, none with a parent."""
        time_s = self._clock()
        code = MEDIA.index(medium)
        for position, block_hash in enumerate(block_hashes):
            self._row(time_s, kind, block_hash, None, position, code)
        self._event_done()

    def events(self) -> list[TimedEvent]:
        """The recorded events in vLLM's format, in order."""
        out: list[TimedEvent] = []
        parts = list(self.chunks())
        raw = {name: np.concatenate([p[name] for p in parts]).tolist() for name, _ in RAW_COLUMNS}
        event_of, kind_of, hash_of = raw["event"], raw["kind"], raw["block_hash"]
        row = 0
        num_rows = len(event_of)
        while row < num_rows:
            end = row + 1
            while end < num_rows and event_of[end] == event_of[row]:
                end += 1
            kind = EventKind(kind_of[row])
            hashes = tuple(BlockHash(h) for h in hash_of[row:end])
            medium = MEDIA[raw["medium"][row]]
            block_size = self.block_size
            if medium != MEDIUM_GPU:
                assert self.tier_block_size is not None
                block_size = self.tier_block_size
            event: KVCacheEvent
            if kind is EventKind.BLOCK_STORED:
                parent = (
                    BlockHash(raw["parent_block_hash"][row]) if raw["has_parent"][row] else None
                )
                num_tokens = len(hashes) * block_size
                event = BlockStored(hashes, parent, num_tokens, block_size, medium=medium)
            elif kind is EventKind.BLOCK_REMOVED:
                event = BlockRemoved(hashes, medium)
            else:
                event = AllBlocksCleared()
            out.append(TimedEvent(raw["time_s"][row], self.replica, event))
            row = end
        return out


def attach_streams(
    replicas: Sequence[Any],
    block_size: int,
    clock: Callable[[], float],
    feeds: Sequence[KVEventSink] | None,
    record: bool,
    spill: bool = False,
) -> list[KVEventStream | None]:
    """Connect each replica's single-group V1 pool, and its CPU offloading tier if any, to
    `feeds[i]` (the router's feed, if a router consumes events) and, with `record`, to a
    recording `KVEventStream`.

    `spill`: the recording streams keep at most `SPILL_ROWS` rows in memory (the rest in a
    temporary file each), for a run whose tables stream to files.

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
                spill_rows = SPILL_ROWS if spill else None
                stream = KVEventStream(replica.index, block_size, clock, feed, spill_rows)
            sink = stream if stream is not None else feed
            pool.event_sink = sink
            tier = _offloading_tier(replica)
            if tier is not None:
                tier.event_sink = sink
        streams.append(stream)
    return streams


def _offloading_tier(replica: Any) -> Any:
    """The replica's CPU offloading tier (`LRUCpuTier`), or None without offloading."""
    from sim.kv_connector.cpu_tier import LRUCpuTier

    hooks = getattr(replica, "connector_hooks", None)
    tier = getattr(getattr(hooks, "connector", None), "tier", None)
    return tier if isinstance(tier, LRUCpuTier) else None
