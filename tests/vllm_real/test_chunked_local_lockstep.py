"""Lockstep tier for chunked-local KV-cache groups (issue #23 part 1): kvsim's
`ChunkedLocalAttentionManager` under the hybrid coordinator against each release's real
manager (0.11.0, 0.19.1, 0.20.0, 0.25.1, 0.26.0, 0.33.0), mutations that the comparison must
catch, the admission cap against each release's spec, and vllm #45856's undercount in a
chunked-local group.

Each check runs in a subprocess (the releases' dependencies differ, see
test_vllm_2026_pins_lockstep.py). Skipped when an install is absent; a failure under
KVSIM_REQUIRE_VLLM=1.
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

pytestmark = pytest.mark.vllm

RELEASES = ["0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]


def _python(
    version: str, script: str, *args: str, sources: bool = False
) -> subprocess.CompletedProcess[str]:
    """`script` as `python -c` would run it, in its own process (a fork of the release's
    zygote, `tests.harness.zygote`); `sources`: on the Python sources, not the compiled core
    (a mutation patches a class, which compiled classes do not allow)."""
    root_or_skip(version)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if sources:
        env["KVSIM_NATIVE"] = "0"
    return run_python(["-c", script, version, *args], vllm_version=version, env=env, cwd=ROOT)


_VERIFY = """
import sys
from sim.kv.v1_engine import chunked_local as cl
from sim.vllm_real.lockstep import verify
version, mutation = sys.argv[1], sys.argv[2]
if mutation == "no-keep":  # 0.19.1's free on 0.11.0 (or 0.11.0's on a later release)
    cl.ChunkedLocalAttentionManager.keeps_last_cached_block = property(
        lambda self: not self.__dict__.get("_keep", True),
        lambda self, value: self.__dict__.__setitem__("_keep", value),
    )
elif mutation == "cap+1":  # the sliding window's "+1" on the chunked-local cap
    cap = cl.ChunkedLocalAttentionManager.admission_cap_blocks
    cl.ChunkedLocalAttentionManager.admission_cap_blocks = lambda self, t, m: cap(self, t, m) + 1
print(verify(None, "v1-engine", 10_000, 7, vllm_version=version, hybrid=True).summary())
"""


@pytest.mark.parametrize("version", RELEASES)
def test_chunked_local_groups_identical_to_real(version):
    """10,000 hybrid operations, of which >= 2,000 on full + chunked-local layouts."""
    out = _python(version, _VERIFY, "none")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"v1-engine vs vLLM {version}: identical over" in out.stdout, out.stdout
    # With and without 0.33.0's sparse retention (a no-op for chunked-local groups).
    chunked = re.findall(r"full \+ chunked-local(?: with sparse retention)? (\d+)", out.stdout)
    assert sum(int(n) for n in chunked) >= 2_000, out.stdout


@pytest.mark.parametrize(
    ("version", "mutation"), [("0.11.0", "no-keep"), ("0.33.0", "no-keep"), ("0.20.0", "cap+1")]
)
def test_the_comparison_catches_a_changed_chunked_local_rule(version, mutation):
    """The comparison can fail: 0.11.0's keep-the-last-cached-block rule, its absence from
    0.19.1 on, and the cap without the "+1" (0.20.0 applies it in every count) each decide."""
    out = _python(version, _VERIFY, mutation, sources=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "DIVERGED" in out.stdout, out.stdout


_CAP = """
import random, sys, torch
from sim.vllm_real.loader import import_vllm, load_vllm
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.chunked_local import ChunkedLocalAttentionManager
iface = import_vllm("v1.kv_cache_interface", load_vllm(None, sys.argv[1]))
rng = random.Random(0)
for _ in range(2000):
    bs, chunk = rng.choice([1, 2, 4, 16, 32]), rng.randint(1, 9000)
    t, length = rng.randint(1, 40000), rng.randint(1, 140000)
    spec = iface.ChunkedLocalAttentionSpec(
        block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float16,
        attention_chunk_size=chunk,
    )
    real = spec.max_admission_blocks_per_request(t, length)
    ours = ChunkedLocalAttentionManager(BlockPool(2, False), bs, chunk).admission_cap_blocks(
        t, length
    )
    assert real == ours, (bs, chunk, t, length, real, ours)
print("ok")
"""


@pytest.mark.parametrize("version", ["0.20.0", "0.25.1", "0.26.0", "0.33.0"])
def test_chunked_local_cap_is_the_release_s(version):
    """kvsim's chunked-local cap is each release's `max_admission_blocks_per_request` on
    2,000 drawn chunk sizes, block sizes, token counts and lengths."""
    out = _python(version, _CAP)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stdout + out.stderr


_UNDERCOUNT = """
import sys
from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from sim.vllm_real.lockstep import verify
config = KVCacheConfig(
    num_gpu_blocks=24, block_size=2, max_num_batched_tokens=4, max_model_len=64,
    kv_cache_groups=(
        KVCacheGroupSpec(attention_chunk_size=4), KVCacheGroupSpec(attention_chunk_size=4),
        KVCacheGroupSpec(None),
    ),
    vllm_pin=sys.argv[1],
)
print(verify(None, "v1-engine", 4_000, 3, vllm_version=sys.argv[1], hybrid=True,
             config=config).summary())
"""


@pytest.mark.parametrize(("version", "crashes"), [("0.20.0", True), ("0.25.1", False)])
def test_chunked_local_capped_count_undercount_regression_vllm_45856(version, crashes):
    """vllm #45856's mechanism in a chunked-local group: 0.20.0 caps every count at
    cdiv(A + T, bs) blocks, so a running request past the cap counts 0 while its table still
    grows a block at each boundary and the pool runs dry (`Cannot get 1 free blocks`): crashes
    on both sides of the lockstep. 0.25.1 caps only the full-sequence check: none."""
    out = _python(version, _UNDERCOUNT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical over" in out.stdout, out.stdout
    found = re.search(r"(\d+) crashes seen on both sides", out.stdout)
    assert found and (int(found[1]) > 0) == crashes, out.stdout
