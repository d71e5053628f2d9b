"""Reading trace files into columns and validating them vectorised, with exact error places.

Loaders read a whole file at once (pandas for CSV/Parquet, one `json.loads` per JSONL line),
then check each column with numpy. pandas is imported by `read_csv_strings` when it runs, not
with this module: a plainly well-formed trace is read without it (`sim.workload.plain_csv`). On failure they report the FIRST bad row, translated to
its 1-based file line by a `RowLocator`, so a 20k-row trace still loads in tens of ms.
"""

from __future__ import annotations

import csv
import json
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

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
    if not path.exists():
        raise WorkloadError(path, "file not found")
    if not path.is_file():
        raise WorkloadError(path, "not a regular file")


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


def read_csv_strings(
    path: Path, required: Sequence[str] = (), optional: Sequence[str] | None = None
) -> pd.DataFrame:
    """A CSV as string columns, one DataFrame row per file line after the header.

    Blank lines are kept as empty rows (so row i is file line i + 2), except trailing ones,
    which are dropped. CRLF line endings and a missing final newline are fine. With
    `required` (and `optional`) columns, the header is checked (`check_columns`) from the
    first line alone before the file is parsed: a 10 MB file without a header fails at once.
    """
    import pandas as pd

    require_file(path)
    if required:
        with path.open(encoding="utf-8-sig", errors="replace", newline="") as fh:
            first = fh.readline(_HEADER_PEEK_CHARS)
        if first.strip():  # an empty file gets its own message from the parser below
            header = next(csv.reader([first]), [])
            check_columns(path, [h.strip() for h in header], required, optional or ())
    try:
        frame = pd.read_csv(
            path, dtype=str, keep_default_na=False, skip_blank_lines=False, encoding="utf-8-sig"
        )
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
    frame.columns = [str(c).strip() for c in frame.columns]
    if len(frame):
        empty = frame.isna() | (frame.astype(str).apply(lambda col: col.str.strip()) == "")
        filled = ~empty.all(axis=1).to_numpy()
        last = int(np.flatnonzero(filled)[-1]) + 1 if filled.any() else 0
        frame = frame.iloc[:last]
    return frame


def read_jsonl_records(path: Path) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Parse a JSONL file: (records, 1-based line number of each record).

    Blank lines at the end are ignored; a blank line between records is an error (it would
    otherwise hide a lost request).
    """
    require_file(path)
    records: list[dict[str, Any]] = []
    lines: list[int] = []
    first_blank: int | None = None
    try:
        with path.open(encoding="utf-8") as fh:
            for lineno, text in enumerate(fh, start=1):
                if not text.strip():
                    first_blank = first_blank or lineno
                    continue
                if first_blank is not None:
                    raise WorkloadError(path, "blank line between records", line=first_blank)
                try:
                    record = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise WorkloadError(
                        path, f"invalid JSON: {exc.msg} (character {exc.colno})", line=lineno
                    ) from None
                if not isinstance(record, dict):
                    raise WorkloadError(path, "expected a JSON object", line=lineno)
                records.append(record)
                lines.append(lineno)
    except UnicodeDecodeError as exc:
        raise WorkloadError(path, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return records, np.asarray(lines, dtype=np.int64)


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


def check_non_decreasing(arrival_s: np.ndarray, name: str, loc: RowLocator) -> None:
    """Arrivals must not go back in time; the first offending row is named."""
    if len(arrival_s) < 2:
        return
    back = np.diff(arrival_s) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        raise loc.error(
            i,
            name,
            f"arrivals must be non-decreasing: {arrival_s[i]:.9g} s comes after "
            f"{arrival_s[i - 1]:.9g} s on {loc.unit} {loc.line(i - 1)}; sort the file by arrival",
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
