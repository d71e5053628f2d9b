"""Trace files read chunk by chunk, so memory follows the requests in flight, not the file.

A loader (`sim.workload.loaders`) is a *chunk reader*: a generator that reads `chunk_rows`
rows at a time, validates them with the same vectorised checks whole-file reading used, and
yields them as a `Chunk`. What a check needs from earlier rows is carried from chunk to chunk
(the previous arrival, the file's first timestamp), so every message names the same file,
line and column at any chunk size. `streamed` runs the reader once, to validate the whole file
before anything runs (a bad row late in the file still fails at startup, in one line), then:

- a file of one chunk (every bundled trace) becomes a list of `RequestSpec`, as before;
- a longer file becomes `StreamedSpecs`, which reads the file again, chunk by chunk, each time
  it is iterated: a 1M-request trace is never all in memory. The engine consumes it in
  arrival order as it comes (`in_arrival_order`; arrivals were checked non-decreasing, so file
  order is arrival order). `time_range_s`, `first_n` and `rate_scale` become a view of it
  (`StreamedSpecs.window` / `head` / `scaled`), applied in `load_workload`'s order, with the
  same float operations as `sim.workload.transform`, so the requests are identical.

A file that changes between two readings (size or modification time) is refused rather than
read half old, half new.

One difference from reading a whole file at once, for files with more than one bad value: the
error reported is the first one in the first chunk that has any (within a chunk, column by
column, as before). A file of one chunk reports exactly what whole-file reading did.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, overload

import numpy as np

from sim.kv.types import Segment
from sim.workload._table import require_file
from sim.workload.errors import WorkloadError
from sim.workload.request import RequestSpec

#: Rows a chunk reader reads at a time (a 3-column CSV chunk is a few MB of strings).
TRACE_CHUNK_ROWS = 65_536


@dataclass(slots=True)
class Chunk:
    """Validated columns of consecutive rows, the first of them row `first_id` of the file."""

    first_id: int
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    priority: np.ndarray | None = None
    prefixes: list[tuple[Segment, ...]] | None = None
    #: Facts about the file only its first chunk knows (Azure: the first timestamp).
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def specs(self, view: View | None = None) -> list[RequestSpec]:
        """The chunk's requests, ids = row indices; with `view`, windowed/scaled (not limited)."""
        ids = np.arange(self.first_id, self.first_id + len(self), dtype=np.int64)
        arrival = self.arrival_s
        keep: np.ndarray | None = None
        if view is not None and view.start_s is not None:
            keep = (view.start_s <= arrival) & (arrival < view.end_s)
            arrival = arrival[keep] - view.start_s
        if view is not None and view.rate_scale != 1.0:
            arrival = arrival / view.rate_scale
        n = len(self)
        prompts, outputs = self.prompt_tokens, self.output_tokens
        prios = self.priority if self.priority is not None else np.zeros(n, dtype=np.int64)
        pres: list[tuple[Segment, ...]] = self.prefixes or [()] * n
        if keep is not None:
            ids, prompts, outputs, prios = ids[keep], prompts[keep], outputs[keep], prios[keep]
            pres = [p for p, k in zip(pres, keep.tolist(), strict=True) if k]
        return [
            RequestSpec(i, a, p, o, q, s)
            for i, a, p, o, q, s in zip(
                ids.tolist(),
                arrival.tolist(),
                prompts.tolist(),
                outputs.tolist(),
                prios.tolist(),
                pres,
                strict=True,
            )
        ]


@dataclass(frozen=True, slots=True)
class View:
    """`time_window` (start_s, end_s), then `first_n` (limit), then `scale_time` (rate_scale)."""

    start_s: float | None = None
    end_s: float = 0.0
    limit: int | None = None
    rate_scale: float = 1.0


ChunkReader = Callable[[], Iterator[Chunk]]


def streamed(read: ChunkReader, path: Path) -> tuple[Sequence[RequestSpec], dict[str, Any]]:
    """Validate the whole file (one reading), then its requests and its first chunk's `meta`.

    `read` must be picklable (a `functools.partial` of a module-level reader): a sweep sends
    the workload to its worker processes."""
    require_file(path)  # a missing file is bad input before it is stat'ed
    stamp = _stamp(path)
    chunks = read()
    first = next(chunks, None)
    if first is None:
        return [], {}
    second = next(chunks, None)
    if second is None:
        return first.specs(), first.meta
    num, last = len(first) + len(second), second
    for last in chunks:  # noqa: B007  # the loop validates; the last chunk is kept
        num += len(last)
    ends = (first.specs()[0], last.specs()[-1])
    return StreamedSpecs(read, path, stamp, View(), num, ends), first.meta


def _stamp(path: Path) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_size, info.st_mtime_ns


class StreamedSpecs(Sequence[RequestSpec]):
    """A trace's requests, read from its file chunk by chunk each time they are iterated.

    Built by `streamed` (which validated the file and counted its rows) or by a view method.
    Indexing reads up to the index (no request is kept), except the first and last request,
    which are known from the counting pass (`sim.workload.transform` reports them).
    """

    in_arrival_order = True

    def __init__(
        self,
        read: ChunkReader,
        path: Path,
        stamp: tuple[int, int],
        view: View,
        num: int,
        ends: tuple[RequestSpec, RequestSpec] | None,
    ) -> None:
        self.read, self.path, self.stamp, self.view = read, path, stamp, view
        self.num = num
        self.ends = ends

    def __len__(self) -> int:
        return self.num

    def _chunks(self) -> Iterator[Chunk]:
        if _stamp(self.path) != self.stamp:
            raise WorkloadError(self.path, "the file changed while kvsim was reading it; run again")
        return self.read()

    def __iter__(self) -> Iterator[RequestSpec]:
        left = self.view.limit
        for chunk in self._chunks():
            specs = chunk.specs(self.view)
            if left is not None:
                specs, left = specs[:left], left - min(left, len(specs))
            yield from specs
            if left == 0:
                return

    def _derive(self, view: View) -> StreamedSpecs:
        """The same file under `view`, counted (one more reading) for its length and ends."""
        derived = StreamedSpecs(self.read, self.path, self.stamp, view, 0, None)
        num, first, last = 0, None, None
        for spec in derived:
            first = first or spec
            last = spec
            num += 1
        derived.num = num
        derived.ends = None if first is None or last is None else (first, last)
        return derived

    def window(self, start_s: float, end_s: float) -> StreamedSpecs | None:
        """Requests arriving in [start_s, end_s), shifted by -start_s (None: not as a view)."""
        if self.view != View():
            return None  # load_workload windows first; any other order is materialised
        return self._derive(View(start_s=start_s, end_s=end_s))

    def head(self, n: int) -> StreamedSpecs | None:
        """The first `n` requests (None: not as a view)."""
        if self.view.rate_scale != 1.0:
            return None
        limit = n if self.view.limit is None else min(n, self.view.limit)
        view = dataclasses.replace(self.view, limit=limit)
        if self.num <= n:  # nothing is cut: the count and the ends stay
            return StreamedSpecs(self.read, self.path, self.stamp, view, self.num, self.ends)
        return self._derive(view)

    def scaled(self, rate_scale: float) -> StreamedSpecs | None:
        """Every arrival divided by `rate_scale` (None: not as a view)."""
        if self.view.rate_scale != 1.0:
            return None
        view = dataclasses.replace(self.view, rate_scale=rate_scale)
        ends = None
        if self.ends is not None:
            ends = (_scale(self.ends[0], rate_scale), _scale(self.ends[1], rate_scale))
        return StreamedSpecs(self.read, self.path, self.stamp, view, self.num, ends)

    @overload
    def __getitem__(self, index: int) -> RequestSpec: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[RequestSpec]: ...

    def __getitem__(self, index: int | slice) -> RequestSpec | Sequence[RequestSpec]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.num)
            if start == 0 and step == 1:
                head = self.head(stop)
                if head is not None:
                    return head
            return list(self)[index]
        i = index + self.num if index < 0 else index
        if not 0 <= i < self.num:
            raise IndexError(f"request {index} of {self.num}")
        if self.ends is not None and i in (0, self.num - 1):
            return self.ends[0] if i == 0 else self.ends[1]
        for j, spec in enumerate(self):
            if j == i:
                return spec
        raise AssertionError("unreachable: i < len(self)")


def _scale(spec: RequestSpec, rate_scale: float) -> RequestSpec:
    return dataclasses.replace(spec, arrival_s=spec.arrival_s / rate_scale)
