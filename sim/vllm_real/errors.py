"""vLLM's exceptions as kvsim's: what the real code raised becomes a `ManagerError`.

The auditor records a `ManagerError` as a violation and lets anything else propagate as a
kvsim bug. So an adapter must tell apart an exception raised *by vLLM's code* (the real
engine would raise it too: a finding) from one raised by the adapter itself (a bug here).
It does so by where the exception was raised: the innermost traceback frame is a file of
the vLLM install, or it is not.

Mapping (vLLM 0.5.4 / 0.11.0 messages), first match wins:

* ``NoFreeBlocksError``, "Out of memory", "No usable cache memory left" (v0) and "Cannot get
  N free blocks from the pool" (V1 engine) -> `NoFreeBlocksError`;
* "Double free! ..." -> `DoubleFreeError`;
* "null block should not be modified" -> `NullBlockWriteError`;
* an IndexError out of v0-V2's ``BlockTable.append_token_ids`` (0.5.4's #7371) ->
  `EmptyAppendIndexError`;
* anything else vLLM raised -> `RaisedByVllm`, which keeps the original class name.

Example: vLLM 0.5.4's ``ValueError("Double free! ...")`` from ``block_manager_v1.py`` ->
``DoubleFreeError("Double free! ...")``; a KeyError raised in the adapter -> None (re-raised).
"""

from __future__ import annotations

from pathlib import Path

from sim.kv.types import (
    DoubleFreeError,
    EmptyAppendIndexError,
    ManagerError,
    NoFreeBlocksError,
    NullBlockWriteError,
)

#: vLLM messages that mean "the free list ran dry".
_NO_FREE_MESSAGES = ("Out of memory", "No usable cache memory left", "Cannot get ")


class RaisedByVllm(ManagerError):
    """An exception vLLM's code raised that kvsim has no named class for (e.g. a RecursionError
    in a v0-V2 fork); `upstream_type` is its class name."""

    def __init__(self, upstream_type: str, message: str) -> None:
        super().__init__(f"{upstream_type}: {message}" if message else upstream_type)
        self.upstream_type = upstream_type


def _frames(exc: BaseException) -> list[tuple[Path, str]]:
    """(file, function) of each frame `exc` passed through, outermost first."""
    frames = []
    tb = exc.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        frames.append((Path(code.co_filename), code.co_name))
        tb = tb.tb_next
    return frames


def translate_error(exc: Exception, root: Path) -> ManagerError | None:
    """kvsim's `ManagerError` for an exception vLLM's code (under `root`) raised; None when the
    exception did not come from vLLM's code (the caller re-raises it: a kvsim bug)."""
    if isinstance(exc, ManagerError):
        return exc
    frames = _frames(exc)
    if not frames or not frames[-1][0].is_relative_to(root):
        return None  # the innermost frame (where it was raised) is not vLLM's code
    text = str(exc)
    if type(exc).__name__ == "NoFreeBlocksError" or text.startswith(_NO_FREE_MESSAGES):
        return NoFreeBlocksError(text or "NoFreeBlocksError()")
    if text.startswith("Double free"):
        return DoubleFreeError(text)
    if text.startswith("null block should not be modified"):
        return NullBlockWriteError(text)
    if isinstance(exc, IndexError) and any(
        path.name == "block_table.py" and name == "append_token_ids" for path, name in frames
    ):
        return EmptyAppendIndexError(text)
    return RaisedByVllm(type(exc).__name__, text)
