"""Terminal tables for `kvsim sweep` and `kvsim capacity` that never cut a column name.

A narrow terminal makes rich shrink columns, and by default it cuts what no longer fits with
"…" (`rate_…`). Here every header is short and made of words, so it wraps at spaces instead
("TTFT p99 (s)" over two lines); a swept setting is shown by its last dotted part with spaces
("rate scale"), and a legend under the table gives each full key; a cell that still does not
fit folds onto the next line rather than losing digits.

Example: ``--set workload.rate_scale=1,2`` gives the header "rate scale" and the legend line
"rate scale = workload.rate_scale".
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any

import pandas as pd
from rich import box
from rich.table import Table

#: Short headers of the metric columns (units in parentheses; words wrap).
METRIC_HEADERS = {
    "throughput_tok_per_s": "tok/s",
    "throughput_req_per_s": "req/s",
    "ttft_p99_ms": "TTFT p99 (ms)",
    "tpot_p99_ms": "TPOT p99 (ms)",
    "e2e_p99_ms": "E2E p99 (ms)",
    "num_preemptions": "pre- empts",
    "num_violations": "viola- tions",
    "kv_util_max": "KV used max",
}


def with_ms(frame: pd.DataFrame, columns: Sequence[str]) -> pd.DataFrame:
    """`x_s` columns also as `x_ms` (shorter numbers in a narrow table: 62.83, not 0.06283)."""
    return frame.assign(**{c.removesuffix("_s") + "_ms": frame[c] * 1e3 for c in columns})


def setting_header(key: str) -> str:
    """'scheduler.max_num_seqs' -> 'max num seqs' (wraps at spaces; the legend has the key)."""
    return key.rpartition(".")[2].replace("_", " ")


def legend(settings: Sequence[str]) -> str:
    """One line naming each abbreviated setting: 'rate scale = workload.rate_scale, ...'."""
    named = [f"{setting_header(k)} = {k}" for k in settings if setting_header(k) != k]
    return "settings: " + ", ".join(named) if named else ""


def fmt(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def results_table(
    title: str,
    frame: pd.DataFrame,
    columns: Sequence[str],
    headers: dict[str, str],
    *,
    left: Sequence[str] = (),
) -> Table:
    """A table of `frame[columns]` under `headers` (a column not in it: `setting_header`)."""
    view = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0)
    )
    cells = [[fmt(row[c]) for c in columns] for _, row in frame.iterrows()]
    for i, column in enumerate(columns):
        header = headers.get(column, setting_header(column))
        # As wide as its longest header word and value (up to 24), the header wrapped to that
        # width at spaces: the table is as narrow as it can be without splitting a word or a
        # number, so rich never has to cut one; a longer value (a status message) folds.
        words = [len(word) for word in header.split()]
        width = min(max(words + [len(row[i]) for row in cells]), 24)
        view.add_column(
            textwrap.fill(header, max(width, max(words))),
            justify="left" if column in left else "right",
            overflow="fold",
        )
    for row in cells:
        view.add_row(*row)
    return view


#: The `kvsim capacity` table's column headers.
_CAPACITY_HEADERS = {
    "config": "config",
    "capacity_rate_req_per_s": "req/s per replica (mean)",
    "interval": "95% interval",
    "band": "at slow - fast step time",
    "num_replicates": "runs",
    "replicas_needed": "replicas (worst run)",
    "replicas_needed_at_mean": "replicas (mean)",
    "replicas_needed_slow_step": "(worst run, slow step)",
    "status": "status",
}


def capacity_view(
    table: pd.DataFrame, name: str, tolerance: float, target_rate: float | None
) -> tuple[Table, list[str]]:
    """The `kvsim capacity` table and the lines to print under it (legend, how to read it).

    The interval is one column ("2.85-4.54"): a planner reads the spread next to the mean. When
    the search covered a step-time band wider than x1 (`sim.planning.band`), one more column
    gives the capacity at the slow and the fast step time ("66.78 - 126"), plus the replicas the
    slow step needs; a note per band source says where the band comes from.
    """
    band = has_band(table)
    frame = _capacity_frame(table, name, band)
    columns = _capacity_columns(table, band, target_rate)
    title = f"kvsim capacity: {name} ({table['slos'].iloc[0]}; tolerance {tolerance:g})"
    view = results_table(title, frame, columns, _CAPACITY_HEADERS, left=("config", "status"))
    return view, _capacity_notes(table, band, target_rate)


def _capacity_frame(table: pd.DataFrame, name: str, band: bool) -> pd.DataFrame:
    """The table with its printed cells made: each configuration's short label (the
    scenario's name for the one unnamed configuration), the interval as one cell ("-" for a
    single run), and the band's slow and fast capacities as one cell."""
    frame = table.assign(
        config=[short_config(c) or name for c in table["config"]],
        interval=[
            f"{fmt(low)}-{fmt(high)}" if high > low else "-"
            for low, high in zip(table["capacity_ci_low"], table["capacity_ci_high"], strict=True)
        ],
    )
    if band:
        frame["band"] = [
            f"{fmt(slow)} - {fmt(fast)}"
            for slow, fast in zip(
                table["capacity_slow_step_req_per_s"],
                table["capacity_fast_step_req_per_s"],
                strict=True,
            )
        ]
    return frame


def _capacity_columns(table: pd.DataFrame, band: bool, target_rate: float | None) -> list[str]:
    """The printed columns: the band's only where it was searched wider than x1, the replica
    counts only with a target rate (the slow step's only with the band)."""
    columns = ["config", "capacity_rate_req_per_s", "interval", "num_replicates"]
    if band:
        columns.insert(3, "band")
    if target_rate is not None:
        columns += ["replicas_needed", "replicas_needed_at_mean"]
        if band and "replicas_needed_slow_step" in table:
            columns.append("replicas_needed_slow_step")
    columns.append("status")
    return columns


def _capacity_notes(table: pd.DataFrame, band: bool, target_rate: float | None) -> list[str]:
    """The lines under the table, each only where it applies: the legend of the compared
    keys, how the replicas are counted, why a single run has no interval, how a closed loop's
    capacity is measured, and where the step-time band comes from."""
    keys = sorted({k for c in table["config"] for k in _config_keys(c)})
    notes = [legend(keys)] if legend(keys) else []
    if target_rate is not None:
        notes.append(
            f"replicas: to serve {fmt(target_rate)} req/s, ceil(target / capacity) with the "
            "worst run's capacity and with the mean (an even split across replicas)"
            + ("; '(worst run, slow step)': the worst run at the band's slow end" if band else "")
        )
    if (table["num_replicates"] < 2).any():
        notes.append(
            "one run per configuration gives no interval: repeat over --seeds (synthetic "
            "workloads) or trace windows (sim.capacity(replicates=...)) to see the spread"
        )
    if table["status"].str.contains("closed loop", regex=False).any():
        notes.append(
            "closed loop (sessions): a turn arrives a think time after the previous one "
            "finished, so the offered rate is not the rate scale times the scale-1 rate; the "
            "capacity is the arrival rate measured at the highest passing probe"
        )
    if band_searched(table):
        notes += band_notes(table)
    return notes


def band_searched(table: pd.DataFrame) -> bool:
    """Whether the capacity search covered the step-time band (not `--no-band`)."""
    column = "capacity_slow_step_req_per_s"
    return column in table and bool(table[column].notna().any())


def has_band(table: pd.DataFrame) -> bool:
    """Whether the band was searched and is wider than x1-x1 (a model without validation data,
    such as user-given linear coefficients, has none: its ends are the central answer)."""
    if not band_searched(table):
        return False
    low, high = table["step_time_low_factor"], table["step_time_high_factor"]
    return bool(((low < 1) | (high > 1)).any())


def band_notes(table: pd.DataFrame) -> list[str]:
    """One line per step-time band source: its factors and where it comes from.

    Example: "step-time band x0.8 (fast) to x1.5 (slow): --step-time-band 0.8,1.5".
    """
    return [
        f"step-time band x{row['step_time_low_factor']:g} (fast) to "
        f"x{row['step_time_high_factor']:g} (slow)"
        f"{', extrapolated' if row['step_time_band_extrapolated'] else ''}: "
        f"{row['step_time_band_source']}"
        for _, row in table.drop_duplicates("step_time_band_source").iterrows()
    ]


def _config_keys(config: str | None) -> list[str]:
    """'hardware.gpu=h100, scheduler.max_num_seqs=128' -> ['hardware.gpu', 'scheduler....']."""
    return [part.partition("=")[0].strip() for part in (config or "").split(", ") if "=" in part]


def short_config(config: str | None) -> str:
    """'hardware.gpu=h100-sxm' -> 'gpu=h100-sxm' (the legend names the full key)."""
    parts = [part.split("=", 1) for part in (config or "").split(", ") if "=" in part]
    return ", ".join(f"{k.rpartition('.')[2]}={v}" for k, v in parts)
