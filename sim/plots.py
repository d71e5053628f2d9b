"""Plots: a DataFrame in, a matplotlib Figure out (no pyplot state); PNGs saved by the CLI.

* `kv_timeline(steps, violations, num_gpu_blocks)`: KV blocks used / free / cached over time,
  violations marked as vertical lines, one style per kind;
* `queue_lengths(steps)`: waiting / running / swapped requests over time;
* `latency_cdfs(requests)`: empirical CDFs of TTFT, TPOT and end-to-end latency;
* `throughput_latency(sweep_table)`: throughput against a latency percentile across a sweep;
* `capacity_frontier(probes, capacity_table)`: each SLO metric against the offered rate, with
  the SLO limit and every configuration's capacity.
* `capacity_band(capacity_table)`: each configuration's capacity with its seed interval and
  the range its step-time band spans.

Figures are built with `matplotlib.figure.Figure` so that nothing depends on a GUI backend.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

_COLORS = {"used": "tab:blue", "free": "tab:green", "cached": "tab:orange"}
MAX_REPLICA_PANELS = 4


def _figure(nrows: int = 1, ncols: int = 1, width: float = 9.0, height: float = 3.2, **kw):
    fig = Figure(figsize=(width, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _end_s(steps: pd.DataFrame) -> pd.Series:
    return steps["start_s"] + steps["duration_s"]


def kv_timeline(
    steps: pd.DataFrame, violations: pd.DataFrame | None = None, num_gpu_blocks: int | None = None
) -> Figure:
    """KV blocks used / free / cached (evictable) after each step; one panel per replica (<= 4)."""
    replicas = sorted(steps["replica"].unique()) if len(steps) else [0]
    shown = replicas[:MAX_REPLICA_PANELS]
    fig, axes = _figure(len(shown), sharex=True)
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
    if len(replicas) > len(shown):
        fig.suptitle(f"first {len(shown)} of {len(replicas)} replicas")
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


def queue_lengths(steps: pd.DataFrame) -> Figure:
    """Waiting / running / swapped requests after each step (summed over replicas)."""
    fig, axes = _figure()
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
    return fig


def latency_cdfs(requests: pd.DataFrame) -> Figure:
    """Empirical CDFs of TTFT, TPOT and end-to-end latency of the finished requests."""
    fig, axes = _figure(1, 3, width=12.0, height=3.4)
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
                    p, color="grey", linestyle=style, linewidth=1, label=f"p{q} = {_seconds(p)}"
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
    return fig


def _seconds(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def _setting_columns(table: pd.DataFrame) -> list[str]:
    """The sweep's setting columns: between 'key' and the first metric."""
    columns = list(table.columns)
    if "key" not in columns or "num_requests" not in columns:
        return []
    return columns[columns.index("key") + 1 : columns.index("num_requests")]


def throughput_latency(
    table: pd.DataFrame,
    latency: str = "ttft_p99_s",
    throughput: str = "throughput_tok_per_s",
    group_by: str | None = None,
) -> Figure:
    """Throughput against a latency percentile, one line per value of `group_by`.

    Default grouping: every setting but the last (the last, often the rate, runs along a line).
    """
    ok = table[table["error"].isna()] if "error" in table else table
    settings = _setting_columns(table)
    if group_by is None and len(settings) > 1:
        group_by = settings[0]
    fig, axes = _figure(width=7.5, height=4.5)
    ax = axes[0, 0]
    groups = ok.groupby(group_by, sort=True) if group_by else [(None, ok)]
    for value, group in groups:
        group = group.sort_values(throughput)
        label = f"{group_by}={value}" if group_by else "sweep points"
        ax.plot(group[throughput], group[latency], marker="o", label=label)
    ax.set_title(f"Throughput vs {latency.removesuffix('_s').replace('_', ' ')} across the sweep")
    ax.set_xlabel(_axis_label(throughput))
    ax.set_ylabel(_axis_label(latency))
    if len(ok) and ok[latency].gt(0).all() and ok[latency].max() / ok[latency].min() > 100:
        ax.set_yscale("log")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _axis_label(column: str) -> str:
    units = {"_req_per_s": " (requests/s)", "_tok_per_s": " (tokens/s)", "_s": " (s)"}
    for suffix, unit in units.items():
        if column.endswith(suffix):
            return column.removesuffix(suffix).replace("_", " ") + unit
    return column.replace("_", " ")


def capacity_frontier(probes: pd.DataFrame, table: pd.DataFrame | None = None) -> Figure:
    """Each SLO metric against the offered rate for every configuration, with SLO and capacity.

    `table` (the capacity table) gives the SLO limits ("slos") and capacities to mark.
    """
    limits = _parse_limits(table["slos"].iloc[0]) if table is not None and len(table) else {}
    metrics = list(limits) or ["ttft_p99"]
    fig, axes = _figure(1, len(metrics), width=6.0 * len(metrics), height=4.2)
    good = probes[probes["error"].isna()] if "error" in probes else probes
    if "step_time_factor" in good:  # the curves at the central step time; the band as lines
        good = good[good["step_time_factor"] == 1.0]
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, (config, group) in enumerate(good.groupby("config", sort=True)):
            color = f"C{i}"
            mean = group.groupby("offered_rate_req_per_s", sort=True)[f"{metric}_s"].mean()
            ax.plot(mean.index, mean.values, marker="o", color=color, label=config or "scenario")
            if table is not None:
                row = table[table["config"] == config]
                if len(row):
                    cap = float(row["capacity_rate_req_per_s"].iloc[0])
                    ax.axvline(
                        cap,
                        color=color,
                        linestyle="--",
                        linewidth=1,
                        label=f"capacity {cap:.3g} req/s",
                    )
                    low, high = (
                        float(row["capacity_ci_low"].iloc[0]),
                        float(row["capacity_ci_high"].iloc[0]),
                    )
                    if high > low:
                        ax.axvspan(low, high, color=color, alpha=0.12)
                    for end in ("slow", "fast"):
                        value = row.get(f"capacity_{end}_step_req_per_s")
                        value = float(value.iloc[0]) if value is not None else float("nan")
                        if value == value and value != cap:  # not NaN, not the centre
                            ax.axvline(
                                value,
                                color=color,
                                linestyle=":",
                                linewidth=1,
                                label=f"at {end} step {value:.3g} req/s",
                            )
        if metric in limits:
            ax.axhline(
                limits[metric],
                color="red",
                linestyle=":",
                label=f"SLO {metric} <= {_seconds(limits[metric])}",
            )
        ax.set_yscale("log")
        ax.set_title(f"Capacity frontier: {metric.replace('_', ' ')} vs offered rate")
        ax.set_xlabel("offered rate per replica (requests/s)")
        ax.set_ylabel(f"{metric.replace('_', ' ')} (s)")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3, which="both")
    return fig


def capacity_band(table: pd.DataFrame) -> Figure:
    """Capacity per configuration: the central answer with its 95 % seed interval (error bar),
    the capacity at the slow and fast ends of the step-time band (ticks), and the span from the
    slow end's interval low to the fast end's interval high (shaded): both uncertainties."""
    rows = table.reset_index(drop=True)
    fig, axes = _figure(1, 1, width=8.0, height=1.2 + 0.6 * len(rows))
    ax = axes[0][0]
    for i, row in rows.iterrows():
        first = i == 0
        ax.plot(
            [row["capacity_slow_step_ci_low"], row["capacity_fast_step_ci_high"]],
            [i, i],
            color="C0",
            linewidth=10,
            alpha=0.2,
            solid_capstyle="butt",
            label="step-time band x seed interval" if first else None,
        )
        centre = row["capacity_rate_req_per_s"]
        ax.errorbar(
            centre,
            i,
            xerr=[[centre - row["capacity_ci_low"]], [row["capacity_ci_high"] - centre]],
            fmt="o",
            color="C0",
            capsize=4,
            label="central step time, 95% seed interval" if first else None,
        )
        ax.plot(
            [row["capacity_slow_step_req_per_s"], row["capacity_fast_step_req_per_s"]],
            [i, i],
            linestyle="none",
            marker="|",
            markersize=16,
            color="C3",
            label="at the slow / fast step time" if first else None,
        )
    ax.set_yticks(range(len(rows)), [c or "scenario" for c in rows["config"]])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("capacity per replica (requests/s)")
    sources = sorted(set(rows["step_time_band_source"])) if len(rows) else []
    ax.set_title("Capacity with its uncertainty" + (f"\n{'; '.join(sources)}" if sources else ""))
    ax.legend(fontsize="small", loc="best")
    ax.grid(alpha=0.3, axis="x")
    return fig


def _parse_limits(text: str) -> dict[str, float]:
    """'ttft_p99<=2s, tpot_p99<=0.1s' -> {'ttft_p99': 2.0, 'tpot_p99': 0.1}."""
    limits = {}
    for part in str(text).split(","):
        metric, sep, value = part.strip().partition("<=")
        if sep:
            limits[metric] = float(value.removesuffix("s"))
    return limits


# ---------------------------------------------------------------------------- saving
def save(fig: Figure, path: Path) -> Path:
    fig.savefig(path, dpi=110)
    return path


def save_run_plots(result, out_dir: str | Path) -> list[Path]:
    """kv_timeline.png, queues.png and latency_cdf.png of one `RunResult` in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    blocks = result.inputs.get("num_gpu_blocks") if result.inputs else None
    paths = [save(kv_timeline(result.steps, result.violations, blocks), out / "kv_timeline.png")]
    paths.append(save(queue_lengths(result.steps), out / "queues.png"))
    paths.append(save(latency_cdfs(result.requests), out / "latency_cdf.png"))
    return paths


def save_sweep_plots(table: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    out = Path(out_dir)
    if not (table["error"].isna()).any():
        return []
    return [save(throughput_latency(table), out / "throughput_latency.png")]


def save_capacity_plots(
    table: pd.DataFrame, probes: pd.DataFrame, out_dir: str | Path
) -> list[Path]:
    out = Path(out_dir)
    if not len(probes):
        return []
    paths = [save(capacity_frontier(probes, table), out / "capacity_frontier.png")]
    if "capacity_slow_step_ci_low" in table and table["capacity_slow_step_ci_low"].notna().any():
        paths.append(save(capacity_band(table), out / "capacity_band.png"))
    return paths


def save_dir_plots(run_dir: str | Path) -> list[Path]:
    """Plots for whatever `run_dir` holds: a run, a sweep, or a capacity search."""
    from sim.results import RunResult

    d = Path(run_dir)
    if not d.is_dir():
        raise FileNotFoundError(f"{d}: no such directory")
    paths: list[Path] = []
    if (d / "steps.parquet").exists() and (d / "requests.parquet").exists():
        meta = json.loads((d / "summary.json").read_text()) if (d / "summary.json").exists() else {}
        violations = (
            pd.read_parquet(d / "violations.parquet")
            if (d / "violations.parquet").exists()
            else None
        )
        result = RunResult(
            requests=pd.read_parquet(d / "requests.parquet"),
            steps=pd.read_parquet(d / "steps.parquet"),
            violations=violations
            if violations is not None
            else pd.DataFrame(columns=["kind", "time_s"]),
            summary=meta.get("summary", {}),
            inputs=meta.get("inputs", {}),
        )
        paths += save_run_plots(result, d)
    if (d / "sweep.parquet").exists():
        paths += save_sweep_plots(pd.read_parquet(d / "sweep.parquet"), d)
    if (d / "capacity.parquet").exists() and (d / "probes.parquet").exists():
        paths += save_capacity_plots(
            pd.read_parquet(d / "capacity.parquet"), pd.read_parquet(d / "probes.parquet"), d
        )
    if not paths:
        raise FileNotFoundError(
            f"{d}: no run (steps.parquet), sweep.parquet or capacity.parquet to plot"
        )
    return paths


__all__ = [
    "capacity_frontier",
    "kv_timeline",
    "latency_cdfs",
    "queue_lengths",
    "save_dir_plots",
    "save_run_plots",
    "throughput_latency",
]
