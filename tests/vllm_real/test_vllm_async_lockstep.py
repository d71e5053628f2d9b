"""Async-scheduling lockstep tier: kvsim's `V1Scheduler` with `AsyncOutputs` behind `EngineCoreLoop` against
vLLM's real `AsyncScheduler` behind the real `EngineCore.step_with_batch_queue`, call for call
(`sim.vllm_real.async_lockstep`), for 0.11.0 (in process) and 0.33.0 (the CLI in a subprocess:
its dependencies live in `.vllm/0.33.0/_deps`, see `test_vllm_v033_lockstep.py`).

Skipped, with the reason shown, when an install is absent (a failure under KVSIM_REQUIRE_VLLM=1).
Run: `pytest -m vllm tests/vllm_real/test_vllm_async_lockstep.py`.
"""

from __future__ import annotations

import os
import re
import subprocess
import warnings
from pathlib import Path

import pytest

from tests.harness.vllm_install import load_or_skip, root_or_skip
from tests.harness.zygote import run_python

warnings.filterwarnings("ignore", module="requests")

#: Every test here belongs to the lockstep tier (`pytest -m vllm` selects them).
pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
TRACE = "sim/data/traces/mooncake_fast25/conversation_trace.jsonl"


def _verify_0_33(*args: str) -> subprocess.CompletedProcess[str]:
    root_or_skip("0.33.0")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["-m", "sim.cli", "verify", "--scheduler", "--async", "--vllm-version", "0.33.0"]
    return run_python([*argv, *args], vllm_version="0.33.0", env=env, cwd=ROOT)


def _counts(stdout: str) -> tuple[int, int]:
    found = re.search(r"identical over (\d+) workloads \((\d+) to the end", stdout)
    assert found, stdout
    return int(found.group(1)), int(found.group(2))


def test_random_workloads_identical_call_by_call_0_11():
    """0.11.0 with async on: random workloads (FCFS / PRIORITY, prefix caching, sliding
    windows) decide identically on every engine-core call, preemptions included."""
    from sim.vllm_real.sched_lockstep import verify_scheduler

    result = verify_scheduler(
        30, seed=0, pin="0.11.0", install=load_or_skip("0.11.0"), async_scheduling=True
    )
    assert result.identical, result.summary()
    assert result.num_workloads - len(result.real_raised) >= 24
    assert result.num_preemptions > 0 and result.num_prefix_hit_workloads > 0


def test_the_synchronous_model_diverges_from_the_real_async_scheduler():
    """The comparison can fail: kvsim's synchronous scheduler, stepped through the same loop
    against the real AsyncScheduler, differs on the first call a decode is rescheduled with
    its token in flight."""
    from dataclasses import replace

    from sim.vllm_real.async_lockstep import run_async_workload
    from sim.vllm_real.sched_lockstep import SchedVerifyResult, Workload
    from sim.vllm_real.v1_sched_adapter import RequestSpec, SchedCase

    install = load_or_skip("0.11.0")
    case = SchedCase(20, 16, 128, 4, 64, async_scheduling=True)
    requests = (RequestSpec(0, ((1000, 20),), 4, 0, 0.0),)
    workload = Workload(case, requests)
    result = SchedVerifyResult("0.11.0", install.version, async_scheduling=True)
    assert run_async_workload(0, workload, "0.11.0", install, result, False) is None

    import sim.vllm_real.async_lockstep as lockstep

    real_side = lockstep.KvsimAsyncCalls

    class SyncSide(real_side):  # kvsim's synchronous case, the real side async
        def __init__(self, side, pin):
            from sim.vllm_real.sched_lockstep import KvsimSide

            super().__init__(KvsimSide(replace(case, async_scheduling=False), pin), pin)
            self.loop.batch_queue_size = 2

    lockstep.KvsimAsyncCalls = SyncSide
    try:
        outcome = run_async_workload(0, workload, "0.11.0", install, result, False)
    finally:
        lockstep.KvsimAsyncCalls = real_side
    assert outcome is not None and outcome.what == "scheduled", outcome


def test_trace_windows_identical_0_11(tmp_path):
    """Windows of the bundled Mooncake trace, scaled down, with async on."""
    from sim.vllm_real.sched_lockstep import verify_scheduler
    from sim.vllm_real.sched_traces import trace_windows

    workloads = trace_windows(4, 0, ROOT / TRACE)
    result = verify_scheduler(
        pin="0.11.0",
        install=load_or_skip("0.11.0"),
        workloads=workloads,
        async_scheduling=True,
    )
    assert result.identical, result.summary()
    assert result.num_workloads == 4


def test_random_workloads_identical_0_33():
    """0.33.0's default async scheduling, random workloads, through the CLI."""
    out = _verify_0_33("--num-workloads", "25")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "async scheduler vs vLLM 0.33.0" in out.stdout
    total, to_the_end = _counts(out.stdout)
    assert total == 25 and to_the_end == 25


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--fast-path"]], ids=["faithful", "fast-path"])
def test_acceptance_size_0_33(extra):
    """Issue #22's size: 300 random workloads and 20 trace windows, identical."""
    out = _verify_0_33("--num-workloads", "300", *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _counts(out.stdout) == (300, 300)
    out = _verify_0_33("--num-workloads", "20", "--trace", TRACE, *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _counts(out.stdout)[0] == 20
