"""Capacity search: SLO parsing, bisection on a D/D/1 scenario with a known answer, compare, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import sim
from sim.cli.main import app
from sim.errors import InputError
from sim.latency.band import StepTimeBand
from sim.planning.capacity import (
    Slo,
    as_slos,
    capacity_search,
    confidence_interval,
    parse_duration_s,
    parse_slo,
)
from tests.harness.sweep import dd1_scenario

NUM_REQUESTS = 200
SLO_S = 0.02


def dd1_threshold_rate(
    num_requests: int = NUM_REQUESTS, step_s: float = 0.01, slo_s: float = SLO_S
) -> float:
    """The rate where TTFT p99 reaches the SLO, by hand.

    TTFT_i = step + i * (step - 1/rate); numpy's p99 over i = 0..n-1 sits at i = 0.99 (n - 1)
    (197.01 for n = 200), so step + 197.01 (step - 1/rate) = slo gives
    1/rate = step - (slo - step) / 197.01 -> rate = 100.51 req/s for 10 ms steps and 20 ms.
    """
    position = 0.99 * (num_requests - 1)
    return 1.0 / (step_s - (slo_s - step_s) / position)


@pytest.mark.parametrize(
    ("text", "seconds"), [("2s", 2.0), ("100ms", 0.1), ("250us", 250e-6), ("1.5s", 1.5)]
)
def test_parse_duration(text, seconds) -> None:
    assert parse_duration_s(text) == pytest.approx(seconds)


def test_slo_without_unit_is_refused() -> None:
    """Regression: `--slo tpot_p99=100` silently meant 100 s; a bare number needs a unit."""
    with pytest.raises(InputError, match="needs a unit .* 100ms or 100s"):
        parse_slo("tpot_p99=100")
    with pytest.raises(InputError, match="no unit"):
        as_slos({"ttft_p99": 2})
    assert as_slos({"ttft_p99_s": 2}) == [Slo("ttft_p99", 2.0)]  # the key names the unit
    result = CliRunner().invoke(app, ["capacity", "x.yaml", "--slo", "tpot_p99=100"])
    assert result.exit_code == 2 and "needs a unit" in result.output
    assert "Traceback" not in result.output


def test_parse_slo_and_errors() -> None:
    assert parse_slo("ttft_p99=2s") == Slo("ttft_p99", 2.0)
    assert parse_slo("tpot_p99_s=100ms") == Slo("tpot_p99", 0.1)
    with pytest.raises(ValueError, match="unknown metric 'ttft_p95'"):
        parse_slo("ttft_p95=1s")
    with pytest.raises(ValueError, match="duration"):
        parse_slo("ttft_p99=fast")


def test_confidence_interval_worked_example() -> None:
    mean, low, high = confidence_interval([100.0, 110.0, 120.0])
    assert (mean, low, high) == pytest.approx((110.0, 85.156, 134.844), abs=1e-3)
    assert confidence_interval([5.0]) == (5.0, 5.0, 5.0)


def test_the_hand_computed_threshold_matches_the_simulator() -> None:
    rate = dd1_threshold_rate()
    assert rate == pytest.approx(100.5102, abs=1e-3)
    scale = rate / 50.0
    below = sim.sweep(
        dd1_scenario(), {"workload.rate_scale": [scale * 0.999, scale * 1.001]}, workers=1
    )
    assert below.loc[0, "ttft_p99_s"] <= SLO_S < below.loc[1, "ttft_p99_s"]


@pytest.mark.parametrize("tolerance", [0.05, 0.01])
def test_bisection_brackets_the_known_capacity(tolerance) -> None:
    table, probes = capacity_search(
        dd1_scenario(), [f"ttft_p99={SLO_S}s"], tolerance=tolerance, workers=1, target_rate=450
    )
    threshold_scale = dd1_threshold_rate() / 50.0
    passed = probes[probes["passed"]]["rate_scale"]
    failed = probes[~probes["passed"]]["rate_scale"]
    assert passed.max() < failed.min()  # monotone: every pass below every failure
    good, bad = passed.max(), failed.min()
    assert good <= threshold_scale < bad
    assert (bad - good) / good <= tolerance
    row = table.iloc[0]
    assert row["capacity_scale_mean"] == good
    assert row["capacity_rate_req_per_s"] == pytest.approx(50.0 * good)
    assert (
        abs(row["capacity_rate_req_per_s"] - dd1_threshold_rate()) / dd1_threshold_rate()
        <= tolerance
    )
    assert row["status"] == "ok"
    assert row["replicas_needed"] == math.ceil(450 / row["capacity_rate_req_per_s"])
    # Probe rates are the offered rates of the scaled workload.
    np.testing.assert_allclose(probes["offered_rate_req_per_s"], 50.0 * probes["rate_scale"])


def test_search_below_the_start_halves_and_reports_bounds() -> None:
    # Starting at 8x (400 req/s) fails; the search halves down to a pass.
    table, probes = capacity_search(
        dd1_scenario(), ["ttft_p99=20ms"], tolerance=0.05, start_scale=8, workers=1
    )
    assert list(probes["rate_scale"][:3]) == [8, 4, 2]
    assert table.loc[0, "capacity_scale_mean"] <= dd1_threshold_rate() / 50
    # An SLO below the step time can never pass.
    never, _ = capacity_search(
        dd1_scenario(40), ["ttft_p99=5ms"], tolerance=0.1, min_scale=0.25, workers=1
    )
    assert never.loc[0, "capacity_rate_req_per_s"] == 0.0
    assert "fails at the minimum scale" in never.loc[0, "status"]


def test_compare_mode_and_seed_spread() -> None:
    # Inline arrivals do not depend on the seed: two seeds would be one run counted twice (a
    # zero-width interval over "2 runs"), so they are refused (issue 20); one seed runs.
    with pytest.raises(InputError, match="every seed runs the same workload"):
        sim.capacity(dd1_scenario(100), {"ttft_p99": "20ms"}, seeds=[0, 1], workers=1)
    table = sim.capacity(
        dd1_scenario(100),
        {"ttft_p99": "20ms"},
        compare={"step_time.linear.fixed_s": [0.01, 0.005]},
        tolerance=0.02,
        workers=1,
    )
    assert list(table["config"]) == [
        "step_time.linear.fixed_s=0.01",
        "step_time.linear.fixed_s=0.005",
    ]
    assert (table["num_replicates"] == 1).all()
    # Half the step time, twice the capacity.
    ratio = table.loc[1, "capacity_rate_req_per_s"] / table.loc[0, "capacity_rate_req_per_s"]
    assert ratio == pytest.approx(2.0, rel=0.05)
    assert isinstance(table.attrs["probes"], pd.DataFrame)


def test_cli_capacity(tmp_path) -> None:
    (tmp_path / "s.yaml").write_text(json.dumps(dd1_scenario(100)))
    args = [
        "capacity",
        str(tmp_path / "s.yaml"),
        "--slo",
        "ttft_p99=20ms",
        "--target-rate",
        "300",
        "-o",
        str(tmp_path / "c"),
        "-j",
        "1",
        "--tolerance",
        "0.05",
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(tmp_path / "c" / "capacity.parquet")
    assert table.loc[0, "replicas_needed"] == 3
    assert (tmp_path / "c" / "probes.csv").exists()
    assert (tmp_path / "c" / "capacity_frontier.png").stat().st_size > 1000
    assert (tmp_path / "c" / "capacity_band.png").stat().st_size > 1000
    bad = CliRunner().invoke(app, ["capacity", str(tmp_path / "s.yaml"), "--slo", "ttft_p95=1s"])
    assert bad.exit_code == 2 and "ttft_p95" in bad.output


def test_capacity_at_the_step_time_band_is_ordered() -> None:
    """A slower step never sustains more: fast-step >= central >= slow-step capacity, and on
    D/D/1 each end is the hand-computed threshold at the scaled step time."""
    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="test band")
    table, probes = capacity_search(
        dd1_scenario(),
        [f"ttft_p99={SLO_S}s"],
        tolerance=0.01,
        workers=1,
        band=band,
        target_rate=450,
    )
    row = table.iloc[0]
    fast, central, slow = (
        row["capacity_fast_step_req_per_s"],
        row["capacity_rate_req_per_s"],
        row["capacity_slow_step_req_per_s"],
    )
    assert fast >= central >= slow > 0
    # The search's answer is a lower bound within the tolerance of the threshold.
    assert 0.99 <= fast / dd1_threshold_rate(step_s=0.008) <= 1.0
    assert 0.99 <= slow / dd1_threshold_rate(step_s=0.015) <= 1.0
    assert (row["step_time_low_factor"], row["step_time_high_factor"]) == (0.8, 1.5)
    assert row["step_time_band_source"] == "test band"
    # One seed: the seed interval collapses, the band does not.
    assert row["capacity_slow_step_ci_low"] == slow and row["capacity_fast_step_ci_high"] == fast
    assert row["replicas_needed_slow_step"] == math.ceil(450 / slow)
    assert sorted(set(probes["step_time_factor"])) == [0.8, 1.0, 1.5]


@settings(max_examples=8, deadline=None)
@given(factors=st.lists(st.floats(0.3, 3.0), min_size=2, max_size=2, unique=True))
def test_capacity_is_monotone_in_the_step_time_factor(factors) -> None:
    """For any two factors, the search at the larger one finds no more capacity (bisection on
    the same grid keeps the order of the thresholds)."""
    low, high = sorted(factors)
    band = StepTimeBand(min(low, 1.0), max(high, 1.0), extrapolated=False, source="hypothesis")
    table, _ = capacity_search(
        dd1_scenario(60), ["ttft_p99=20ms"], tolerance=0.05, workers=1, band=band
    )
    row = table.iloc[0]
    assert (
        row["capacity_fast_step_req_per_s"]
        >= row["capacity_rate_req_per_s"]
        >= row["capacity_slow_step_req_per_s"]
    )


def test_capacity_band_defaults_to_the_models_own() -> None:
    """The linear model has no band (x1-x1): one search per replicate, the ends equal the centre;
    band_ends=False leaves them NaN."""
    table, probes = capacity_search(dd1_scenario(60), ["ttft_p99=20ms"], workers=1)
    row = table.iloc[0]
    assert row["step_time_band_source"].startswith("linear")
    assert set(probes["step_time_factor"]) == {1.0}
    assert row["capacity_fast_step_req_per_s"] == row["capacity_rate_req_per_s"]
    assert row["capacity_slow_step_req_per_s"] == row["capacity_rate_req_per_s"]
    off, _ = capacity_search(
        dd1_scenario(60),
        ["ttft_p99=20ms"],
        workers=1,
        band_ends=False,
        band=StepTimeBand(0.5, 2.0, extrapolated=True, source="unused"),
    )
    assert math.isnan(off.loc[0, "capacity_slow_step_req_per_s"])


def test_cli_capacity_reports_the_band(tmp_path) -> None:
    from sim.cli.main import app

    (tmp_path / "s.yaml").write_text(json.dumps(dd1_scenario(100)))
    common = ["capacity", str(tmp_path / "s.yaml"), "--slo", "ttft_p99=20ms", "-j", "1"]
    args = [*common, "-o", str(tmp_path / "c"), "--no-plots", "--step-time-band", "0.8,1.5"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "step-time band x0.8 (fast) to x1.5 (slow)" in result.output
    table = pd.read_parquet(tmp_path / "c" / "capacity.parquet")
    row = table.iloc[0]
    assert row["capacity_fast_step_req_per_s"] > row["capacity_rate_req_per_s"]
    assert row["capacity_rate_req_per_s"] > row["capacity_slow_step_req_per_s"]
    for bad in ("1.2,1.5", "0.8", "x,y"):
        out = CliRunner().invoke(app, [*common, "--step-time-band", bad])
        assert out.exit_code == 2 and "--step-time-band" in out.output, out.output


def test_band_columns_worked_example() -> None:
    """The sim.planning.band docstring: slow-end replicates [100, 110, 120] req/s."""
    from sim.planning.band import band_columns, band_factors

    band = StepTimeBand(0.8, 1.5, extrapolated=True, source="example")
    results = [
        {"config_index": 0, "step_time_factor": f, "capacity_rate_req_per_s": c}
        for f, caps in ((1.5, (100, 110, 120)), (0.8, (150, 150, 150)), (1.0, (1, 2, 3)))
        for c in caps
    ]
    columns = band_columns(results, 0, band, searched=True)
    assert columns["capacity_slow_step_req_per_s"] == 110
    assert columns["capacity_slow_step_ci_low"] == pytest.approx(85.16, abs=0.01)
    assert columns["capacity_slow_step_min"] == 100
    assert columns["capacity_fast_step_ci_high"] == 150
    assert band_factors(band) == [0.8, 1.0, 1.5]
    assert band_factors(StepTimeBand(1.0, 1.0, extrapolated=True, source="none")) == [1.0]
