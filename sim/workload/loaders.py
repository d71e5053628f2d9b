"""Trace loaders: canonical CSV/JSONL/Parquet, Azure LLM 2023, Mooncake, Vidur/Sarathi, lengths.

Every loader validates the whole file before anything runs and raises `WorkloadError` naming
the file, the 1-based line (CSV header = line 1) and the column of the first bad value. Files
are read in chunks of rows (`sim.workload.trace_stream`): a trace longer than one chunk is
read again, chunk by chunk, as the run consumes it, so it is never all in memory. No row is ever dropped or
reordered: arrivals that go back in time are rejected, not sorted (re-sorting would silently
change which request a line number refers to). Request ids are the 0-based data-row index.

Formats (column names exactly as below; unknown columns are errors):

- canonical (``.csv``, ``.jsonl``, ``.parquet``): ``arrival_s, prompt_tokens, output_tokens``;
  optional ``priority`` (int, lower runs first), ``prefix_id`` + ``prefix_tokens`` (requests
  with the same id share their first ``prefix_tokens`` tokens), or ``hash_ids`` (prefix-block
  hashes of ``hash_block_tokens``-token blocks, Mooncake style; in CSV a space-separated string).
  Optional values may be left empty / absent per row.
- azure: ``TIMESTAMP,ContextTokens,GeneratedTokens`` (Azure LLM inference trace 2023; naive
  datetimes with up to 9 fractional digits; CRLF). Arrivals are seconds after the first row.
- mooncake: JSONL ``{"timestamp": ms, "input_length", "output_length", "hash_ids"}``; arrival
  is ``timestamp / 1000`` as given (upstream timestamps are already relative).
- vidur (also Sarathi-Serve): ``arrived_at, num_prefill_tokens, num_decode_tokens`` (+ ignored
  ``num_total_tokens``, ``pd_ratio``); arrivals in seconds as given.
- lengths: ``num_prefill_tokens, num_decode_tokens`` (+ ``num_total_tokens``, checked, and
  ``pd_ratio``, ignored) without arrivals: `load_lengths` returns them for an arrival process.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.kv.types import Segment
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
    require_file,
)
from sim.workload.errors import WorkloadError
from sim.workload.plain_csv import NotPlain, plain_azure_chunks
from sim.workload.prefixes import hash_prefixes
from sim.workload.request import MAX_PREFIX_ID, PREFIX_KEY_BASE, Workload
from sim.workload.trace_stream import Chunk, ChunkReader, streamed

if TYPE_CHECKING:
    import pandas as pd

#: Mooncake FAST'25 traces hash prompts in blocks of this many tokens (upstream README).
MOONCAKE_BLOCK_TOKENS = 512
_OUTPUT_HINT = " (vLLM generates at least one token)"
_AZURE_TIME_RE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,9})?"


@dataclass(frozen=True, slots=True)
class LengthSamples:
    """Prompt/output lengths without arrivals (a length-distribution file)."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.prompt_tokens)


# --------------------------------------------------------------------------- shared pieces


def _output_column(values: Any, name: str, loc: RowLocator) -> np.ndarray:
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


def _arrivals(
    values: Any, name: str, loc: RowLocator, carry: ArrivalCarry, divisor: float = 1.0
) -> np.ndarray:
    # Divide (not multiply by 1e-3): 3536999 / 1000 is the nearest double to 3536.999.
    arrival = numeric_column(values, name, loc, integer=False, min_value=0) / divisor
    check_non_decreasing(arrival, name, loc, carry)
    return arrival


def _tokens(values: Any, name: str, loc: RowLocator) -> np.ndarray:
    return numeric_column(values, name, loc, integer=True, min_value=1).astype(np.int64)


def _workload(read: ChunkReader, path: Path, metadata: dict[str, Any]) -> Workload:
    """Validate the file `read` reads and stream its requests (`sim.workload.trace_stream`)."""
    requests, first_meta = streamed(read, path)
    if len(requests) == 0:
        raise WorkloadError(str(path), "no requests in file")
    metadata = {"path": str(path), "num_rows": len(requests), **metadata, **first_meta}
    return Workload(requests, str(path), metadata)


def _csv_chunks(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], chunk_rows: int
) -> Iterator[tuple[pd.DataFrame, RowLocator, int]]:
    """(frame, its locator, index of its first row) of each chunk of a CSV, header checked."""
    for frame, start in iter_csv_strings(path, required, optional, chunk_rows):
        check_columns(path, list(frame.columns), required, optional)
        yield frame, RowLocator(str(path), first_line=2 + start), start


def _jsonl_chunks(
    path: Path, required: tuple[str, ...], optional: tuple[str, ...], chunk_rows: int
) -> Iterator[tuple[dict[str, list[Any]], RowLocator, int]]:
    """(columns, locator, index of the first row) of each chunk of a JSONL file."""
    start = 0
    for records, lines in iter_jsonl_records(path, chunk_rows):
        loc = RowLocator(str(path), line_numbers=lines)
        yield jsonl_columns(records, loc, required, optional), loc, start
        start += len(records)


def _rows(chunk_rows: int | None) -> int:
    # Looked up when a file is read (not bound as a default) so tests can shrink it.
    return chunk_rows if chunk_rows is not None else trace_stream.TRACE_CHUNK_ROWS


# --------------------------------------------------------------------------- canonical

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
    read = partial(_canonical_chunks, path, hash_block_tokens, _rows(chunk_rows))
    return _workload(read, path, {"format": "canonical"})


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
        for frame, loc, start in _csv_chunks(path, required, optional, chunk_rows):
            columns: dict[str, Any] = {c: frame[c] for c in frame.columns}
            if "hash_ids" in frame:
                columns["hash_ids"] = _split_csv_ids(frame["hash_ids"], loc)
            yield columns, loc, start
    elif suffix == ".jsonl":
        yield from _jsonl_chunks(path, required, optional, chunk_rows)
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
    arrival = _arrivals(columns["arrival_s"], "arrival_s", loc, carry)
    prompt = _tokens(columns["prompt_tokens"], "prompt_tokens", loc)
    output = _output_column(columns["output_tokens"], "output_tokens", loc)
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


# --------------------------------------------------------------------------- public traces


def load_azure(path: Path, *, chunk_rows: int | None = None) -> Workload:
    """Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Timestamps like ``2023-11-16 18:15:50.9951690`` (7 fractional digits) are parsed to the
    nanosecond; arrival_s = timestamp - first timestamp, e.g. rows 1-2 of the conv trace give
    0.0 and 50.9951690 - 46.6805900 = 4.314579 s. A plainly well-formed file is read without
    pandas (`sim.workload.plain_csv`); anything else the validating way.
    """
    path = Path(path)
    rows = _rows(chunk_rows)
    try:  # no pandas for a plainly well-formed file
        return _workload(partial(_plain_azure_chunks, path, rows), path, {"format": "azure"})
    except NotPlain:
        return _workload(partial(_azure_chunks, path, rows), path, {"format": "azure"})


def _plain_azure_chunks(path: Path, chunk_rows: int) -> Iterator[Chunk]:
    start = 0
    for piece in plain_azure_chunks(path, chunk_rows):
        meta = {"start_timestamp": piece.start_timestamp} if start == 0 else {}
        yield Chunk(start, piece.arrival_s, piece.prompt_tokens, piece.output_tokens, meta=meta)
        start += len(piece.arrival_s)


def _azure_chunks(path: Path, chunk_rows: int) -> Iterator[Chunk]:
    import pandas as pd

    required = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    carry, first_ns = ArrivalCarry(), None
    for frame, loc, start in _csv_chunks(path, required, (), chunk_rows):
        text = frame["TIMESTAMP"].fillna("").str.strip()
        bad = ~text.str.fullmatch(_AZURE_TIME_RE).to_numpy(dtype=bool)
        stamps = pd.to_datetime(text.where(~bad, None), format="ISO8601", errors="coerce")
        # pandas (>= 3) parses at the unit the chunk's text needs: a year past 2262 fits in
        # microseconds, not in the nanoseconds counted below (it would wrap), so it is bad in
        # any chunk, as it is where a 7-digit fraction makes pandas parse in nanoseconds.
        outside = (stamps < pd.Timestamp.min) | (stamps > pd.Timestamp.max)
        bad |= stamps.isna().to_numpy() | outside.to_numpy(dtype=bool)
        if bad.any():
            i = int(np.argmax(bad))
            raise loc.error(
                i, "TIMESTAMP", f"expected 'YYYY-MM-DD HH:MM:SS[.fffffff]', got {text.iloc[i]!r}"
            )
        ns = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
        meta = {}
        if first_ns is None:
            first_ns, meta = int(ns[0]), {"start_timestamp": str(stamps.iloc[0])}
        arrival = (ns - first_ns) / 1e9
        check_non_decreasing(arrival, "TIMESTAMP", loc, carry)
        prompt = _tokens(frame["ContextTokens"], "ContextTokens", loc)
        output = _output_column(frame["GeneratedTokens"], "GeneratedTokens", loc)
        yield Chunk(start, arrival, prompt, output, meta=meta)


def load_mooncake(
    path: Path, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS, chunk_rows: int | None = None
) -> Workload:
    """Mooncake FAST'25 JSONL trace; ``hash_ids`` become shared prompt segments.

    Each hash id h is Segment(key=h, num_tokens=512), the last one holding the remainder
    ``input_length - 512 * (n - 1)``; ``len(hash_ids)`` must be ``ceil(input_length / 512)``.
    """
    path = Path(path)
    read = partial(_mooncake_chunks, path, block_tokens, _rows(chunk_rows))
    return _workload(read, path, {"format": "mooncake", "hash_block_tokens": block_tokens})


def _mooncake_chunks(path: Path, block_tokens: int, chunk_rows: int) -> Iterator[Chunk]:
    required = ("timestamp", "input_length", "output_length", "hash_ids")
    carry = ArrivalCarry()
    for columns, loc, start in _jsonl_chunks(path, required, (), chunk_rows):
        arrival = _arrivals(columns["timestamp"], "timestamp", loc, carry, divisor=1000.0)
        prompt = _tokens(columns["input_length"], "input_length", loc)
        output = _output_column(columns["output_length"], "output_length", loc)
        prefixes = hash_prefixes(columns["hash_ids"], prompt, block_tokens, loc)
        yield Chunk(start, arrival, prompt, output, prefixes=prefixes)


_LENGTH_OPTIONAL = ("num_total_tokens", "pd_ratio")
_VIDUR_REQUIRED = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def load_vidur(path: Path, *, chunk_rows: int | None = None) -> Workload:
    """Vidur / Sarathi-Serve processed trace: ``arrived_at,num_prefill_tokens,num_decode_tokens``."""
    path = Path(path)
    return _workload(partial(_vidur_chunks, path, _rows(chunk_rows)), path, {"format": "vidur"})


def _vidur_chunks(path: Path, chunk_rows: int) -> Iterator[Chunk]:
    carry = ArrivalCarry()
    for frame, loc, start in _csv_chunks(path, _VIDUR_REQUIRED, _LENGTH_OPTIONAL, chunk_rows):
        arrival = _arrivals(frame["arrived_at"], "arrived_at", loc, carry)
        prompt = _tokens(frame["num_prefill_tokens"], "num_prefill_tokens", loc)
        output = _output_column(frame["num_decode_tokens"], "num_decode_tokens", loc)
        yield Chunk(start, arrival, prompt, output)


def load_lengths(path: Path, *, chunk_rows: int | None = None) -> LengthSamples:
    """Length-distribution CSV (``num_prefill_tokens,num_decode_tokens[,num_total_tokens,pd_ratio]``).

    Read in chunks; the lengths themselves are kept (two int64 arrays: they are sampled from
    at random)."""
    path = Path(path)
    required = ("num_prefill_tokens", "num_decode_tokens")
    prompts, outputs = [], []
    for frame, loc, _ in _csv_chunks(path, required, _LENGTH_OPTIONAL, _rows(chunk_rows)):
        prompt = _tokens(frame["num_prefill_tokens"], "num_prefill_tokens", loc)
        output = _output_column(frame["num_decode_tokens"], "num_decode_tokens", loc)
        if "num_total_tokens" in frame:
            total = numeric_column(
                frame["num_total_tokens"], "num_total_tokens", loc, integer=True, min_value=2
            ).astype(np.int64)
            bad = total != prompt + output
            if bad.any():
                i = int(np.argmax(bad))
                raise loc.error(i, "num_total_tokens", f"{total[i]} != {prompt[i]} + {output[i]}")
        prompts.append(prompt)
        outputs.append(output)
    if not prompts:
        raise WorkloadError(path, "no rows in file")
    return LengthSamples(np.concatenate(prompts), np.concatenate(outputs), str(path))


# --------------------------------------------------------------------------- dispatch

FORMATS = ("canonical", "azure", "mooncake", "vidur", "lengths")


def detect_format(path: Path) -> str:
    """Guess a trace's format from its extension and header (first line / first record)."""
    path = Path(path)
    require_file(path)
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        return "canonical"
    if suffix not in (".csv", ".jsonl"):
        raise WorkloadError(
            path,
            f"cannot detect the format of a {suffix or 'no'}-extension file; set format explicitly",
        )
    with path.open(encoding="utf-8", errors="replace") as fh:
        first = fh.readline(1 << 20)  # the header (or first record); a huge line is not read
    if suffix == ".jsonl":
        return "mooncake" if '"hash_ids"' in first and '"timestamp"' in first else "canonical"
    header = {h.strip() for h in first.split(",")}
    if "TIMESTAMP" in header:
        return "azure"
    if "arrived_at" in header:
        return "vidur"
    if "num_prefill_tokens" in header:
        return "lengths"
    return "canonical"


def load_trace(path: Path, fmt: str = "auto", *, hash_block_tokens: int = 512) -> Workload:
    """Load a trace with arrivals; `fmt` "auto" detects it (see `detect_format`)."""
    path = Path(path)
    fmt = detect_format(path) if fmt == "auto" else fmt
    if fmt == "canonical":
        return load_canonical(path, hash_block_tokens=hash_block_tokens)
    if fmt == "azure":
        return load_azure(path)
    if fmt == "mooncake":
        return load_mooncake(path, block_tokens=hash_block_tokens)
    if fmt == "vidur":
        return load_vidur(path)
    if fmt == "lengths":
        raise WorkloadError(
            path,
            "a length-distribution file has no arrivals; give an arrival process (arrival: ...)",
        )
    raise WorkloadError(path, f"unknown format {fmt!r} (one of {FORMATS})")
