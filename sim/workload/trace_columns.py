"""The pieces every trace loader shares (`loaders`, `canonical`): a column of arrivals,
token counts or output lengths checked row by row, the chunks of a CSV or JSONL file with
their row locators, and the validated, streamed `Workload` of a file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.workload import trace_stream
from sim.workload._table import (
    ArrivalCarry,
    RowLocator,
    check_columns,
    check_non_decreasing,
    iter_csv_strings,
    iter_jsonl_records,
    jsonl_columns,
    numeric_column,
)
from sim.workload.errors import WorkloadError
from sim.workload.request import Workload
from sim.workload.trace_stream import ChunkReader, streamed

if TYPE_CHECKING:
    import pandas as pd

#: Mooncake FAST'25 traces hash prompts in blocks of this many tokens (upstream README).
MOONCAKE_BLOCK_TOKENS = 512
_OUTPUT_HINT = " (vLLM generates at least one token)"


def output_column(values: Any, name: str, loc: RowLocator) -> np.ndarray:
    try:
        return numeric_column(values, name, loc, integer=True, min_value=1).astype(np.int64)
    except WorkloadError as exc:
        if exc.message.startswith("must be >= 1"):
            raise loc.error(_row_of(exc, loc), name, exc.message + _OUTPUT_HINT) from None
        raise


def _row_of(exc: WorkloadError, loc: RowLocator) -> int:
    if loc.line_numbers is not None:
        return int(np.searchsorted(loc.line_numbers, exc.line))  # type: ignore[arg-type]  # a row error has a line
    return int(exc.line) - loc.first_line  # type: ignore[arg-type]


def arrival_column(
    values: Any, name: str, loc: RowLocator, carry: ArrivalCarry, divisor: float = 1.0
) -> np.ndarray:
    # Divide (not multiply by 1e-3): 3536999 / 1000 is the nearest double to 3536.999.
    arrival = numeric_column(values, name, loc, integer=False, min_value=0) / divisor
    check_non_decreasing(arrival, name, loc, carry)
    return arrival


def token_column(values: Any, name: str, loc: RowLocator) -> np.ndarray:
    return numeric_column(values, name, loc, integer=True, min_value=1).astype(np.int64)


def stream_workload(read: ChunkReader, path: Path, metadata: dict[str, Any]) -> Workload:
    """Validate the file `read` reads and stream its requests (`sim.workload.trace_stream`)."""
    requests, first_meta = streamed(read, path)
    if len(requests) == 0:
        raise WorkloadError(str(path), "no requests in file")
    metadata = {"path": str(path), "num_rows": len(requests), **metadata, **first_meta}
    return Workload(requests, str(path), metadata)


def csv_chunks(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], chunk_rows: int
) -> Iterator[tuple[pd.DataFrame, RowLocator, int]]:
    """(frame, its locator, index of its first row) of each chunk of a CSV, header checked."""
    for frame, start in iter_csv_strings(path, required, optional, chunk_rows):
        check_columns(path, list(frame.columns), required, optional)
        yield frame, RowLocator(str(path), first_line=2 + start), start


def jsonl_chunks(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], chunk_rows: int
) -> Iterator[tuple[dict[str, list[Any]], RowLocator, int]]:
    """(columns, locator, index of the first row) of each chunk of a JSONL file."""
    start = 0
    for records, lines in iter_jsonl_records(path, chunk_rows):
        loc = RowLocator(str(path), line_numbers=lines)
        yield jsonl_columns(records, loc, required, optional), loc, start
        start += len(records)


def chunk_rows_or_default(chunk_rows: int | None) -> int:
    # Looked up when a file is read (not bound as a default) so tests can shrink it.
    return chunk_rows if chunk_rows is not None else trace_stream.TRACE_CHUNK_ROWS
