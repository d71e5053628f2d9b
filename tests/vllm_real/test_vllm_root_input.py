"""`--vllm-root` input checks that need no vLLM install (so they run outside the `vllm` tier)."""

from __future__ import annotations

from pathlib import Path

import pytest


def test_vllm_root_that_is_not_an_install_is_bad_input(tmp_path):
    """Regression: `--vllm-root` was ignored, so any path (even a missing one) ran kvsim's model
    and exited 0. Now a folder without vLLM is bad input: one line, exit status 2."""
    from typer.testing import CliRunner

    from sim.cli.main import app
    from sim.engine.run import run
    from sim.scenario.schema import ScenarioError

    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "swa_4_vs_3_v0_v2.yaml"
    for root in (tmp_path / "missing", tmp_path):
        with pytest.raises(ScenarioError, match="vllm_root: no vllm package"):
            run(scenario, vllm_root=root)
    result = CliRunner().invoke(
        app,
        ["run", str(scenario), "--vllm-root", str(tmp_path / "missing"), "-o", str(tmp_path / "o")],
    )
    assert result.exit_code == 2
    assert "no vllm package" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_vllm_root_with_v0_fixed_is_bad_input(tmp_path):
    """v0-fixed is kvsim's own design: there is no vLLM code to run for it."""
    from sim.engine.run import run
    from sim.scenario.schema import ScenarioError

    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "swa_4_vs_3_v0_fixed.yaml"
    with pytest.raises(ScenarioError, match="scheduler.design: v0-fixed"):
        run(scenario, vllm_root=tmp_path)
