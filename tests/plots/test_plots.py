"""Plots come out of a small run, a sweep and a capacity search, with titles, units and legends."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

import sim
import sim.plots.run as plots
from sim.output.results import write_result
from sim.planning.capacity import capacity_search
from tests.harness.sweep import dd1_scenario

SWA = Path(__file__).resolve().parents[2] / "scenarios" / "swa_4_vs_3_v0_v2.yaml"


@pytest.fixture(scope="module")
def violating_run():
    """The 4-vs-3 case: admission_undercount + leaked_blocks at t=0 (scenarios/swa_4_vs_3_v0_v2.yaml)."""
    return sim.run(SWA)


def _texts(fig):
    axes = fig.axes
    return (
        [a.get_title() for a in axes],
        [a.get_xlabel() for a in axes],
        [a.get_ylabel() for a in axes],
    )


def test_kv_timeline_marks_violations(violating_run) -> None:
    result = violating_run
    assert len(result.violations)
    fig = plots.kv_timeline(result.steps, result.violations, result.inputs["num_gpu_blocks"])
    ax = fig.axes[0]
    assert ax.get_title() == "KV-cache blocks over time"
    assert ax.get_xlabel() == "simulated time (s)" and ax.get_ylabel() == "KV blocks"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"used", "free", "total (10)"} <= set(labels)
    assert any(label.startswith("violation: admission_undercount") for label in labels)


def test_save_run_plots_writes_pngs(tmp_path, violating_run) -> None:
    paths = plots.save_run_plots(violating_run, tmp_path)
    assert [p.name for p in paths] == ["kv_timeline.png", "queues.png", "latency_cdf.png"]
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_latency_cdfs_and_queues_have_units() -> None:
    result = sim.run(sim.scenario_from_dict(dd1_scenario(50)))
    titles, xlabels, _ = _texts(plots.latency_cdfs(result.requests))
    assert titles[0] == "Time to first token (n=50)" and xlabels == ["seconds"] * 3
    # One output token: no TPOT defined, the panel says so instead of failing.
    assert titles[1] == "Time per output token (n=0)"
    titles, xlabels, ylabels = _texts(plots.queue_lengths(result.steps))
    assert titles == ["Queue lengths over time"] and ylabels == ["requests"]


def test_sweep_and_capacity_plots(tmp_path) -> None:
    table = sim.sweep(
        dd1_scenario(40),
        {"step_time.linear.fixed_s": [0.01, 0.02], "workload.rate_scale": [1, 2]},
        workers=1,
    )
    fig = plots.throughput_latency(table)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "throughput (tokens/s)"
    assert ax.get_ylabel() == "ttft p99 (s)"
    assert len(ax.get_legend().get_texts()) == 2  # one line per step time
    cap, probes = capacity_search(dd1_scenario(40), ["ttft_p99=20ms"], tolerance=0.1, workers=1)
    frontier = plots.capacity_frontier(probes, cap)
    assert "offered rate" in frontier.axes[0].get_xlabel()
    assert any("SLO ttft_p99" in t.get_text() for t in frontier.axes[0].get_legend().get_texts())
    assert plots.save_sweep_plots(table, tmp_path)[0].exists()
    assert plots.save_capacity_plots(cap, probes, tmp_path)[0].exists()


def test_plot_command_on_a_run_dir(tmp_path, violating_run) -> None:
    from sim.cli.main import app

    write_result(violating_run, tmp_path / "run")
    result = CliRunner().invoke(app, ["plot", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "kv_timeline.png").exists()
    missing = CliRunner().invoke(app, ["plot", str(tmp_path / "nothing")])
    assert missing.exit_code == 2 and "no such directory" in missing.output


def test_capacity_frontier_marks_the_step_time_band() -> None:
    from sim.latency.band import StepTimeBand

    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="test")
    cap, probes = capacity_search(
        dd1_scenario(40), ["ttft_p99=20ms"], tolerance=0.1, workers=1, band=band
    )
    frontier = plots.capacity_frontier(probes, cap)
    texts = [t.get_text() for t in frontier.axes[0].get_legend().get_texts()]
    assert any(t.startswith("at slow step") for t in texts)
    assert any(t.startswith("at fast step") for t in texts)
    # One curve: the probes at the band's ends are not drawn as configurations of their own.
    assert len(frontier.axes[0].get_lines()) == 1 + 1 + 2 + 1  # curve, capacity, band, SLO


def test_capacity_band_plot() -> None:
    from sim.latency.band import StepTimeBand

    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="test band")
    cap, _ = capacity_search(
        dd1_scenario(40),
        ["ttft_p99=20ms"],
        tolerance=0.1,
        workers=1,
        band=band,
        compare={"step_time.linear.fixed_s": [0.01, 0.005]},
    )
    fig = plots.capacity_band(cap)
    ax = fig.axes[0]
    assert ax.get_xlabel() == "capacity per replica (requests/s)"
    assert "test band" in ax.get_title()
    assert [t.get_text() for t in ax.get_yticklabels()] == ["fixed_s=0.01", "fixed_s=0.005"]
    assert len(fig.legends[0].get_texts()) == 3  # band span, seed interval, band ends
    span = ax.get_lines()[0].get_xdata()
    assert list(span) == [
        cap.loc[0, "capacity_slow_step_ci_low"],
        cap.loc[0, "capacity_fast_step_ci_high"],
    ]


def test_written_sweep_and_capacity_folders_plot(tmp_path) -> None:
    """The tables kvsim writes have every column `kvsim plot` checks for (regression: the
    foreign-table check must not refuse kvsim's own sweep or banded capacity tables)."""
    from sim.latency.band import StepTimeBand
    from sim.planning.capacity import write_capacity
    from sim.planning.executor import write_table

    table = sim.sweep(dd1_scenario(40), {"workload.rate_scale": [1, 2]}, workers=1)
    (tmp_path / "sweep").mkdir()
    write_table(table, tmp_path / "sweep", "sweep")
    assert [p.name for p in plots.save_dir_plots(tmp_path / "sweep")] == ["throughput_latency.png"]
    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="test")
    cap, probes = capacity_search(
        dd1_scenario(40), ["ttft_p99=20ms"], tolerance=0.1, workers=1, band=band
    )
    write_capacity(cap, probes, tmp_path / "cap")
    names = [p.name for p in plots.save_dir_plots(tmp_path / "cap")]
    assert names == ["capacity_frontier.png", "capacity_band.png"]
