"""The `kvsim compare-versions` figure: one panel per metric, one bar per design variant.

Six panels (preemptions, violations, throughput, TTFT p50/p99, TPOT p50/p99, KV use mean and
peak), the variants in the table's order on the y axis of each. A variant the scenario refused has no
bar but the word "refused" where its bar would be, so a missing bar never reads as zero. Latency
percentiles are over the requests that finished: the panels say so, and a variant that did not
finish every request says how many did ("v0-v2 (1,480/1,500 finished)"), so a design that fails
requests never reads as a fast one.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from sim.plots.common import figure, name_figure

#: (title, columns drawn side by side, scale to the shown unit).
PANELS = (
    ("preemptions", ("num_preemptions",), 1.0),
    ("violations (all kinds)", ("num_violations",), 1.0),
    ("throughput (tokens/s)", ("throughput_tok_per_s",), 1.0),
    ("TTFT p50 / p99 (s), finished requests", ("ttft_p50_s", "ttft_p99_s"), 1.0),
    ("TPOT p50 / p99 (ms), finished requests", ("tpot_p50_s", "tpot_p99_s"), 1e3),
    ("KV use mean / peak (% of blocks)", ("kv_util_mean", "kv_util_max"), 100.0),
)


def _value_text(value: float) -> str:
    """A bar's label: '16,940' for counts in the thousands (not '1.69e+04'), else 3 digits."""
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def _variant_label(row: pd.Series) -> str:
    """The variant, with how many requests finished when not all did (latency counts those)."""
    total, finished = row.get("num_requests"), row.get("num_finished")
    if row["status"] != "ran" or total is None or finished is None or finished == total:
        return str(row["variant"])
    if total != total or finished != finished:  # NaN: a table without the counts
        return str(row["variant"])
    return f"{row['variant']} ({int(finished):,}/{int(total):,} finished)"


def compare_versions_figure(table: pd.DataFrame) -> Figure:
    """The figure of a `sim.compare_versions` table."""
    fig, axes = figure(2, 3, width=13.0, height=3.0)
    labels = [_variant_label(row) for _, row in table.iterrows()]
    positions = range(len(labels))
    ran = table["status"] == "ran"
    for ax, (title, columns, scale) in zip(axes.flat, PANELS, strict=True):
        height = 0.8 / len(columns)
        for offset, column in enumerate(columns):
            values = table[column].astype(float) * scale
            ys = [p - 0.4 + height * (offset + 0.5) for p in positions]
            bars = ax.barh(ys, values.where(ran, 0.0), height=height)
            labels_text = [_value_text(v) if ok else "" for v, ok in zip(values, ran, strict=True)]
            ax.bar_label(bars, labels_text, padding=2, fontsize="x-small")
        for position, is_ran in zip(positions, ran, strict=True):
            if not is_ran:
                ax.text(0, position, " refused", va="center", fontsize="small", color="grey")
        ax.set_yticks(list(positions), labels, fontsize="small")
        peak = float((table[list(columns)].astype(float) * scale).max().max())
        # From 0, with room for the value labels; all zero (no violations): 0 to 1, not +-0.04.
        ax.set_xlim(0, peak * 1.2 if peak > 0 else 1.0)
        ax.invert_yaxis()  # the first variant on top, as in the table
        ax.set_title(title, fontsize="medium")
    name = str(table["scenario"].dropna().iloc[0]) if table["scenario"].notna().any() else ""
    name_figure(
        fig,
        f"scenario {name} | one workload through every vLLM design kvsim models",
        "v0-fixed = kvsim's corrected design; v1-engine@X = the V1 engine at vLLM release X; "
        "paired bars: blue = p50 or mean, orange = p99 or peak; "
        "latency over the requests that finished",
    )
    return fig


def save_compare_versions_plot(table: pd.DataFrame, out_dir: str | Path) -> Path:
    """`compare_versions_<scenario>.png` in `out_dir`."""
    from sim.plots.run import save

    name = str(table["scenario"].dropna().iloc[0]) if table["scenario"].notna().any() else "run"
    return save(compare_versions_figure(table), Path(out_dir) / f"compare_versions_{name}.png")
