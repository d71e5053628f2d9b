"""`load_workload`: a `WorkloadConfig` in, a validated, windowed, scaled `Workload` out."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from sim.files.inputs import require_regular_file
from sim.kv.types import Segment
from sim.scenario.fields import time_error
from sim.workload.config import WorkloadConfig
from sim.workload.errors import WorkloadError
from sim.workload.loaders import detect_format, load_lengths, load_trace
from sim.workload.request import PREFIX_KEY_BASE, RequestSpec, Workload
from sim.workload.sessions import infer_sessions, synthetic_sessions
from sim.workload.synthetic import lengths_workload, resolve, synthetic_workload
from sim.workload.transform import first_n, scale_time, time_window


def load_workload(spec: WorkloadConfig, base_dir: Path | str = ".") -> Workload:
    """Build the workload `spec` describes; relative paths resolve against `base_dir`.

    Raises `WorkloadError` (one line: file, line, column, problem) for any bad input.
    """
    base_dir = Path(base_dir)
    if spec.kind == "trace":
        workload = _trace(spec, base_dir)
    elif spec.kind == "sessions":
        workload = _sessions(spec, base_dir)
    elif spec.kind == "synthetic":
        assert spec.arrival and spec.lengths and spec.num_requests  # config validation
        workload = synthetic_workload(
            spec.num_requests, spec.arrival, spec.lengths, spec.seed, base_dir
        )
    else:
        workload = _inline(spec)
    if spec.time_range_s is not None:
        workload = time_window(workload, *spec.time_range_s)
    if spec.first_n is not None:
        workload = first_n(workload, spec.first_n)
    if spec.kind == "sessions" and spec.sessions and spec.sessions.source == "mooncake":
        # After the window: a turn whose parent fell outside it starts a session.
        workload = infer_sessions(workload, spec.hash_block_tokens)
    return _resolvable(scale_time(workload, spec.rate_scale), spec)


def _resolvable(workload: Workload, spec: WorkloadConfig) -> Workload:
    """`workload`, if its last arrival is a time float64 still resolves a millisecond at
    (`sim.scenario.fields.MAX_TIME_S`); a rate of 1e-300 or a trace at 1e300 s is refused, naming the
    knob that put it there. Requests are sorted by arrival, so the last one is the latest."""
    if not len(workload):
        return workload
    last = workload[len(workload) - 1].arrival_s
    what = "arrival_s"
    if spec.rate_scale != 1.0:
        what = f"arrival_s after rate_scale {spec.rate_scale:g}"
    elif spec.kind == "synthetic" and spec.arrival is not None:
        what = f"arrival_s drawn at arrival.rate_per_s {spec.arrival.rate_per_s:g}"
    problem = time_error(f"last {what}", last)
    if problem is not None:
        raise WorkloadError(workload.source, problem)
    return workload


def _sessions(spec: WorkloadConfig, base_dir: Path) -> Workload:
    assert spec.sessions is not None  # config validation
    if spec.sessions.source == "synthetic":
        return synthetic_sessions(spec.sessions, spec.seed)
    path = resolve(spec.sessions.path, base_dir)
    return load_trace(path, "mooncake", hash_block_tokens=spec.hash_block_tokens)


def _trace(spec: WorkloadConfig, base_dir: Path) -> Workload:
    path = resolve(spec.path, base_dir)
    fmt = detect_format(path) if spec.format == "auto" else spec.format
    if fmt == "lengths":
        if spec.arrival is None:
            raise WorkloadError(path, "a length-distribution file has no arrivals; give 'arrival'")
        return lengths_workload(load_lengths(path), spec.num_requests, spec.arrival, spec.seed)
    if spec.arrival is not None or spec.num_requests is not None:
        raise WorkloadError(
            path,
            f"a {fmt} trace has its own arrivals and length; drop 'arrival'/'num_requests' "
            "(use 'first_n', 'time_range_s', 'rate_scale')",
        )
    return load_trace(path, fmt, hash_block_tokens=spec.hash_block_tokens)


def _inline(spec: WorkloadConfig) -> Workload:
    assert spec.requests is not None  # config validation
    requests = []
    for i, item in enumerate(spec.requests):
        if i and item.arrival_s < spec.requests[i - 1].arrival_s:
            raise WorkloadError(
                "workload.requests",
                f"arrivals must be non-decreasing ({item.arrival_s} after "
                f"{spec.requests[i - 1].arrival_s})",
                line=i,
                column="arrival_s",
                unit="item",
            )
        prefix: tuple[Segment, ...] = ()
        if item.prefix_id is not None and item.prefix_tokens > 0:
            prefix = (Segment(PREFIX_KEY_BASE + item.prefix_id, item.prefix_tokens),)
        requests.append(
            RequestSpec(
                i, item.arrival_s, item.prompt_tokens, item.output_tokens, item.priority, prefix
            )
        )
    return Workload(requests, "inline", {"format": "inline", "num_rows": len(requests)})


def input_files(spec: WorkloadConfig, base_dir: Path | str = ".") -> list[Path]:
    """The files `load_workload` would read for `spec`, resolved as it resolves them (trace
    path, a length distribution's trace, a Mooncake sessions trace); none for inline or
    purely synthetic workloads."""
    base_dir = Path(base_dir)
    given: list[str | None] = []
    if spec.kind == "trace":
        given.append(spec.path)
    if spec.kind == "sessions" and spec.sessions is not None:
        given.append(spec.sessions.path)
    if spec.kind == "synthetic" and spec.lengths is not None:
        given += [d.path for d in (spec.lengths.prompt, spec.lengths.output) if d.kind == "trace"]
    # `resolve` already refuses a path that exists but is no regular file (a FIFO, a device).
    return [resolve(path, base_dir) for path in given if path is not None]


def check_input_files(spec: WorkloadConfig, base_dir: Path | str = ".") -> None:
    """Refuse (`WorkloadError`) a workload whose input files are missing or not regular files,
    without opening any: a planning command checks this before its first point runs, so a bad
    trace is bad input (exit 2), not one error row per point."""
    for path in input_files(spec, base_dir):
        require_regular_file(path, partial(WorkloadError, path))
