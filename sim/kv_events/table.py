"""The `kv_events` table: one row per block of each KV cache event, in emission order.

An event carries a list of block hashes (`BlockStored` several, `BlockRemoved` one in
practice, `AllBlocksCleared` none), which a flat table (CSV) cannot hold in one cell, so each
block gets a row and `event` numbers the events of a replica (0, 1, ...): the rows of one
event share it, and `position` orders its blocks. `parent_block_hash` is the hash of the block
before this one in the chain (the event's parent for its first block), so every stored row
says what the block extends. An `AllBlocksCleared` event is one row without a hash.

Example: replica 0 caches blocks [h1, h2] of a fresh prompt at t = 0.5 s (block size 16),
then evicts h2 at 0.9 s::

    replica event time_s kind          block_hash parent_block_hash position num_tokens ...
    0       0     0.5    BlockStored   h1         <NA>              0        16
    0       0     0.5    BlockStored   h2         h1                1        16
    0       1     0.9    BlockRemoved  h2         <NA>              0        <NA>
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sim.files.tables import FileSink, write_table
from sim.kv_events.stream import MEDIA, EventKind, KVEventStream, RawRows

if TYPE_CHECKING:  # imported where a table is built: `kvsim run` without events loads no pandas
    import pandas as pd

KV_EVENT_COLUMNS = [
    "replica",
    "event",
    "time_s",
    "kind",
    "block_hash",
    "parent_block_hash",
    "position",
    "num_tokens",
    "block_size",
    "lora_id",
    "medium",
]

#: The `kind` column's values: vLLM's event class names.
KIND_NAMES = {
    EventKind.BLOCK_STORED: "BlockStored",
    EventKind.BLOCK_REMOVED: "BlockRemoved",
    EventKind.ALL_BLOCKS_CLEARED: "AllBlocksCleared",
}


def _ints(values: np.ndarray, present: np.ndarray) -> pd.arrays.IntegerArray:
    """A nullable int64 column: `values` where `present`, missing elsewhere."""
    import pandas as pd

    return pd.arrays.IntegerArray(values.astype(np.int64, copy=False), ~present)


_DTYPES = {
    "replica": np.int64,
    "event": np.int64,
    "time_s": np.float64,
    "kind": np.int8,
    "hash": np.int64,
    "parent": np.int64,
    "has_parent": np.int8,
    "position": np.int32,
    "block_size": np.int64,
    "medium": np.int8,
}


def _parts(stream: KVEventStream, raw: RawRows) -> dict[str, np.ndarray]:
    """One chunk of a stream's rows as the table's raw columns (`_DTYPES`)."""
    medium = raw["medium"]
    tier_block_size = stream.tier_block_size or 0
    return {
        "replica": np.full(len(raw["event"]), stream.replica, dtype=np.int64),
        "event": raw["event"],
        "time_s": raw["time_s"],
        "kind": raw["kind"],
        "hash": raw["block_hash"],
        "parent": raw["parent_block_hash"],
        "has_parent": raw["has_parent"],
        "position": raw["position"],
        "medium": medium,
        "block_size": np.where(medium == 0, stream.block_size, tier_block_size).astype(np.int64),
    }


def _frame(col: dict[str, np.ndarray]) -> pd.DataFrame:
    """The table's rows from raw columns (`_parts`, or several joined)."""
    import pandas as pd

    kind = col["kind"]
    stored = kind == EventKind.BLOCK_STORED
    has_block = kind != EventKind.ALL_BLOCKS_CLEARED
    # Categoricals: two text columns of millions of rows would be millions of objects.
    kinds = pd.Categorical.from_codes(kind, categories=[KIND_NAMES[k] for k in EventKind])
    medium = pd.Categorical.from_codes(
        np.where(has_block, col["medium"], -1), categories=list(MEDIA)
    )
    num_rows = len(kind)
    return pd.DataFrame(
        {
            "replica": col["replica"],
            "event": col["event"],
            "time_s": col["time_s"],
            "kind": kinds,
            "block_hash": _ints(col["hash"], has_block),
            "parent_block_hash": _ints(col["parent"], col["has_parent"].astype(bool)),
            "position": _ints(col["position"], has_block),
            "num_tokens": _ints(col["block_size"], stored),
            "block_size": _ints(col["block_size"], stored),
            # kvsim models no LoRA adapters.
            "lora_id": _ints(np.zeros(num_rows, dtype=np.int64), np.zeros(num_rows, dtype=bool)),
            "medium": medium,
        },
        columns=KV_EVENT_COLUMNS,
    )


def kv_events_frame(streams: Iterable[KVEventStream | None]) -> pd.DataFrame:
    """The table of every replica's recorded events (replica by replica, each in order)."""
    parts = [
        _parts(stream, raw) for stream in streams if stream is not None for raw in stream.chunks()
    ]
    col = {
        name: np.concatenate([p[name] for p in parts]) if parts else np.empty(0, dtype=dtype)
        for name, dtype in _DTYPES.items()
    }
    return _frame(col)


def kv_events_chunks(streams: Iterable[KVEventStream | None]) -> Iterator[pd.DataFrame]:
    """`kv_events_frame(streams)` in consecutive pieces (a stream's chunks, `chunks()`): the
    pieces joined are that frame, and only one piece is built at a time."""
    for stream in streams:
        if stream is None:
            continue
        for raw in stream.chunks():
            if len(raw["event"]):
                yield _frame(_parts(stream, raw))


def write_kv_events(streams: Sequence[KVEventStream | None], folder: Path) -> int:
    """Write the `kv_events` table into `folder` (`kv_events.csv`, `kv_events.parquet`) a
    piece at a time (`kv_events_chunks`); returns its row count.

    The CSV is byte for byte what `write_table(kv_events_frame(streams), ...)` writes, the
    Parquet file the same table (in a row group per piece); memory stays one piece.
    """
    sink: FileSink | None = None
    num_rows = 0
    try:
        for frame in kv_events_chunks(streams):
            if sink is None:
                sink = FileSink(folder, "kv_events", tuple(KV_EVENT_COLUMNS))
            sink.write_frame(frame)
            num_rows += len(frame)
    except BaseException:
        if sink is not None:
            sink.abort()
        raise
    if sink is None:  # no row: the typed empty table, as `write_table` writes it
        write_table(kv_events_frame([]), folder, "kv_events")
    else:
        sink.close()
    return num_rows
