"""Lockstep tier for 0.33.0's sparse prefix-cache retention of sliding-window groups (issue #23,
"the #7470 class in today's vLLM"; `sim.kv.v1_engine.sliding_retention`): kvsim's managers
(one sliding group, full + sliding hybrids, with the shared-prefix junction the walk keeps on
the request as the scheduler does) and its V1 scheduler against vLLM 0.33.0's real ones with
`prefix_cache_retention_interval` 0, and mutations of the model the comparison must catch.

Each check runs in a subprocess on the Python sources (a mutation patches a class), through
the chunked-local tier's helper. Skipped when the install is absent; a failure under
KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.vllm_real.test_chunked_local_lockstep import _python as run_python

pytestmark = pytest.mark.vllm


def _python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python("0.33.0", script, *args, sources=True)


_MUTATIONS = """
from sim.kv.v1_engine import sliding_retention as sr
def mutate(mutation):
    keep = sr.SparseWindowRetention.retained_mask
    if mutation == "dense":  # every full block cached, as before this model
        sr.SparseWindowRetention.retained_mask = lambda self, s, e, b: [True] * (e - s)
    elif mutation == "no-junction":  # only the replay boundary's window kept
        sr.SparseWindowRetention.retained_mask = lambda self, s, e, b: keep(self, s, e, b[:1])
    elif mutation == "window-past-boundary":  # the window ending one block above it
        sr.SparseWindowRetention.retained_mask = lambda self, s, e, b: keep(
            self, s, e, tuple(x + self.block_size if x else 0 for x in b)
        )
"""

_VERIFY = (
    _MUTATIONS
    + """
import sys
from sim.vllm_real.lockstep import verify
mutate(sys.argv[2])
hybrid = sys.argv[3] == "hybrid"
print(verify(None, "v1-engine", 10_000, 7, vllm_version="0.33.0", hybrid=hybrid).summary())
"""
)

_SCHED = (
    _MUTATIONS
    + """
import sys
from sim.vllm_real.sched_lockstep import verify_scheduler
mutate(sys.argv[2])
asynchronous = sys.argv[3] == "async"
r = verify_scheduler(200, 7, pin="0.33.0", vllm_version="0.33.0", async_scheduling=asynchronous)
print(r.summary())
"""
)


def _sparse_ops(summary: str) -> int:
    """Operations on layouts under sparse retention with a sliding window (one group counts:
    the non-hybrid walk's sparse configs are half sliding), from a verify summary."""
    return sum(
        int(n)
        for n in re.findall(
            r"(?:one group|full \+ sliding window) with sparse retention (\d+)", summary
        )
    )


@pytest.mark.parametrize("walk", ["hybrid", "one-group"])
def test_sparse_sliding_retention_identical_to_real(walk):
    """`kvsim verify --design v1-engine [--hybrid] --vllm-version 0.33.0 --num-ops 10000
    --seed 7`: identical, with >= 300 operations on sliding layouts under sparse retention."""
    out = _python(_VERIFY, "none", walk)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "v1-engine vs vLLM 0.33.0: identical over" in out.stdout, out.stdout
    assert _sparse_ops(out.stdout) >= 300, out.stdout


@pytest.mark.parametrize(
    ("mutation", "walk"),
    [
        ("dense", "hybrid"),
        ("dense", "one-group"),
        ("no-junction", "hybrid"),
        ("window-past-boundary", "one-group"),
    ],
)
def test_the_comparison_catches_a_changed_retention_rule(mutation, walk):
    """The comparison can fail: dense caching instead of sparse, the junction left out (a
    hybrid's: one group has none), the window kept one block too high, each decide."""
    out = _python(_VERIFY, mutation, walk)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_scheduler_with_sparse_retention_identical_to_real(mode):
    """`kvsim verify --scheduler --vllm-version 0.33.0 --pin 0.33.0 --num-workloads 200
    --seed 7` (and `--async`): identical, with >= 20 sliding-window workloads under sparse
    retention (every 0.33.0 case with a window and caching, as its scenario resolves)."""
    out = _python(_SCHED, "none", mode)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical over 200 workloads" in out.stdout, out.stdout
    found = re.search(r"(\d+) sliding-window workloads with sparse retention", out.stdout)
    assert found and int(found[1]) >= 20, out.stdout


def test_the_scheduler_comparison_catches_dense_caching():
    out = _python(_SCHED, "dense", "sync")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


def test_sparse_ops_parse():
    summary = (
        "by layout: one group 8012, one group with sparse retention 1988, full + sliding "
        "window with sparse retention 401, full + chunked-local with sparse retention 601"
    )
    assert _sparse_ops(summary) == 2389
