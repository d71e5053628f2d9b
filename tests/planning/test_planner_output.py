"""Output a planner can read at a glance: plots name what they show, lines join only what
belongs together, tables keep their column names, and a run says what to do next.

Plots are checked through their matplotlib objects (lines, labels, titles), never pixels.
"""

from __future__ import annotations

import io
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest
from rich.console import Console

import sim
import sim.plots.run as plots
from sim.cli.main import next_steps
from sim.kv.config import Design
from sim.latency.band import StepTimeBand
from sim.planning.capacity import capacity_search
from sim.planning.executor import start_method
from sim.planning.tables import METRIC_HEADERS, capacity_view, legend, results_table
from sim.scenario.schema import ScenarioError
from tests.harness.sweep import dd1_scenario

ROOT = Path(__file__).resolve().parents[2]
SWA = ROOT / "scenarios" / "swa_4_vs_3_v0_v2.yaml"


# ---------------------------------------------------------------------------- design -> vLLM
def test_every_design_names_the_vllm_it_models() -> None:
    assert Design("v0-v1").upstream == "vLLM 0.5.4 v0, BlockSpaceManagerV1"
    assert Design("v0-v2").upstream == "vLLM 0.5.4 v0, BlockSpaceManagerV2"
    assert "no vLLM release" in Design("v0-fixed").upstream
    assert "4ac7713" in Design("v1-engine").upstream
    assert len({d.upstream for d in Design}) == len(Design)


# ---------------------------------------------------------------------------- plot subjects
def test_run_plots_name_scenario_design_and_vllm(tmp_path: Path) -> None:
    result = sim.run(SWA)
    timeline = plots.kv_timeline(
        result.steps, result.violations, result.inputs["num_gpu_blocks"], subject=result.inputs
    )
    expected = "scenario swa-4-vs-3-v0-v2 | design v0-v2 = vLLM 0.5.4 v0, BlockSpaceManagerV2"
    assert timeline.get_suptitle() == expected
    assert plots.queue_lengths(result.steps, subject=result.inputs).get_suptitle() == expected
    assert plots.latency_cdfs(result.requests, subject=result.inputs).get_suptitle() == expected


def _sweep_3_axes() -> pd.DataFrame:
    return sim.sweep(
        dd1_scenario(30),
        {
            "step_time.linear.fixed_s": [0.01, 0.02],
            "workload.rate_scale": [1, 2, 4],
            "scheduler.max_num_seqs": [1, 2],
        },
        workers=1,
    )


def test_sweep_plot_joins_points_only_along_the_rate() -> None:
    """test_sweep_plot_joined_points_across_the_second_axis: one line per other-setting pair."""
    table = _sweep_3_axes()
    fig = plots.throughput_latency(table)
    ax = fig.axes[0]
    lines = ax.get_lines()
    assert len(lines) == 4  # 2 step times x 2 max_num_seqs; each runs along the 3 rates
    labels = sorted(line.get_label() for line in lines)
    assert labels == [
        "fixed_s=0.01, max_num_seqs=1",
        "fixed_s=0.01, max_num_seqs=2",
        "fixed_s=0.02, max_num_seqs=1",
        "fixed_s=0.02, max_num_seqs=2",
    ]
    for line in lines:
        assert len(line.get_xdata()) == 3
    # Each line's points are one setting pair's rows, in rate order.
    first = table[
        (table["step_time.linear.fixed_s"] == 0.01) & (table["scheduler.max_num_seqs"] == 1)
    ].sort_values("workload.rate_scale")
    line = next(x for x in lines if x.get_label() == "fixed_s=0.01, max_num_seqs=1")
    assert list(line.get_xdata()) == list(first["throughput_tok_per_s"])
    assert ax.get_legend().get_title().get_text() == "each line: rate_scale rising"
    assert "design v0-v2 = vLLM 0.5.4 v0" in fig.get_suptitle()


def test_sweep_plot_without_a_numeric_axis_joins_nothing() -> None:
    table = sim.sweep(dd1_scenario(20), {"scheduler.design": ["v0-v2", "v0-fixed"]}, workers=1)
    fig = plots.throughput_latency(table)
    lines = fig.axes[0].get_lines()
    assert len(lines) == 2 and all(line.get_linestyle() == "None" for line in lines)
    assert "designs v0-fixed = kvsim's corrected v0" in fig.get_suptitle()
    assert "v0-v2 = vLLM 0.5.4 v0" in fig.get_suptitle()


def test_capacity_frontier_one_line_per_replicate_with_the_band_in_the_legend() -> None:
    """test_capacity_frontier_zigzag_across_windows: windows are separate lines."""
    windows = [{"workload.time_range_s": [start_s, start_s + 4]} for start_s in (0, 1, 2)]
    table, probes = capacity_search(
        dd1_scenario(300, gap_s=0.02),
        ["ttft_p99=20ms"],
        replicates=windows,
        compare={"step_time.linear.fixed_s": [0.01, 0.012]},
        tolerance=0.2,
        workers=1,
    )
    fig = plots.capacity_frontier(probes, table)
    ax = fig.axes[0]
    probe_lines = [line for line in ax.get_lines() if line.get_marker() not in ("None", None)]
    assert len(probe_lines) == 2 * 3  # configurations x windows
    for line in probe_lines:
        x = list(line.get_xdata())
        assert x == sorted(x)  # along the rate, never back and forth
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "fixed_s=0.01: time_range_s=[0, 4]" in labels
    assert sum("95% interval" in label for label in labels) == 2
    assert any(label.startswith("SLO ttft_p99") for label in labels)
    # Log ticks read as plain numbers, not powers of ten.
    assert ax.get_yscale() == "log"
    assert ax.yaxis.get_major_formatter()(0.05, 0) == "0.05"
    assert "scenario dd1 | design v0-v2" in fig.get_suptitle()


# ---------------------------------------------------------------------------- tables
def _render(table, width: int = 80) -> str:
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_sweep_table_keeps_every_column_name_at_80_columns() -> None:
    """test_sweep_table_cut_column_names: `rate_…` no more; words wrap, a legend names keys."""
    frame = _sweep_3_axes().assign(
        ttft_p99_ms=lambda f: f["ttft_p99_s"] * 1e3,
        tpot_p99_ms=lambda f: f["tpot_p99_s"] * 1e3,
        e2e_p99_ms=lambda f: f["e2e_p99_s"] * 1e3,
    )
    settings = ["step_time.linear.fixed_s", "workload.rate_scale", "scheduler.max_num_seqs"]
    columns = [*settings, *METRIC_HEADERS]
    columns.remove("throughput_req_per_s")
    text = _render(results_table("sweep", frame, columns, METRIC_HEADERS))
    assert "…" not in text
    words = text.split()
    for header in ["fixed s", "rate scale", "max num seqs", "TTFT p99 (ms)", "viola- tions"]:
        for word in header.split():
            assert word in words, (word, text)
    assert legend(settings) == (
        "settings: fixed s = step_time.linear.fixed_s, rate scale = workload.rate_scale, "
        "max num seqs = scheduler.max_num_seqs"
    )


def test_capacity_table_keeps_its_names_and_says_how_to_read_it() -> None:
    table, _ = capacity_search(
        dd1_scenario(40),
        ["ttft_p99=20ms"],
        target_rate=300,
        compare={"scheduler.max_num_seqs": [1, 2]},
        tolerance=0.2,
        workers=1,
    )
    view, notes = capacity_view(table, "dd1", 0.2, 300)
    text = _render(view)
    assert "…" not in text
    assert "max_num_seqs=1" in text and "(worst" in text
    assert notes[0] == "settings: max num seqs = scheduler.max_num_seqs"
    assert any("ceil(target / capacity)" in note for note in notes)
    assert any("gives no interval" in note for note in notes)  # one run each


def test_capacity_table_shows_the_step_time_band_with_readable_headers() -> None:
    """The band column (slow - fast step time) and the slow-step replicas, never cut at 80
    columns; a note names the band's source. A band of x1 (no validation data) adds a note
    only, and --no-band neither."""
    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="test band")
    search = {"compare": {"scheduler.max_num_seqs": [1, 2]}, "tolerance": 0.2, "workers": 1}
    table, _ = capacity_search(
        dd1_scenario(40), ["ttft_p99=20ms"], target_rate=300, band=band, **search
    )
    view, notes = capacity_view(table, "dd1", 0.2, 300)
    text = _render(view)
    assert "…" not in text
    headers = " ".join(" ".join(column.header.split()) for column in view.columns)
    assert "at slow - fast step time" in headers and "(worst run, slow step)" in headers
    row = table.iloc[0]
    band_cell = "".join(list(view.columns[3].cells)[0].split())
    expected = (
        f"{row['capacity_slow_step_req_per_s']:.4g}-{row['capacity_fast_step_req_per_s']:.4g}"
    )
    assert band_cell == expected
    assert row["capacity_slow_step_req_per_s"] < row["capacity_fast_step_req_per_s"]
    assert list(view.columns[-2].cells)[0] == f"{row['replicas_needed_slow_step']:.4g}"
    assert "step-time band x0.8 (fast) to x1.5 (slow), extrapolated: test band" in notes
    # The linear model's own band is x1: no band column, but the note says why.
    plain, _ = capacity_search(dd1_scenario(40), ["ttft_p99=20ms"], **search)
    view, notes = capacity_view(plain, "dd1", 0.2, None)
    assert "at slow" not in _render(view, 120)
    assert any(n.startswith("step-time band x1 (fast) to x1 (slow)") for n in notes)
    off, _ = capacity_search(dd1_scenario(40), ["ttft_p99=20ms"], band_ends=False, **search)
    view, notes = capacity_view(off, "dd1", 0.2, None)
    assert "at slow" not in _render(view, 120) and not any("step-time band" in n for n in notes)


def test_capacity_band_plot_names_its_subject(tmp_path: Path) -> None:
    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="test band")
    table, probes = capacity_search(
        dd1_scenario(40), ["ttft_p99=20ms"], tolerance=0.2, workers=1, band=band
    )
    fig = plots.capacity_band(table, probes)
    assert "scenario dd1 | design v0-v2" in fig.get_suptitle()
    assert "test band" in fig.axes[0].get_title()
    saved = plots.save_capacity_plots(table, probes, tmp_path)
    assert [p.name for p in saved] == ["capacity_frontier.png", "capacity_band.png"]
    off, off_probes = capacity_search(
        dd1_scenario(40), ["ttft_p99=20ms"], tolerance=0.2, workers=1, band_ends=False
    )
    (tmp_path / "off").mkdir()
    saved = plots.save_capacity_plots(off, off_probes, tmp_path / "off")
    assert [p.name for p in saved] == ["capacity_frontier.png"]


# ---------------------------------------------------------------------------- capacity
def test_capacity_explains_an_slo_no_rate_meets() -> None:
    """An SLO below the 10 ms step time: TTFT p99 does not fall with the rate, and it says so."""
    table, _ = capacity_search(
        dd1_scenario(40), ["ttft_p99=5ms"], tolerance=0.1, min_scale=0.25, workers=1
    )
    status = table.loc[0, "status"]
    assert status.startswith("fails at the minimum scale 0.25: ttft_p99 0.01s > 0.005s")
    assert "barely falls with the rate" in status and "at any load" in status


def test_capacity_of_simultaneous_arrivals_is_bad_input() -> None:
    """test_capacity_crashed_on_a_workload_without_a_rate (stdev of inf capacities)."""
    with pytest.raises(ScenarioError, match="no arrival rate to scale"):
        capacity_search(SWA, ["ttft_p99=2s"], workers=1)


# ---------------------------------------------------------------------------- worker pools
def test_start_method_forks_only_a_single_threaded_script(monkeypatch) -> None:
    main = type(sys)("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    assert start_method() == "spawn"  # Jupyter / REPL: no file to re-import
    main.__file__ = "/tmp/script.py"
    monkeypatch.setattr(threading, "active_count", lambda: 1)
    monkeypatch.setattr(sys, "platform", "linux")
    assert start_method() == "fork"
    monkeypatch.setattr(threading, "active_count", lambda: 2)
    assert start_method() == "spawn"  # another thread (a Dask client): never fork


def test_sweep_from_an_unguarded_script(tmp_path: Path) -> None:
    """test_sweep_broke_the_pool_from_an_unguarded_script (spawn re-ran the script)."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "import sim\n"
        f"table = sim.sweep({str(ROOT / 'scenarios' / 'swa_4_vs_3_v0_fixed.yaml')!r},\n"
        "                  {'scheduler.max_num_seqs': [1, 2]}, workers=2)\n"
        "print(list(table['error']))\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)],
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[None, None]"


# ---------------------------------------------------------------------------- kvsim run
def test_run_summary_says_what_to_run_next() -> None:
    summary = {"violation_kinds": ["admission_undercount", "leaked_blocks"]}
    lines = next_steps(summary, Path("runs/x"))
    assert lines[1] == "  kvsim shrink runs/x -o runs/x/minimal.yaml --kind admission_undercount"
    assert lines[2] == "  kvsim check runs/x/minimal.yaml"
    assert lines[3] == "(one kind per shrink; the others: leaked_blocks)"
    assert next_steps({"violation_kinds": []}, Path("runs/x")) == []
