"""Sweep and capacity plots: a table in, a matplotlib Figure out (re-exported by `sim.plots`).

`capacity_band(capacity_table)` shows each configuration's capacity with its seed interval and
the range its step-time band spans (`sim.planning.band`).
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Mapping
from typing import Any

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sim.plots.common import (
    axis_label,
    figure,
    name_figure,
    readable_log_axis,
    seconds_text,
    short,
    subject_of,
    table_subject,
)


def _setting_columns(table: pd.DataFrame) -> list[str]:
    """The sweep's setting columns: between 'key' and the first metric."""
    columns = list(table.columns)
    if "key" not in columns or "num_requests" not in columns:
        return []
    return columns[columns.index("key") + 1 : columns.index("num_requests")]


def line_axis(table: pd.DataFrame, settings: list[str]) -> str | None:
    """The setting a sweep line runs along: the rate scale if swept, else the last numeric one.

    None when no setting is numeric (then every point stands alone, unjoined).
    """
    if "workload.rate_scale" in settings:
        return "workload.rate_scale"
    numeric = [s for s in settings if pd.api.types.is_numeric_dtype(table[s])]
    return numeric[-1] if numeric else None


def throughput_latency(
    table: pd.DataFrame,
    latency: str = "ttft_p99_s",
    throughput: str = "throughput_tok_per_s",
    along: str | None = None,
) -> Figure:
    """Throughput against a latency percentile: one line per combination of the other settings.

    A line joins the points of one combination in the order of the setting it runs `along`
    (default: `line_axis`), so points that differ in any other setting are never joined.
    Example: a 2 x 3 x 2 grid of max_num_seqs x rate_scale x gpu draws 2 x 2 = 4 lines of 3
    points each, labelled "max_num_seqs=128, gpu=h100-sxm" and so on.
    """
    ok = table[table["error"].isna()] if "error" in table else table
    settings = _setting_columns(table)
    if along is None:
        along = line_axis(ok, settings)
    others = [s for s in settings if s != along]
    fig, axes = figure(width=8.5, height=4.8)
    ax = axes[0, 0]
    groups = ok.groupby(others, sort=True, dropna=False) if others else [((), ok)]
    for values, group in groups:
        values = values if isinstance(values, tuple) else (values,)
        label = ", ".join(short(f"{k}={v}") for k, v in zip(others, values, strict=True))
        if along is not None:
            group = group.sort_values(along, kind="stable")
        ax.plot(
            group[throughput],
            group[latency],
            marker="o",
            linestyle="-" if along is not None else "none",
            label=label or "sweep points",
        )
    ax.set_title(f"Throughput vs {latency.removesuffix('_s').replace('_', ' ')} across the sweep")
    ax.set_xlabel(axis_label(throughput))
    ax.set_ylabel(axis_label(latency))
    if len(ok) and ok[latency].gt(0).all() and ok[latency].max() / ok[latency].min() > 100:
        readable_log_axis(ax)
    title = f"each line: {short(along)} rising" if along is not None else "points not joined"
    ax.legend(fontsize="small", title=title, title_fontsize="small")
    ax.grid(alpha=0.3)
    name_figure(fig, table_subject(ok))
    return fig


_REPLICATE_STYLES = [("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", "-")]


def capacity_frontier(probes: pd.DataFrame, table: pd.DataFrame | None = None) -> Figure:
    """Each SLO metric against the offered rate: one line per configuration and replicate.

    Replicates (trace windows, seeds) offer different rates at the same scale, so each gets its
    own line (same colour per configuration, own marker) rather than one line zig-zagging
    between them. `table` (the capacity table) gives the SLO limits ("slos"), each
    configuration's mean capacity (dashed line) and its 95 % interval (shaded, in the legend),
    and the capacity at the slow and fast ends of its step-time band (dotted, in the legend).
    Only the central probes (step time x1) are curves: the band's probes are its two lines.
    """
    limits = _parse_limits(table["slos"].iloc[0]) if table is not None and len(table) else {}
    metrics = list(limits) or ["ttft_p99"]
    fig, axes = figure(1, len(metrics), width=7.0 * len(metrics), height=4.8)
    good = probes[probes["error"].isna()] if "error" in probes else probes
    if "step_time_factor" in good:  # the curves at the central step time; the band as lines
        good = good[good["step_time_factor"] == 1.0]
    for ax, metric in zip(axes[0], metrics, strict=True):
        for i, (config, group) in enumerate(good.groupby("config", sort=True)):
            color = f"C{i}"
            name = short(config) if config else ""
            for j, (replicate, runs) in enumerate(group.groupby("replicate", sort=True)):
                runs = runs.sort_values("offered_rate_req_per_s", kind="stable")
                marker, style = _REPLICATE_STYLES[j % len(_REPLICATE_STYLES)]
                rep = runs["replicate_label"].iloc[0] if "replicate_label" in runs else None
                rep = short(str(rep)) if rep else f"replicate {replicate}"
                ax.plot(
                    runs["offered_rate_req_per_s"],
                    runs[f"{metric}_s"],
                    marker=marker,
                    linestyle=style,
                    color=color,
                    label=f"{name}: {rep}" if name else rep,
                )
            if table is not None:
                _mark_capacity(ax, table[table["config"] == config], color, name)
        if metric in limits:
            ax.axhline(
                limits[metric],
                color="red",
                linestyle=":",
                label=f"SLO {metric} <= {seconds_text(limits[metric])}",
            )
        if len(good) and good[f"{metric}_s"].gt(0).any():
            readable_log_axis(ax)
        ax.set_title(f"Capacity frontier: {metric.replace('_', ' ')} vs offered rate")
        ax.set_xlabel("offered rate per replica (requests/s)")
        ax.set_ylabel(f"{metric.replace('_', ' ')} (s)")
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.grid(alpha=0.3, which="both")
    name_figure(fig, table_subject(good))
    return fig


def _mark_capacity(ax, row: pd.DataFrame, color: str, name: str) -> None:
    """The mean capacity (dashed) and its 95 % interval (shaded), both in the legend."""
    if not len(row):
        return
    prefix = f"{name}: " if name else ""
    cap = float(row["capacity_rate_req_per_s"].iloc[0])
    low, high = float(row["capacity_ci_low"].iloc[0]), float(row["capacity_ci_high"].iloc[0])
    runs = int(row["num_replicates"].iloc[0]) if "num_replicates" in row else 1
    note = "" if high > low else f" ({runs} run, no interval)" if runs == 1 else ""
    ax.axvline(
        cap,
        color=color,
        linestyle="--",
        linewidth=1,
        label=f"{prefix}capacity {cap:.3g} req/s (mean of {runs}){note}",
    )
    if high > low:
        ax.axvspan(
            low,
            high,
            color=color,
            alpha=0.12,
            label=f"{prefix}95% interval {low:.3g}-{high:.3g} req/s",
        )
    for end in ("slow", "fast"):
        column = f"capacity_{end}_step_req_per_s"
        value = float(row[column].iloc[0]) if column in row else math.nan
        if not math.isnan(value) and value != cap:  # a band end that differs from the centre
            ax.axvline(
                value,
                color=color,
                linestyle=":",
                linewidth=1,
                label=f"{prefix}at {end} step {value:.3g} req/s",
            )


def capacity_band(
    table: pd.DataFrame,
    probes: pd.DataFrame | None = None,
    *,
    subject: str | Mapping[str, Any] | None = None,
) -> Figure:
    """Capacity per configuration with both of its uncertainties, one row each.

    The central answer with its 95 % seed interval (error bar), the capacity at the slow and
    fast ends of the step-time band (ticks), and the span from the slow end's interval low to
    the fast end's interval high (shaded): what a purchase may have to cover. The subject line
    comes from `subject`, else the probes (`probes`, or `table.attrs["probes"]` as `sim.capacity`
    returns it). Example: slow-step CI low 60 and fast-step CI high 130 req/s shade 60-130.
    """
    rows = table.reset_index(drop=True)
    fig, axes = figure(1, 1, width=9.0, height=2.4 + 0.6 * len(rows))
    ax = axes[0, 0]
    for i, row in rows.iterrows():
        _capacity_row(ax, i, row, first=i == 0)
    ax.set_yticks(range(len(rows)), [short(c) if c else "scenario" for c in rows["config"]])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlabel("capacity per replica (requests/s)")
    sources = _band_sources(rows)
    ax.set_title(
        "\n".join(["Capacity with its seed interval and step-time band", *sources]),
        fontsize="medium",
    )
    fig.legend(fontsize="small", loc="outside lower center", ncols=3)
    ax.grid(alpha=0.3, axis="x")
    if probes is None:
        probes = table.attrs.get("probes")
    text = subject_of(subject) or (table_subject(probes) if probes is not None else "")
    name_figure(fig, text)
    return fig


def _capacity_row(ax: Axes, i: int, row: pd.Series, first: bool) -> None:
    """Row `i` of `capacity_band`: the shaded span, the central answer with its seed interval,
    the slow- and fast-step ticks (labelled for the legend on the `first` row only)."""
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


def _band_sources(rows: pd.DataFrame) -> list[str]:
    """One wrapped line per band source (they can be long: a fit's file and why it
    extrapolates)."""
    return [
        textwrap.fill(f"band x{low:.3g}-x{high:.3g}: {source}", 90)
        for low, high, source in sorted(
            set(
                zip(
                    rows["step_time_low_factor"],
                    rows["step_time_high_factor"],
                    rows["step_time_band_source"],
                    strict=True,
                )
            )
        )
    ]


def _parse_limits(text: str) -> dict[str, float]:
    """'ttft_p99<=2s, tpot_p99<=0.1s' -> {'ttft_p99': 2.0, 'tpot_p99': 0.1}."""
    limits = {}
    for part in str(text).split(","):
        metric, sep, value = part.strip().partition("<=")
        if sep:
            limits[metric] = float(value.removesuffix("s"))
    return limits
