"""`kvsim fuzz --vllm-root .vllm/0.33.0`: vLLM 0.33.0's real manager under kvsim's scheduler.

Runs in a subprocess: a process that already imported 0.11.0's dependencies would keep them
(`test_vllm_v033_lockstep.py`). Each case runs twice, on kvsim's model of 0.33.0 and on the real
manager, and every table must be identical: that is what found the three regressions below.
Left out: multi-replica cases behind a prefix-aware router that reads KV events (the real
adapter publishes none, so such a router routes differently: not a manager difference).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.harness.vllm_install import root_or_skip
from tests.harness.zygote import run_python

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import sys
from sim.ci.fuzz_cases import case_seed, draw_case
from sim.ci.fuzz_variant import CaseVariant
from sim.ci.selfcheck import first_difference, tables_of
from sim.engine.run import run
root, num_cases = sys.argv[1], int(sys.argv[2])
variant = CaseVariant("0.33.0", hybrid=True, async_mix=True)
compared = hybrid = 0
for index in range(num_cases):
    seed = case_seed(7, index)
    scenario = draw_case("v1-engine", seed, True, variant)
    if scenario.engine.kv_events and scenario.engine.num_replicas > 1:
        continue
    model, real = run(scenario), run(scenario, vllm_root=root)
    difference = first_difference(tables_of(model), tables_of(real))
    assert difference is None, f"case seed {seed}: {difference}"
    compared += 1
    hybrid += bool(model.inputs.get("kv_cache_groups"))
print(compared, hybrid)
"""


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    """`python ARGS` in its own process: a fork of 0.33.0's zygote (`tests.harness.zygote`),
    which has imported that release's dependencies only."""
    return run_python(list(args), vllm_version="0.33.0", env=os.environ, cwd=ROOT, timeout=600)


def test_real_0330_manager_matches_kvsims_model_on_fuzz_cases():
    """Regressions, all three found by this comparison: the real adapter had no `cache_blocks`
    (async scheduling raised AttributeError), counted the null block held but not refcounted
    (every full audit reported `refcount`), and ran 4ac7713's scheduler rules around 0.33.0's
    manager (no full-sequence gate: 35 of 40 cases differed from the model)."""
    root = root_or_skip("0.33.0")
    done = _run("-c", _SCRIPT, str(root), "30")
    assert done.returncode == 0, done.stderr[-3000:]
    compared, hybrid = map(int, done.stdout.split())
    assert compared >= 20 and hybrid >= 5, done.stdout


def test_kvsim_fuzz_vllm_root_0330_reports_no_internal_error():
    root = root_or_skip("0.33.0")
    args = ["-m", "sim.cli", "fuzz", "--design", "v1-engine", "--vllm-root", str(root)]
    done = _run(*args, "--max-cases", "12", "--hybrid", "--async-mix")
    assert done.returncode in (0, 1), done.stdout[-2000:] + done.stderr[-3000:]
    assert f"--vllm-version 0.33.0 --hybrid --async-mix --vllm-root {root}" in done.stdout or (
        "no violations found" in done.stdout
    )


_JUNCTION = """
import sys
from sim.ci.fuzz_cases import draw_case
from sim.ci.fuzz_variant import CaseVariant
from sim.engine.run import run
scenario = draw_case("v1-engine", 1956387801, True, CaseVariant("0.33.0", hybrid=True,
                                                                  async_mix=True))
assert scenario.cache.enable_prefix_caching
model, real = run(scenario), run(scenario, vllm_root=sys.argv[1])
assert model.inputs["prefix_cache_retention_interval"] == 0
hits = [list(r.requests["num_prefix_hit_tokens"]) for r in (model, real)]
assert hits[0] == hits[1] and hits[0][2] == 24, hits
"""


def test_real_adapter_passes_the_shared_prefix_junction_to_the_scheduler():
    """Regression (fuzz case seed 1956387801, a full + sliding layout with 0.33.0's sparse
    retention): the real adapter had no `num_uncached_common_prefix_tokens`, so kvsim's
    scheduler kept no junction for vLLM's manager, which then kept no sliding window there:
    request 2 hit 24 tokens on kvsim's model and 0 on vLLM's code."""
    root = root_or_skip("0.33.0")
    done = _run("-c", _JUNCTION, str(root))
    assert done.returncode == 0, done.stderr[-3000:]
