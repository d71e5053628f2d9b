"""Lockstep tier for Mamba prefix caching (issue #23 item 1, the Mamba cache modes "align" and
"all"): kvsim's `MambaManager` under the hybrid coordinator, and its V1 scheduler's
block-aligned split, against the real manager and scheduler of each release that has the
modes (0.19.1, 0.20.0, 0.25.1, 0.26.0), and mutations of the model the comparison must
catch.

Each check runs in a subprocess on the Python sources (a mutation patches a class), through
the chunked-local tier's helper. Skipped when an install is absent; a failure under
KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.vllm_real.test_chunked_local_lockstep import _python as run_python

pytestmark = pytest.mark.vllm

RELEASES = ["0.19.1", "0.20.0", "0.25.1", "0.26.0"]


def _python(version: str, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python(version, script, *args, sources=True)


_VERIFY = """
import sys
from sim.kv.v1_engine import hybrid_coordinator, mamba
from sim.vllm_real.lockstep import verify
version, mutation = sys.argv[1], sys.argv[2]
M = mamba.MambaManager
if mutation == "no-same-step-refusal":  # a hit on a block cached this step admitted at once
    M.cache_blocks = lambda self, rid, hashes, n: mamba.SingleTypeManager.cache_blocks(
        self, rid, hashes, n
    )
elif mutation == "previous-state-kept":  # the previous state block never freed
    M.allocate_new_blocks = (lambda f: lambda self, rid, n: (
        f(self, rid, n), self.last_state_block_idx.pop(rid, None))[0])(M.allocate_new_blocks)
elif mutation == "leftmost-hit":  # the first cached state, not the last
    def leftmost(pool, hashes, max_length, bs):
        for index in range(max_length // bs):
            found = [pool.get_cached_block(h[index]) for h in hashes]
            if all(b is not None for b in found):
                return [[pool.null_block] * index + [b] for b in found]
        return [[] for _ in hashes]
    hybrid_coordinator.mamba_align_hit = leftmost
print(verify(None, "v1-engine", 10_000, 7, vllm_version=version, hybrid=True).summary())
"""


def _caching_ops(summary: str, mode: str) -> int:
    """Operations on Mamba layouts with prefix caching in `mode`, from a verify summary."""
    match = re.search(rf"caching \('{mode}'\) (\d+)", summary)
    return int(match.group(1)) if match else 0


@pytest.mark.parametrize("version", RELEASES)
def test_mamba_align_identical_to_real(version):
    """`kvsim verify --design v1-engine --hybrid --num-ops 10000 --seed 7`: identical, with
    >= 300 operations on full + Mamba layouts in each caching mode ("align", "all"; the draws
    share the walk with the other group types, so 0.20.0 gets 400 "all" ones)."""
    out = _python(version, _VERIFY, "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"v1-engine vs vLLM {version}: identical over" in out.stdout, out.stdout
    assert "new_step_starts=" in out.stdout, out.stdout
    assert _caching_ops(out.stdout, "align") >= 300, out.stdout
    assert _caching_ops(out.stdout, "all") >= 300, out.stdout


@pytest.mark.parametrize(
    "mutation", ["no-same-step-refusal", "previous-state-kept", "leftmost-hit"]
)
def test_the_comparison_catches_a_changed_align_rule(mutation):
    """The comparison can fail: each of the three "align" rules, changed, decides."""
    out = _python("0.19.1", _VERIFY, mutation)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


def test_caching_summary_parse():
    summary = (
        "by layout: full + Mamba 800, full + Mamba, caching ('align') 2803, "
        "full + Mamba, caching ('all') 12, full + x 1"
    )
    assert _caching_ops(summary, "align") == 2803
    assert _caching_ops(summary, "all") == 12


_SCHED = """
import sys
from sim.scheduler.v1 import mamba_align, scheduler
from sim.vllm_real.sched_lockstep import verify_scheduler
version, mutation = sys.argv[1], sys.argv[2]
if mutation == "no-split":  # prefill chunks not trimmed to block boundaries
    mamba_align.MambaAlignedSplit.split = lambda self, n, *args, **kwargs: n
elif mutation == "floor-only":  # 0.19.1's rule on every release
    scheduler.split_rule_for = lambda pin: mamba_align.SplitRule.FLOOR
asynchronous = mutation == "async"
r = verify_scheduler(
    100, 7, pin=version, vllm_version=version, mamba_align=True, async_scheduling=asynchronous
)
print(r.summary())
"""


@pytest.mark.parametrize("mode", ["none", "async"])
@pytest.mark.parametrize("version", RELEASES)
def test_mamba_align_scheduler_identical_to_real(version, mode):
    """kvsim's V1 scheduler (block-aligned split, new_step_starts) against the release's real
    scheduler on 100 random full + Mamba workloads with prefix caching ("align", a third
    "all"), synchronous and under async scheduling: identical, with prefix hits in some."""
    out = _python(version, _SCHED, mode)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"scheduler vs vLLM {version}: identical over 100 workloads" in out.stdout, out.stdout
    hits = re.search(r"(\d+) workloads with prefix hits", out.stdout)
    assert hits is not None and int(hits.group(1)) >= 10, out.stdout


@pytest.mark.parametrize(
    ("version", "mutation"),
    [("0.19.1", "no-split"), ("0.25.1", "floor-only"), ("0.26.0", "floor-only")],
)
def test_the_scheduler_comparison_catches_a_changed_split(version, mutation):
    out = _python(version, _SCHED, mutation)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


_LEAK = """
import sys
from sim.vllm_real.async_lockstep import RealAsyncCore
from sim.vllm_real.loader import load_vllm
from sim.vllm_real.sched_lockstep import Workload, verify_scheduler
from sim.vllm_real.v1_sched_adapter import RequestSpec, SchedCase
version = sys.argv[1]
install = load_vllm(vllm_version=version)
case = SchedCase(12, 16, 83, 3, 64, enable_prefix_caching=True, mamba_groups=1,
                 mamba_cache_mode="align", async_scheduling=True)
requests = (RequestSpec(0, ((1000, 1),), 1, 0, 0.0), RequestSpec(1, ((1001, 80),), 3, 0, 0.001))
core = RealAsyncCore(case, install)
for spec in requests:
    core.add_request(spec)
mamba = core.real.kv_cache_manager.coordinator.single_type_managers[1]
for _ in range(3):
    core.call()
print("real:", [b.block_id for b in mamba.req_to_blocks["1"]])
"""


@pytest.mark.parametrize(("version", "leaks"), [("0.26.0", True), ("0.25.1", False)])
def test_the_align_state_leak_is_the_real_release_s_vllm_55450(version, leaks):
    """tests/regressions/v1_engine_0_26_0_mamba_align_async_state_leak_vllm_55450.yaml on the
    real async scheduler: after three calls 0.26.0 still holds the state block at index 2
    behind the null at index 3 (three real entries); 0.25.1 has freed it (two)."""
    out = _python(version, _LEAK)
    assert out.returncode == 0, out.stdout + out.stderr
    table = [int(x) for x in re.search(r"real: \[(.*)\]", out.stdout).group(1).split(",")]
    assert (table[2] != 0) == leaks, table
    assert sum(1 for b in table if b) == (3 if leaks else 2), table
