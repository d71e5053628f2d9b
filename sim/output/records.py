"""Columnar run records: the `steps` and `requests` tables, row by row into chunks, chunk by
chunk into a sink.

A table is a `ColumnarTable`: one preallocated numpy chunk of `chunk_rows` rows (a structured
array: one typed field per column), filled with one assignment per row; a full chunk is cut
into one contiguous array per column and handed to the table's sink, and the chunk is reused.
So a run holds at most one chunk per table, whatever its length. Sinks (`TableSink`):

* `MemorySink` keeps the chunks and joins them into a DataFrame at the end (the Python API,
  `sim.engine.run.run`);
* `FileSink` (`sim.files.tables`) writes each chunk as a Parquet row group and CSV rows, as
  the run goes (`kvsim run -o`).

`requests` rows are written when a request reaches a terminal state (then the engine drops the
Request), but the table is sorted by `request_id`: `RequestRows` holds each finished row
until every request with a smaller id has its row (see its docstring), so the rows reach the
table, and the files, in their final order and nothing is sorted at the end.

Example: chunk_rows 2, rows r0, r1, r2 -> the sink gets the chunk [r0, r1] at the second
append and [r2] at `close()`; the frame is the three rows in order.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from sim.scheduler import Request

if TYPE_CHECKING:  # pandas loads when a table becomes a DataFrame, not with the engine
    import pandas as pd

#: One row per scheduler call that ran a batch or changed the queues. A call that ran nothing
#: but preempted, ignored or failed requests (vLLM's engine step with an empty batch), and the
#: call in which the run ended (a fatal engine error, a stop policy), are rows with
#: `duration_s` 0 and no tokens, so `num_preempted` sums to the requests' preemptions.
STEP_COLUMNS = (
    "replica",
    "step",
    "start_s",
    "duration_s",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_decode_seqs",
    "num_tokens",
    "num_context_tokens",
    "num_preempted",
    "num_waiting",
    "num_running",
    "num_swapped",
    "num_free_blocks",
    "num_used_blocks",
    "num_cached_blocks",
)
STEP_DTYPE = np.dtype(
    [(name, "f8" if name in ("start_s", "duration_s") else "i8") for name in STEP_COLUMNS]
)

REQUEST_COLUMNS = (
    "request_id",
    "replica",
    "arrival_s",
    "prompt_tokens",
    "max_tokens",
    "generated_tokens",
    "first_scheduled_s",
    "first_token_s",
    "finish_s",
    "queueing_s",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "num_preemptions",
    "num_prefix_hit_tokens",
    "state",
    "reason",
)
_REQUEST_TEXT = ("state", "reason")
_REQUEST_INTS = (
    "request_id",
    "replica",
    "prompt_tokens",
    "max_tokens",
    "generated_tokens",
    "num_preemptions",
    "num_prefix_hit_tokens",
)
REQUEST_DTYPE = np.dtype(
    [
        (name, "O" if name in _REQUEST_TEXT else "i8" if name in _REQUEST_INTS else "f8")
        for name in REQUEST_COLUMNS
    ]
)

#: Rows per chunk: ~8 MB of steps; large enough that Parquet row groups compress well.
DEFAULT_CHUNK_ROWS = 65_536
#: A table's first chunk; it doubles up to the chunk size.
_FIRST_CHUNK_ROWS = 1_024

Columns = dict[str, np.ndarray]


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def request_row(r: Request) -> tuple:
    """A terminal request's row of the `requests` table (see `sim.output.results` for the latencies)."""
    generated = r.seq.output_len
    first_token_s = r.first_token_s
    last_token_s = r.last_token_s
    tpot = (
        (last_token_s - first_token_s) / (generated - 1)
        if first_token_s is not None and last_token_s is not None and generated > 1
        else math.nan
    )
    state = r.state.value
    return (
        r.request_id,
        r.replica,
        r.arrival_s,
        r.prompt_tokens,
        r.max_tokens,
        generated,
        _nan(r.first_scheduled_s),
        _nan(first_token_s),
        _nan(r.finish_s),
        _nan(r.first_scheduled_s) - r.arrival_s,
        _nan(first_token_s) - r.arrival_s,
        tpot,
        _nan(r.finish_s) - r.arrival_s if state == "finished" else math.nan,
        r.num_preemptions,
        r.num_prefix_hit_tokens,
        state,
        r.finish_reason,
    )


def columns_frame(columns: Columns, names: tuple[str, ...]) -> pd.DataFrame:
    """The DataFrame of one chunk (or of the joined chunks), columns in table order."""
    import pandas as pd

    return pd.DataFrame({name: columns[name] for name in names})


def empty_frame(names: tuple[str, ...]) -> pd.DataFrame:
    """A table with no rows, typed as the run's tables always were when empty (object)."""
    import pandas as pd

    return pd.DataFrame.from_records([], columns=list(names))


class TableSink(Protocol):
    """Where a table's chunks go, in row order; `close()` once after the last chunk."""

    def write(self, columns: Columns) -> None: ...

    def close(self) -> None: ...

    def abort(self) -> None:
        """The run failed: release what is open; the table is incomplete."""
        ...

    def frame(self) -> pd.DataFrame:
        """The whole table as a DataFrame (after `close()`)."""
        ...


class MemorySink:
    """Keeps every chunk: the table in memory, for the Python API."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.chunks: list[Columns] = []

    def write(self, columns: Columns) -> None:
        self.chunks.append(columns)

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass

    def frame(self) -> pd.DataFrame:
        if not self.chunks:
            return empty_frame(self.names)
        if len(self.chunks) > 1:  # joined once, so later frames need no copy
            self.chunks = [
                {name: np.concatenate([c[name] for c in self.chunks]) for name in self.names}
            ]
        return columns_frame(self.chunks[0], self.names)


@dataclass(frozen=True)
class TableSinks:
    """Where a run's `requests` and `steps` go. `spill_to_file`: the summary's latency values
    wait in a temporary file rather than in memory (`sim.output.stats.Spill`)."""

    requests: TableSink
    steps: TableSink
    spill_to_file: bool = False

    def abort(self) -> None:
        self.requests.abort()
        self.steps.abort()


def memory_sinks() -> TableSinks:
    return TableSinks(MemorySink(REQUEST_COLUMNS), MemorySink(STEP_COLUMNS))


class ColumnarTable:
    """A table filled one row at a time into a preallocated chunk, flushed to `sink` when full.

    The chunk starts small and doubles up to `chunk_rows` (a short run allocates little);
    `listeners` see every flushed chunk too (the run's summary statistics).
    """

    def __init__(
        self, dtype: np.dtype, sink: TableSink, chunk_rows: int = DEFAULT_CHUNK_ROWS
    ) -> None:
        if chunk_rows < 1:
            raise ValueError(f"chunk_rows must be >= 1, got {chunk_rows}")
        self.dtype = dtype
        self.names: tuple[str, ...] = tuple(dtype.names or ())
        self.sink = sink
        self.listeners: list = []
        self.num_rows = 0
        self._chunk = np.empty(min(_FIRST_CHUNK_ROWS, chunk_rows), dtype)
        self._chunk_rows = chunk_rows
        self._n = 0

    def append(self, row: tuple) -> None:
        self._chunk[self._n] = row
        self._n += 1
        if self._n == len(self._chunk):
            self._grow_or_flush()

    def _grow_or_flush(self) -> None:
        size = len(self._chunk)
        if size >= self._chunk_rows:
            self.flush()
            return
        grown = np.empty(min(2 * size, self._chunk_rows), self.dtype)
        grown[:size] = self._chunk
        self._chunk = grown

    def flush(self) -> None:
        n = self._n
        if not n:
            return
        part = self._chunk[:n]
        # One contiguous copy per column: the sink may keep it while the chunk is refilled.
        # (`np.ascontiguousarray` would not copy a one-row field view, which is contiguous.)
        columns = {name: part[name].copy() for name in self.names}
        self.num_rows += n
        self._n = 0
        for listener in self.listeners:
            listener(columns)
        self.sink.write(columns)

    def close(self) -> None:
        self.flush()
        self.sink.close()


class RequestRows:
    """Terminal requests' rows, released to the `requests` table in `request_id` order.

    When requests arrive in increasing id order (every trace and synthetic workload: ids are
    row numbers, rows are sorted by arrival), a row can be written as soon as every request
    that arrived before it has its row: the arrived ids wait in a queue, the finished rows in a
    dict, and the head of the queue is released while it has a row. Memory: the requests that
    arrived since the oldest unfinished one (about the requests in flight). Requests that never
    arrived come after the arrived ones in id order, so they go through the same queue.

    Otherwise (`ids_ascending` False: ids out of arrival order, e.g. an inline workload listed
    out of id order) every row waits until `close()`, which sorts them: that workload is a
    list in memory anyway.

    Example: arrivals 0, 1, 2; 1 finishes (held), 0 finishes (0 and 1 written), 2 finishes
    (2 written).
    """

    def __init__(self, table: ColumnarTable, ids_ascending: bool) -> None:
        self.table = table
        self.ids_ascending = ids_ascending
        self._arrived: deque[int] = deque()
        self._ready: dict[int, tuple] = {}
        self._last_id = -1

    @property
    def num_held(self) -> int:
        """Rows waiting for a request with a smaller id (the reorder window)."""
        return len(self._ready)

    def arrived(self, request_id: int) -> None:
        if self.ids_ascending:
            if request_id <= self._last_id:
                raise RuntimeError(
                    f"request {request_id} arrived after request {self._last_id}: the "
                    "workload promised ids ascending in arrival order"
                )
            self._last_id = request_id
            self._arrived.append(request_id)

    def terminal(self, request: Request) -> None:
        """`request` reached its terminal state: its row is final."""
        self._ready[request.request_id] = request_row(request)
        if self.ids_ascending:
            arrived, ready, append = self._arrived, self._ready, self.table.append
            while arrived and arrived[0] in ready:
                append(ready.pop(arrived.popleft()))

    def close(self) -> None:
        if self._arrived:
            raise RuntimeError(
                f"request {self._arrived[0]} arrived but never reached a terminal state "
                "(every request must end finished, ignored, failed or aborted)"
            )
        for request_id in sorted(self._ready):
            self.table.append(self._ready[request_id])
        self._ready.clear()
        self.table.close()
