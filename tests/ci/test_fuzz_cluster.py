"""`kvsim fuzz` on clusters: some cases run on 2-4 audited replicas behind a drawn router, and
about one v1-engine case in 8 is prefill/decode disaggregated."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.ci.fuzz_cases as fuzz_cases
from sim.ci.check import check_paths
from sim.ci.fuzz import (
    DISAGG_PREFIX,
    case_seed,
    fuzz,
    fuzz_one_case,
    generate_case,
    run_case,
    save_findings,
)
from sim.ci.fuzz_cases import FUZZ_ROUTERS, MULTI_REPLICA_SHARE, draw_case, generate_disagg_case
from sim.cluster.config import ClusterMode
from sim.kv.config import Design
from sim.routing import Router
from sim.scenario.schema import scenario_to_yaml


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
    # prefix_cache_aware and KV events only where they do something (the V1 engine; the router
    # with prefix caching): elsewhere kvsim refuses them (sim.scenario.no_effect).
    v1 = design == "v1-engine"
    routers = set(FUZZ_ROUTERS) - (set() if v1 else {"prefix_cache_aware"})
    assert set(Counter(e.router for e in multi)) == routers
    cases = [generate_case(design, case_seed(0, i)) for i in range(200)]
    assert all(
        c.cache.enable_prefix_caching for c in cases if c.engine.router == "prefix_cache_aware"
    )
    assert any(e.router_staleness_s > 0 for e in multi) is v1
    assert any(e.kv_events for e in multi) is v1
    # About MULTI_REPLICA_SHARE of the cases (0.25 of 200 = 50; binomial sd ~6).
    assert abs(len(multi) - MULTI_REPLICA_SHARE * 200) < 25
    single = [e for e in engines if e.num_replicas == 1]
    assert all(e.router == "round_robin" and not e.kv_events for e in single)


def test_the_cluster_draw_changes_nothing_else(monkeypatch):
    for index, clustered in _multi("v1-engine", 5):
        seed = case_seed(0, index)
        monkeypatch.setattr(fuzz_cases, "_cluster", lambda seed, design, cache: {})
        alone = generate_case("v1-engine", seed)
        monkeypatch.undo()
        data = clustered.model_dump(mode="json")
        assert data["engine"]["num_replicas"] > 1
        for key in ("num_replicas", "router", "router_staleness_s", "kv_events"):
            data["engine"].pop(key)
        expected = alone.model_dump(mode="json")
        for key in ("num_replicas", "router", "router_staleness_s", "kv_events"):
            expected["engine"].pop(key)
        if clustered.engine.router == "prefix_cache_aware":  # comes with its prefix cache
            expected["cache"]["enable_prefix_caching"] = True
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
    from sim.engine.run import run

    _, scenario = next(
        (i, s)
        for i, s in _multi("v1-engine", 40)
        if s.engine.kv_events and s.cache.enable_prefix_caching
    )
    fast, slow = tables_of(run(scenario)), tables_of(run(without_shortcuts(scenario)))
    assert "kv_events" in fast and fast["kv_events"].count("\n") > 1
    assert fast == slow


# ---------------------------------------------------------------- disaggregated (P/D) cases
def test_about_one_v1_engine_case_in_8_is_disaggregated_and_only_on_v1_engine():
    seeds = [case_seed(0, i) for i in range(400)]
    disagg = [s for s in seeds if fuzz_cases.is_disagg_case(Design.V1_ENGINE, s)]
    # 400 / DISAGG_ONE_IN = 50 expected (binomial sd ~6.6).
    assert abs(len(disagg) - 400 / fuzz_cases.DISAGG_ONE_IN) < 20
    for seed in disagg[:5]:
        assert draw_case("v1-engine", seed).cluster.mode is ClusterMode.DISAGGREGATED
        assert draw_case("v1-engine", seed) == generate_disagg_case(seed)
    for design in ("v0-v1", "v0-v2", "v0-fixed"):
        assert not any(fuzz_cases.is_disagg_case(Design(design), s) for s in seeds)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    design=st.sampled_from(["v0-v1", "v0-v2", "v0-fixed", "v1-engine"]),
)
def test_a_case_that_is_not_disaggregated_is_the_case_it_always_was(seed, design):
    """The P/D draw has a stream of its own: every other case seed keeps its case."""
    if fuzz_cases.is_disagg_case(Design(design), seed):
        assert design == "v1-engine"
        return
    drawn = draw_case(design, seed)
    assert drawn.cluster.mode is ClusterMode.CO_LOCATED
    assert scenario_to_yaml(drawn) == scenario_to_yaml(generate_case(design, seed))


def test_pinned_case_seeds_are_never_disaggregated():
    for seed in fuzz_cases.PINNED_INLINE_CASES:
        assert not fuzz_cases.is_disagg_case(Design.V1_ENGINE, seed)


def test_v1_engine_fuzz_runs_disaggregated_cases_and_keys_their_findings():
    report = fuzz("v1-engine", master_seed=0, budget_s=None, max_cases=40)
    disagg_indices = [
        i for i in range(40) if fuzz_cases.is_disagg_case(Design.V1_ENGINE, case_seed(0, i))
    ]
    assert report.num_disagg_cases == len(disagg_indices) > 0
    assert report.to_dict()["num_disagg_cases"] == report.num_disagg_cases
    finding = report.findings[f"{DISAGG_PREFIX}no_progress"]
    assert finding.case_index in disagg_indices
    assert finding.scenario.cluster.mode is ClusterMode.DISAGGREGATED
    assert finding.observed_kinds == ["no_progress"]
    assert report.internal_error is None and report.inconsistency is None


def test_a_saved_disaggregated_finding_reproduces_with_check(tmp_path):
    report = fuzz("v1-engine", master_seed=0, budget_s=None, max_cases=40)
    saved = save_findings(report, tmp_path)
    path = saved[f"{DISAGG_PREFIX}no_progress"]
    assert path.name.startswith("v1-engine-disagg-no_progress-seed")
    assert "# Reproduce: kvsim check <this file>" in path.read_text()
    (outcome,) = check_paths([path])
    assert outcome.passed and outcome.observed_kinds == ["no_progress"]
    finding = report.findings[f"{DISAGG_PREFIX}no_progress"]
    assert finding.reproduce_command("v1-engine", path) == f"kvsim check {path}"
    # The case seed alone replays it too (cross-checked with the shortcuts off).
    replay = fuzz_one_case("v1-engine", finding.case_seed)
    assert replay.kinds == [f"{DISAGG_PREFIX}no_progress"]
    assert replay.num_disagg_cases == 1 and replay.num_cross_checked == 1
    assert replay.inconsistency is None
