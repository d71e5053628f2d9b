"""Lockstep tier: each release's real `EngineArgs(...).create_engine_config()` (built on CPU, see
`sim/vllm_real/defaults_lockstep.py` for what is patched) against `sim.scenario.vllm_defaults`,
every resolved field, over >= 200 deployments per release.

Each release runs `kvsim verify --defaults` in its own subprocess: the V1 releases' pinned
dependencies (transformers 5 for 0.33.0) live in their `.vllm/<v>/_deps`, and one process can
hold one transformers. Skipped, with the reason, where an install is absent; a failure under
KVSIM_REQUIRE_VLLM=1, as for the other lockstep tiers. `--num-configs 220` keeps the tier
under a minute; `kvsim verify --defaults` with no count compares the whole grid (~600-1400).
"""

from __future__ import annotations

import re

import pytest

from tests.harness.repo_process import run_in_repo
from tests.harness.vllm_install import root_or_skip

pytestmark = pytest.mark.vllm

#: Deployments per release: at least the 200 the acceptance asks for.
NUM_CONFIGS = 220


@pytest.mark.parametrize(
    "version", ["0.5.4", "0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]
)
def test_defaults_identical_to_the_release(version: str) -> None:
    root_or_skip(version)
    if version == "0.5.4":
        root_or_skip("0.11.0")  # 0.5.4's config code runs on 0.11.0's pinned transformers
    # A fresh interpreter, not tests.harness.zygote: `_RealV1` puts stand-ins for vLLM's
    # compiled modules (`vllm._C`, ...) in sys.modules before its first vLLM import, and the
    # config modules read them at import; a zygote has imported those modules without them
    # (and 0.5.4's `_RealV0` runs on 0.11.0's _deps, a second release's packages).
    proc = run_in_repo(
        "-m",
        "sim.cli",
        "verify",
        "--defaults",
        "--vllm-version",
        version,
        "--num-configs",
        str(NUM_CONFIGS),
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    match = re.search(r"(\d+) of (\d+) configurations identical", out)
    assert match is not None, out
    assert match.group(1) == match.group(2) == str(NUM_CONFIGS), out
