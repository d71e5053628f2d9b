"""Plots: a DataFrame in, a matplotlib Figure out (no pyplot state); PNGs saved by the CLI.

* `kv_timeline(steps, violations, num_gpu_blocks)`: KV blocks used / free / cached over time,
  violations marked as vertical lines, one style per kind;
* `queue_lengths(steps)`: waiting / running / swapped requests over time;
* `latency_cdfs(requests)`: empirical CDFs of TTFT, TPOT and end-to-end latency;
* `throughput_latency(sweep_table)`: throughput against a latency percentile across a sweep,
  one line per combination of the settings a line does not run along;
* `capacity_frontier(probes, capacity_table)`: each SLO metric against the offered rate, one
  line per configuration and replicate (trace window or seed), with the SLO limit, every
  configuration's capacity and its 95 % interval, and the capacity at the ends of its
  step-time band;
* `capacity_band(capacity_table)`: each configuration's capacity with its seed interval and the
  range its step-time band spans.

Every figure names what it shows in its title line: the scenario, the design and the vLLM
release that design models (`sim.kv.Design.upstream`). Run plots take it as `subject=`
(`result.inputs` or a string); sweep and capacity plots read it from the table's `scenario`
and `design` columns.

Figures are built with `matplotlib.figure.Figure` so that nothing depends on a GUI backend.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from sim.errors import PathError, one_line
from sim.files.inputs import refuse_non_regular, require_folder
from sim.files.outdir import staged_file
from sim.plots.common import (
    figure,
    name_figure,
    seconds_text,
    subject_of,
)
from sim.plots.planning import (
    _parse_limits,
    capacity_band,
    capacity_frontier,
    throughput_latency,
)

_COLORS = {"used": "tab:blue", "free": "tab:green", "cached": "tab:orange"}
MAX_REPLICA_PANELS = 4


def _end_s(steps: pd.DataFrame) -> pd.Series:
    return steps["start_s"] + steps["duration_s"]


def kv_timeline(
    steps: pd.DataFrame,
    violations: pd.DataFrame | None = None,
    num_gpu_blocks: int | None = None,
    *,
    subject: str | Mapping[str, Any] | None = None,
) -> Figure:
    """KV blocks used / free / cached (evictable) after each step; one panel per replica (<= 4)."""
    replicas = sorted(steps["replica"].unique()) if len(steps) else [0]
    shown = replicas[:MAX_REPLICA_PANELS]
    fig, axes = figure(len(shown), sharex=True)
    for ax, replica in zip(axes[:, 0], shown, strict=True):
        mine = steps[steps["replica"] == replica]
        t = _end_s(mine)
        ax.step(t, mine["num_used_blocks"], where="post", color=_COLORS["used"], label="used")
        ax.step(t, mine["num_free_blocks"], where="post", color=_COLORS["free"], label="free")
        if mine["num_cached_blocks"].any():
            ax.step(
                t,
                mine["num_cached_blocks"],
                where="post",
                color=_COLORS["cached"],
                label="cached (evictable)",
            )
        if num_gpu_blocks:
            ax.axhline(
                num_gpu_blocks,
                color="grey",
                linestyle=":",
                linewidth=1,
                label=f"total ({num_gpu_blocks})",
            )
        if violations is not None and len(violations):
            _mark_violations(ax, violations)
        ax.set_ylabel("KV blocks")
        title = "KV-cache blocks over time" + (f" (replica {replica})" if len(replicas) > 1 else "")
        ax.set_title(title)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("simulated time (s)")
    note = f"first {len(shown)} of {len(replicas)} replicas" if len(replicas) > len(shown) else ""
    name_figure(fig, subject_of(subject), note)
    return fig


#: One line style per violation kind, so overlapping kinds stay tellable apart.
_VIOLATION_STYLES = [
    ("red", "-"),
    ("darkorange", "--"),
    ("purple", ":"),
    ("brown", "-."),
    ("magenta", "-"),
    ("black", "--"),
]


def _mark_violations(ax, violations: pd.DataFrame) -> None:
    for index, (kind, group) in enumerate(violations.groupby("kind", sort=True)):
        color, style = _VIOLATION_STYLES[index % len(_VIOLATION_STYLES)]
        for i, time_s in enumerate(group["time_s"].dropna().unique()):
            ax.axvline(
                time_s,
                color=color,
                linestyle=style,
                alpha=0.6,
                linewidth=1,
                label=f"violation: {kind} ({len(group)})" if i == 0 else None,
            )


def queue_lengths(steps: pd.DataFrame, *, subject: str | Mapping[str, Any] | None = None) -> Figure:
    """Waiting / running / swapped requests after each step (summed over replicas)."""
    fig, axes = figure()
    ax = axes[0, 0]
    ordered = steps.assign(end_s=_end_s(steps)).sort_values(["end_s", "replica"], kind="stable")
    if ordered["replica"].nunique() > 1:
        # The latest value of each replica at every step end, summed.
        wide = ordered.pivot_table(
            index="end_s",
            columns="replica",
            values=["num_waiting", "num_running", "num_swapped"],
            aggfunc="last",
        )
        wide = wide.ffill().fillna(0)
        series = {
            name: wide[name].sum(axis=1) for name in ("num_waiting", "num_running", "num_swapped")
        }
        t = wide.index
    else:
        series = {name: ordered[name] for name in ("num_waiting", "num_running", "num_swapped")}
        t = ordered["end_s"]
    for name, label in (
        ("num_waiting", "waiting"),
        ("num_running", "running"),
        ("num_swapped", "swapped"),
    ):
        if name == "num_swapped" and not np.any(series[name]):
            continue
        ax.step(t, series[name], where="post", label=label)
    ax.set_title("Queue lengths over time")
    ax.set_xlabel("simulated time (s)")
    ax.set_ylabel("requests")
    ax.legend(loc="upper right", fontsize="small")
    ax.grid(alpha=0.3)
    name_figure(fig, subject_of(subject))
    return fig


def latency_cdfs(
    requests: pd.DataFrame, *, subject: str | Mapping[str, Any] | None = None
) -> Figure:
    """Empirical CDFs of TTFT, TPOT and end-to-end latency of the finished requests."""
    fig, axes = figure(1, 3, width=12.0, height=3.4)
    finished = requests[requests["state"] == "finished"]
    for ax, (column, title) in zip(
        axes[0],
        (
            ("ttft_s", "Time to first token"),
            ("tpot_s", "Time per output token"),
            ("e2e_s", "End-to-end latency"),
        ),
        strict=True,
    ):
        values = np.sort(finished[column].dropna().to_numpy())
        if len(values):
            ax.step(values, np.arange(1, len(values) + 1) / len(values), where="post")
            for q, style in ((50, "--"), (99, ":")):
                p = float(np.percentile(values, q))
                ax.axvline(
                    p, color="grey", linestyle=style, linewidth=1, label=f"p{q} = {seconds_text(p)}"
                )
            if values[0] > 0 and values[-1] / values[0] > 100:
                ax.set_xscale("log")
            ax.legend(loc="lower right", fontsize="small")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(f"{title} (n={len(values)})")
        ax.set_xlabel("seconds")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("fraction of requests")
    name_figure(fig, subject_of(subject))
    return fig


# ---------------------------------------------------------------------------- saving
def save(fig: Figure, path: Path) -> Path:
    with staged_file(path) as tmp:
        fig.savefig(tmp, dpi=110)
    return path


def save_run_plots(result, out_dir: str | Path) -> list[Path]:
    """kv_timeline.png, queues.png and latency_cdf.png of one `RunResult` in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    inputs = result.inputs or {}
    blocks = inputs.get("num_gpu_blocks")
    timeline = kv_timeline(result.steps, result.violations, blocks, subject=inputs)
    paths = [save(timeline, out / "kv_timeline.png")]
    paths.append(save(queue_lengths(result.steps, subject=inputs), out / "queues.png"))
    paths.append(save(latency_cdfs(result.requests, subject=inputs), out / "latency_cdf.png"))
    return paths


def save_sweep_plots(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    if not (table["error"].isna()).any():
        return []
    return [save(throughput_latency(table), out / "throughput_latency.png")]


def save_capacity_plots(
    table: pd.DataFrame, probes: pd.DataFrame, out_dir: str | Path
) -> list[Path]:
    """capacity_frontier.png, and capacity_band.png when the table has the band's columns."""
    out = Path(out_dir)
    if not len(probes):
        return []
    paths = [save(capacity_frontier(probes, table), out / "capacity_frontier.png")]
    if "capacity_slow_step_ci_low" in table and table["capacity_slow_step_ci_low"].notna().any():
        paths.append(save(capacity_band(table, probes), out / "capacity_band.png"))
    return paths


#: The files `save_dir_plots` may read from a run, sweep or capacity folder.
_PLOT_INPUTS = (
    "steps.parquet",
    "requests.parquet",
    "summary.json",
    "violations.parquet",
    "sweep.parquet",
    "capacity.parquet",
    "probes.parquet",
)


def _files_in(folder: Path, names: tuple[str, ...]) -> dict[str, bool]:
    """Which of `names` are in `folder`; one that is there but is not a regular file (a FIFO
    would block the reader, a device never end) is refused before anything is read."""
    for name in names:
        refuse_non_regular(folder / name)
    return {name: (folder / name).exists() for name in names}


#: The columns the plots read from each table (a subset of what kvsim writes, for a run of
#: `kvsim run` and of `kvsim disagg` alike): a Parquet file that reads fine but lacks one is
#: another table put in its place, refused in one line rather than a KeyError mid-plot.
_NEEDED = {
    "steps.parquet": (
        "replica",
        "start_s",
        "duration_s",
        "num_used_blocks",
        "num_free_blocks",
        "num_cached_blocks",
        "num_waiting",
        "num_running",
        "num_swapped",
    ),
    "requests.parquet": ("state", "ttft_s", "tpot_s", "e2e_s"),
    "violations.parquet": ("kind", "time_s"),
    "sweep.parquet": ("error", "ttft_p99_s", "throughput_tok_per_s"),
    "capacity.parquet": (
        "slos",
        "config",
        "capacity_rate_req_per_s",
        "capacity_ci_low",
        "capacity_ci_high",
    ),
    "probes.parquet": ("config", "replicate", "offered_rate_req_per_s"),
}
#: Read by `capacity_band` when the capacity table has a step-time band.
_BAND_COLUMNS = (
    "capacity_slow_step_ci_low",
    "capacity_fast_step_ci_high",
    "capacity_slow_step_req_per_s",
    "capacity_fast_step_req_per_s",
    "step_time_low_factor",
    "step_time_high_factor",
    "step_time_band_source",
)


def _read_parquet(path: Path, extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """A table of a run folder; a truncated file, or a foreign one (without the columns the
    plots read, `_NEEDED` and `extra`), is one line naming it and the missing columns."""
    import pyarrow as pa

    try:
        table = pd.read_parquet(path)
    except (pa.ArrowInvalid, OSError) as error:  # pyarrow: not a Parquet file / truncated
        raise PathError(f"{path}: not a readable Parquet table ({one_line(str(error))})") from None
    missing = sorted(set(_NEEDED.get(path.name, ()) + extra) - set(table.columns))
    if missing:
        raise PathError(
            f"{path}: missing columns {', '.join(missing)} (not a table kvsim wrote here)"
        )
    return table


def _read_capacity(folder: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """capacity.parquet and probes.parquet, the probes checked for each SLO metric's column."""
    table = _read_parquet(folder / "capacity.parquet")
    if "capacity_slow_step_ci_low" in table:
        table = _read_parquet(folder / "capacity.parquet", _BAND_COLUMNS)
    limits = _parse_limits(table["slos"].iloc[0]) if len(table) else {}
    metrics = tuple(f"{metric}_s" for metric in limits or ["ttft_p99"])
    return table, _read_parquet(folder / "probes.parquet", metrics)


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PathError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise PathError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def save_dir_plots(run_dir: str | Path) -> list[Path]:
    """Plots for whatever `run_dir` holds: a run, a sweep, or a capacity search."""
    from sim.output.results import RunResult

    d = Path(run_dir)
    require_folder(d, "run folder")
    has = _files_in(d, _PLOT_INPUTS)
    paths: list[Path] = []
    if has["steps.parquet"] and has["requests.parquet"]:
        meta = _read_json(d / "summary.json") if has["summary.json"] else {}
        violations = _read_parquet(d / "violations.parquet") if has["violations.parquet"] else None
        result = RunResult(
            requests=_read_parquet(d / "requests.parquet"),
            steps=_read_parquet(d / "steps.parquet"),
            violations=violations
            if violations is not None
            else pd.DataFrame(columns=["kind", "time_s"]),
            summary=meta.get("summary", {}),
            inputs=meta.get("inputs", {}),
        )
        paths += save_run_plots(result, d)
    if has["sweep.parquet"]:
        paths += save_sweep_plots(_read_parquet(d / "sweep.parquet"), d)
    if has["capacity.parquet"] and has["probes.parquet"]:
        paths += save_capacity_plots(*_read_capacity(d), d)
    if not paths:
        raise PathError(f"{d}: no run (steps.parquet), sweep.parquet or capacity.parquet to plot")
    return paths
