"""The canonical trace format (``.csv``, ``.jsonl``, ``.parquet``): ``arrival_s,
prompt_tokens, output_tokens``, optional ``priority``, ``prefix_id`` + ``prefix_tokens`` or
``hash_ids`` (`loaders`' docstring describes every format; `load_trace` dispatches here)."""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.kv.types import Segment
from sim.workload._table import (
    ArrivalCarry,
    RowLocator,
    check_columns,
    numeric_column,
    require_file,
)
from sim.workload.errors import WorkloadError
from sim.workload.prefixes import hash_prefixes
from sim.workload.request import MAX_PREFIX_ID, PREFIX_KEY_BASE, Workload
from sim.workload.trace_columns import (
    MOONCAKE_BLOCK_TOKENS,
    arrival_column,
    chunk_rows_or_default,
    csv_chunks,
    jsonl_chunks,
    output_column,
    stream_workload,
    token_column,
)
from sim.workload.trace_stream import Chunk

if TYPE_CHECKING:
    import pandas as pd

_CANONICAL_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
_CANONICAL_OPTIONAL = ("priority", "prefix_id", "prefix_tokens", "hash_ids")


def load_canonical(
    path: Path, *, hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS, chunk_rows: int | None = None
) -> Workload:
    """Canonical trace from ``.csv``, ``.jsonl`` or ``.parquet`` (see the module docstring)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".jsonl", ".parquet"):
        raise WorkloadError(path, f"unknown canonical extension {suffix!r} (.csv/.jsonl/.parquet)")
    read = partial(_canonical_chunks, path, hash_block_tokens, chunk_rows_or_default(chunk_rows))
    return stream_workload(read, path, {"format": "canonical"})


def _canonical_chunks(path: Path, hash_block_tokens: int, chunk_rows: int) -> Iterator[Chunk]:
    carry = ArrivalCarry()
    for columns, loc, start in _canonical_columns(path, chunk_rows):
        yield _canonical_chunk(columns, loc, start, hash_block_tokens, carry)


def _canonical_columns(
    path: Path, chunk_rows: int
) -> Iterator[tuple[dict[str, Any], RowLocator, int]]:
    suffix = path.suffix.lower()
    required, optional = _CANONICAL_REQUIRED, _CANONICAL_OPTIONAL
    if suffix == ".csv":
        for frame, loc, start in csv_chunks(path, required, optional, chunk_rows):
            columns: dict[str, Any] = {c: frame[c] for c in frame.columns}
            if "hash_ids" in frame:
                columns["hash_ids"] = _split_csv_ids(frame["hash_ids"], loc)
            yield columns, loc, start
    elif suffix == ".jsonl":
        yield from jsonl_chunks(path, required, optional, chunk_rows)
    else:
        yield from _parquet_chunks(path, chunk_rows)


def _canonical_chunk(
    columns: dict[str, Any],
    loc: RowLocator,
    start: int,
    hash_block_tokens: int,
    carry: ArrivalCarry,
) -> Chunk:
    num_rows = len(columns["arrival_s"])
    arrival = arrival_column(columns["arrival_s"], "arrival_s", loc, carry)
    prompt = token_column(columns["prompt_tokens"], "prompt_tokens", loc)
    output = output_column(columns["output_tokens"], "output_tokens", loc)
    priority = None
    if columns.get("priority") is not None:
        prio = numeric_column(columns["priority"], "priority", loc, integer=True, optional=True)
        priority = np.nan_to_num(prio, nan=0.0).astype(np.int64)
    prefixes: list[tuple[Segment, ...]] = [()] * num_rows
    has_hash = np.zeros(num_rows, dtype=bool)
    if columns.get("hash_ids") is not None:
        prefixes = hash_prefixes(columns["hash_ids"], prompt, hash_block_tokens, loc, optional=True)
        has_hash = np.array([bool(p) for p in prefixes])
    if columns.get("prefix_id") is not None or columns.get("prefix_tokens") is not None:
        _add_prefix_ids(columns, prompt, has_hash, prefixes, loc, num_rows)
    return Chunk(start, arrival, prompt, output, priority, prefixes)


def _add_prefix_ids(
    columns: dict[str, Any],
    prompt: np.ndarray,
    has_hash: np.ndarray,
    prefixes: list[tuple[Segment, ...]],
    loc: RowLocator,
    num_rows: int,
) -> None:
    none = [None] * num_rows
    ids_raw, sizes_raw = columns.get("prefix_id"), columns.get("prefix_tokens")
    ids = numeric_column(
        none if ids_raw is None else ids_raw,
        "prefix_id",
        loc,
        integer=True,
        min_value=0,
        optional=True,
    )
    sizes = numeric_column(
        none if sizes_raw is None else sizes_raw,
        "prefix_tokens",
        loc,
        integer=True,
        min_value=0,
        optional=True,
    )
    id_set, size_set = ~np.isnan(ids), ~np.isnan(sizes)
    checks = [
        (id_set & ~size_set, "prefix_tokens", "missing: prefix_id is set"),
        (size_set & ~id_set, "prefix_id", "missing: prefix_tokens is set"),
        (id_set & has_hash, "prefix_id", "a row has either prefix_id or hash_ids, not both"),
        (id_set & (np.nan_to_num(ids) >= MAX_PREFIX_ID), "prefix_id", "must be < 2**40"),
        (size_set & (np.nan_to_num(sizes) > prompt), "prefix_tokens", "exceeds prompt_tokens"),
    ]
    for bad, name, message in checks:
        if bad.any():
            raise loc.error(int(np.argmax(bad)), name, message)
    for i in np.flatnonzero(id_set & (np.nan_to_num(sizes) > 0)).tolist():
        prefixes[i] = (Segment(PREFIX_KEY_BASE + int(ids[i]), int(sizes[i])),)


def _split_csv_ids(values: pd.Series, loc: RowLocator) -> list[list[int] | None]:
    out: list[list[int] | None] = []
    for i, text in enumerate(values.fillna("").tolist()):
        parts = text.split()
        if not parts:
            out.append(None)
            continue
        try:
            out.append([int(p) for p in parts])
        except ValueError:
            raise loc.error(
                i, "hash_ids", f"expected space-separated integers, got {text!r}"
            ) from None
    return out


def _parquet_chunks(
    path: Path, chunk_rows: int
) -> Iterator[tuple[dict[str, Any], RowLocator, int]]:
    """(columns, locator, index of the first row) of each batch of a canonical Parquet file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    require_file(path)
    try:
        batches = pq.ParquetFile(path).iter_batches(batch_size=chunk_rows)
        start = 0
        for batch in batches:
            columns = batch.to_pydict()
            if start == 0:
                check_columns(path, list(columns), _CANONICAL_REQUIRED, _CANONICAL_OPTIONAL)
            yield columns, RowLocator(str(path), first_line=1 + start, unit="row"), start
            start += batch.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise WorkloadError(path, f"cannot read Parquet: {exc}") from None
