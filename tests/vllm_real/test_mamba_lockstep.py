"""Lockstep tier for Mamba state groups (issue #23 part 1): kvsim's `MambaManager` (caching
off, vLLM's default mode) under the hybrid coordinator against the real manager of each
release it models (0.11.0, 0.19.1, 0.20.0, 0.25.1, 0.26.0, 0.33.0), and mutations the
comparison must catch.

Each check runs in a subprocess (the releases' dependencies differ, see
test_vllm_2026_pins_lockstep.py), through the chunked-local tier's helper. Skipped when an
install is absent; a failure under KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.harness.vllm_install import root_or_skip
from tests.vllm_real.test_chunked_local_lockstep import _python as run_python

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.vllm

RELEASES = ["0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]


def _python(version: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`script` in a fresh interpreter on the Python sources (a mutation patches a class)."""
    return run_python(version, script, *args, sources=True)


_VERIFY = """
import sys
from sim.kv.v1_engine.mamba import MambaManager
from sim.vllm_real.lockstep import verify
version, mutation = sys.argv[1], sys.argv[2]
if mutation == "state-per-block":  # the state table grown like attention's, 4 tokens a block
    init = MambaManager.__init__
    MambaManager.__init__ = lambda self, pool, block_size: init(self, pool, 4)
elif mutation == "uncounted-state":  # the state block taken but never counted
    MambaManager.get_num_blocks_to_allocate = lambda self, request_id, tokens, hits, **kw: 0
print(verify(None, "v1-engine", 10_000, 7, vllm_version=version, hybrid=True).summary())
"""


def _mamba_ops(summary: str) -> int:
    """Operations on layouts with a Mamba group, caching off or ("align") on, from a verify
    summary."""
    pattern = r"Mamba(?:, caching \('(?:align|all)'\))? (\d+)"
    return sum(int(n) for n in re.findall(pattern, summary))


@pytest.mark.parametrize("version", RELEASES)
def test_mamba_groups_identical_to_real(version):
    """10,000 hybrid operations, of which >= 2,000 on full + Mamba (+ sliding) layouts (on
    0.19.1-0.26.0 some with prefix caching on: test_mamba_align_lockstep.py)."""
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
    summary = "by layout: full + Mamba 1603, full + sliding window + Mamba 1803"
    assert _mamba_ops(summary) == 3406
    assert _mamba_ops(summary + ", full + Mamba, caching ('align') 10") == 3416
    assert _mamba_ops(summary + ", full + Mamba, caching ('all') 10") == 3416


_REPRODUCER = """
import sys
from sim.engine.run import run
path, root = sys.argv[2], sys.argv[3]
result = run(path, vllm_root=root)
print("kinds:", sorted(result.summary["violation_kinds"]))
"""

UNDERCOUNT = (
    ROOT
    / "tests"
    / "regressions"
    / "v1_engine_0_20_0_mamba_hybrid_capped_count_undercount_vllm_45856.yaml"
)


@pytest.mark.parametrize(("version", "undercounts"), [("0.20.0", True), ("0.25.1", False)])
def test_mamba_hybrid_undercount_on_the_real_manager_vllm_45856(version, undercounts, tmp_path):
    """The Mamba-hybrid reproducer of #45856 on each release's real manager under kvsim's
    scheduler: 0.20.0's capped count runs the pool dry, 0.25.1's does not."""
    root = root_or_skip(version)
    path = tmp_path / "reproducer.yaml"
    text = UNDERCOUNT.read_text(encoding="utf-8")
    path.write_text(text.replace("vllm_version: 0.20.0", f"vllm_version: {version}"))
    out = _python(version, _REPRODUCER, str(path), str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("admission_undercount" in out.stdout) == undercounts, out.stdout
