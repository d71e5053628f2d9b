"""Output folders that are either the old run or the new one, whole: never a mix.

A run's files are written into a fresh hidden folder next to the target
(``runs/.x.partial-k3j9``) and only when every file is there does it take the target's name;
the folder it replaces is removed. So Ctrl-C, a crash or a full disk leaves the previous run
untouched (and no partial folder), and two runs into one folder never interleave: each writes
its own temporary folder, and the last one to finish wins whole.

The target is checked before the simulation starts (`OutputPathError`, exit 2): it must be a
new path, an empty folder, or a folder holding an earlier run (it has ``summary.json``), so a
mistyped ``-o ~`` never replaces a folder of the user's own files.

Example::

    with staged_folder(Path("runs/x")) as tmp:   # checked and created here
        (tmp / "summary.json").write_text("{}")  # runs/x is still the old run
    # runs/x is now the new run; the old one is gone
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import PathError

#: A folder holding this file was written by `kvsim run` and may be replaced by a new run.
RUN_MARKER = "summary.json"


class OutputPathError(PathError):
    """An output path that cannot be written (an existing file, no permission, foreign files)."""


def check_output_file(path: Path) -> None:
    """Raise `OutputPathError` unless a file can be written at `path` (creates its folder).

    Called before the work that produces the file, so a bad `--junit x/` fails at once.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder; give a file name")
    _make_parent(path)
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputPathError(f"{path}: cannot write (permission denied)")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: cannot write in {path.parent} (permission denied)")


def check_output_dir(path: Path) -> None:
    """Raise `OutputPathError` unless `path` is, or can be made, a writable folder."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{path}: exists and is not a folder; give a folder for the outputs")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(f"{path}: cannot create the folder ({_reason(error)})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: cannot write in this folder (permission denied)")


def _umask() -> int:
    """The process umask (reading it means setting it: set it back at once)."""
    umask = os.umask(0)
    os.umask(umask)
    return umask


def _reason(error: OSError) -> str:
    return error.strerror or type(error).__name__


def _make_parent(path: Path) -> None:
    parent = path.parent
    if parent.exists() and not parent.is_dir():
        raise OutputPathError(f"{path}: {parent} is a file, not a folder")
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise OutputPathError(f"{path}: cannot create {parent} ({_reason(error)})") from None


def _check_replaceable(target: Path) -> None:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise OutputPathError(
            f"{target}: exists and is not a folder; give a new or empty folder for the outputs"
        )
    if not target.exists():
        return
    entries = sorted(p.name for p in target.iterdir())
    if entries and RUN_MARKER not in entries:
        raise OutputPathError(
            f"{target}: a folder that holds no earlier run ({entries[0]!r}, ...); a run replaces "
            "its output folder whole, so give a new or empty folder"
        )


def start_staging(target: Path) -> Path:
    """Check `target` and create the temporary folder the outputs are written into."""
    target = Path(target)
    _check_replaceable(target)
    _make_parent(target)
    try:
        staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent))
    except OSError as error:
        raise OutputPathError(
            f"{target}: cannot write in {target.parent} ({_reason(error)})"
        ) from None
    # mkdtemp makes the folder private (0700); a run folder gets the usual mode (umask).
    staging.chmod(0o777 & ~_umask())
    return staging


def commit_staging(staging: Path, target: Path) -> None:
    """Give `staging` the name `target`, replacing (and removing) what was there.

    Two renames: the old folder aside, the new one in. Another run committing at the same
    time makes a rename fail with "exists"/"not empty"; then move that one aside too and
    retry, so exactly one complete run ends up at `target` (the last to commit).
    """
    replaced: list[Path] = []
    while True:
        if target.exists():
            aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            try:
                os.replace(target, aside / "run")
                replaced.append(aside)
            except FileNotFoundError:  # another run moved it aside first
                aside.rmdir()
        try:
            os.rename(staging, target)
            break
        except OSError as error:
            if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    for aside in replaced:
        shutil.rmtree(aside, ignore_errors=True)


def discard_staging(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A temporary folder that becomes `target` when the block ends without an exception.

    On any exception (KeyboardInterrupt included) the temporary folder is removed and the
    target is left exactly as it was; the exception propagates.
    """
    staging = start_staging(target)
    try:
        yield staging
    except BaseException:
        discard_staging(staging)
        raise
    try:
        commit_staging(staging, Path(target))
    except BaseException:
        discard_staging(staging)
        raise


@contextmanager
def staged_file(path: Path) -> Iterator[Path]:
    """A temporary file next to `path` that replaces it when the block ends without an exception.

    The same promise as `staged_folder`, for one file: readers see the old file or the new
    one, whole; on any exception the temporary file is removed and `path` is untouched. The
    temporary name keeps the suffix (matplotlib picks the image format from it).

    Example::

        with staged_file(Path("out/sweep.csv")) as tmp:  # out/ is created here
            frame.to_csv(tmp)                            # out/sweep.csv is still the old file
        # out/sweep.csv is now the new file
    """
    path = Path(path)
    _make_parent(path)
    try:
        fd, name = tempfile.mkstemp(
            prefix=f".{path.name}.partial-", suffix=path.suffix, dir=path.parent
        )
    except OSError as error:
        raise OutputPathError(f"{path}: cannot write in {path.parent} ({_reason(error)})") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        # mkstemp makes the file private (0600); an output gets the usual mode (umask).
        tmp.chmod(0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through `staged_file`; returns `path`."""
    with staged_file(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


__all__ = [
    "OutputPathError",
    "RUN_MARKER",
    "check_output_dir",
    "check_output_file",
    "commit_staging",
    "discard_staging",
    "staged_file",
    "staged_folder",
    "start_staging",
    "write_text_atomic",
]
