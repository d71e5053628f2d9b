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
import stat
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from sim.errors import PathError
from sim.files.lock import FolderBusyError, folder_lock

#: A folder holding this file was written by `kvsim run` and may be replaced by a new run.
RUN_MARKER = "summary.json"


class OutputPathError(PathError):
    """An output path that cannot be written (an existing file, no permission, foreign files)."""


def check_output_file(path: Path) -> None:
    """Raise `OutputPathError` unless a file can be written at `path` (creates its folder).

    Called before the work that produces the file, so a bad `--junit x/` fails at once. A
    device or FIFO passes (it is written in place; a FIFO's reader may start later).
    """
    path = Path(path)
    _make_parent(path)
    kind = _existing(path)
    if kind != "absent" and not os.access(path, os.W_OK):
        raise OutputPathError(f"{path}: cannot write (permission denied)")
    if kind == "stream":
        return
    folder = _final(path).parent  # the temporary file is made next to the file it replaces
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{path}: cannot write in {folder} (permission denied)")


def check_regular_file(path: Path, what: str) -> None:
    """Raise `OutputPathError` unless `path` is absent or a regular file (through symlinks).

    For a file kvsim reads back before appending to it (a sweep's cache of finished points):
    a FIFO there would block the read forever and a device such as /dev/zero never end it.
    """
    if _existing(Path(path)) == "stream":
        raise OutputPathError(
            f"{path}: {what} is read back, so it must be a regular file, not a device or "
            "FIFO; remove it, or give another output folder"
        )


#: What `_existing` calls the kinds of node that are refused as single-file outputs.
_REFUSED = {stat.S_IFBLK: "block device", stat.S_IFSOCK: "socket", stat.S_IFDIR: "folder"}


def _existing(path: Path) -> str:
    """What is at `path`: "absent", "file" (regular, through any symlinks) or "stream".

    A stream is a character device or a FIFO (through any symlinks): written in place, never
    renamed over. Raises `OutputPathError` for everything else (a folder, a block device, a
    socket, a symlink to nothing).
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise OutputPathError(
                f"{path}: a symlink to nothing ({os.readlink(path)}); give a file name"
            ) from None
        return "absent"
    except OSError as error:  # a folder on the way that cannot be searched, ...
        raise OutputPathError(f"{path}: cannot look at ({_reason(error)})") from None
    mode = info.st_mode
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "stream"
    what = _REFUSED.get(stat.S_IFMT(mode), "special file")
    hint = "" if what == "folder" else ", not a file"
    raise OutputPathError(f"{path}: is a {what}{hint}; give a file name")


def _final(path: Path) -> Path:
    """`path`, or the file its symlinks lead to (that file is replaced; the links stay)."""
    return path.resolve() if path.is_symlink() else path


def check_distinct_outputs(outputs: Mapping[str, Path | None], inputs: Iterable[Path] = ()) -> None:
    """Raise `OutputPathError` if two options name one file, or an output is an input.

    `outputs` maps each option as the user types it (``--junit``) to its path (None: not
    given). One file is recognised however it is spelled (``./F``, ``d/../F``, an absolute
    path, a symlink or a hard link to it), so one report can never silently replace another,
    nor a report replace the scenario it was made from.
    """
    seen: dict[tuple, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = _identity(Path(path))
        if key in seen:
            raise OutputPathError(
                f"{path}: given to both {seen[key]} and {option}; give each its own path"
            )
        seen[key] = option
    read = {_identity(Path(p)): Path(p) for p in inputs}
    for key, option in seen.items():
        if key in read:
            raise OutputPathError(
                f"{outputs[option]}: {option} is an input of this command (the scenario "
                f"{read[key]}); give {option} another path"
            )


def _identity(path: Path) -> tuple:
    """The file `path` names: its device and inode if it exists, else its absolute real path."""
    try:
        info = os.stat(path)
    except OSError:  # nothing there (yet): the name is the identity
        return ("path", os.path.realpath(path))
    return ("inode", info.st_dev, info.st_ino)


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
    target is left exactly as it was; the exception propagates. The folder's lock
    (`folder_lock`) is held throughout.
    """
    with folder_lock(Path(target)):  # a second run into `target` is refused meanwhile
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
    given = Path(path)
    _make_parent(given)
    if _existing(given) == "stream":
        with _staged_stream(given) as tmp:
            yield tmp
        return
    path = _final(given)
    try:
        fd, name = tempfile.mkstemp(
            prefix=f".{path.name}.partial-", suffix=path.suffix, dir=path.parent
        )
    except OSError as error:
        raise OutputPathError(
            f"{given}: cannot write in {path.parent} ({_reason(error)})"
        ) from None
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


@contextmanager
def _staged_stream(path: Path) -> Iterator[Path]:
    """`staged_file` for a device or FIFO: stage in the system's temp folder, then copy in.

    The stream gets the finished bytes or nothing (an exception before the end writes none).
    """
    try:
        fd, name = tempfile.mkstemp(prefix="kvsim-", suffix=path.suffix)
    except OSError as error:
        where = tempfile.gettempdir()
        raise OutputPathError(f"{path}: cannot stage in {where} ({_reason(error)})") from None
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        _copy_into(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _copy_into(source: Path, path: Path) -> None:
    """Write `source`'s bytes into the device or FIFO at `path`, opened in place."""
    fifo = _existing(path) == "stream" and stat.S_ISFIFO(os.stat(path).st_mode)
    try:
        # O_NONBLOCK: a FIFO with no reader fails (ENXIO) instead of blocking this open forever.
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as error:
        if fifo and error.errno == errno.ENXIO:
            raise OutputPathError(
                f"{path}: a FIFO with no reader; start its reader first, or give a file name"
            ) from None
        raise OutputPathError(f"{path}: cannot write ({_reason(error)})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)):  # swapped for a file meanwhile
            raise OutputPathError(f"{path}: changed while kvsim ran; nothing was written")
        os.set_blocking(fd, True)  # the open must not wait; the writes may (a slow reader)
        with source.open("rb") as data:
            while chunk := data.read(1 << 16):
                view = memoryview(chunk)
                while view:
                    view = view[_write(fd, view, path) :]
    finally:
        os.close(fd)


def _write(fd: int, data: memoryview, path: Path) -> int:
    try:
        return os.write(fd, data)
    except OSError as error:  # /dev/full (ENOSPC), a reader that went away (EPIPE), ...
        raise OutputPathError(f"{path}: cannot write ({_reason(error)})") from None


def write_text_atomic(path: Path, text: str) -> Path:
    """Write `text` (UTF-8) to `path` through `staged_file`; returns `path`."""
    with staged_file(Path(path)) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


__all__ = [
    "FolderBusyError",
    "OutputPathError",
    "RUN_MARKER",
    "check_distinct_outputs",
    "check_output_dir",
    "check_output_file",
    "check_regular_file",
    "commit_staging",
    "discard_staging",
    "folder_lock",
    "staged_file",
    "staged_folder",
    "start_staging",
    "write_text_atomic",
]
