"""`kvsim fuzz` on clusters: some cases run on 2-4 audited replicas behind a drawn router."""

from __future__ import annotations

from collections import Counter

import pytest

import sim.ci.fuzz_cases as fuzz_cases
from sim.ci.fuzz import case_seed, fuzz, generate_case, run_case
from sim.ci.fuzz_cases import FUZZ_ROUTERS, MULTI_REPLICA_SHARE
from sim.routing import Router
from sim.scenario import scenario_to_yaml


def _multi(design: str, count: int, master_seed: int = 0):
    """The first `count` multi-replica cases of `design` as (case index, scenario)."""
    found = []
    index = 0
    while len(found) < count:
        scenario = generate_case(design, case_seed(master_seed, index))
        if scenario.engine.num_replicas > 1:
            found.append((index, scenario))
        index += 1
    return found


def test_the_fuzz_routers_are_every_router():
    assert sorted(FUZZ_ROUTERS) == sorted(r.value for r in Router)


@pytest.mark.parametrize("design", ["v0-v2", "v1-engine"])
def test_cases_draw_every_router_and_2_to_4_replicas(design):
    engines = [generate_case(design, case_seed(0, i)).engine for i in range(200)]
    multi = [e for e in engines if e.num_replicas > 1]
    assert {e.num_replicas for e in multi} == {2, 3, 4}
    assert set(Counter(e.router for e in multi)) == set(FUZZ_ROUTERS)
    assert any(e.router_staleness_s > 0 for e in multi)
    assert any(e.kv_events for e in multi)
    # About MULTI_REPLICA_SHARE of the cases (0.25 of 200 = 50; binomial sd ~6).
    assert abs(len(multi) - MULTI_REPLICA_SHARE * 200) < 25
    single = [e for e in engines if e.num_replicas == 1]
    assert all(e.router == "round_robin" and not e.kv_events for e in single)


def test_the_cluster_draw_changes_nothing_else(monkeypatch):
    for index, clustered in _multi("v1-engine", 5):
        seed = case_seed(0, index)
        monkeypatch.setattr(fuzz_cases, "_cluster", lambda seed: {})
        alone = generate_case("v1-engine", seed)
        monkeypatch.undo()
        data = clustered.model_dump(mode="json")
        assert data["engine"]["num_replicas"] > 1
        for key in ("num_replicas", "router", "router_staleness_s", "kv_events"):
            data["engine"].pop(key)
        expected = alone.model_dump(mode="json")
        for key in ("num_replicas", "router", "router_staleness_s", "kv_events"):
            expected["engine"].pop(key)
        assert data == expected
        assert scenario_to_yaml(clustered) == scenario_to_yaml(generate_case("v1-engine", seed))


def test_the_audit_runs_on_every_replica_of_a_cluster_case():
    # The v0-V2 sliding-window undercount is found in multi-replica cases too: the auditor
    # wraps each replica's manager whatever the router.
    kinds_by_router: dict[str, set[str]] = {}
    for _, scenario in _multi("v0-v2", 40):
        kinds = set(run_case(scenario).kind_names)
        kinds_by_router.setdefault(scenario.engine.router, set()).update(kinds)
    assert any("admission_undercount" in kinds for kinds in kinds_by_router.values())


@pytest.mark.parametrize("design", ["v0-fixed", "v1-engine"])
def test_cluster_cases_of_correct_designs_stay_quiet(design):
    # v0-fixed has no finding, the V1 engine only the max_model_len hang (`no_progress`).
    for _, scenario in _multi(design, 40):
        result = run_case(scenario, cross_check=True)
        assert set(result.kind_names) <= {"no_progress"}, (scenario.name, result.kinds)
        assert result.difference is None


def test_fuzz_runs_cluster_cases_without_internal_errors():
    report = fuzz("v1-engine", master_seed=3, budget_s=None, max_cases=60)
    assert report.internal_error is None and report.inconsistency is None
    assert report.num_invalid_cases == 0


def test_the_cross_check_compares_the_kv_events_too():
    # The decode shortcuts must not change the events either: a case that records them has
    # them among the tables the cross-check compares (and they agree).
    from sim.ci.selfcheck import tables_of, without_shortcuts
    from sim.runner import run

    _, scenario = next(
        (i, s)
        for i, s in _multi("v1-engine", 40)
        if s.engine.kv_events and s.cache.enable_prefix_caching
    )
    fast, slow = tables_of(run(scenario)), tables_of(run(without_shortcuts(scenario)))
    assert "kv_events" in fast and fast["kv_events"].count("\n") > 1
    assert fast == slow
