"""Lockstep tier for vLLM 0.33.0's Mamba cache mode "align" (issue #23): kvsim's
`MambaManager` with `sim.kv.v1_engine.mamba_checkpoint` under the hybrid coordinator, and the
V1 scheduler's 0.33.0 split (`SplitRule.CHECKPOINTS`), against 0.33.0's real manager and
scheduler, with and without prefill checkpoint blocks, dense and sparse retention; and
mutations of the checkpoint rule, the retired-range free, the retention and the split that
the comparison must catch.

Each check runs in a subprocess on the Python sources (a mutation patches a module), through
the chunked-local tier's helper. Skipped when the install is absent; a failure under
KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.harness.zygote import run_python as run_in_zygote
from tests.vllm_real.test_chunked_local_lockstep import _python as run_python

pytestmark = pytest.mark.vllm

VERSION = "0.33.0"

_MUTATIONS = """
import dataclasses
from sim.kv.v1_engine import mamba_checkpoint as mc
from sim.scheduler.v1 import mamba_align, scheduler
COUNT = {"checkpoints": 0}
count = mc.AlignCheckpoints.num_checkpoint_blocks_for
def counted(self, *args, **kwargs):
    n = count(self, *args, **kwargs)
    COUNT["checkpoints"] += n
    return n
mc.AlignCheckpoints.num_checkpoint_blocks_for = counted
if mutation == "last-at-length":  # 0.26.0's last boundary (L - L % bs) as the checkpoint
    mc.checkpoint_position = lambda n, bs: n - n % bs
elif mutation == "no-checkpoint-block":  # the manager never reserves one
    mc.AlignCheckpoints.num_checkpoint_blocks_for = lambda self, *a, **k: 0
elif mutation == "walk-back":  # 0.26.0's free: walk back, stop at the first null
    def walk(self, pool, rid, table, last):
        freed = []
        for i in range(min(last, len(table)) - 1, -1, -1):
            if table[i].is_null:
                break
            freed.append(table[i])
            table[i] = pool.null_block
        if freed:
            pool.free_blocks(freed)
    mc.AlignCheckpoints.remove_in_range = walk
elif mutation == "dense-retention":  # sparse retention (vllm serve's 0) cached densely
    mc.AlignCheckpoints.retained_mask = lambda self, start, end, boundaries: None
elif mutation == "no-junction":  # sparse retention forgets the shared-prefix junction
    mask = mc.AlignCheckpoints.retained_mask
    mc.AlignCheckpoints.retained_mask = lambda self, start, end, boundaries: mask(
        self, start, end, boundaries[:1]
    )
elif mutation == "stops":  # 0.26.0's split on 0.33.0
    scheduler.split_rule_for = lambda pin: mamba_align.SplitRule.STOPS
elif mutation == "split-ignores-checkpoints":  # the split stops at the last boundary anyway
    split = mamba_align.MambaAlignedSplit._split_033
    mamba_align.MambaAlignedSplit._split_033 = lambda self, *a: split(
        dataclasses.replace(self, checkpoint_blocks=False), *a
    )
"""

_VERIFY = (
    """
import sys
from sim.vllm_real.lockstep import verify
version, mutation = sys.argv[1], sys.argv[2]
"""
    + _MUTATIONS
    + """
print(verify(None, "v1-engine", 10_000, 7, vllm_version=version, hybrid=True).summary())
print("checkpoint blocks reserved:", COUNT["checkpoints"])
"""
)

_SCHED = (
    """
import sys
from sim.vllm_real.sched_lockstep import verify_scheduler
version, mutation, mode = sys.argv[1], sys.argv[2], sys.argv[3]
"""
    + _MUTATIONS
    + """
r = verify_scheduler(
    100, 7, pin=version, vllm_version=version, mamba_align=True,
    async_scheduling=mode == "async",
)
print(r.summary())
print("checkpoint blocks reserved:", COUNT["checkpoints"])
"""
)


def _python(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return run_python(VERSION, script, *args, sources=True)


def _kvsim(command: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """The `kvsim` console script (`command[0]`) as the shell runs it, in this process's
    environment and folder, in a fork of the release's zygote (`tests.harness.zygote`)."""
    script = shutil.which(command[0])
    assert script is not None, f"{command[0]} is not on PATH"
    argv = [script, *command[1:]]
    env, cwd = dict(os.environ), os.getcwd()
    return run_in_zygote(argv, vllm_version=VERSION, env=env, cwd=cwd, timeout=timeout)


def _number(pattern: str, text: str) -> int:
    match = re.search(pattern, text)
    return int(match.group(1)) if match else 0


def test_manager_identical_to_real_with_align_draws():
    """`kvsim verify --design v1-engine --hybrid --vllm-version 0.33.0 --num-ops 10000 --seed
        7`: identical, with >= 300 operations on full + Mamba layouts in "align" and checkpoint
        blocks reserved along the way (the walk draws them two in three, and sparse retention,
    `vllm serve`'s default, in half)."""
    out = _python(_VERIFY, "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"v1-engine vs vLLM {VERSION}: identical over" in out.stdout, out.stdout
    assert _number(r"caching \('align'\) (\d+)", out.stdout) >= 300, out.stdout
    assert _number(r"checkpoint blocks reserved: (\d+)", out.stdout) >= 50, out.stdout


@pytest.mark.parametrize("mutation", ["last-at-length", "no-checkpoint-block", "dense-retention"])
def test_the_manager_comparison_catches_a_wrong_checkpoint_rule(mutation):
    out = _python(_VERIFY, mutation)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_scheduler_identical_to_real(mode):
    """kvsim's V1 scheduler against 0.33.0's on 100 random full + Mamba workloads with prefix
    caching ("align", two in three with checkpoint blocks, half with sparse retention),
    synchronous and async: identical,
    with prefix hits in some and checkpoint blocks reserved."""
    out = _python(_SCHED, "none", mode)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"scheduler vs vLLM {VERSION}: identical over 100 workloads" in out.stdout, out.stdout
    assert _number(r"(\d+) workloads with prefix hits", out.stdout) >= 10, out.stdout
    assert _number(r"checkpoint blocks reserved: (\d+)", out.stdout) >= 50, out.stdout


@pytest.mark.parametrize(
    ("mutation", "mode"),
    [
        ("stops", "sync"),
        ("split-ignores-checkpoints", "sync"),
        ("last-at-length", "sync"),
        ("dense-retention", "sync"),
        ("no-junction", "sync"),
        # Async frees on the processed basis: a removal can jump a gap of nulls.
        ("walk-back", "async"),
    ],
)
def test_the_scheduler_comparison_catches_a_changed_rule(mutation, mode):
    out = _python(_SCHED, mutation, mode)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


@pytest.mark.parametrize("extra", [[], ["--async"]], ids=["sync", "async"])
def test_the_cli_runs_the_scheduler_lockstep_with_mamba_caching(extra: list[str]) -> None:
    """`kvsim verify --scheduler --mamba-caching` (the closing notes' command; it used to take
    a Python call): identical on 0.33.0, every workload a Mamba hybrid, some with hits."""
    command = ["kvsim", "verify", "--scheduler", "--design", "v1-engine", "--vllm-version",
               VERSION, "--mamba-caching", "--num-workloads", "12", "--seed", "7", *extra]  # fmt: skip
    out = _kvsim(command, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical over 12 workloads" in out.stdout, out.stdout
    assert "12 Mamba-hybrid workloads" in out.stdout, out.stdout
    hits = re.search(r"(\d+) workloads with prefix hits", out.stdout)
    assert hits and int(hits.group(1)) > 0, out.stdout


def test_mamba_caching_is_refused_where_it_would_mean_nothing() -> None:
    """One line, exit 2: a pin without Mamba prefix caching, and --trace or --hybrid beside it."""
    base = ["kvsim", "verify", "--scheduler", "--design", "v1-engine", "--mamba-caching"]
    cases = [
        ([*base, "--vllm-version", VERSION, "--pin", "0.11.0"], "pin 0.11.0 has no Mamba"),
        ([*base, "--vllm-version", VERSION, "--hybrid"], "with --hybrid give one of them"),
        ([*base, "--trace", "t.jsonl"], "with --trace it would do nothing"),
        (["kvsim", "verify", "--mamba-caching"], "--mamba-caching is for the V1 Scheduler"),
    ]
    for command, message in cases:
        out = _kvsim(command, timeout=300)
        assert out.returncode == 2 and message in out.stderr, (command, out.stderr)
        assert "Traceback" not in out.stderr
