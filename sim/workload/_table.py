"""Reading trace files into columns and validating them vectorised, with exact error places.

Loaders read a file in chunks of rows (pandas for CSV, one `json.loads` per JSONL line; see
`sim.workload.trace_stream`), then check each chunk's columns with numpy. pandas is imported
by `iter_csv_strings` when it runs, not with this module: a plainly well-formed trace is read
without it (`sim.workload.plain_csv`). On failure they report the FIRST bad row of the chunk,
translated to its 1-based file line by a `RowLocator` (offset to the chunk), so a 20k-row
trace still loads in tens of ms.
"""

from __future__ import annotations

import contextlib
import csv
import json
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sim.files.inputs import refuse_non_regular
from sim.workload.errors import WorkloadError

if TYPE_CHECKING:
    import pandas as pd

_NUMBER_TYPES = (int, float)


@dataclass(frozen=True, slots=True)
class RowLocator:
    """Maps a 0-based data-row index to the place a user sees in the file.

    CSV: line = index + 2 (the header is line 1). JSONL: an explicit line per record (blank
    lines are not records). Parquet: ``row index + 1``.
    """

    path: str
    line_numbers: np.ndarray | None = None
    first_line: int = 2
    unit: str = "line"

    def line(self, index: int) -> int:
        if self.line_numbers is not None:
            return int(self.line_numbers[index])
        return index + self.first_line

    def error(self, index: int, column: str | None, message: str) -> WorkloadError:
        return WorkloadError(
            self.path, message, line=self.line(index), column=column, unit=self.unit
        )


def require_file(path: Path) -> None:
    """A trace must be an existing regular file: never a FIFO or device (`sim.files.inputs`)."""
    if not path.exists():
        raise WorkloadError(path, "file not found")
    refuse_non_regular(path, lambda reason: WorkloadError(path, reason))


def check_columns(
    path: Path | str, present: Sequence[str], required: Sequence[str], optional: Sequence[str]
) -> None:
    """Header check: every required column present, nothing unknown (line 1 of a CSV)."""
    allowed = list(required) + list(optional)
    for name in required:
        if name not in present:
            raise WorkloadError(
                path,
                f"missing required column (header has {list(present)}, needs {list(required)})",
                line=1,
                column=name,
            )
    for name in present:
        if name not in allowed:
            raise WorkloadError(
                path, f"unexpected column (allowed: {allowed})", line=1, column=str(name)
            )


_FIELDS_RE = re.compile(r"Expected (\d+) fields in line (\d+), saw (\d+)")


#: How much of a CSV's first line is read to check its header before the whole file is parsed.
_HEADER_PEEK_CHARS = 1 << 16
#: The longest JSONL line (one record) read: 16 Mi characters, ~2.8M Mooncake hash ids.
MAX_LINE_CHARS = 1 << 24


def iter_csv_strings(
    path: Path,
    required: Sequence[str] = (),
    optional: Sequence[str] | None = None,
    chunk_rows: int = 65_536,
) -> Iterator[tuple[pd.DataFrame, int]]:
    """A CSV as string columns, `chunk_rows` rows at a time: (frame, index of its first row).

    Row i of the file's data is file line i + 2 (the header is line 1), across chunks: blank
    lines are kept as empty rows, except trailing ones, which are dropped. A chunk's trailing
    blank rows are held back until the next chunk shows whether data follows them; when it
    does, the first of them is yielded alone (it fails its loader's first check, naming its
    line, exactly as whole-file reading did). CRLF line endings and a missing final newline
    are fine. With `required` (and `optional`) columns, the header is checked
    (`check_columns`) from the first line alone before the file is parsed: a 10 MB file
    without a header fails at once.
    """
    import pandas as pd

    require_file(path)
    if required:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
            first = fh.readline(_HEADER_PEEK_CHARS)
        if first.strip():  # an empty file gets its own message from the parser below
            header = next(csv.reader([first]), [])
            check_columns(path, [h.strip() for h in header], required, optional or ())
    with _csv_errors(path):
        reader = pd.read_csv(
            path,
            dtype=str,
            keep_default_na=False,
            skip_blank_lines=False,
            encoding="utf-8-sig",
            chunksize=chunk_rows,
        )
    with reader:
        next_row = 0
        held: tuple[pd.DataFrame, int] | None = None  # the first held-back blank row
        while True:
            with _csv_errors(path):
                frame = next(reader, None)
            if frame is None:
                return  # held-back blank rows at the end are dropped
            frame.columns = [str(c).strip() for c in frame.columns]
            start, next_row = next_row, next_row + len(frame)
            filled = _filled_rows(frame)
            if not filled.any():
                held = held or (frame.iloc[:1], start)
                continue
            if held is not None:  # blank rows with data after them: the first one is an error
                yield held
                raise AssertionError(f"{path}: a blank row at index {held[1]} passed validation")
            last = int(np.flatnonzero(filled)[-1]) + 1
            if last < len(frame):
                held = (frame.iloc[last : last + 1], start + last)
            yield frame.iloc[:last], start


def _filled_rows(frame: pd.DataFrame) -> np.ndarray:
    """Rows with at least one non-blank field."""
    empty = frame.isna() | (frame.astype(str).apply(lambda col: col.str.strip()) == "")
    return ~empty.all(axis=1).to_numpy()


@contextlib.contextmanager
def _csv_errors(path: Path) -> Iterator[None]:
    """pandas' CSV errors as the one-line `WorkloadError` that names the file (and line)."""
    import pandas as pd

    try:
        yield
    except pd.errors.EmptyDataError:
        raise WorkloadError(path, "file is empty (no header line)", line=1) from None
    except pd.errors.ParserError as exc:
        match = _FIELDS_RE.search(str(exc))
        if match:
            want, line, saw = match.groups()
            raise WorkloadError(
                path, f"expected {want} fields, found {saw}", line=int(line)
            ) from None
        raise WorkloadError(path, f"cannot parse CSV: {exc}") from None
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def iter_jsonl_records(
    path: Path, chunk_rows: int = 65_536
) -> Iterator[tuple[list[dict[str, Any]], np.ndarray]]:
    """A JSONL file, `chunk_rows` records at a time: (records, 1-based line of each record).

    Blank lines at the end are ignored; a blank line between records is an error (it would
    otherwise hide a lost request).
    """
    require_file(path)
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    first_blank: int | None = None
    try:
        with path.open(encoding="utf-8") as fh:
            # A line is read whole to be parsed: past the cap it is refused, not buffered.
            for lineno, text in enumerate(iter(partial(fh.readline, MAX_LINE_CHARS + 1), ""), 1):
                if len(text) > MAX_LINE_CHARS:
                    raise WorkloadError(
                        path, f"line longer than {MAX_LINE_CHARS:,} characters", line=lineno
                    )
                if not text.strip():
                    first_blank = first_blank or lineno
                    continue
                if first_blank is not None:
                    raise WorkloadError(path, "blank line between records", line=first_blank)
                records.append(_json_record(path, text, lineno))
                lines.append(lineno)
                if len(records) == chunk_rows:
                    yield records, np.asarray(lines, dtype=np.int64)
                    records, lines = [], []
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if records:
        yield records, np.asarray(lines, dtype=np.int64)


def _json_record(path: Path, text: str, lineno: int) -> dict[str, Any]:
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise WorkloadError(
            path, f"invalid JSON: {exc.msg} (character {exc.colno})", line=lineno
        ) from None
    if not isinstance(record, dict):
        raise WorkloadError(path, "expected a JSON object", line=lineno)
    return record


def jsonl_columns(
    records: list[dict[str, Any]],
    loc: RowLocator,
    required: Sequence[str],
    optional: Sequence[str],
) -> dict[str, list[Any]]:
    """Records to column lists (None where an optional key is absent); unknown keys rejected."""
    allowed = set(required) | set(optional)
    required_set = set(required)
    for i, record in enumerate(records):
        keys = record.keys()
        if not required_set <= keys:
            missing = sorted(required_set - keys)[0]
            raise loc.error(i, missing, "missing required key")
        if not keys <= allowed:
            extra = sorted(keys - allowed)[0]
            raise loc.error(i, extra, f"unexpected key (allowed: {sorted(allowed)})")
    return {name: [r.get(name) for r in records] for name in (*required, *optional)}


#: The largest integer a float64-parsed column holds exactly.
MAX_EXACT_INT = 2**53


def numeric_column(
    values: pd.Series | list[Any],
    name: str,
    loc: RowLocator,
    *,
    integer: bool,
    min_value: float | None = None,
    optional: bool = False,
) -> np.ndarray:
    """Validate one column; float64 array with NaN where an optional value is absent.

    Accepts CSV strings (a `pd.Series`) or JSON values (a list: numbers only, no bools or
    strings). Rejects missing required values, non-numbers, NaN/inf, fractions in integer
    columns and values below `min_value`, naming the first bad row.
    """
    if _is_series(values):
        import pandas as pd

        assert isinstance(values, pd.Series)
        text = values.astype(object)
        absent = text.isna().to_numpy() | (values.fillna("").str.strip() == "").to_numpy()
        parsed = pd.to_numeric(text.where(~absent, None), errors="coerce").to_numpy(np.float64)
        bad_type = ~absent & np.isnan(parsed)
    else:
        absent = np.fromiter((v is None for v in values), dtype=bool, count=len(values))
        bad_type = np.fromiter(
            (v is not None and v.__class__ not in _NUMBER_TYPES for v in values),
            dtype=bool,
            count=len(values),
        )
        parsed = np.array(
            [v if v.__class__ in _NUMBER_TYPES else np.nan for v in values], dtype=np.float64
        )
    if not optional and absent.any():
        raise loc.error(int(np.argmax(absent)), name, "missing value")
    if bad_type.any():
        i = int(np.argmax(bad_type))
        raise loc.error(i, name, f"not a number: {_show(values, i)}")
    present = ~absent
    bad = present & ~np.isfinite(parsed)
    if bad.any():
        i = int(np.argmax(bad))
        raise loc.error(i, name, f"not a finite number: {_show(values, i)}")
    if integer:
        bad = present & (parsed != np.floor(np.where(present, parsed, 0.0)))
        if bad.any():
            i = int(np.argmax(bad))
            raise loc.error(i, name, f"not an integer: {_show(values, i)}")
        # Read as float64: beyond 2**53 an integer is no longer exact, beyond 2**63 the int64
        # cast wraps (2**70 prompt tokens became 0). No token count or id comes near either.
        bad = present & (np.abs(np.where(present, parsed, 0.0)) > MAX_EXACT_INT)
        if bad.any():
            i = int(np.argmax(bad))
            raise loc.error(i, name, f"integer beyond 2**53: {_show(values, i)}")
    if min_value is not None:
        bad = present & (np.where(present, parsed, min_value) < min_value)
        if bad.any():
            i = int(np.argmax(bad))
            raise loc.error(i, name, f"must be >= {min_value:g}, got {parsed[i]:.10g}")
    return parsed


@dataclass(slots=True)
class ArrivalCarry:
    """What `check_non_decreasing` needs from the chunks before: the last arrival, its line."""

    last: tuple[float, int] | None = None


def check_non_decreasing(
    arrival_s: np.ndarray, name: str, loc: RowLocator, carry: ArrivalCarry | None = None
) -> None:
    """Arrivals must not go back in time; the first offending row is named.

    With `carry`, `arrival_s` is one chunk of a file: its first arrival is checked against the
    previous chunk's last (named by its line), and `carry` is updated for the next chunk."""
    if carry is not None and carry.last is not None and len(arrival_s):
        before, before_line = carry.last
        if arrival_s[0] < before:
            raise loc.error(0, name, _back_in_time(arrival_s[0], before, loc.unit, before_line))
    if carry is not None and len(arrival_s):
        carry.last = (float(arrival_s[-1]), loc.line(len(arrival_s) - 1))
    if len(arrival_s) < 2:
        return
    back = np.diff(arrival_s) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        message = _back_in_time(arrival_s[i], arrival_s[i - 1], loc.unit, loc.line(i - 1))
        raise loc.error(i, name, message)


def _back_in_time(arrival: float, before: float, unit: str, before_line: int) -> str:
    return (
        f"arrivals must be non-decreasing: {arrival:.9g} s comes after "
        f"{before:.9g} s on {unit} {before_line}; sort the file by arrival"
    )


def as_int64(values: np.ndarray) -> np.ndarray:
    return values.astype(np.int64)


def _is_series(values: object) -> bool:
    """A pandas Series (CSV strings)? pandas is loaded if one exists, so it is not imported."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(values, pandas.Series)


def _show(values: pd.Series | list[Any], index: int) -> str:
    value = values.iloc[index] if _is_series(values) else values[index]  # type: ignore[union-attr]
    text = repr(value) if isinstance(value, str) or value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."
