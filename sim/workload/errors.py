"""The one exception a workload loader raises for bad input, printable as a single line.

Every message names the file, the line (or row) and the column, so a user can open the file at
the right place: ``traces/x.csv:17: column 'prompt_tokens': must be >= 1, got 0``. Lines are
1-based file lines (a CSV header is line 1); Parquet has no lines, so its rows are 1-based data
rows (``x.parquet:row 3: ...``).
"""

from __future__ import annotations

from pathlib import Path

from sim.errors import InputError


class WorkloadError(InputError):
    """Bad workload input: a malformed trace, a missing file, an impossible setting.

    Example::

        >>> str(WorkloadError("a.csv", "must be >= 1, got 0", line=3, column="prompt_tokens"))
        "a.csv:3: column 'prompt_tokens': must be >= 1, got 0"
    """

    def __init__(
        self,
        source: str | Path,
        message: str,
        *,
        line: int | None = None,
        column: str | None = None,
        unit: str = "line",
    ) -> None:
        self.source = str(source)
        self.message = message
        self.line = line
        self.column = column
        self.unit = unit
        super().__init__(self._format())

    def _format(self) -> str:
        where = self.source
        if self.line is not None:
            where += f":{self.line}" if self.unit == "line" else f":{self.unit} {self.line}"
        what = self.message if self.column is None else f"column {self.column!r}: {self.message}"
        # One line, always: newlines from wrapped library messages would break log parsing.
        return " ".join(f"{where}: {what}".split())
