"""Lockstep tier for Mamba state groups (issue #23 part 1): kvsim's `MambaManager` (caching
off, vLLM's default mode) under the hybrid coordinator against the real manager of each
release it models (0.11.0, 0.33.0), and mutations the comparison must catch.

Each check runs in a subprocess (the releases' dependencies differ, see
test_vllm_2026_pins_lockstep.py). Skipped when an install is absent; a failure under
KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.vllm_install import root_or_skip

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm

RELEASES = ["0.11.0", "0.33.0"]


def _python(version: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter on the Python sources (a mutation patches a class,
    which compiled classes do not allow)."""
    root_or_skip(version)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KVSIM_NATIVE": "0"}
    return subprocess.run(
        [sys.executable, "-c", script, version, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        check=False,
    )


_VERIFY = """
import sys
from sim.kv.v1_engine.mamba import MambaManager
from sim.vllm_real.lockstep import verify
version, mutation = sys.argv[1], sys.argv[2]
if mutation == "state-per-block":  # the state table grown like attention's, 4 tokens a block
    init = MambaManager.__init__
    MambaManager.__init__ = lambda self, pool, block_size: init(self, pool, 4)
elif mutation == "uncounted-state":  # the state block taken but never counted
    MambaManager.get_num_blocks_to_allocate = lambda self, request_id, tokens, hits: 0
print(verify(None, "v1-engine", 10_000, 7, vllm_version=version, hybrid=True).summary())
"""


def _mamba_ops(summary: str) -> int:
    """Operations on layouts with a Mamba group, from a verify summary."""
    return sum(int(n) for n in re.findall(r"Mamba (\d+)", summary))


@pytest.mark.parametrize("version", RELEASES)
def test_mamba_groups_identical_to_real(version):
    """10,000 hybrid operations, of which >= 2,000 on full + Mamba (+ sliding) layouts."""
    out = _python(version, _VERIFY, "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"v1-engine vs vLLM {version}: identical over" in out.stdout, out.stdout
    assert "full + sliding window + Mamba" in out.stdout, out.stdout
    assert _mamba_ops(out.stdout) >= 2_000, out.stdout


@pytest.mark.parametrize("mutation", ["state-per-block", "uncounted-state"])
def test_the_comparison_catches_a_changed_mamba_rule(mutation):
    """The comparison can fail: a Mamba table grown per attention-sized block instead of one
    max_model_len block, and a count that leaves the state block out, each decide."""
    out = _python("0.33.0", _VERIFY, mutation)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


def test_mamba_summary_parse_reads_both_layouts():
    summary = "by layout: full + Mamba 801, full + sliding window + Mamba 2603"
    assert _mamba_ops(summary) == 3404
