"""Input paths that are not regular files are refused before they are opened.

Every file kvsim reads on the user's say-so (a scenario, a trace a scenario names, a step-time
profile or coefficients file, the tables under `kvsim plot RUN_DIR`, a vLLM install's version
file) goes through `refuse_non_regular` or `require_regular_file` first. Opening a FIFO blocks
until a writer comes, which may be never; reading a character device such as /dev/zero never
ends (`kvsim run /dev/zero` grew to 22 GB before the kernel killed it); a socket cannot be
opened at all. So the path is `os.stat`-ed (which follows symlinks, as `open` would, and never
blocks) and anything but a regular file is a one-line `PathError`, exit 2.

Example::

    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> os.mkfifo(os.path.join(folder, "s.yaml"))
    >>> non_regular_reason(os.path.join(folder, "s.yaml"))
    'is a FIFO (named pipe), not a regular file'
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

from sim.errors import InputError, PathError

#: What each non-regular file type is called in a message.
_KINDS = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class NotRegularFileError(PathError):
    """An input path exists but is a folder, FIFO, device or socket where a file is meant."""


def non_regular_reason(path: str | Path) -> str | None:
    """Why `path` cannot be read as a file, or None for a regular file or a missing path.

    A missing path is left to the caller, which says "no such file" in its own words.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as error:  # a broken symlink loop, a path through a file, no permission
        return f"cannot be examined ({error.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
    return f"is {kind}, not a regular file"


def refuse_non_regular(path: str | Path, error: Callable[[str], InputError] | None = None) -> None:
    """Raise when `path` exists but is not a regular file (a missing path passes).

    `error` builds the exception from the reason (e.g. a `WorkloadError` naming the trace);
    the default is a `NotRegularFileError` reading "PATH: is a FIFO (named pipe), ...".
    """
    reason = non_regular_reason(path)
    if reason is None:
        return
    if error is not None:
        raise error(reason)
    raise NotRegularFileError(f"{path}: {reason}")


def require_regular_file(
    path: str | Path, error: Callable[[str], InputError] | None = None
) -> None:
    """`refuse_non_regular`, and a missing path is an error too ("no such file")."""
    if not os.path.exists(path):
        reason = "no such file"
        if error is not None:
            raise error(reason)
        raise PathError(f"{path}: {reason}")
    refuse_non_regular(path, error)


def require_folder(path: str | Path, what: str = "folder") -> None:
    """Raise a one-line `PathError` unless `path` is an existing folder (symlinks followed)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise PathError(f"{path}: no such directory ({what})") from None
    except OSError as error:
        raise PathError(f"{path}: cannot be examined ({error.strerror})") from None
    if not stat.S_ISDIR(mode):
        kind = next((name for test, name in _KINDS if test(mode)), "a regular file")
        raise NotRegularFileError(f"{path}: is {kind}, not a folder ({what})")


def read_capped_bytes(path: str | Path, limit: int, too_big: Callable[[int], InputError]) -> bytes:
    """The bytes of the regular file `path`, refusing one larger than `limit` bytes.

    The size is checked with `os.stat` before reading, and the read itself stops one byte
    past the limit, so a file that grows meanwhile is refused too instead of read whole.
    `too_big(size)` builds the error. Call `refuse_non_regular` first.
    """
    size = os.stat(path).st_size
    if size > limit:
        raise too_big(size)
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise too_big(len(data))
    return data


__all__ = [
    "NotRegularFileError",
    "non_regular_reason",
    "read_capped_bytes",
    "refuse_non_regular",
    "require_folder",
    "require_regular_file",
]
