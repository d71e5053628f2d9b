"""The one base class of bad user input, and how an error becomes one short line.

Everything the user gives kvsim (a scenario file, `--set`, a trace, a step-time profile,
`--slo`, sweep and capacity arguments, an output folder) is validated explicitly and, when
wrong, raises a subclass of `InputError` whose message names the file, line and field. The
CLI turns exactly these into one line on stderr and exit status 2; any other exception is a
kvsim bug and is shown with its traceback (exit status 3, see `sim.cli.main`).

`InputError` derives from `ValueError` so that library callers who already catch
`ValueError` keep working; the CLI never catches plain `ValueError`.

Example::

    >>> one_line("trace.csv:1: header has " + "9," * 300, limit=40)
    'trace.csv:1: header has 9,9,9,9,9,9,9,9…'
"""

from __future__ import annotations

#: The most characters an error line echoes; longer ones end in "…" (a 10 MB header-less
#: trace would otherwise print its whole first line as the "one-line" error).
MAX_ERROR_CHARS = 300


class InputError(ValueError):
    """Bad user input; `str(error)` is one line naming the file / row / field at fault."""


class PathError(InputError):
    """A file or folder named by the user is missing, unreadable, or cannot be written."""


def one_line(message: str, limit: int = MAX_ERROR_CHARS) -> str:
    """The first line of `message`, at most `limit` characters.

    >>> one_line("bad value\\n(details from a library)")
    'bad value'
    """
    lines = str(message).strip().splitlines()
    text = lines[0].rstrip() if lines else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["MAX_ERROR_CHARS", "InputError", "PathError", "one_line"]
