"""Lockstep tier for the V1 *scheduler* on hybrid models: `kvsim verify --scheduler --hybrid`
draws Mamba hybrids (1-2 full, 1-3 Mamba, maybe a sliding group, and on releases that have
them a sink, R-SWA or circular-buffer group; prefix caching off) in half the workloads, and
kvsim's `V1Scheduler` must decide every step as vLLM's real `Scheduler` does, synchronous and
async; mutations of the Mamba and variant managers must make it fail.

Each check runs in a subprocess (the releases' dependencies differ). Skipped when an install
is absent; a failure under KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.vllm_real.test_chunked_local_lockstep import _python as run_python

pytestmark = pytest.mark.vllm

_VERIFY = """
import sys
from sim.kv.v1_engine import full_variants as fv
from sim.kv.v1_engine.mamba import MambaManager
from sim.vllm_real.sched_lockstep import verify_scheduler
version, mutation, run_async = sys.argv[1], sys.argv[2], sys.argv[3] == "async"
if mutation == "state-per-block":  # the Mamba state table grown per 4-token block
    init = MambaManager.__init__
    MambaManager.__init__ = lambda self, pool, block_size: init(self, pool, 4)
elif mutation == "rswa-no-gap":
    fv.RSWAManager.remove_skipped_blocks = lambda self, r, c, p=None: None
elif mutation == "sink-unreserved":
    fv.SinkFullAttentionManager.reserve_sink_blocks = lambda self: None
result = verify_scheduler(
    60, 0, pin=version, vllm_version=version, hybrid=True, async_scheduling=run_async
)
print(result.summary())
"""


def _verify(version: str, mutation: str = "none", mode: str = "sync") -> str:
    out: subprocess.CompletedProcess[str] = run_python(
        version, _VERIFY, mutation, mode, sources=mutation != "none"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _counts(summary: str) -> tuple[int, int]:
    """(Mamba-hybrid workloads, those with a variant group) from a summary."""
    found = re.search(r"(\d+) Mamba-hybrid workloads, \d+ of their steps, (\d+) with", summary)
    assert found, summary
    return int(found.group(1)), int(found.group(2))


@pytest.mark.parametrize(
    ("version", "mode"),
    [
        ("0.11.0", "sync"),
        ("0.19.1", "sync"),
        ("0.20.0", "sync"),
        ("0.25.1", "sync"),
        ("0.26.0", "sync"),
        ("0.33.0", "sync"),
        ("0.26.0", "async"),
        ("0.33.0", "async"),
    ],
)
def test_hybrid_scheduler_identical_to_real(version, mode):
    """60 workloads at seed 0, >= 20 on Mamba hybrids, >= 10 of them (from 0.19.1) with a
    sink, R-SWA or circular-buffer group."""
    out = _verify(version, mode=mode)
    assert f"vs vLLM {version}: identical over 60 workloads" in out, out
    mamba, variants = _counts(out)
    assert mamba >= 20, out
    assert variants >= (10 if version != "0.11.0" else 0), out


@pytest.mark.parametrize(
    ("mutation", "version"),
    [("state-per-block", "0.33.0"), ("rswa-no-gap", "0.25.1"), ("sink-unreserved", "0.20.0")],
)
def test_the_scheduler_comparison_catches_a_changed_group_rule(mutation, version):
    out = _verify(version, mutation)
    assert "DIVERGED" in out, out


def test_counts_parse():
    summary = "(...; 32 Mamba-hybrid workloads, 1330 of their steps, 19 with a sink, ...)"
    assert _counts(summary) == (32, 19)
