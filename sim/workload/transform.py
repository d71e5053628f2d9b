"""Windowing and time scaling of a workload; each step records what it excluded.

Order used by `load_workload`: `time_window` (in the source's seconds), then `first_n`, then
`scale_time`. Request ids are kept (they name the source row), so a windowed workload's ids
need not start at 0.

Example: arrivals [0, 1, 2, 3, 4] s; time_window(1, 3) keeps [1, 2] -> shifted to [0, 1];
scale_time(2.0) then gives [0, 0.5] (twice the rate).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sim.workload.errors import WorkloadError
from sim.workload.request import RequestSpec, Workload
from sim.workload.trace_stream import StreamedSpecs


def scale_time(workload: Workload, rate_scale: float) -> Workload:
    """Replay at `rate_scale` times the rate: every arrival (and session think time) divided
    by `rate_scale`."""
    if not rate_scale > 0:
        raise WorkloadError(workload.source, f"rate_scale must be > 0, got {rate_scale}")
    if rate_scale == 1.0:
        return workload
    lazy = _streamed(workload)
    view = lazy.scaled(rate_scale) if lazy is not None else None
    requests = (
        view
        if view is not None
        else [
            dataclasses.replace(
                r,
                arrival_s=r.arrival_s / rate_scale,
                think_s=None if r.think_s is None else r.think_s / rate_scale,
            )
            for r in workload
        ]
    )
    return _derive(workload, requests, "rate_scale", {"rate_scale": rate_scale})


def first_n(workload: Workload, n: int) -> Workload:
    """The first `n` requests (all of them if there are fewer)."""
    if n < 1:
        raise WorkloadError(workload.source, f"first_n must be >= 1, got {n}")
    # A lazy source slices to a lazy prefix (`LazySpecs`, `StreamedSpecs`).
    return _derive(workload, workload.requests[:n], "first_n", {"n": n})


def time_window(workload: Workload, start_s: float, end_s: float) -> Workload:
    """Requests arriving in [start_s, end_s), shifted so that start_s becomes 0."""
    if not 0 <= start_s < end_s:
        raise WorkloadError(
            workload.source, f"time range needs 0 <= start < end: {start_s}, {end_s}"
        )
    lazy = _streamed(workload)
    view = lazy.window(start_s, end_s) if lazy is not None else None
    kept = (
        view
        if view is not None
        else [
            dataclasses.replace(r, arrival_s=r.arrival_s - start_s)
            for r in workload
            if start_s <= r.arrival_s < end_s
        ]
    )
    if not kept:
        raise WorkloadError(
            workload.source,
            f"no request arrives in [{start_s:g}, {end_s:g}) s "
            f"(arrivals span {workload.requests[0].arrival_s:g} to {workload.requests[-1].arrival_s:g} s)",
        )
    return _derive(workload, kept, "time_range_s", {"start_s": start_s, "end_s": end_s})


def _streamed(workload: Workload) -> StreamedSpecs | None:
    """The workload's requests if a trace file streams them (transforms become views)."""
    return workload.requests if isinstance(workload.requests, StreamedSpecs) else None


def _derive(
    workload: Workload, requests: Sequence[RequestSpec], name: str, params: dict
) -> Workload:
    step = {"transform": name, **params, "num_excluded": len(workload) - len(requests)}
    meta = dict(workload.metadata)
    meta["transforms"] = [*meta.get("transforms", []), step]
    # A prefix of a lazy workload stays lazy (`LazySpecs` / `StreamedSpecs` slice to one).
    return Workload(requests, workload.source, meta)
