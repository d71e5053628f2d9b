"""`kvsim shrink`: ddmin to a 1-minimal, self-contained reproducer of one violation kind."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.ci.check import check_paths
from sim.ci.shrink import NothingToShrink, ddmin, minimize_int, shrink
from sim.cli.main import app
from sim.engine.run import run
from sim.scenario.schema import load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
MISTRAL_AZURE = ROOT / "scenarios" / "mistral_azure_conv_swa.yaml"
runner = CliRunner()
#: The noisy case shrinks in 70 simulator runs today; twice that means the shrinker regressed.
NOISY_SHRINK_MAX_RUNS = 140


def noisy_4_vs_3() -> dict:
    """The 4-vs-3 case (A 112 tokens, B 64 tokens at t=0.5) among 14 unrelated short requests.

    11 GPU blocks: the early requests' decodes create V2's null block (held for good), so A
    leaves 11 - 1 - 7 = 3 free and B (4 blocks, counted 3) trips the undercount.
    """
    requests = [
        {"arrival_s": 0.01 * i, "prompt_tokens": 8 + i, "output_tokens": 2} for i in range(6)
    ]
    requests += [
        {"arrival_s": 0.5, "prompt_tokens": 112, "output_tokens": 8},
        {"arrival_s": 0.5, "prompt_tokens": 64, "output_tokens": 8},
    ]
    requests += [
        {"arrival_s": 0.6 + 0.05 * i, "prompt_tokens": 20, "output_tokens": 3} for i in range(8)
    ]
    return {
        "name": "noisy-4-vs-3",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": 11,
            "num_cpu_blocks": 0,
            "sliding_window": 24,
        },
        "scheduler": {"design": "v0-v2", "max_model_len": 160},
        "workload": {"kind": "inline", "requests": requests},
        "step_time": {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001}},
    }


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def kinds_without(scenario, index: int) -> set[str]:
    requests = [r for i, r in enumerate(scenario.workload.requests) if i != index]
    workload = scenario.workload.model_copy(update={"requests": requests})
    return run(scenario.model_copy(update={"workload": workload})).violation_kinds


def assert_one_minimal(scenario, kind: str) -> None:
    assert kind in run(scenario).violation_kinds
    for index in range(len(scenario.workload.requests)):
        assert kind not in kinds_without(scenario, index), f"request {index} is not needed"


# ---------------------------------------------------------------- the algorithms
def test_ddmin_finds_the_two_needed_items():
    calls = []

    def test(items):
        calls.append(list(items))
        return 3 in items and 7 in items

    assert ddmin(list(range(10)), test) == [3, 7]
    assert len(calls) < 60  # ddmin is quadratic at worst; the shrinker caches repeated runs


def test_ddmin_single_cause_and_order_kept():
    assert ddmin(list(range(16)), lambda items: 11 in items) == [11]
    assert ddmin([5, 1, 9, 2], lambda items: 9 in items and 5 in items) == [5, 9]


def test_minimize_int():
    assert minimize_int(100, 1, lambda v: v >= 37) == 37
    assert minimize_int(100, 1, lambda v: True) == 1
    assert minimize_int(1, 1, lambda v: False) == 1


# ---------------------------------------------------------------- shrinking scenarios
def test_shrinks_the_noisy_4_vs_3_case_to_a_1_minimal_reproducer(tmp_path):
    source = write_yaml(tmp_path / "noisy.yaml", noisy_4_vs_3())
    assert "admission_undercount" in run(source).violation_kinds
    result = shrink(load_scenario(source), tmp_path, "admission_undercount", str(source))
    # The effort, counted in simulator runs (not seconds; benchmarks/ci_speed.py times it).
    assert result.num_runs < NOISY_SHRINK_MAX_RUNS, result.num_runs
    assert result.start_num_requests == 16
    assert result.final_num_requests <= 3
    assert result.final_num_gpu_blocks <= 11
    out = tmp_path / "minimal.yaml"
    out.write_text(result.to_yaml())
    minimal = load_scenario(out)  # self-contained and valid
    assert minimal.workload.kind == "inline"
    assert minimal.scheduler.design.value == "v0-v2"
    assert minimal.cache.num_gpu_blocks == result.final_num_gpu_blocks
    assert "admission_undercount" in run(out).violation_kinds  # `kvsim run` reproduces it
    assert_one_minimal(minimal, "admission_undercount")
    (outcome,) = check_paths([out])  # can be checked in as a regression test
    assert outcome.passed, outcome.reason


def test_default_kind_is_the_first_violation(tmp_path):
    source = write_yaml(tmp_path / "noisy.yaml", noisy_4_vs_3())
    first = run(source).violations.sort_values("time_s", kind="stable").iloc[0]["kind"]
    result = shrink(load_scenario(source), tmp_path, None, str(source))
    assert result.kind == first
    assert result.kind in run(result.scenario).violation_kinds


def test_clean_scenario_has_nothing_to_shrink(tmp_path):
    data = noisy_4_vs_3() | {"scheduler": {"design": "v0-fixed", "max_model_len": 160}}
    with pytest.raises(NothingToShrink, match="shows no violation"):
        shrink(scenario_from_dict(data), tmp_path)
    with pytest.raises(NothingToShrink, match="shows no refcount"):
        shrink(scenario_from_dict(noisy_4_vs_3()), tmp_path, "refcount")


# ---------------------------------------------------------------- CLI
def test_cli_writes_minimal_yaml(tmp_path):
    source = write_yaml(tmp_path / "noisy.yaml", noisy_4_vs_3())
    out = tmp_path / "min" / "minimal.yaml"
    result = runner.invoke(app, ["shrink", str(source), "-o", str(out), "--kind", "leaked_blocks"])
    assert result.exit_code == 0, result.output
    assert "16 -> " in result.output and "reproduce with: kvsim run" in result.output.replace(
        "\n", " "
    )
    assert out.read_text().startswith("# Minimal reproducer of leaked_blocks")
    assert "leaked_blocks" in run(out).violation_kinds


def test_cli_run_directory_with_scenario(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_yaml(run_dir / "scenario.yaml", noisy_4_vs_3())
    result = runner.invoke(app, ["shrink", str(run_dir), "-o", str(tmp_path / "m.yaml")])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("setup", "args", "code", "message"),
    [
        ("missing", [], 2, "no such file"),
        ("rundir", [], 2, "needs the scenario.yaml it ran"),
        ("noisy", ["--kind", "nonsense"], 2, "--kind 'nonsense': expected one of"),
        ("clean", [], 1, "shows no violation"),
        ("noisy", ["--kind", "refcount"], 1, "shows no refcount"),
    ],
)
def test_cli_errors(tmp_path, setup, args, code, message):
    if setup == "missing":
        source = tmp_path / "nope.yaml"
    elif setup == "rundir":
        source = tmp_path / "rundir"
        source.mkdir()
    elif setup == "clean":
        data = noisy_4_vs_3() | {"scheduler": {"design": "v0-v1", "max_model_len": 160}}
        source = write_yaml(tmp_path / "clean.yaml", data)
    else:
        source = write_yaml(tmp_path / "noisy.yaml", noisy_4_vs_3())
    result = runner.invoke(app, ["shrink", str(source), "-o", str(tmp_path / "m.yaml"), *args])
    assert result.exit_code == code, result.output
    assert message in result.output
    assert not (tmp_path / "m.yaml").exists()


@pytest.mark.slow
@pytest.mark.skipif(not MISTRAL_AZURE.exists(), reason="scenario written by the lead")
def test_mistral_azure_trace_shrinks_to_at_most_3_requests(tmp_path):
    """19,366 Azure conversation requests -> <= 3 (measured: 2 requests, ~40 s, ~680 runs)."""
    result = shrink(load_scenario(MISTRAL_AZURE), MISTRAL_AZURE.parent, "admission_undercount")
    assert result.start_num_requests > 10_000
    assert result.final_num_requests <= 3
    out = tmp_path / "mistral_min.yaml"
    out.write_text(result.to_yaml())
    minimal = load_scenario(out)
    assert minimal.model == "mistral-7b-v0.1"
    assert_one_minimal(minimal, "admission_undercount")


def test_no_progress_fuzz_finding_shrinks_to_the_max_model_len_prompt(tmp_path):
    """`kvsim shrink --kind no_progress` on the V1 fuzz case that hangs (vLLM #29496): what is
    left is the one chunked prompt of exactly max_model_len tokens."""
    from sim.ci.fuzz_cases import generate_case
    from sim.scenario.schema import scenario_to_yaml

    source = tmp_path / "fuzz.yaml"
    source.write_text(scenario_to_yaml(generate_case("v1-engine", 673228719)))
    out = tmp_path / "minimal.yaml"
    result = runner.invoke(app, ["shrink", str(source), "-o", str(out), "--kind", "no_progress"])
    assert result.exit_code == 0, result.output
    minimal = load_scenario(out)
    (request,) = minimal.workload.requests
    assert request.prompt_tokens == minimal.scheduler.max_model_len
    assert run(out).violation_kinds == {"no_progress"}
    (outcome,) = check_paths([out])
    assert outcome.passed, outcome.reason
