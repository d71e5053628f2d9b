"""`scheduler.vllm_version` for the v0 designs (`sim.kv.pins`): the pins each design takes,
the default (the 0.5.4 release), the #7371 IndexError the pin switches, and every report naming
the exact version."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import pytest
import yaml
from typer.testing import CliRunner

import sim
from sim.ci.check import explicit_yaml
from sim.cli.main import _design_row, app
from sim.engine.run import resolve
from sim.kv.config import Design
from sim.kv.pins import VllmPin, manager_pin, resolve_pin
from sim.plots.common import subject_of
from sim.scenario.schema import ScenarioError, scenario_from_dict

runner = CliRunner()


def _data(design: str, version: str | None = None, prompt_tokens: int = 32) -> dict:
    """One chunked prompt in 16-token chunks (bs=16): at 32 tokens its last chunk fills the
    table, and the next append is empty, which the 0.5.4 release indexes past (#7371)."""
    scheduler = {
        "design": design,
        "max_model_len": 128,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 16,
        "max_num_seqs": 8,  # at most the budget, or vLLM refuses to start
    }
    if version is not None:
        scheduler["vllm_version"] = version
    return {
        "name": "tiny",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 16, "num_cpu_blocks": 0},
        "scheduler": scheduler,
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": prompt_tokens, "output_tokens": 2}],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
        "expect": {"violations": "any"},
    }


@pytest.mark.parametrize(
    ("design", "version", "pin"),
    [
        ("v0-v1", None, "0.5.4"),
        ("v0-v1", "0.5.4", "0.5.4"),
        ("v0-v2", None, "0.5.4"),
        ("v0-v2", "0.5.4", "0.5.4"),
        ("v0-v2", "0.5.4+7380", "0.5.4+7380"),
        ("v0-fixed", None, "0.5.4"),
        ("v0-fixed", "0.5.4", "0.5.4"),
        ("v1-engine", None, "0.33.0"),
        ("v1-engine", "4ac7713", "4ac7713"),
    ],
)
def test_each_design_resolves_its_default_and_explicit_pins(design, version, pin):
    resolved = resolve(scenario_from_dict(_data(design, version)))
    assert resolved.inputs["vllm_version"] == pin
    assert resolved.engine.kv.vllm_pin == pin


def test_the_v0_default_is_the_release_the_real_code_mode_runs():
    assert all(resolve_pin(design, None) is VllmPin.V0_5_4 for design in ("v0-v1", "v0-v2"))
    assert resolve_pin("v0-v2", None).empty_append_raises
    assert not resolve_pin("v0-v2", "0.5.4+7380").empty_append_raises
    # A v0-V2 manager built without a pin keeps the behaviour it always had: #7380's fix.
    assert not manager_pin("v0-v2", None).empty_append_raises


@pytest.mark.parametrize(
    ("design", "version"),
    [
        ("v0-v1", "0.5.4+7380"),  # V1 makes the same decisions with and without #7380
        ("v0-fixed", "0.5.4+7380"),  # its table never indexes on an empty append
        ("v0-v2", "00c3d68"),  # not modelled exactly (#7193, #6849): no such pin
        ("v0-v2", "0.33.0"),
        ("v1-engine", "0.5.4"),
    ],
)
def test_a_version_the_design_lacks_is_a_one_line_input_error(design, version, tmp_path):
    with pytest.raises(ScenarioError, match=re.escape(f"unknown vLLM version '{version}' for")):
        scenario_from_dict(_data(design, version), "s.yaml")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(_data(design, version)))
    result = runner.invoke(app, ["run", str(path), "-o", str(tmp_path / "out"), "--no-plots"])
    assert result.exit_code == 2, result.output
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "scheduler: vllm_version:" in message


def test_the_7371_index_error_is_switched_by_the_pin():
    """v0-V2 at the 0.5.4 release: the empty append after the last chunk raises (a
    `manager_error`, the request fails); with #7380 it writes nothing and the request ends."""
    release = sim.run(scenario_from_dict(_data("v0-v2")))
    assert list(release.violations["kind"]) == ["manager_error"]
    assert "EmptyAppendIndexError" in release.violations["message"].iloc[0]
    assert release.summary["states"]["failed"] == 1
    fixed = sim.run(scenario_from_dict(_data("v0-v2", "0.5.4+7380")))
    assert len(fixed.violations) == 0 and fixed.summary["states"]["finished"] == 1
    # Not block-aligned (40 tokens): the last chunk leaves room, nothing to raise on either pin.
    unaligned = sim.run(scenario_from_dict(_data("v0-v2", prompt_tokens=40)))
    assert len(unaligned.violations) == 0


@pytest.mark.parametrize("design", ["v0-v1", "v0-fixed"])
def test_designs_without_the_7371_path_finish_the_aligned_prompt(design):
    result = sim.run(scenario_from_dict(_data(design)))
    assert len(result.violations) == 0 and result.summary["states"]["finished"] == 1


def test_design_rows_and_plot_titles_name_the_version():
    assert Design.V0_V2.upstream_at("0.5.4") == "vLLM 0.5.4 v0, BlockSpaceManagerV2"
    assert Design.V0_V2.upstream_at("0.5.4+7380") == ("vLLM 0.5.4 + #7380 v0, BlockSpaceManagerV2")
    assert Design.V0_V1.upstream_at("0.5.4") == "vLLM 0.5.4 v0, BlockSpaceManagerV1"
    assert "vLLM 0.5.4 v0 code" in Design.V0_FIXED.upstream_at("0.5.4")
    assert _design_row("v0-v2", "0.5.4+7380") == (
        "v0-v2 = vLLM 0.5.4 + #7380 v0, BlockSpaceManagerV2"
    )
    inputs = {"scenario": "s", "design": "v0-v2", "vllm_version": "0.5.4+7380"}
    assert "vLLM 0.5.4 + #7380" in subject_of(inputs)


def test_summary_json_and_the_printed_summary_name_the_version(tmp_path):
    path = tmp_path / "pinned.yaml"
    path.write_text(yaml.safe_dump(_data("v0-v2", "0.5.4+7380")))
    out = tmp_path / "out"
    result = runner.invoke(app, ["run", str(path), "-o", str(out), "--no-plots"])
    assert result.exit_code == 0, result.output
    assert "vLLM 0.5.4 + #7380 v0, BlockSpaceManagerV2" in " ".join(result.output.split())
    summary = json.loads((out / "summary.json").read_text())
    assert summary["inputs"]["vllm_version"] == "0.5.4+7380"


def test_check_junit_and_json_name_the_version(tmp_path):
    path = tmp_path / "release.yaml"
    data = _data("v0-v2")
    data["expect"] = {"violations": "none"}  # fails: the release raises #7371 here
    path.write_text(yaml.safe_dump(data))
    junit = tmp_path / "junit.xml"
    result = runner.invoke(app, ["check", str(path), "--junit", str(junit)])
    assert result.exit_code == 1, result.output
    case = ET.parse(junit).getroot().find(".//testcase")
    assert case is not None
    assert "design=v0-v2 vllm_version=0.5.4 " in case.findtext("system-out", "")
    failure = case.find("failure")
    assert failure is not None and "design v0-v2 @ vLLM 0.5.4," in failure.get("message", "")
    report_path = tmp_path / "check.json"
    runner.invoke(app, ["check", str(path), "--json", str(report_path)])
    report = json.loads(report_path.read_text())
    assert report["scenarios"][0]["vllm_version"] == "0.5.4"


def test_sweep_rows_carry_the_version():
    table = sim.sweep(
        _data("v0-v2"),
        {"scheduler.vllm_version": ["0.5.4", "0.5.4+7380"]},
        workers=1,
    )
    assert table["vllm_version"].tolist() == ["0.5.4", "0.5.4+7380"]
    assert table["num_failed"].tolist() == [1, 0]


def test_generated_reproducers_pin_the_version():
    """A shrunk or fuzzed scenario must keep its meaning if a default changes (it did)."""
    text = explicit_yaml(scenario_from_dict(_data("v0-v2")))
    assert yaml.safe_load(text)["scheduler"]["vllm_version"] == "0.5.4"


@pytest.mark.vllm
def test_the_default_agrees_with_the_real_0_5_4_on_the_7371_case():
    """What `--vllm-root .vllm/0.5.4` runs raises where the unpinned model does: the default
    is the release, so model and real code agree without a pin."""
    import os

    from sim.vllm_real.loader import VllmNotAvailableError, resolve_root

    try:
        root = resolve_root(vllm_version="0.5.4")
    except VllmNotAvailableError as exc:
        if os.environ.get("KVSIM_REQUIRE_VLLM") == "1":
            raise
        pytest.skip(f"vLLM 0.5.4 not set up: {exc}")
    model = sim.run(scenario_from_dict(_data("v0-v2")))
    real = sim.run(scenario_from_dict(_data("v0-v2")), vllm_root=root)
    assert real.inputs["vllm_version"] == model.inputs["vllm_version"] == "0.5.4"
    assert list(real.violations["kind"]) == list(model.violations["kind"]) == ["manager_error"]
    assert "EmptyAppendIndexError" in real.violations["message"].iloc[0]
    # Same request outcomes; only the exception's own text differs (vLLM's IndexError message).
    columns = [c for c in model.requests.columns if c != "reason"]
    assert real.requests[columns].equals(model.requests[columns])
    assert real.requests["state"].tolist() == ["failed"]


def test_capacity_rows_carry_the_version():
    from tests.harness.sweep import dd1_scenario

    table = sim.capacity(
        dd1_scenario(40),
        {"ttft_p99": "20ms"},
        compare={"scheduler.vllm_version": ["0.5.4", "0.5.4+7380"]},
        tolerance=0.1,
        workers=1,
    )
    assert table["vllm_version"].tolist() == ["0.5.4", "0.5.4+7380"]
    assert set(table.attrs["probes"]["vllm_version"]) == {"0.5.4", "0.5.4+7380"}
