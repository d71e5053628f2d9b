"""KV cache events: what each V1-engine replica tells a router about its prefix cache.

`events` holds the vLLM-format event types, `stream` the per-replica sink the block pool
writes to (a stream the router consumes and a history the run writes as the `kv_events`
table), `table` that table's layout.
"""

from sim.kv_events.events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    TimedEvent,
)
from sim.kv_events.stream import KVEventSink, KVEventStream, attach_streams
from sim.kv_events.table import (
    KV_EVENT_COLUMNS,
    kv_events_chunks,
    kv_events_frame,
    write_kv_events,
)

__all__ = [
    "KV_EVENT_COLUMNS",
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "KVEventSink",
    "KVEventStream",
    "TimedEvent",
    "attach_streams",
    "kv_events_chunks",
    "kv_events_frame",
    "write_kv_events",
]
