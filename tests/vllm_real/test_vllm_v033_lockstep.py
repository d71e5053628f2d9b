"""Lockstep tier for vLLM 0.33.0: kvsim's 0.33.0 pin against the real 0.33.0 manager and Scheduler.

Needs `bash scripts/setup_vllm.sh 0.33.0` (CI's `.ci/run` installs it). Each check runs the
`kvsim verify` CLI in a subprocess: 0.33.0's pinned dependencies (transformers 5, ...) live in
`.vllm/0.33.0/_deps`, and a process that already imported 0.11.0's would keep those.
Skipped, with the reason shown, when the install is absent; a failure under
KVSIM_REQUIRE_VLLM=1, as for the other lockstep tiers.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.harness.vllm_install import root_or_skip
from tests.harness.zygote import run_python

ROOT = Path(__file__).resolve().parents[2]

#: Every test here belongs to the lockstep tier (`pytest -m vllm` selects them).
pytestmark = pytest.mark.vllm


def _verify(*args: str) -> subprocess.CompletedProcess[str]:
    root_or_skip("0.33.0")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["-m", "sim.cli", "verify", "--vllm-version", "0.33.0", *args]
    return run_python(argv, vllm_version="0.33.0", env=env, cwd=ROOT)


@pytest.mark.parametrize("hybrid", [False, True], ids=["one-group", "hybrid"])
def test_manager_identical_to_real_0_33(hybrid):
    """The V1 manager pinned to 0.33.0 (chosen from the loaded version) vs the real one."""
    extra = ["--hybrid"] if hybrid else []
    # Issue #14's acceptance size: >= 10,000 operations in >= 50 workloads, in CI.
    out = _verify("--design", "v1-engine", "--num-ops", "10000", *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.match(
        r"v1-engine vs vLLM 0.33.0: identical over (\d+) operations \((\d+) workloads", out.stdout
    )
    assert found and int(found[1]) >= 10_000 and int(found[2]) >= 50, out.stdout


def test_loaded_version_picks_kvsims_pin():
    from sim.vllm_real.lockstep import v1_pin_for

    assert v1_pin_for((0, 33, 0)) == "0.33.0"
    assert v1_pin_for((0, 11, 0)) is None  # 4ac7713, which decides as 0.10 / 0.11 do


def test_scheduler_identical_to_real_0_33():
    """Without --pin the loaded 0.33.0 selects kvsim's 0.33.0 pin, and only that one."""
    out = _verify("--scheduler", "--num-workloads", "50")  # the acceptance size
    assert out.returncode == 0, out.stdout + out.stderr
    (line,) = out.stdout.splitlines()  # one pin compared
    assert line.startswith("v1-engine @0.33.0 scheduler vs vLLM 0.33.0: identical over 50 "), line


def test_scheduler_pinned_to_4ac7713_diverges_from_real_0_33():
    """The comparison can fail: 4ac7713 caps a lone prompt at the long-prefill threshold."""
    out = _verify("--scheduler", "--pin", "4ac7713", "--num-workloads", "20")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "v1-engine @4ac7713 scheduler vs vLLM 0.33.0: DIVERGED" in out.stdout
