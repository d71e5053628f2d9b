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

import numpy as np

from sim.workload._table import (
    ArrivalCarry,
    check_non_decreasing,
    numeric_column,
    require_file,
)
from sim.workload.canonical import load_canonical
from sim.workload.errors import WorkloadError
from sim.workload.plain_csv import NotPlain, plain_azure_chunks
from sim.workload.prefixes import hash_prefixes
from sim.workload.request import Workload
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

_AZURE_TIME_RE = r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,9})?"


@dataclass(frozen=True, slots=True)
class LengthSamples:
    """Prompt/output lengths without arrivals (a length-distribution file)."""

    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self) -> int:
        return len(self.prompt_tokens)


# --------------------------------------------------------------------------- public traces


def load_azure(path: Path, *, chunk_rows: int | None = None) -> Workload:
    """Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Timestamps like ``2023-11-16 18:15:50.9951690`` (7 fractional digits) are parsed to the
    nanosecond; arrival_s = timestamp - first timestamp, e.g. rows 1-2 of the conv trace give
    0.0 and 50.9951690 - 46.6805900 = 4.314579 s. A plainly well-formed file is read without
    pandas (`sim.workload.plain_csv`); anything else the validating way.
    """
    path = Path(path)
    rows = chunk_rows_or_default(chunk_rows)
    try:  # no pandas for a plainly well-formed file
        return stream_workload(partial(_plain_azure_chunks, path, rows), path, {"format": "azure"})
    except NotPlain:
        return stream_workload(partial(_azure_chunks, path, rows), path, {"format": "azure"})


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
    for frame, loc, start in csv_chunks(path, required, (), chunk_rows):
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
        prompt = token_column(frame["ContextTokens"], "ContextTokens", loc)
        output = output_column(frame["GeneratedTokens"], "GeneratedTokens", loc)
        yield Chunk(start, arrival, prompt, output, meta=meta)


def load_mooncake(
    path: Path, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS, chunk_rows: int | None = None
) -> Workload:
    """Mooncake FAST'25 JSONL trace; ``hash_ids`` become shared prompt segments.

    Each hash id h is Segment(key=h, num_tokens=512), the last one holding the remainder
    ``input_length - 512 * (n - 1)``; ``len(hash_ids)`` must be ``ceil(input_length / 512)``.
    """
    path = Path(path)
    read = partial(_mooncake_chunks, path, block_tokens, chunk_rows_or_default(chunk_rows))
    return stream_workload(read, path, {"format": "mooncake", "hash_block_tokens": block_tokens})


def _mooncake_chunks(path: Path, block_tokens: int, chunk_rows: int) -> Iterator[Chunk]:
    required = ("timestamp", "input_length", "output_length", "hash_ids")
    carry = ArrivalCarry()
    for columns, loc, start in jsonl_chunks(path, required, (), chunk_rows):
        arrival = arrival_column(columns["timestamp"], "timestamp", loc, carry, divisor=1000.0)
        prompt = token_column(columns["input_length"], "input_length", loc)
        output = output_column(columns["output_length"], "output_length", loc)
        prefixes = hash_prefixes(columns["hash_ids"], prompt, block_tokens, loc)
        yield Chunk(start, arrival, prompt, output, prefixes=prefixes)


_LENGTH_OPTIONAL = ("num_total_tokens", "pd_ratio")
_VIDUR_REQUIRED = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")


def load_vidur(path: Path, *, chunk_rows: int | None = None) -> Workload:
    """Vidur / Sarathi-Serve processed trace: ``arrived_at,num_prefill_tokens,num_decode_tokens``."""
    path = Path(path)
    return stream_workload(
        partial(_vidur_chunks, path, chunk_rows_or_default(chunk_rows)), path, {"format": "vidur"}
    )


def _vidur_chunks(path: Path, chunk_rows: int) -> Iterator[Chunk]:
    carry = ArrivalCarry()
    for frame, loc, start in csv_chunks(path, _VIDUR_REQUIRED, _LENGTH_OPTIONAL, chunk_rows):
        arrival = arrival_column(frame["arrived_at"], "arrived_at", loc, carry)
        prompt = token_column(frame["num_prefill_tokens"], "num_prefill_tokens", loc)
        output = output_column(frame["num_decode_tokens"], "num_decode_tokens", loc)
        yield Chunk(start, arrival, prompt, output)


def load_lengths(path: Path, *, chunk_rows: int | None = None) -> LengthSamples:
    """Length-distribution CSV (``num_prefill_tokens,num_decode_tokens[,num_total_tokens,pd_ratio]``).

    Read in chunks; the lengths themselves are kept (two int64 arrays: they are sampled from
    at random)."""
    path = Path(path)
    required = ("num_prefill_tokens", "num_decode_tokens")
    prompts, outputs = [], []
    for frame, loc, _ in csv_chunks(
        path, required, _LENGTH_OPTIONAL, chunk_rows_or_default(chunk_rows)
    ):
        prompt = token_column(frame["num_prefill_tokens"], "num_prefill_tokens", loc)
        output = output_column(frame["num_decode_tokens"], "num_decode_tokens", loc)
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
