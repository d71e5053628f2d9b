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

import pandas as pd

from sim.kv_events.events import BlockRemoved, BlockStored, TimedEvent

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

BLOCK_STORED = "BlockStored"
BLOCK_REMOVED = "BlockRemoved"
ALL_BLOCKS_CLEARED = "AllBlocksCleared"


def kv_events_frame(histories: Iterable[list[TimedEvent] | None]) -> pd.DataFrame:
    """The table of every replica's event history (replica by replica, each in order)."""
    columns: dict[str, list] = {name: [] for name in KV_EVENT_COLUMNS}
    replica_col = columns["replica"]
    event_col = columns["event"]
    time_col = columns["time_s"]
    kind_col = columns["kind"]
    hash_col = columns["block_hash"]
    parent_col = columns["parent_block_hash"]
    position_col = columns["position"]
    tokens_col = columns["num_tokens"]
    size_col = columns["block_size"]
    medium_col = columns["medium"]

    def row(replica, number, time_s, kind, block_hash, parent, position, tokens, size, medium):
        replica_col.append(replica)
        event_col.append(number)
        time_col.append(time_s)
        kind_col.append(kind)
        hash_col.append(block_hash)
        parent_col.append(parent)
        position_col.append(position)
        tokens_col.append(tokens)
        size_col.append(size)
        medium_col.append(medium)

    for history in histories:
        for number, timed in enumerate(history or ()):
            event = timed.event
            if isinstance(event, BlockStored):
                parent = event.parent_block_hash
                for position, block_hash in enumerate(event.block_hashes):
                    row(
                        timed.replica,
                        number,
                        timed.time_s,
                        BLOCK_STORED,
                        block_hash,
                        parent,
                        position,
                        event.block_size,
                        event.block_size,
                        event.medium,
                    )
                    parent = block_hash
            elif isinstance(event, BlockRemoved):
                for position, block_hash in enumerate(event.block_hashes):
                    row(
                        timed.replica,
                        number,
                        timed.time_s,
                        BLOCK_REMOVED,
                        block_hash,
                        None,
                        position,
                        None,
                        None,
                        event.medium,
                    )
            else:
                row(timed.replica, number, timed.time_s, ALL_BLOCKS_CLEARED, *[None] * 6)
    columns["lora_id"] = [None] * len(replica_col)  # kvsim models no LoRA adapters
    return pd.DataFrame(
        {
            "replica": pd.array(replica_col, dtype="int64"),
            "event": pd.array(event_col, dtype="int64"),
            "time_s": pd.array(time_col, dtype="float64"),
            "kind": pd.array(kind_col, dtype="object"),
            "block_hash": pd.array(hash_col, dtype="Int64"),
            "parent_block_hash": pd.array(parent_col, dtype="Int64"),
            "position": pd.array(position_col, dtype="Int64"),
            "num_tokens": pd.array(tokens_col, dtype="Int64"),
            "block_size": pd.array(size_col, dtype="Int64"),
            "lora_id": pd.array(columns["lora_id"], dtype="Int64"),
            "medium": pd.array(medium_col, dtype="object"),
        },
        columns=KV_EVENT_COLUMNS,
    )
