"""Run sweep points in parallel: local processes (default) or a Dask distributed cluster.

A point is plain data (the resolved scenario dict and its overrides) and its result is one flat
row of summary metrics, so both executors ship it as-is. A point that raises becomes a row with
`error` set; the sweep goes on. Rows come back in grid order whatever order they finish in.

Local workers start as `start_method` decides: forked from a single-threaded script on Linux,
so `sim.sweep` / `sim.capacity` are safe at a script's top level without an
``if __name__ == "__main__":`` guard; spawned from Jupyter or a multi-threaded process.

Resuming: each finished row is appended to ``points.jsonl`` in the output folder as it arrives;
a later sweep over the same folder reuses every error-free row whose key (the scenario hash,
see `sim.planning.grid.scenario_key`) is still in the grid and runs only the rest.
"""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import InputError
from sim.files.outdir import check_regular_file, staged_file
from sim.planning.grid import SweepPoint

#: Summary metrics copied into a sweep row, in column order.
METRIC_COLUMNS = (
    "num_requests",
    "num_finished",
    "num_ignored",
    "num_failed",
    "num_aborted",
    "throughput_req_per_s",
    "throughput_tok_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_p99_s",
    "num_preemptions",
    "num_violations",
    "violation_kinds",
    "kv_util_mean",
    "kv_util_max",
    "num_gpu_blocks",
    "offered_rate_req_per_s",
    "simulated_s",
    "num_steps",
    "fatal_error",
    "stopped_early",
)
#: Which scenario, design and vLLM version a row ran (plots name them), then how it went.
TAIL_COLUMNS = ("scenario", "design", "vllm_version", "error", "wall_s")
CACHE_FILE = "points.jsonl"


def offered_rate(arrivals_s: pd.Series) -> float:
    """Requests per second offered by the arrivals: (n - 1) / span (a rate between arrivals).

    Example: arrivals at 0, 0.5, 1.0, 1.5 s -> 3 / 1.5 = 2 req/s. NaN for fewer than 2 arrivals.
    """
    if len(arrivals_s) < 2:
        return math.nan
    span = float(arrivals_s.max() - arrivals_s.min())
    return (len(arrivals_s) - 1) / span if span > 0 else math.inf


def summary_row(result) -> dict[str, Any]:
    """The sweep-row metrics of one `RunResult`."""
    s = result.summary
    states = s["states"]
    row = {
        "num_requests": s["num_requests"],
        "num_finished": states["finished"],
        "num_ignored": states["ignored"],
        "num_failed": states["failed"],
        "num_aborted": states["aborted"],
        "violation_kinds": ",".join(s["violation_kinds"]),
        "num_gpu_blocks": result.inputs.get("num_gpu_blocks"),
        #: The exact vLLM version modelled ("0.5.4", "0.33.0", ...; `sim.kv.pins`).
        "vllm_version": result.inputs.get("vllm_version"),
        "offered_rate_req_per_s": offered_rate(result.requests["arrival_s"]),
    }
    for name in METRIC_COLUMNS:
        if name not in row:
            row[name] = s.get(name)
    return row


def run_point(
    scenario_data: dict[str, Any],
    overrides: dict[str, Any],
    key: str,
    index: int,
    step_time_factor: float = 1.0,
) -> dict[str, Any]:
    """Run one point and return its row; never raises (the error goes in the row).

    `step_time_factor` multiplies every step time (`sim.run`'s argument of that name)."""
    from sim.engine.run import run
    from sim.scenario.schema import scenario_from_dict

    start = time.perf_counter()
    row: dict[str, Any] = {"point": index, "key": key, **overrides}
    row["scenario"] = scenario_data.get("name")
    row["design"] = (scenario_data.get("scheduler") or {}).get("design")
    try:
        scenario = scenario_from_dict(scenario_data, f"sweep point {index}")
        row["design"] = scenario.scheduler.design.value
        row.update(summary_row(run(scenario, base_dir=".", step_time_factor=step_time_factor)))
        row["error"] = None
    except Exception as error:  # noqa: BLE001 - a failing point must not sink the sweep
        row.update({name: None for name in METRIC_COLUMNS})
        last = traceback.extract_tb(error.__traceback__)[-1:] or [None]  # type: ignore[list-item]
        where = f" ({Path(last[0].filename).name}:{last[0].lineno})" if last[0] else ""
        row["error"] = (
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}{where}"
        )
    row["wall_s"] = time.perf_counter() - start
    return row


def default_workers() -> int:
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def start_method() -> str:
    """How local worker processes start: "fork" or "spawn" (see `multiprocessing`).

    A "spawn" worker re-imports the caller's main module. From a script that calls `sim.sweep`
    at its top level without an ``if __name__ == "__main__":`` guard, that re-import runs the
    script again inside every worker, which then tries to start a pool of its own while it is
    still bootstrapping, and the pool breaks. A "fork" worker is a copy of the caller and
    imports nothing, but forking a process that runs other threads (a Dask client, a Jupyter
    kernel) can deadlock. Hence:

    * a main module with no file (Jupyter, the REPL, ``python -c``): "spawn" (nothing is
      re-imported, and a notebook kernel runs threads);
    * a script on Linux with no thread but this one: "fork" (the script is not re-run, so the
      guard is not needed);
    * anything else: "spawn" (the script needs the guard, as `multiprocessing` documents).
    """
    main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if main_file and sys.platform == "linux" and threading.active_count() == 1:
        return "fork"
    return "spawn"


def map_tasks(
    fn: Callable[..., Any],
    args_list: Sequence[tuple],
    *,
    workers: int | None = None,
    cluster: Any = None,
    on_result: Callable[[int, Any], None] | None = None,
) -> list[Any]:
    """`fn(*args)` for every args tuple, in parallel; results in input order.

    cluster: None runs on local processes (`workers` of them; 1 runs in this process, which is
    what notebooks and tests want for tiny grids); a Dask scheduler address ("tcp://host:8786")
    or a `distributed.Client` runs on that cluster. `on_result(i, value)` is called as each
    task finishes (for progress bars and the resume cache).
    """
    results: list[Any] = [None] * len(args_list)

    def done(i: int, value: Any) -> None:
        results[i] = value
        if on_result is not None:
            on_result(i, value)

    if not args_list:
        return results
    if cluster is not None:
        _map_dask(fn, args_list, cluster, done)
        return results
    workers = workers or default_workers()
    if workers <= 1 or len(args_list) == 1:
        for i, args in enumerate(args_list):
            done(i, fn(*args))
        return results
    context = multiprocessing.get_context(start_method())
    with ProcessPoolExecutor(max_workers=min(workers, len(args_list)), mp_context=context) as pool:
        futures = {pool.submit(fn, *args): i for i, args in enumerate(args_list)}
        for future in as_completed(futures):
            done(futures[future], future.result())
    return results


def _map_dask(fn, args_list, cluster, done) -> None:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError as error:  # pragma: no cover - dask is an optional extra
        raise InputError("--cluster needs dask[distributed] (pip install 'kvsim[dask]')") from error
    own = isinstance(cluster, str)
    try:
        client = Client(cluster, timeout="20s") if own else cluster
    except (OSError, TimeoutError) as error:  # an address nothing answers at: the user's input
        raise InputError(f"--cluster {cluster}: cannot connect ({error})") from None
    try:
        futures = [client.submit(fn, *args, pure=False) for args in args_list]
        index = {future.key: i for i, future in enumerate(futures)}
        for future in dask_completed(futures):
            done(index[future.key], future.result())
    finally:
        if own:
            client.close()


def load_cache(out_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Error-free rows already computed in `out_dir`, by key (later lines win)."""
    if out_dir is None or not (out_dir / CACHE_FILE).exists():
        return {}
    rows = {}
    for line in (out_dir / CACHE_FILE).read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by an interrupted sweep
        if row.get("error") is None and "key" in row:
            rows[row["key"]] = row
    return rows


def run_points(
    points: Sequence[SweepPoint],
    *,
    out_dir: str | Path | None = None,
    workers: int | None = None,
    cluster: Any = None,
    resume: bool = True,
    on_row: Callable[[dict[str, Any], bool], None] | None = None,
) -> pd.DataFrame:
    """Run the points not already done in `out_dir`; one row per point, in grid order.

    `on_row(row, cached)` is called for every point (cached ones first).
    """
    out = Path(out_dir) if out_dir is not None else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        check_regular_file(out / CACHE_FILE, "the sweep's cache of finished points")
    cache = load_cache(out) if resume else {}
    rows: list[dict[str, Any] | None] = [None] * len(points)
    todo = []
    for point in points:
        if point.key in cache:
            # Settings from this grid (a cached row may come from a grid with other columns).
            row = {**cache[point.key], "point": point.index, **point.overrides}
            rows[point.index] = row
            if on_row is not None:
                on_row(row, True)
        else:
            todo.append(point)

    def finished(i: int, row: dict[str, Any]) -> None:
        rows[todo[i].index] = row
        if out is not None:
            with open(out / CACHE_FILE, "a", encoding="utf-8") as cache_file:
                cache_file.write(json.dumps(row, default=_json_default) + "\n")
        if on_row is not None:
            on_row(row, False)

    args = [(p.scenario_data, p.overrides, p.key, p.index) for p in todo]
    map_tasks(run_point, args, workers=workers, cluster=cluster, on_result=finished)
    return rows_frame(
        [r for r in rows if r is not None], [k for p in points[:1] for k in p.overrides]
    )


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    return str(value)


def rows_frame(rows: list[dict[str, Any]], setting_columns: list[str]) -> pd.DataFrame:
    """Rows -> a DataFrame with columns point, key, settings, metrics, error, wall_s."""
    columns = ["point", "key", *setting_columns, *METRIC_COLUMNS, *TAIL_COLUMNS]
    frame = pd.DataFrame.from_records(rows, columns=columns)
    for name in setting_columns:
        # A setting column of mixed types (1 and "auto") cannot go to Parquet: write it as text.
        if len({type(v) for v in frame[name] if v is not None}) > 1 and not _numeric(frame[name]):
            frame[name] = frame[name].map(lambda v: v if v is None else str(v))
    for name in METRIC_COLUMNS:
        if name not in ("violation_kinds", "fatal_error", "stopped_early"):
            frame[name] = pd.to_numeric(frame[name], errors="coerce")
    return frame


def _numeric(series: pd.Series) -> bool:
    return all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in series if v is not None
    )


def write_table(frame: pd.DataFrame, out_dir: str | Path, name: str) -> Path:
    """`name`.parquet and `name`.csv in `out_dir`."""
    out = Path(out_dir)
    # Each file whole or not at all (a Ctrl-C mid-sweep keeps the previous table).
    with staged_file(out / f"{name}.parquet") as tmp:
        frame.to_parquet(tmp, index=False)
    with staged_file(out / f"{name}.csv") as tmp:
        frame.to_csv(tmp, index=False, float_format="%.9g")
    return out / f"{name}.parquet"
