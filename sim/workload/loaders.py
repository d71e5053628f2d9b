"""Trace loaders: canonical CSV/JSONL/Parquet, Azure LLM 2023, Mooncake, Vidur/Sarathi, lengths.

Every loader validates the whole file and raises `WorkloadError` naming the file, the 1-based
line (CSV header = line 1) and the column of the first bad value. No row is ever dropped or
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

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.kv.types import Segment
from sim.workload._table import (
    RowLocator,
    check_columns,
    check_non_decreasing,
    jsonl_columns,
    numeric_column,
    read_csv_strings,
    read_jsonl_records,
    require_file,
)
from sim.workload.errors import WorkloadError
from sim.workload.plain_csv import read_plain_azure
from sim.workload.prefixes import hash_prefixes
from sim.workload.request import MAX_PREFIX_ID, PREFIX_KEY_BASE, RequestSpec, Workload

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


def _lengths(columns: dict[str, Any], prompt: str, output: str, loc: RowLocator):
    prompt_tokens = numeric_column(columns[prompt], prompt, loc, integer=True, min_value=1)
    output_tokens = numeric_column(columns[output], output, loc, integer=True, min_value=1)
    return prompt_tokens.astype(np.int64), output_tokens.astype(np.int64)


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


def _arrivals(values: Any, name: str, loc: RowLocator, divisor: float = 1.0) -> np.ndarray:
    # Divide (not multiply by 1e-3): 3536999 / 1000 is the nearest double to 3536.999.
    arrival = numeric_column(values, name, loc, integer=False, min_value=0) / divisor
    check_non_decreasing(arrival, name, loc)
    return arrival


def _build(
    arrival_s: np.ndarray,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    source: str,
    metadata: dict[str, Any],
    priority: np.ndarray | None = None,
    prefixes: list[tuple[Segment, ...]] | None = None,
) -> Workload:
    if len(arrival_s) == 0:
        raise WorkloadError(source, "no requests in file")
    arrivals = arrival_s.tolist()
    prompts = prompt_tokens.tolist()
    outputs = output_tokens.tolist()
    prios = priority.tolist() if priority is not None else [0] * len(arrivals)
    pres = prefixes if prefixes is not None else [()] * len(arrivals)
    requests = [
        RequestSpec(i, a, p, o, q, s)
        for i, (a, p, o, q, s) in enumerate(
            zip(arrivals, prompts, outputs, prios, pres, strict=True)
        )
    ]
    metadata = {"path": source, "num_rows": len(requests), **metadata}
    return Workload(requests, source, metadata)


# --------------------------------------------------------------------------- canonical

_CANONICAL_REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
_CANONICAL_OPTIONAL = ("priority", "prefix_id", "prefix_tokens", "hash_ids")


def load_canonical(path: Path, *, hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Workload:
    """Canonical trace from ``.csv``, ``.jsonl`` or ``.parquet`` (see the module docstring)."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame = read_csv_strings(path, _CANONICAL_REQUIRED, _CANONICAL_OPTIONAL)
        check_columns(path, list(frame.columns), _CANONICAL_REQUIRED, _CANONICAL_OPTIONAL)
        loc = RowLocator(str(path))
        columns: dict[str, Any] = {c: frame[c] for c in frame.columns}
        if "hash_ids" in frame:
            columns["hash_ids"] = _split_csv_ids(frame["hash_ids"], loc)
    elif suffix == ".jsonl":
        records, lines = read_jsonl_records(path)
        loc = RowLocator(str(path), line_numbers=lines)
        columns = jsonl_columns(records, loc, _CANONICAL_REQUIRED, _CANONICAL_OPTIONAL)
    elif suffix == ".parquet":
        columns, loc = _read_parquet(path)
        check_columns(path, list(columns), _CANONICAL_REQUIRED, _CANONICAL_OPTIONAL)
    else:
        raise WorkloadError(path, f"unknown canonical extension {suffix!r} (.csv/.jsonl/.parquet)")
    return _canonical_from_columns(columns, loc, str(path), hash_block_tokens)


def _canonical_from_columns(
    columns: dict[str, Any], loc: RowLocator, source: str, hash_block_tokens: int
) -> Workload:
    num_rows = len(columns["arrival_s"])
    if num_rows == 0:
        raise WorkloadError(source, "no requests in file")
    arrival = _arrivals(columns["arrival_s"], "arrival_s", loc)
    prompt = numeric_column(
        columns["prompt_tokens"], "prompt_tokens", loc, integer=True, min_value=1
    )
    prompt = prompt.astype(np.int64)
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
    return _build(arrival, prompt, output, source, {"format": "canonical"}, priority, prefixes)


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


def _read_parquet(path: Path) -> tuple[dict[str, Any], RowLocator]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    require_file(path)
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as exc:
        raise WorkloadError(path, f"cannot read Parquet: {exc}") from None
    return table.to_pydict(), RowLocator(str(path), first_line=1, unit="row")


# --------------------------------------------------------------------------- public traces


def load_azure(path: Path) -> Workload:
    """Azure LLM inference trace 2023 (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Timestamps like ``2023-11-16 18:15:50.9951690`` (7 fractional digits) are parsed to the
    nanosecond; arrival_s = timestamp - first timestamp, e.g. rows 1-2 of the conv trace give
    0.0 and 50.9951690 - 46.6805900 = 4.314579 s.
    """
    path = Path(path)
    plain = read_plain_azure(path)  # no pandas for a plainly well-formed file
    if plain is not None:
        meta = {"format": "azure", "start_timestamp": plain.start_timestamp}
        return _build(plain.arrival_s, plain.prompt_tokens, plain.output_tokens, str(path), meta)
    import pandas as pd

    required = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
    frame = read_csv_strings(path, required, ())
    check_columns(path, list(frame.columns), required, ())
    loc = RowLocator(str(path))
    if len(frame) == 0:
        raise WorkloadError(path, "no requests in file")
    text = frame["TIMESTAMP"].fillna("").str.strip()
    bad = ~text.str.fullmatch(_AZURE_TIME_RE).to_numpy(dtype=bool)
    stamps = pd.to_datetime(text.where(~bad, None), format="ISO8601", errors="coerce")
    bad |= stamps.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise loc.error(
            i, "TIMESTAMP", f"expected 'YYYY-MM-DD HH:MM:SS[.fffffff]', got {text.iloc[i]!r}"
        )
    ns = stamps.to_numpy().astype("datetime64[ns]").astype(np.int64)
    arrival = (ns - ns[0]) / 1e9
    check_non_decreasing(arrival, "TIMESTAMP", loc)
    prompt = numeric_column(frame["ContextTokens"], "ContextTokens", loc, integer=True, min_value=1)
    output = _output_column(frame["GeneratedTokens"], "GeneratedTokens", loc)
    meta = {"format": "azure", "start_timestamp": str(stamps.iloc[0])}
    return _build(arrival, prompt.astype(np.int64), output, str(path), meta)


def load_mooncake(path: Path, *, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> Workload:
    """Mooncake FAST'25 JSONL trace; ``hash_ids`` become shared prompt segments.

    Each hash id h is Segment(key=h, num_tokens=512), the last one holding the remainder
    ``input_length - 512 * (n - 1)``; ``len(hash_ids)`` must be ``ceil(input_length / 512)``.
    """
    path = Path(path)
    records, lines = read_jsonl_records(path)
    loc = RowLocator(str(path), line_numbers=lines)
    required = ("timestamp", "input_length", "output_length", "hash_ids")
    columns = jsonl_columns(records, loc, required, ())
    if not records:
        raise WorkloadError(path, "no requests in file")
    arrival = _arrivals(columns["timestamp"], "timestamp", loc, divisor=1000.0)
    prompt = numeric_column(columns["input_length"], "input_length", loc, integer=True, min_value=1)
    prompt = prompt.astype(np.int64)
    output = _output_column(columns["output_length"], "output_length", loc)
    prefixes = hash_prefixes(columns["hash_ids"], prompt, block_tokens, loc)
    meta = {"format": "mooncake", "hash_block_tokens": block_tokens}
    return _build(arrival, prompt, output, str(path), meta, prefixes=prefixes)


_LENGTH_OPTIONAL = ("num_total_tokens", "pd_ratio")


def load_vidur(path: Path) -> Workload:
    """Vidur / Sarathi-Serve processed trace: ``arrived_at,num_prefill_tokens,num_decode_tokens``."""
    path = Path(path)
    required = ("arrived_at", "num_prefill_tokens", "num_decode_tokens")
    frame = read_csv_strings(path, required, _LENGTH_OPTIONAL)
    check_columns(path, list(frame.columns), required, _LENGTH_OPTIONAL)
    loc = RowLocator(str(path))
    if len(frame) == 0:
        raise WorkloadError(path, "no requests in file")
    arrival = _arrivals(frame["arrived_at"], "arrived_at", loc)
    prompt = numeric_column(
        frame["num_prefill_tokens"], "num_prefill_tokens", loc, integer=True, min_value=1
    ).astype(np.int64)
    output = _output_column(frame["num_decode_tokens"], "num_decode_tokens", loc)
    return _build(arrival, prompt, output, str(path), {"format": "vidur"})


def load_lengths(path: Path) -> LengthSamples:
    """Length-distribution CSV (``num_prefill_tokens,num_decode_tokens[,num_total_tokens,pd_ratio]``)."""
    path = Path(path)
    required = ("num_prefill_tokens", "num_decode_tokens")
    frame = read_csv_strings(path, required, _LENGTH_OPTIONAL)
    check_columns(path, list(frame.columns), required, _LENGTH_OPTIONAL)
    loc = RowLocator(str(path))
    if len(frame) == 0:
        raise WorkloadError(path, "no rows in file")
    prompt = numeric_column(
        frame["num_prefill_tokens"], "num_prefill_tokens", loc, integer=True, min_value=1
    ).astype(np.int64)
    output = _output_column(frame["num_decode_tokens"], "num_decode_tokens", loc)
    if "num_total_tokens" in frame:
        total = numeric_column(
            frame["num_total_tokens"], "num_total_tokens", loc, integer=True, min_value=2
        ).astype(np.int64)
        bad = total != prompt + output
        if bad.any():
            i = int(np.argmax(bad))
            raise loc.error(i, "num_total_tokens", f"{total[i]} != {prompt[i]} + {output[i]}")
    return LengthSamples(prompt, output, str(path))


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
        first = fh.readline()
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
