"""`kvsim fuzz`: deterministic cases, finds the v0-V2 undercount, quiet on correct designs."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from sim.ci.check import check_paths
from sim.ci.fuzz import (
    case_seed,
    fuzz,
    fuzz_one_case,
    generate_case,
    parse_budget,
    save_findings,
    sim_time_limit_s,
)
from sim.ci.selfcheck import (
    CROSS_CHECK_EVERY,
    first_difference,
    is_cross_checked,
    tables_of,
    without_shortcuts,
)
from sim.cli.main import app
from sim.engine.run import run
from sim.scenario.schema import load_scenario, scenario_to_yaml

runner = CliRunner()


def test_case_seeds_are_deterministic_and_distinct():
    seeds = [case_seed(7, i) for i in range(200)]
    assert seeds == [case_seed(7, i) for i in range(200)]
    assert len(set(seeds)) == 200
    assert case_seed(7, 0) != case_seed(8, 0)


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"])
def test_generated_cases_are_valid_and_reproducible(design):
    for index in range(40):
        seed = case_seed(0, index)
        scenario = generate_case(design, seed)
        assert scenario_to_yaml(scenario) == scenario_to_yaml(generate_case(design, seed))
        assert scenario.engine.audit_level.value == "full"
        if scenario.workload.kind == "sessions":
            assert 1 <= scenario.workload.sessions.num_sessions <= 4
        else:
            assert 2 <= len(scenario.workload.requests) <= 24
        cache, sched = scenario.cache, scenario.scheduler
        if design != "v1-engine" and cache.sliding_window is not None:
            # vLLM 0.5.4 refuses both combinations with a sliding window.
            assert not cache.enable_prefix_caching and not sched.enable_chunked_prefill
        if design == "v1-engine":
            assert sched.preemption_mode.value == "recompute"


def test_no_swap_changes_only_the_preemption_mode():
    for index in range(20):
        seed = case_seed(0, index)
        with_swap = generate_case("v0-fixed", seed).model_dump(mode="json")
        without = generate_case("v0-fixed", seed, allow_swap=False).model_dump(mode="json")
        assert without["scheduler"]["preemption_mode"] == "recompute"
        assert without["cache"]["num_cpu_blocks"] == 0
        for section in ("workload", "engine"):
            assert with_swap[section] == without[section]


def test_sim_time_limit_example():
    requests = [{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 5}] * 2
    assert sim_time_limit_s(requests) == pytest.approx(3 * 30 * 0.0052 + 1.0)


def test_finds_the_v0_v2_sliding_window_undercount_within_25_cases():
    report = fuzz("v0-v2", master_seed=0, budget_s=None, max_cases=25)
    assert "admission_undercount" in report.kinds
    finding = report.findings["admission_undercount"]
    # Found within the first cases (counted, not timed: benchmarks/ci_speed.py times it).
    assert finding.case_index < 25
    assert "can_allocate counted" in finding.message
    assert finding.case_seed == case_seed(0, finding.case_index)
    assert finding.scenario.cache.sliding_window is not None


def test_finds_the_undercount_for_other_master_seeds():
    for master_seed in (1, 2, 3):
        report = fuzz("v0-v2", master_seed=master_seed, budget_s=None, max_cases=60)
        assert "admission_undercount" in report.kinds, master_seed


def test_fuzz_is_deterministic_for_a_seed():
    first = fuzz("v0-v2", master_seed=5, budget_s=None, max_cases=30).to_dict()
    second = fuzz("v0-v2", master_seed=5, budget_s=None, max_cases=30).to_dict()
    for report in (first, second):
        report.pop("elapsed_s")
        for finding in report["findings"]:
            finding.pop("found_after_s")
    assert first == second


def test_v1_engine_fuzz_finds_only_the_max_model_len_hang():
    """The V1 engine's only co-located finding is liveness: a chunked prompt of exactly
    max_model_len tokens never gets its last token (vLLM #29496), found as `no_progress` with
    its seed. Its disaggregated cases find only liveness too (tests/vllm_real/test_vllm_pd_deadlock.py)."""
    report = fuzz("v1-engine", master_seed=0, budget_s=None, max_cases=250)
    assert report.kinds == ["disagg:no_progress", "no_progress"], report.to_dict()["findings"]
    assert report.num_disagg_cases > 0
    finding = report.findings["no_progress"]
    assert "running request 0 new tokens" in finding.message
    scenario = finding.scenario
    assert scenario.scheduler.enable_chunked_prefill
    prompt_lens = [r.prompt_tokens for r in scenario.workload.requests]
    assert scenario.scheduler.max_model_len in prompt_lens
    assert "no_progress" in run(scenario).violation_kinds
    assert report.num_invalid_cases == 0


def test_quiet_on_v0_fixed_without_swap():
    """v0-fixed fixes the sliding-window undercount: no finding under recompute preemption."""
    report = fuzz("v0-fixed", master_seed=0, budget_s=None, max_cases=250, allow_swap=False)
    assert report.findings == {}, report.to_dict()["findings"]
    assert report.num_invalid_cases == 0


def test_quiet_on_v0_fixed_with_swap():
    """v0-fixed counts swaps exactly (incl. the append after swap-in): no finding with swap."""
    report = fuzz("v0-fixed", master_seed=0, budget_s=None, max_cases=250)
    assert report.findings == {}, report.to_dict()["findings"]


def test_saved_findings_reproduce_and_pass_check(tmp_path):
    report = fuzz("v0-v2", master_seed=0, budget_s=None, max_cases=10)
    saved = save_findings(report, tmp_path)
    path = saved["admission_undercount"]
    text = path.read_text()
    assert text.startswith("# Found by: kvsim fuzz --design v0-v2")
    scenario = load_scenario(path)
    assert scenario.scheduler.design.value == "v0-v2"
    assert scenario.workload.kind == "inline"
    assert "admission_undercount" in run(path).violation_kinds
    (outcome,) = check_paths([path])
    assert outcome.passed, outcome.reason


def test_budget_stops_the_run():
    report = fuzz("v1-engine", master_seed=0, budget_s=0.2)
    assert report.num_cases >= 1 and report.stopped_by == "budget of 0.2 s"
    # It stopped because of the clock, not because it ran out of cases (it has none).
    assert report.elapsed_s >= 0.2


@pytest.mark.parametrize(
    ("text", "seconds"), [("60s", 60), ("2m", 120), ("90", 90), ("1.5h", 5400), ("500ms", 0.5)]
)
def test_parse_budget(text, seconds):
    assert parse_budget(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["soon", "-5s", "0"])
def test_parse_budget_rejects(text):
    with pytest.raises(ValueError, match="--budget"):
        parse_budget(text)


# ---------------------------------------------------------------- CLI
def test_cli_exit_1_with_findings_and_json(tmp_path):
    out = tmp_path / "fuzz.json"
    result = runner.invoke(
        app,
        [
            "fuzz",
            "--design",
            "v0-v2",
            "--max-cases",
            "10",
            "--save",
            str(tmp_path / "found"),
            "--json",
            str(out),
        ],
    )
    assert result.exit_code == 1, result.output
    assert "admission_undercount" in result.output
    assert "reproduce: kvsim run" in result.output
    data = json.loads(out.read_text())
    kinds = {f["kind"]: f for f in data["findings"]}
    assert kinds["admission_undercount"]["saved"].endswith(".yaml")
    assert data["num_cases"] == 10


def test_cli_exit_0_when_quiet_and_case_seed_replay():
    result = runner.invoke(app, ["fuzz", "--design", "v0-fixed", "--no-swap", "--max-cases", "15"])
    assert result.exit_code == 0, result.output
    assert "no violations found" in result.output
    report = fuzz("v0-v2", master_seed=0, budget_s=None, max_cases=5)
    seed = report.findings["admission_undercount"].case_seed
    result = runner.invoke(app, ["fuzz", "--design", "v0-v2", "--case-seed", str(seed)])
    assert result.exit_code == 1 and "admission_undercount" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--design", "v9"], "--design 'v9': expected one of"),
        (["--budget", "soon"], "--budget 'soon'"),
    ],
)
def test_cli_exit_2_on_bad_input(args, message):
    result = runner.invoke(app, ["fuzz", *args])
    assert result.exit_code == 2
    assert message in result.output


# ---------------------------------------------------------------- kvsim checking itself
def test_cross_checked_cases_are_picked_by_the_seed():
    seeds = [case_seed(0, i) for i in range(400)]
    picked = [s for s in seeds if is_cross_checked(s)]
    assert picked == [s for s in seeds if s % CROSS_CHECK_EVERY == 0]
    assert 20 <= len(picked) <= 80  # about one case in 8
    report = fuzz("v0-fixed", master_seed=0, budget_s=None, max_cases=60)
    assert report.num_cross_checked == sum(is_cross_checked(case_seed(0, i)) for i in range(60))
    assert report.num_cross_checked > 0 and report.inconsistency is None


def test_repeated_corruption_reports_are_the_only_difference_the_shortcuts_make():
    """Regression (found by the fuzz cross-check): after v0-V2's swap_out failed on this case,
    the run went on with a refcount-0 block in a table; the full audit re-reported it after
    every manager call, and the fast path made fewer calls. The failed swap_out now ends the
    run (vLLM raises out of the engine there), so there is nothing to re-report and the
    shortcuts change nothing at all, violations included."""
    scenario = generate_case("v0-v2", 23012616)
    fast, slow = run(scenario), run(without_shortcuts(scenario))
    assert fast.summary["fatal_error"].startswith("swap_out raised NullBlockWriteError")
    assert "refcount" not in set(fast.violations["kind"])
    assert fast.violations.to_csv() == slow.violations.to_csv()
    assert tables_of(fast) == tables_of(slow)
    assert first_difference(tables_of(fast), tables_of(slow)) is None


def test_first_difference_names_the_table_and_line():
    same = {"requests": "a\n1\n", "steps": "s\n", "violations": "v\n", "summary": "{}"}
    other = {**same, "steps": "s\n2\n"}
    assert first_difference(same, same) is None
    assert first_difference(same, other) == "steps: 1 lines with the shortcuts, 2 without"
    other = {**same, "requests": "a\n9\n"}
    assert first_difference(same, other) == "requests line 2: '1' with the shortcuts, '9' without"


def _break_the_slow_run(monkeypatch):
    """Make the shortcut-free run differ (one more GPU block), as a fast-path bug would."""
    import sim.ci.fuzz as fz

    def with_one_more_block(scenario):
        cache = scenario.cache.model_copy(
            update={"num_gpu_blocks": scenario.cache.num_gpu_blocks + 1}
        )
        return without_shortcuts(scenario).model_copy(update={"cache": cache})

    monkeypatch.setattr(fz, "without_shortcuts", with_one_more_block)


def test_an_inconsistency_is_reported_as_kvsim_being_wrong(monkeypatch, tmp_path):
    _break_the_slow_run(monkeypatch)
    report = fuzz("v1-engine", master_seed=0, budget_s=None, max_cases=40)
    assert report.inconsistency is not None and report.kvsim_is_wrong
    assert is_cross_checked(report.inconsistency.case_seed)
    # Never a vLLM finding (the run's other finding is the max_model_len hang of an earlier case).
    assert report.inconsistency.case_seed not in {f.case_seed for f in report.findings.values()}
    replay = fuzz_one_case("v1-engine", report.inconsistency.case_seed)  # --case-seed
    assert replay.inconsistency.difference == report.inconsistency.difference
    out = tmp_path / "fuzz.json"
    result = runner.invoke(
        app, ["fuzz", "--design", "v1-engine", "--max-cases", "40", "--json", str(out)]
    )
    assert result.exit_code == 3, result.output
    assert "kvsim internal inconsistency" in result.output
    assert f"--case-seed {report.inconsistency.case_seed}" in result.output
    assert (
        json.loads(out.read_text())["inconsistency"]["case_seed"] == report.inconsistency.case_seed
    )


def _crash_kvsim(monkeypatch, after_calls: int):
    """kvsim's own code raises (a ZeroDivisionError no vLLM code path models) mid-run."""
    from sim.kv.v0_v2.manager import BlockSpaceManagerV2

    original = BlockSpaceManagerV2.allocate
    calls = {"n": 0}

    def allocate(self, seq_group):
        calls["n"] += 1
        if calls["n"] > after_calls:
            raise ZeroDivisionError("a kvsim bug")
        return original(self, seq_group)

    monkeypatch.setattr(BlockSpaceManagerV2, "allocate", allocate)


def test_an_internal_error_is_not_a_finding(monkeypatch):
    _crash_kvsim(monkeypatch, after_calls=30)
    report = fuzz("v0-v2", master_seed=0, budget_s=None, max_cases=50)
    error = report.internal_error
    assert error is not None and report.kvsim_is_wrong
    assert error.error == "ZeroDivisionError: a kvsim bug"
    assert "Traceback" in error.traceback and "allocate" in error.traceback
    assert error.case_seed == case_seed(0, error.case_index)
    assert report.num_cases == error.case_index + 1  # the run stopped there
    assert report.stopped_by == f"an internal error in case {error.case_index}"
    assert not any(kind.startswith("exception") for kind in report.findings)


def test_cli_exit_3_with_traceback_on_an_internal_error(monkeypatch):
    _crash_kvsim(monkeypatch, after_calls=0)
    seed = case_seed(0, 0)
    for args in (["--max-cases", "5"], ["--case-seed", str(seed)]):
        result = runner.invoke(app, ["fuzz", "--design", "v0-v2", *args])
        assert result.exit_code == 3, result.output
        assert "Traceback (most recent call last)" in result.output
        assert "ZeroDivisionError: a kvsim bug" in result.output
        assert "kvsim internal error" in result.output and "not a vLLM finding" in result.output
        assert f"reproduce: kvsim fuzz --design v0-v2 --case-seed {seed}" in result.output
