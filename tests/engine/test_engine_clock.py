"""The engine's clock-advancing step loop changes no table (`sim.engine.engine.Clock`).

A replica whose step ends strictly before the next scheduled SimPy event moves the clock itself
instead of yielding a timeout. Each run here is made twice, with that loop and with the plain
one (`Engine(..., yield_every_step=True)`: one timeout per step), and every table (requests,
steps, violations with their times and steps, summary) must be byte-identical: bundled
scenarios, multi-replica runs under each router, and drawn cases (hypothesis) with ties at equal
times, time limits and stop policies.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.engine.engine
import sim.engine.run
from sim.cluster.config import ClusterMode
from sim.engine.engine import Clock, Engine
from sim.engine.run import builtin_scenario_path, resolve, run
from sim.output.results import build_result
from sim.scenario.schema import load_scenario, scenario_from_dict
from tests.scheduler.test_decode_cohort import DESIGNS, replay_cases

ROOT = Path(__file__).resolve().parents[2]
# A disaggregated scenario runs on `sim.engine.disagg`'s own loop, not on this engine's.
SCENARIOS = [
    path
    for path in sorted((ROOT / "scenarios").glob("*.yaml"))
    if load_scenario(path).cluster.mode is ClusterMode.CO_LOCATED
] + [builtin_scenario_path()]


def _csv_tables(result) -> dict[str, str]:
    tables = {name: getattr(result, name).to_csv(index=False) for name in ("requests", "steps")}
    tables["violations"] = result.violations.to_csv(index=False)
    tables["summary"] = repr(sorted(result.summary.items()))
    return tables


class _CountingClock(Clock):
    advances = 0

    def advance_to(self, time_s: float) -> None:
        _CountingClock.advances += 1
        super().advance_to(time_s)


def _both_loops(monkeypatch, path: Path, overrides: dict) -> tuple[dict, dict]:
    """The tables of `path` run with the clock-advancing loop and with the plain loop."""
    _CountingClock.advances = 0
    monkeypatch.setattr(sim.engine.engine, "Clock", _CountingClock)
    monkeypatch.setattr(sim.engine.run, "Engine", Engine)
    advancing = _csv_tables(run(path, overrides=overrides))
    assert _CountingClock.advances > 0  # the comparison is not vacuous
    plain_engine = functools.partial(Engine, yield_every_step=True)
    monkeypatch.setattr(sim.engine.run, "Engine", plain_engine)
    plain = _csv_tables(run(path, overrides=overrides))
    return advancing, plain


def _assert_same(advancing: dict, plain: dict) -> None:
    for name, text in plain.items():
        assert advancing[name] == text, f"{name} differs between the two loops"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_bundled_scenarios_give_the_same_tables_with_either_loop(monkeypatch, path):
    # The Azure replay is cut to its first 3,000 requests here (the whole trace: the slow test).
    overrides = {"workload.first_n": 3000} if path.stem == "mistral_azure_conv_swa" else {}
    _assert_same(*_both_loops(monkeypatch, path, overrides))


@pytest.mark.slow
def test_whole_azure_replay_gives_the_same_tables_with_either_loop(monkeypatch):
    # The designs of benchmarks/replay_azure.py (the V1 engine with chunked prefill on).
    for design in ("v0-v2", "v1-engine"):
        overrides = {"scheduler.design": design}
        if design == "v1-engine":
            overrides["scheduler.enable_chunked_prefill"] = True
        path = ROOT / "scenarios" / "mistral_azure_conv_swa.yaml"
        _assert_same(*_both_loops(monkeypatch, path, overrides))


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "prefix_cache_aware"])
@pytest.mark.parametrize("num_replicas", [2, 3, 4])
def test_replicas_give_the_same_tables_with_either_loop(monkeypatch, router, num_replicas):
    """Replicas interleave: each advances only up to the next event of any other."""
    overrides = {
        "workload.first_n": 300,
        "workload.rate_scale": 0.25 * num_replicas,
        "engine.num_replicas": num_replicas,
        "engine.router": router,
    }
    path = ROOT / "scenarios" / "mooncake_prefix_caching.yaml"  # shared prefixes
    _assert_same(*_both_loops(monkeypatch, path, overrides))


@pytest.mark.parametrize(
    "overrides",
    [
        {"engine.max_sim_time_s": 7.5},
        {"engine.violation_policy": "stop_any"},
        {"engine.violation_policy": "stop"},
    ],
    ids=["time_limit", "stop_any", "stop"],
)
def test_limits_and_stop_policies_give_the_same_tables_with_either_loop(monkeypatch, overrides):
    """The default scenario's v0-v2 records violations and crashes on long prompts: each of
    these runs ends early."""
    overrides = {"workload.rate_scale": 3, **overrides}
    advancing, plain = _both_loops(monkeypatch, builtin_scenario_path(), overrides)
    assert "('stopped_early', None)" not in plain["summary"]
    _assert_same(advancing, plain)


def _drawn_tables(data: dict, lookahead: int, yield_every_step: bool) -> dict:
    resolved = resolve(scenario_from_dict(data, "drawn case"))
    scheduler = dataclasses.replace(resolved.engine.scheduler, num_lookahead_slots=lookahead)
    config = dataclasses.replace(resolved.engine, scheduler=scheduler)
    progress: list[tuple[int, int]] = []
    engine = Engine(
        config,
        resolved.workload.requests,
        resolved.step_time,
        lambda done, total: progress.append((done, total)),
        yield_every_step=yield_every_step,
    )
    records = engine.run()
    tables = _csv_tables(build_result(records, resolved.inputs))
    tables["end_s"] = repr(records.end_s)
    tables["progress"] = repr(progress)
    return tables


@pytest.mark.parametrize("design", DESIGNS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_drawn_cases_give_the_same_tables_with_either_loop(design, data):
    """Drawn cases: arrivals at equal times and at gaps of a few step times (ties with step
    ends), 1-2 replicas under every router, time limits, preemptions, stalls; the progress
    callbacks and the end time must be the same too."""
    scenario, lookahead = data.draw(replay_cases(design), label="case")
    if data.draw(st.booleans(), label="stop_any"):
        scenario["engine"]["violation_policy"] = "stop_any"
    _assert_same(
        _drawn_tables(scenario, lookahead, False), _drawn_tables(scenario, lookahead, True)
    )


def test_clock_refuses_to_pass_or_reach_the_next_event():
    """At a tie the event already scheduled runs first: the clock may not reach it."""
    clock = Clock()
    clock.timeout(0.5)
    clock.advance_to(0.25)
    assert clock.now == 0.25
    with pytest.raises(ValueError, match="next event 0.5"):
        clock.advance_to(0.5)
    with pytest.raises(ValueError, match="now 0.25"):
        clock.advance_to(0.1)
    assert isinstance(clock, simpy.Environment)
