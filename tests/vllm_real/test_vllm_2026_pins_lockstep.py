"""Lockstep tier for the releases where the 2026 admission bugs live (issue #23): kvsim's pins
0.19.1, 0.20.0, 0.25.1 and 0.26.0 against each release's real manager, Scheduler and
AsyncScheduler.

Needs `bash scripts/setup_vllm.sh 0.19.1 0.20.0 0.25.1 0.26.0` (CI's `.ci/run` installs them).
Each check runs the `kvsim verify` CLI in a subprocess: these releases' dependencies live in
their `.vllm/<v>/_deps` (transformers 5, as 0.33.0's), and a process that already imported
0.11.0's would keep those. Skipped when an install is absent; a failure under
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

PINS = ["0.19.1", "0.20.0", "0.25.1", "0.26.0"]


def _verify(version: str, *args: str) -> subprocess.CompletedProcess[str]:
    root_or_skip(version)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["-m", "sim.cli", "verify", "--vllm-version", version, *args]
    return run_python(argv, vllm_version=version, env=env, cwd=ROOT)


@pytest.mark.parametrize("version", PINS)
@pytest.mark.parametrize("hybrid", [False, True], ids=["one-group", "hybrid"])
def test_manager_identical_to_real(version, hybrid):
    """The V1 manager pinned to the loaded release vs the real one, issue #14's size."""
    extra = ["--hybrid"] if hybrid else []
    out = _verify(version, "--design", "v1-engine", "--num-ops", "10000", *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    found = re.search(
        rf"v1-engine vs vLLM {re.escape(version)}: identical over (\d+) operations "
        r"\((\d+) workloads, (\d+) crashes",
        out.stdout,
    )
    assert found and int(found[1]) >= 10_000 and int(found[2]) >= 50, out.stdout


def test_0_20_0_crashes_on_both_sides_regression_vllm_45856():
    """0.20.0's cap inside every count makes the real manager raise `Cannot get 1 free blocks`
    (vllm #45856) where kvsim's model raises it too: the lockstep's random workloads (with a
    token budget small enough for the cap to bite) end in crashes seen on *both* sides."""
    out = _verify("0.20.0", "--design", "v1-engine", "--hybrid", "--num-ops", "10000")
    assert out.returncode == 0, out.stdout + out.stderr
    crashes = re.search(r"(\d+) crashes seen on both sides", out.stdout)
    assert crashes and int(crashes[1]) > 0, out.stdout


@pytest.mark.parametrize("version", PINS)
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_scheduler_identical_to_real(version, async_scheduling):
    """Without --pin the loaded release selects kvsim's pin of it, and only that one."""
    extra = ["--async"] if async_scheduling else []
    out = _verify(version, "--scheduler", "--num-workloads", "40", *extra)
    assert out.returncode == 0, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("v1-engine @")]
    kind = "async scheduler" if async_scheduling else "scheduler"
    assert lines == [line for line in lines if line.startswith(f"v1-engine @{version} {kind} ")]
    assert len(lines) == 1 and "identical over 40 workloads" in lines[0], out.stdout


@pytest.mark.parametrize(
    ("version", "pin", "extra"),
    [("0.19.1", "0.33.0", []), ("0.26.0", "0.11.0", ["--async"])],
    ids=["0.33.0-rules-on-0.19.1", "0.11.0-async-on-0.26.0"],
)
def test_another_pins_rules_diverge(version, pin, extra):
    """The comparison can fail: another release's rules do not pass for this one."""
    out = _verify(version, "--scheduler", "--pin", pin, "--num-workloads", "40", *extra)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"v1-engine @{pin}" in out.stdout and "DIVERGED" in out.stdout


def test_loaded_versions_pick_their_pins():
    from sim.vllm_real.lockstep import v1_pin_for

    assert [v1_pin_for(tuple(int(x) for x in v.split("."))) for v in PINS] == PINS


@pytest.mark.parametrize(
    ("scenario", "version", "kinds"),
    [
        (
            "v1_engine_0_20_0_capped_count_undercount_vllm_45856.yaml",
            "0.20.0",
            {"admission_undercount", "no_progress", "freed_while_in_flight"},
        ),
        (
            "v1_engine_0_25_1_capped_count_fixed_vllm_45856.yaml",
            "0.25.1",
            {"no_progress", "freed_while_in_flight"},
        ),
        (
            "v1_engine_0_19_1_swa_gate_vs_startup_no_progress_vllm_39734.yaml",
            "0.19.1",
            # startup_gate_mismatch is kvsim's startup arithmetic (sim.scenario.resolve); the
            # real manager's no_progress is what confirms it
            {"startup_gate_mismatch", "no_progress"},
        ),
        ("v1_engine_0_20_0_swa_gate_admits_vllm_39734.yaml", "0.20.0", set()),
        (
            "v1_engine_0_25_1_async_swa_freed_while_in_flight_vllm_47728.yaml",
            "0.25.1",
            {"freed_while_in_flight"},
        ),
        ("v1_engine_0_26_0_async_swa_processed_basis_vllm_47728.yaml", "0.26.0", set()),
        (
            "v1_engine_0_25_1_async_chunked_local_freed_while_in_flight_vllm_47728.yaml",
            "0.25.1",
            {"freed_while_in_flight"},
        ),
        ("v1_engine_0_26_0_async_chunked_local_processed_basis_vllm_47728.yaml", "0.26.0", set()),
    ],
)
def test_regression_on_real_release_regression_vllm_45856_39734_47728(
    scenario, version, kinds, tmp_path
):
    """The reproducers show on vLLM's real manager of the release too (`--vllm-root`), with
    kvsim's scheduler and auditor around it: the findings are vLLM's, not the model's."""
    root = root_or_skip(version)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    path = ROOT / "tests" / "regressions" / scenario
    out = run_python(
        [
            "-m",
            "sim.cli",
            "run",
            str(path),
            "--no-plots",
            "--vllm-root",
            str(root),
            "-o",
            str(tmp_path / "out"),
        ],
        vllm_version=version,  # the zygote loads the release from `root`, as --vllm-root does
        env=env,
        cwd=ROOT,
    )
    assert out.returncode in (0, 1), out.stdout + out.stderr
    import pandas as pd

    found = (
        set(pd.read_csv(tmp_path / "out" / "violations.csv")["kind"])
        if (tmp_path / "out" / "violations.csv").stat().st_size
        else set()
    )
    assert found == kinds, out.stdout


_BOUND_SCRIPT = """
import random, sys, torch
from sim.vllm_real.loader import import_vllm, load_vllm
from sim.kv.v1_engine.admission import admission_cap_blocks
iface = import_vllm("v1.kv_cache_interface", load_vllm(None, sys.argv[1]))
rng = random.Random(0)
for _ in range(2000):
    bs, w = rng.choice([1, 2, 4, 16, 32]), rng.randint(1, 9000)
    t, length = rng.randint(1, 40000), rng.randint(1, 140000)
    spec = iface.SlidingWindowSpec(
        block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float16, sliding_window=w
    )
    real = spec.max_admission_blocks_per_request(t, length)
    assert real == admission_cap_blocks(w, bs, t, length), (bs, w, t, length, real)
print("ok")
"""


@pytest.mark.parametrize("version", ["0.20.0", "0.25.1", "0.26.0", "0.33.0"])
def test_window_bound_is_the_release_s_regression_vllm_54703(version):
    """kvsim's per-request sliding-window bound (the gate's cap, the startup sizing and the
    admission reserve of vllm #54703) is each release's `max_admission_blocks_per_request`,
    on 2,000 drawn windows, block sizes, token counts and lengths."""
    root_or_skip(version)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = run_python(["-c", _BOUND_SCRIPT, version], vllm_version=version, env=env, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr
