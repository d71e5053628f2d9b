"""Capacity search: SLO parsing, bisection on a D/D/1 scenario with a known answer, compare, CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import sim
from sim.cli import app
from sim.errors import InputError
from sim.planning.capacity import (
    Slo,
    as_slos,
    capacity_search,
    confidence_interval,
    parse_duration_s,
    parse_slo,
)
from tests.sweep_helpers import dd1_scenario

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
    table = sim.capacity(
        dd1_scenario(100),
        {"ttft_p99": "20ms"},
        compare={"step_time.linear.fixed_s": [0.01, 0.005]},
        seeds=[0, 1],
        tolerance=0.02,
        workers=1,
    )
    assert list(table["config"]) == [
        "step_time.linear.fixed_s=0.01",
        "step_time.linear.fixed_s=0.005",
    ]
    assert (table["num_replicates"] == 2).all()
    # Inline arrivals do not depend on the seed: no spread. Half the step time, twice the capacity.
    assert (table["capacity_ci_low"] == table["capacity_ci_high"]).all()
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
    bad = CliRunner().invoke(app, ["capacity", str(tmp_path / "s.yaml"), "--slo", "ttft_p95=1s"])
    assert bad.exit_code == 2 and "ttft_p95" in bad.output
