"""The advisory lock a `kvsim run` holds on its output folder while it writes (`folder_lock`).

Two runs into one folder used to both print "outputs written" while one result vanished
(each staged its own folder; the last to commit won). Now the run takes ``fcntl.flock`` on
``.NAME.lock`` beside the target (``runs/.x.lock`` for ``runs/x``) before it checks the
target, and keeps it until its folder has taken the target's name; a second run finds the
lock held and is refused at once, exit 2: "runs/x: is being written by another kvsim run
(pid 1234)".

The lock file is removed when the run ends, while still locked: a run that opened the file
just before sees, once it holds the lock, that the name now leads elsewhere (or nowhere) and
locks afresh, so two runs never both believe they hold it. A run killed with SIGKILL leaves
the file behind, harmlessly: a flock dies with its process, and the next run takes it over
(and removes it). A lock path that is not a regular file (a FIFO, a symlink, a device) is
refused, never opened through.

Example::

    with folder_lock(Path("runs/x")):   # FolderBusyError if another run holds runs/x
        ...                             # stage and commit runs/x
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sim.errors import PathError


class FolderBusyError(PathError):
    """The output folder is being written by another run, or its lock path is unusable."""


def lock_path(target: Path) -> Path:
    """Where the lock of output folder `target` lives: ``.NAME.lock`` in its parent."""
    target = Path(target)
    return target.parent / f".{target.name}.lock"


@contextmanager
def folder_lock(target: Path) -> Iterator[None]:
    """Hold the advisory lock of output folder `target` for the block (see the module).

    Creates `target`'s parent folder if needed (the lock lives there). Where it cannot be
    made (a file on the way, no permission), nothing can be written there either: the block
    runs unlocked and the output check it starts with refuses the target, naming the reason.
    """
    target = Path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        yield
        return
    lock = lock_path(target)
    fd = _take(lock, target)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        if _still_named(fd, lock):
            lock.unlink(missing_ok=True)
        os.close(fd)


def _take(lock: Path, target: Path) -> int:
    """An open descriptor of `lock`, locked; `FolderBusyError` if another process holds it."""
    while True:
        fd = _open(lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            pid = f"pid {holder}" if holder.isdigit() else "pid unknown"
            raise FolderBusyError(
                f"{target}: is being written by another kvsim run ({pid}); wait for it to "
                "finish, or give another output folder"
            ) from None
        if _still_named(fd, lock):
            return fd
        os.close(fd)  # its holder removed it as it finished: lock the file there now


def _open(lock: Path) -> int:
    unusable = f"{lock}: the output folder's lock path is not a regular file; remove it"
    if lock.is_symlink() or (lock.exists() and not lock.is_file()):
        raise FolderBusyError(unusable)  # never opened: a device or FIFO is not ours to open
    try:
        # O_NOFOLLOW and O_NONBLOCK: a symlink or FIFO swapped in since the check above is
        # refused below instead of followed or waited on.
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o666)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise FolderBusyError(unusable) from None
        reason = error.strerror or type(error).__name__
        raise FolderBusyError(
            f"{lock}: cannot create the output folder's lock ({reason})"
        ) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise FolderBusyError(unusable)
    return fd


def _still_named(fd: int, lock: Path) -> bool:
    """Whether the name `lock` still leads to the file open at `fd`."""
    try:
        named = os.stat(lock, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (mine.st_dev, mine.st_ino)


__all__ = ["FolderBusyError", "folder_lock", "lock_path"]
