"""A plainly well-formed Azure trace read with the `csv` module and numpy, without pandas.

`kvsim run` of a trace scenario should not pay for importing pandas (~0.2 s, more than reading
the 19k-row Azure trace) when the file needs none of its leniency. `read_plain_azure` accepts
only the plain form: the exact header, every row three fields, timestamps
``YYYY-MM-DD HH:MM:SS[.f{1,9}]`` (years 1700-2199, inside datetime64[ns]) that never go back,
and token counts of 1-15 digits, at least 1. Anything else (blank or short rows, spaces,
`1e3`, a bad date, ...) returns None and the caller reads the file the
validating way (`sim.workload.loaders.load_azure`), which accepts what it can and names the
file, line and column of what it cannot. So the two readers never disagree on a file both
accept: same arrivals (``(ns - ns[0]) / 1e9``), same token counts
(tests/workload/test_plain_csv.py compares them).

Example: ``2023-11-16 18:15:46.6805900,374,44`` then ``2023-11-16 18:15:50.9951690,396,109``
-> arrivals 0.0 and 4.314579 s, prompts [374, 396], outputs [44, 109].
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_TIMESTAMP_RE = re.compile(r"(\d{4})-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(\.\d{1,9})?")
_COUNT_RE = re.compile(r"\d{1,15}")
#: datetime64[ns] spans 1677-09-21 to 2262-04-11; numpy wraps silently outside it.
_YEARS = range(1700, 2200)


@dataclass(frozen=True, slots=True)
class PlainAzure:
    """The columns of a plain Azure trace, as `load_azure` builds its workload from them."""

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    #: The first timestamp as pandas prints it (`str(pd.Timestamp)`), e.g. "2023-11-16 18:15:46.680590".
    start_timestamp: str
    #: The file's first timestamp, nanoseconds since 1970 (arrivals are measured from it).
    first_ns: int = 0


class NotPlain(Exception):
    """Internal: the file is not plainly well-formed; read it the validating way instead."""


def read_plain_azure(path: Path) -> PlainAzure | None:
    """The trace at `path` if it is plainly well-formed (see the module docstring), else None."""
    try:
        pieces = list(plain_azure_chunks(path, 1 << 62))
    except NotPlain:
        return None
    assert len(pieces) == 1  # one chunk: as many rows as the file has
    return pieces[0]


def plain_azure_chunks(path: Path, chunk_rows: int) -> Iterator[PlainAzure]:
    """The plain trace at `path`, `chunk_rows` rows at a time (arrivals from the file's first
    timestamp, `start_timestamp` that of the file); raises `NotPlain` at the first thing that
    is not plain (the chunks already yielded are then to be dropped)."""
    try:
        with path.open(encoding="utf-8-sig", newline="") as fh:
            rows = csv.reader(fh)
            header = next(rows, [])
            if sorted(header) != sorted(AZURE_COLUMNS):
                raise NotPlain
            order = [header.index(name) for name in AZURE_COLUMNS]
            first_ns: int | None = None
            last_s = 0.0
            for batch in _batches(rows, chunk_rows):
                piece = _plain_piece(batch, order, first_ns, last_s)
                first_ns = piece.first_ns
                last_s = float(piece.arrival_s[-1])
                yield piece
            if first_ns is None:  # a header alone
                raise NotPlain
    except (OSError, UnicodeDecodeError, csv.Error):
        raise NotPlain from None


def _batches(rows: Iterator[list[str]], size: int) -> Iterator[list[list[str]]]:
    """Data rows in lists of `size`, blank rows only at the end (dropped), each 3 fields."""
    batch: list[list[str]] = []
    blank = False
    for row in rows:
        if not row:
            blank = True
            continue
        if blank or len(row) != len(AZURE_COLUMNS):
            raise NotPlain
        batch.append(row)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def _plain_piece(
    rows: list[list[str]], order: list[int], first_ns: int | None, last_s: float
) -> PlainAzure:
    """One chunk's columns; `first_ns`: the file's first timestamp (None: this chunk's own)."""
    stamps, prompts, outputs = ([row[i] for row in rows] for i in order)
    for text in stamps:
        match = _TIMESTAMP_RE.fullmatch(text)
        if match is None or int(match.group(1)) not in _YEARS:
            raise NotPlain
    if not all(_COUNT_RE.fullmatch(text) for text in (*prompts, *outputs)):
        raise NotPlain
    try:
        ns = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
    except ValueError:  # month 13, February 30, 24:00:00, ...
        raise NotPlain from None
    first_ns = int(ns[0]) if first_ns is None else first_ns
    prompt_tokens = np.array([int(text) for text in prompts], dtype=np.int64)
    output_tokens = np.array([int(text) for text in outputs], dtype=np.int64)
    arrival_s = (ns - first_ns) / 1e9
    if (
        arrival_s[0] < last_s
        or (np.diff(arrival_s) < 0).any()
        or (prompt_tokens < 1).any()
        or (output_tokens < 1).any()
    ):
        raise NotPlain
    return PlainAzure(arrival_s, prompt_tokens, output_tokens, timestamp_text(first_ns), first_ns)


def timestamp_text(ns: int) -> str:
    """A datetime64[ns] (nanoseconds since 1970) as `str(pandas.Timestamp)` prints it.

    Whole seconds alone; microseconds as six digits; nanoseconds, when there are any, as
    three more. Example: 1700158546680590000 -> "2023-11-16 18:15:46.680590";
    1700158546680590100 -> "2023-11-16 18:15:46.680590100".
    """
    seconds, fraction_ns = divmod(ns, 10**9)
    text = str(np.datetime64(seconds, "s")).replace("T", " ")
    if fraction_ns:
        micro, nano = divmod(fraction_ns, 1000)
        text += f".{micro:06d}" + (f"{nano:03d}" if nano else "")
    return text
