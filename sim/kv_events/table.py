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

from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from sim.kv_events.stream import MEDIA, EventKind, KVEventStream

if TYPE_CHECKING:  # pandas loads when the table is made, not with the engine
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


def kv_events_frame(streams: Iterable[KVEventStream | None]) -> pd.DataFrame:
    """The table of every replica's recorded events (replica by replica, each in order)."""
    import pandas as pd

    parts: dict[str, list[np.ndarray]] = {
        name: []
        for name in (
            "replica",
            "event",
            "time_s",
            "kind",
            "hash",
            "parent",
            "has_parent",
            "position",
            "block_size",
            "medium",
        )
    }
    for stream in streams:
        if stream is None:
            continue
        num_rows = len(stream.event)
        parts["replica"].append(np.full(num_rows, stream.replica, dtype=np.int64))
        parts["event"].append(np.frombuffer(stream.event, dtype=np.int64))
        parts["time_s"].append(np.frombuffer(stream.time_s, dtype=np.float64))
        parts["kind"].append(np.frombuffer(stream.kind, dtype=np.int8))
        parts["hash"].append(np.frombuffer(stream.block_hash, dtype=np.int64))
        parts["parent"].append(np.frombuffer(stream.parent_block_hash, dtype=np.int64))
        parts["has_parent"].append(np.frombuffer(stream.has_parent, dtype=np.int8))
        parts["position"].append(np.frombuffer(stream.position, dtype=np.int32))
        medium = np.frombuffer(stream.medium, dtype=np.int8)
        parts["medium"].append(medium)
        tier_block_size = stream.tier_block_size or 0
        parts["block_size"].append(
            np.where(medium == 0, stream.block_size, tier_block_size).astype(np.int64)
        )
    empty = {
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
    col = {
        name: np.concatenate(arrays) if arrays else np.empty(0, dtype=empty[name])
        for name, arrays in parts.items()
    }
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
