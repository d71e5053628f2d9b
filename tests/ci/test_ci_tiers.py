"""The test tiers skip or fail as documented, whatever is installed.

* Without torch (the optional `calibrate` extra), tests/latency/test_calibrate.py skips with a reason:
  a plain `pip install -e '.[test]'` has no torch, and collection must not fail there.
* The lockstep tier (tests/vllm_real/test_vllm_lockstep.py, `-m vllm`) skips without a vLLM install,
  but FAILS with KVSIM_REQUIRE_VLLM=1 (what `.ci/run` sets): a silent skip would let CI pass
  without it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_calibrate_tests_skip_with_a_reason_when_torch_is_absent(tmp_path):
    # A `torch` package that fails to import the way a missing one does, first on the path.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-o",
            "addopts=",
            "tests/latency/test_calibrate.py",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = result.stdout + result.stderr
    # Exit 5 is "no tests ran" (the module skipped as a whole); a collection error exits 2.
    assert result.returncode == 5 and "1 skipped" in output, output
    assert "error" not in output.lower(), output
    assert "torch is not installed" in output, output


def _pytest(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-o", "addopts=", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_lockstep_tier_fails_instead_of_skipping_when_vllm_is_required(tmp_path):
    # A pytest plugin that makes every vLLM install look absent (whatever .vllm/ holds).
    (tmp_path / "no_vllm_here.py").write_text(
        "import sim.vllm_real.loader as loader\n"
        "def _absent(*args, **kwargs):\n"
        "    raise loader.VllmNotAvailableError('absent for this test: run scripts/setup_vllm.sh')\n"
        "loader.resolve_root = _absent\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    env.pop("KVSIM_REQUIRE_VLLM", None)
    args = ["-p", "no_vllm_here", "-m", "vllm", "tests/vllm_real/test_vllm_lockstep.py"]
    skipped = _pytest(args, env)
    output = skipped.stdout + skipped.stderr
    assert skipped.returncode == 0, output
    assert "skipped" in output and "vLLM 0.5.4 not set up" in output, output
    required = _pytest(args, {**env, "KVSIM_REQUIRE_VLLM": "1"})
    output = required.stdout + required.stderr
    assert required.returncode != 0, output
    assert "KVSIM_REQUIRE_VLLM=1 but vLLM 0.5.4 is not set up" in output, output
