"""`kvsim check`: expectations, exit codes 0 / 1 / 2, JUnit XML, JSON, GitHub annotations."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.ci.check import Status, check_paths, compare, exit_code
from sim.ci.junit import github_annotation, in_github_actions, junit_xml
from sim.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
SWA_4_VS_3 = sorted(SCENARIOS.glob("swa_4_vs_3_*.yaml"))
REGRESSIONS = ROOT / "tests" / "regressions"

runner = CliRunner()

FOUR_VS_THREE = """\
name: {name}
model: null
cache: {{block_size: 16, num_gpu_blocks: 10, num_cpu_blocks: 0, sliding_window: 24}}
scheduler: {{design: {design}, max_model_len: 128}}
workload:
  kind: inline
  requests:
    - {{arrival_s: 0.0, prompt_tokens: 112, output_tokens: 8}}
    - {{arrival_s: 0.0, prompt_tokens: 64, output_tokens: 8}}
step_time:
  linear: {{fixed_s: 0.005}}
expect: {{violations: {expect}}}
"""


def write(tmp_path: Path, name: str, design: str, expect: str) -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(FOUR_VS_THREE.format(name=name, design=design, expect=expect))
    return path


@pytest.fixture
def failing(tmp_path: Path) -> Path:
    """v0-v2 shows admission_undercount + leaked_blocks (+ overtake); this expects refcount."""
    return write(tmp_path, "wrong-expectation", "v0-v2", "[leaked_blocks, refcount]")


@pytest.fixture
def passing(tmp_path: Path) -> Path:
    return write(tmp_path, "clean-v1-engine", "v1-engine", "none")


# ---------------------------------------------------------------- comparison rules
def test_compare_none_fails_on_any_violation():
    status, reason, unexpected, _ = compare("none", ["leaked_blocks"], None)
    assert status is Status.FAILED and unexpected == ["leaked_blocks"]
    assert "unexpected violation: leaked_blocks" in reason


def test_compare_none_fails_on_fatal_engine_error():
    status, reason, _, _ = compare("none", [], "Aborted due to the lack of CPU swap space")
    assert status is Status.FAILED and "fatal engine error" in reason


def test_compare_any_and_exact_list():
    assert compare("any", [], None)[0] is Status.FAILED
    assert compare("any", ["refcount"], None)[0] is Status.PASSED
    assert compare(["refcount"], ["refcount"], None)[0] is Status.PASSED
    status, reason, unexpected, missing = compare(
        ["refcount", "watermark"], ["refcount", "double_free"], None
    )
    assert status is Status.FAILED
    assert unexpected == ["double_free"] and missing == ["watermark"]
    assert reason == "unexpected violation: double_free; expected violation missing: watermark"


# ---------------------------------------------------------------- the shipped scenarios
def test_swa_4_vs_3_scenarios_hold_their_expectations():
    outcomes = check_paths(SWA_4_VS_3)
    assert len(outcomes) == 4
    assert [o.reason for o in outcomes if not o.passed] == []
    by_design = {o.design: o for o in outcomes}
    assert "admission_undercount" in by_design["v0-v2"].observed_kinds
    assert by_design["v0-fixed"].observed_kinds == []
    assert by_design["v1-engine"].observed_kinds == []


def test_regression_scenarios_hold_their_expectations():
    outcomes = check_paths([REGRESSIONS])
    assert outcomes, "tests/regressions holds the shrunk reproducers"
    assert [o.one_line() for o in outcomes if not o.passed] == []


def test_kvsim_check_scenarios_folder():
    """The project's own CI gate: `kvsim check scenarios/` exits 0 (~25 s: the Azure trace)."""
    result = runner.invoke(app, ["check", str(SCENARIOS)])
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------- exit codes
def test_exit_0_when_all_expectations_hold(passing):
    result = runner.invoke(app, ["check", str(passing)])
    assert result.exit_code == 0, result.output
    assert "1 passed, 0 failed" in result.output


def test_exit_1_on_unexpected_or_missing_violation(failing, passing):
    result = runner.invoke(app, ["check", str(passing), str(failing)])
    assert result.exit_code == 1, result.output
    assert "unexpected violation: admission_overtake, admission_undercount" in result.output
    assert "expected violation missing: refcount" in result.output
    assert f"kvsim run {failing} --no-plots" in result.output.replace("\n", "")


def test_exit_1_when_a_known_bug_is_gone(tmp_path):
    path = write(tmp_path, "bug-expected-on-v1", "v1-engine", "[admission_undercount]")
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 1
    assert "expected violation missing: admission_undercount" in result.output


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name: [unclosed\n", "invalid YAML"),
        (
            "name: x\nworkload: {kind: inline, requests: [{arrival_s: 0, prompt_tokens: 4, output_tokens: 1}]}\nbogus: 1\n",
            "unknown key 'bogus'",
        ),
        ("just a string\n", "must be a YAML mapping"),
    ],
)
def test_exit_2_on_invalid_scenario(tmp_path, passing, content, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    result = runner.invoke(app, ["check", str(passing), str(bad)])
    assert result.exit_code == 2
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and message in errors[0] and "bad.yaml" in errors[0]
    assert errors[0].startswith("error: ")
    # The valid scenario still ran, so the reports are complete.
    assert "1 passed, 0 failed, 1 bad input (not run)" in result.stdout


def test_exit_2_on_missing_path_and_empty_folder(tmp_path):
    result = runner.invoke(app, ["check", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2 and "no such file or directory" in result.output
    empty = tmp_path / "empty"
    empty.mkdir()
    result = runner.invoke(app, ["check", str(empty)])
    assert result.exit_code == 2 and "no scenario files" in result.output


def test_exit_2_on_unreadable_trace(tmp_path):
    path = tmp_path / "trace.yaml"
    path.write_text(
        "model: null\nscheduler: {max_model_len: 64}\ncache: {num_gpu_blocks: 8}\n"
        "workload: {kind: trace, path: missing.csv, format: azure}\n"
        "step_time: {linear: {fixed_s: 0.01}}\n"
    )
    result = runner.invoke(app, ["check", str(path)])
    assert result.exit_code == 2
    assert "missing.csv" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_folder_is_searched_recursively(tmp_path):
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    write(sub, "deep", "v0-fixed", "none")
    write(tmp_path, "top", "v0-v1", "none")
    outcomes = check_paths([tmp_path])
    assert sorted(o.name for o in outcomes) == ["deep", "top"]
    assert exit_code(outcomes) == 0


# ---------------------------------------------------------------- reports
def test_junit_xml_parses_back(tmp_path, failing, passing):
    junit = tmp_path / "out" / "junit.xml"
    result = runner.invoke(app, ["check", str(passing), str(failing), "--junit", str(junit)])
    assert result.exit_code == 1
    root = ET.parse(junit).getroot()
    assert root.tag == "testsuites"
    suite = root.find("testsuite")
    assert suite is not None
    assert suite.get("tests") == "2" and suite.get("failures") == "1" and suite.get("errors") == "0"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["clean-v1-engine", "wrong-expectation"]
    assert cases[0].find("failure") is None
    failure = cases[1].find("failure")
    assert failure is not None
    assert "\n" not in failure.get("message")
    assert "expected violation missing: refcount" in failure.get("message")
    assert f"reproduce locally: kvsim run {failing} --no-plots" in failure.text
    assert "seed 0" in failure.text
    assert "admission_undercount (x1) at t=0 s: can_allocate counted 3 blocks" in failure.text
    for case in cases:
        assert float(case.get("time")) >= 0
        assert case.get("file", "").endswith(".yaml")


def test_json_report(tmp_path, failing, passing):
    out = tmp_path / "check.json"
    runner.invoke(app, ["check", str(passing), str(failing), "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["num_scenarios"] == 2 and data["num_failed"] == 1 and data["exit_code"] == 1
    failed = data["scenarios"][1]
    assert failed["status"] == "failed"
    assert failed["missing_kinds"] == ["refcount"]
    assert failed["reproduce"] == f"kvsim run {failing} --no-plots"


def test_github_annotations_only_in_github_actions(failing, passing, monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    result = runner.invoke(app, ["check", str(passing), str(failing)])
    errors = [line for line in result.output.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1
    assert errors[0].startswith(
        f"::error file={str(failing).replace(':', '%3A')},title=kvsim check%3A wrong-expectation::"
    )
    assert "%0Areproduce locally: kvsim run" in errors[0]
    monkeypatch.setenv("GITHUB_ACTIONS", "false")
    result = runner.invoke(app, ["check", str(failing)])
    assert "::error" not in result.output
    assert not in_github_actions({}) and in_github_actions({"GITHUB_ACTIONS": "true"})


def test_annotation_escapes_percent_and_newlines(failing):
    (outcome,) = check_paths([failing])
    outcome.reason = "100% wrong,\r\nreally"
    line = github_annotation(outcome)
    assert "\n" not in line and "\r" not in line
    assert "100%25 wrong,%0D%0Areally" in line


def test_simulator_crash_is_a_junit_error_not_a_traceback(passing, monkeypatch):
    import sim.engine.run

    def boom(*args, **kwargs):
        raise RuntimeError("engine exploded")

    monkeypatch.setattr(sim.engine.run, "run", boom)
    (outcome,) = check_paths([passing])
    assert not outcome.passed and outcome.crashed
    assert "the simulator raised RuntimeError: engine exploded" in outcome.reason
    root = ET.fromstring(junit_xml([outcome]))
    suite = root.find("testsuite")
    assert suite.get("errors") == "1" and suite.get("failures") == "0"
    assert suite.find("testcase/error") is not None


def test_check_not_scenarios_refuses_yaml_reports_inside_checked_folders(tmp_path):
    """A .yaml/.yml report under a checked folder is refused however it is spelled."""
    from sim.cli.ci import check_not_scenarios
    from sim.files.outdir import OutputPathError

    folder = tmp_path / "d"
    (folder / "sub").mkdir(parents=True)
    (tmp_path / "link").symlink_to(folder)
    for report in (
        folder / "r.yaml",
        folder / "sub" / "new" / "r.yml",
        tmp_path / "link" / "r.yaml",
    ):
        with pytest.raises(OutputPathError, match="--json would write"):
            check_not_scenarios({"--json": report, "--junit": None}, [folder])
    # Another suffix, a path outside, or only files named (no folder searched): allowed.
    check_not_scenarios({"--json": folder / "r.json"}, [folder])
    check_not_scenarios({"--json": tmp_path / "r.yaml"}, [folder])
    check_not_scenarios({"--junit": folder / "r.yaml"}, [folder / "s.yaml"])
