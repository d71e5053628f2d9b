"""Lockstep tier for the hybrid pools of catalog models (issue #23 item 1): kvsim's
`sim.memory.hybrid_pool` and the scenario path against each release's own functions
(`sim.vllm_real.pool_layout`: the state calculators, the page-size unification, the spec
classes, `get_kv_cache_groups`, `get_kv_cache_config_from_groups` and the concurrency).

Each release runs in a subprocess (their dependencies differ); skipped when an install is
absent, a failure under KVSIM_REQUIRE_VLLM=1.
"""

from __future__ import annotations

import json

import pytest

from sim.catalog import get_model
from sim.engine.run import resolve
from sim.kv.pins import VllmPin
from sim.kv.v1_engine.hybrid_coordinator import _describe as describe
from sim.memory.hybrid_pool import hybrid_pool
from sim.scenario.schema import scenario_from_dict
from sim.vllm_real.pool_layout import CASES, TOKEN_BUDGET
from tests.vllm_real.test_chunked_local_lockstep import _python

pytestmark = pytest.mark.vllm

RELEASES = ["0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]
_SCRIPT = "from sim.vllm_real.pool_layout import main; main()"


def _real(version: str) -> dict[tuple, dict]:
    out = _python(version, _SCRIPT, sources=True)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(CASES), out.stdout
    return {tuple(row["case"]): row for row in rows}


def _ours(version: str, case: tuple) -> dict:
    name, block_size, mml, tp, available = case
    pool = hybrid_pool(
        get_model(name), VllmPin(version), block_size=block_size, max_model_len=mml, tp=tp
    )
    return {
        "block_size": pool.block_size,
        "mamba_page_size_padded": pool.page_bytes if pool.mamba_padding_bytes else None,
        "groups": [
            [describe(g), list(layers)]
            for g, layers in zip(pool.groups, pool.layout.group_layers, strict=True)
        ],
        "page_bytes": [pool.page_bytes],
        "num_blocks": pool.num_blocks(available),
    }


def _scenario_log(version: str, case: tuple, num_blocks: int) -> tuple[float, int]:
    """The concurrency and "GPU KV cache size" tokens a scenario of the case logs, through
    `resolve` (the scenario path)."""
    name, block_size, mml, tp, _ = case
    scenario = scenario_from_dict(
        {
            "name": "pool",
            "model": name,
            "hardware": {"gpu": "h100-sxm", "tensor_parallel_size": tp},
            "cache": {
                "block_size": block_size,
                "num_gpu_blocks": num_blocks,
                "enable_prefix_caching": False,
            },
            "scheduler": {
                "design": "v1-engine",
                "vllm_version": version,
                "max_model_len": mml,
                "max_num_batched_tokens": TOKEN_BUDGET,
                "async_scheduling": False,
            },
            "workload": {"kind": "inline", "requests": [
                {"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 1}]},
            "step_time": {"linear": {"fixed_s": 0.01}},
        }
    )  # fmt: skip
    inputs = resolve(scenario).inputs
    tokens = int(inputs["vllm_kv_cache_log"][0].split(":")[1].split()[0].replace(",", ""))
    return num_blocks / inputs["startup_blocks_per_request"], tokens


@pytest.mark.parametrize("version", RELEASES)
def test_hybrid_pools_identical_to_real(version):
    """Every case: the unified block size, the padded Mamba page, each group's type and
    layers, the page, num_blocks and (through a scenario) the logged concurrency and token
    count."""
    real = _real(version)
    for case in CASES:
        got, want = _ours(version, case), real[case]
        for key in ("block_size", "mamba_page_size_padded", "groups", "page_bytes", "num_blocks"):
            assert got[key] == want[key], (version, case, key, got[key], want[key])
        concurrency, tokens = _scenario_log(version, case, want["num_blocks"])
        assert concurrency == pytest.approx(want["concurrency"], rel=1e-12), (version, case)
        assert tokens == want["logged_tokens"], (version, case, tokens, want["logged_tokens"])


def test_the_comparison_catches_a_release_rule():
    """The releases differ where kvsim says they do, so a pin's rule on another release is
    caught: 0.19.1's alignment on 0.20.0 (Nemotron-H, block size 32, TP 2: 528 vs 544
    tokens), 0.11.0's chunked-local default on 0.33.0 (Llama-4: 1 group vs 4)."""
    real_020, real_033 = _real("0.20.0"), _real("0.33.0")
    nemotron = ("nemotron-h-8b", 32, 4096, 2, 30 * 2**30)
    scout = ("llama-4-scout-17b-16e", 16, 65536, 4, 50 * 2**30)
    assert _ours("0.19.1", nemotron)["block_size"] != real_020[nemotron]["block_size"]
    assert _ours("0.11.0", scout)["groups"] != real_033[scout]["groups"]
