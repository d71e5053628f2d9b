"""Capacity answers that are true (issue 20, section 7): seeds reach the workload or are
refused, and a closed-loop capacity never exceeds a rate some probe actually offered."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.errors import InputError
from sim.planning.grid import resolved_data
from sim.planning.replicates import seed_free, seed_replicates
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict
from tests.harness.sweep import dd1_scenario
from tests.hostile.cases_capacity import PINNED, SESSIONS

SLO = ["ttft_p99=1s"]


def _pinned() -> dict:
    return yaml.safe_load(PINNED)


def _arrivals(data: dict, replicate: dict) -> np.ndarray:
    """The arrival times of the workload one replicate runs."""
    resolved = resolve(scenario_from_dict(resolved_data(scenario_from_dict(data), replicate, ".")))
    return np.array([r.arrival_s for r in resolved.workload.requests])


def test_seeds_reach_a_pinned_workload_seed() -> None:
    """Regression: `--seeds 0,1,2` set the top-level seed, which a pinned `workload.seed`
    ignores: three identical replicates, a zero-width interval over "3 runs"."""
    data = _pinned()
    reps = seed_replicates(scenario_from_dict(data), [0, 1, 2])
    assert reps == [{"workload.seed": 0}, {"workload.seed": 1}, {"workload.seed": 2}]
    workloads = [_arrivals(data, rep) for rep in reps]
    assert not np.array_equal(workloads[0], workloads[1])
    assert not np.array_equal(workloads[1], workloads[2])
    assert not np.array_equal(workloads[0], workloads[2])
    # The old replicate ({"seed": s}) indeed changed nothing: that was the bug.
    assert np.array_equal(_arrivals(data, {"seed": 0}), _arrivals(data, {"seed": 1}))


def test_capacity_replicates_on_a_pinned_seed_differ() -> None:
    table = sim.capacity(_pinned(), SLO, seeds=[0, 1, 2], band_ends=False, workers=1)
    probes = table.attrs["probes"]
    first = probes[probes["rate_scale"] == 1.0]
    assert sorted(first["replicate_label"]) == [f"workload.seed={s}" for s in (0, 1, 2)]
    assert first["offered_rate_req_per_s"].nunique() == 3  # three different workloads
    assert table.loc[0, "num_replicates"] == 3


def test_the_default_runs_the_scenarios_own_seed() -> None:
    """No `seeds`: the workload as written (seed 7 pinned), named for what it is."""
    data = _pinned()
    assert seed_replicates(scenario_from_dict(data), None) == [{"workload.seed": 7}]
    assert seed_replicates(scenario_from_dict(dd1_scenario(4)), None) == [{"seed": 0}]
    assert seed_replicates(scenario_from_dict({**dd1_scenario(4), "seed": 5}), None) == [
        {"seed": 5}
    ]


def test_seeds_that_reach_nothing_are_refused(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0,8,2\n0.1,8,2\n0.2,8,2\n")
    data = {**dd1_scenario(4), "workload": {"kind": "trace", "path": str(trace)}}
    scenario = scenario_from_dict(data)
    assert seed_free(scenario.workload) == "a trace's arrivals and lengths are the file's"
    with pytest.raises(InputError, match="trace's arrivals .* every seed runs the same"):
        seed_replicates(scenario, [0, 1, 2])
    assert seed_replicates(scenario, [3]) == [{"seed": 3}]  # one run is one run
    with pytest.raises(InputError, match="seed 1 is repeated"):
        seed_replicates(scenario_from_dict(_pinned()), [1, 2, 1])


def test_replicates_that_run_one_simulation_are_refused() -> None:
    """`replicates=` (the API's override dicts) go through the same check."""
    with pytest.raises(InputError, match="pins workload.seed \\(7\\)"):
        sim.capacity(_pinned(), SLO, replicates=[{"seed": 0}, {"seed": 1}], workers=1)
    with pytest.raises(InputError, match="run the same simulation"):
        sim.capacity(_pinned(), SLO, replicates=[{"workload.seed": 1}] * 2, workers=1)


def test_sweep_over_a_seed_that_reaches_nothing_is_refused() -> None:
    with pytest.raises(InputError, match="sweep points 0 \\(seed=0\\) and 1 \\(seed=1\\)"):
        sim.sweep(_pinned(), {"seed": [0, 1]}, workers=1)


def _sessions(num_sessions: int, think_s: float, seed: int) -> dict:
    data = yaml.safe_load(SESSIONS)
    data["workload"]["seed"] = seed
    data["workload"]["sessions"]["num_sessions"] = num_sessions
    data["workload"]["sessions"]["think_s"]["mean_s"] = think_s
    return data


@settings(max_examples=6, deadline=None)
@given(
    num_sessions=st.integers(2, 8),
    think_s=st.sampled_from([0.2, 1.0, 3.0]),
    seed=st.integers(0, 50),
    limit=st.sampled_from(["ttft_p99=50ms", "ttft_p99=2s"]),
)
def test_closed_loop_capacity_never_exceeds_an_offered_rate(num_sessions, think_s, seed, limit):
    """Regression: `sessions_chat_v1.yaml` answered 21.96 req/s per replica while no probe
    offered more than 6.8 req/s ("scale x rate at scale 1" is not true in a closed loop)."""
    data = _sessions(num_sessions, think_s, seed)
    table = sim.capacity(data, [limit], band_ends=False, workers=1, max_scale=16)
    probes = table.attrs["probes"]
    row = table.iloc[0]
    offered = probes["offered_rate_req_per_s"].max()
    assert row["capacity_rate_req_per_s"] <= offered + 1e-9, (row.to_dict(), offered)
    assert row["status"].startswith("closed loop, rate measured at the passing probe")
    passing = probes[probes["passed"]]
    if len(passing):  # the answer is a rate measured at a passing probe
        assert row["capacity_rate_req_per_s"] in set(passing["offered_rate_req_per_s"])
    else:
        assert row["capacity_rate_req_per_s"] == 0.0


def test_open_loop_capacity_is_still_the_scaled_rate() -> None:
    """An open-loop workload's offered rate is linear in the scale: the answer is unchanged."""
    table = sim.capacity(dd1_scenario(100), {"ttft_p99": "20ms"}, workers=1, band_ends=False)
    row = table.iloc[0]
    assert row["capacity_rate_req_per_s"] == pytest.approx(row["capacity_scale_mean"] * 50.0)
    assert "closed loop" not in row["status"]


def test_the_readme_sessions_figure() -> None:
    """README "What the rate is": sessions_chat_v1 at TTFT p99 <= 2 s answers the 7.6 req/s
    measured at scale 64, not the 214 that 64 x the scale-1 rate claims (vLLM 0.33.0 as served,
    async scheduling on; 6.9 and 208 with kvsim's old synchronous constants)."""
    table = sim.capacity(
        "scenarios/sessions_chat_v1.yaml", ["ttft_p99=2s"], band_ends=False, workers=1
    )
    row = table.iloc[0]
    assert round(row["capacity_rate_req_per_s"], 1) == 7.6
    assert (
        round(row["capacity_scale_mean"] * table.attrs["probes"]["offered_rate_req_per_s"].iloc[0])
        == 214
    )
    assert "the sessions bound the load" in row["status"]


def test_a_compared_seed_is_not_overridden_by_the_default_replicate() -> None:
    """`--compare workload.seed=1,2` on a pinned scenario: each row runs its own seed."""
    table = sim.capacity(
        _pinned(), SLO, compare={"workload.seed": [1, 2]}, band_ends=False, workers=1
    )
    probes = table.attrs["probes"]
    first = probes[probes["rate_scale"] == 1.0]
    assert first["offered_rate_req_per_s"].nunique() == 2
    with pytest.raises(InputError, match="pins workload.seed"):
        sim.capacity(_pinned(), SLO, compare={"seed": [0, 1]}, workers=1)


def test_cluster_capacity_runs_the_rate_asked_for() -> None:
    """`at_rate` resets workload.rate_scale: rate 10 at rate_scale 2 was run at 20 req/s."""
    from sim.cluster.compare import at_rate

    data = _pinned()
    data["workload"]["rate_scale"] = 2.0
    scenario = at_rate(scenario_from_dict(data), 10.0)
    assert scenario.workload.rate_scale == 1.0
    assert scenario.workload.arrival is not None
    assert scenario.workload.arrival.rate_per_s == 10.0


def test_which_workloads_draw_from_their_seed() -> None:
    from sim.workload.config import WorkloadConfig

    mooncake = WorkloadConfig(kind="sessions", sessions={"source": "mooncake", "path": "t.jsonl"})
    assert "Mooncake" in (seed_free(mooncake) or "")
    lengths = WorkloadConfig(kind="trace", path="l.csv", arrival={"rate_per_s": 2.0})
    assert seed_free(lengths) is None  # a lengths file: arrivals and samples are drawn
    assert seed_free(scenario_from_dict(_pinned()).workload) is None
    assert "inline" in (seed_free(scenario_from_dict(dd1_scenario(4)).workload) or "")
