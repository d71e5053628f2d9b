"""Lockstep tier: kvsim's hybrid KV-cache manager against vLLM 0.11.0's real
`HybridKVCacheCoordinator` / `KVCacheCoordinatorNoPrefixCache` over several KV-cache groups.

Random V1 workloads (`sim.vllm_real.lockstep.verify` with a fixed hybrid config): every
`get_computed_blocks` and `allocate_slots` answer, block id for block id (flat, group 0
first), every free count and every running request's tables must be identical.
Skipped when `.vllm/0.11.0` is absent (`bash scripts/setup_vllm.sh && pytest -m vllm`).
"""

from __future__ import annotations

import re

import pytest

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from tests.vllm_real.test_vllm_lockstep import V011

pytestmark = pytest.mark.vllm

SLIDING, FULL = KVCacheGroupSpec(8), KVCacheGroupSpec(None)

CONFIGS = {
    # Gemma-2's order: the sliding group first.
    "sliding-full-no-caching": (4, 16, (SLIDING, FULL), False),
    "sliding-full-caching": (4, 16, (SLIDING, FULL), True),
    # Full group first, a window that is not a multiple of the block size.
    "full-sliding-caching": (4, 24, (FULL, KVCacheGroupSpec(13)), True),
    # Gemma-3-like: two sliding groups then one full group (joint lookups over two groups).
    "two-sliding-one-full": (4, 30, (KVCacheGroupSpec(13), KVCacheGroupSpec(13), FULL), True),
    "bs16-window40": (16, 20, (KVCacheGroupSpec(40), FULL), True),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("seed", [1, 2])
def test_hybrid_manager_lockstep_against_real_0_11_0(name, seed):
    for mark in V011:
        if mark.name == "skip":
            pytest.skip(mark.kwargs["reason"])
    from sim.vllm_real.lockstep import verify

    block_size, num_gpu_blocks, groups, caching = CONFIGS[name]
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        enable_prefix_caching=caching,
        kv_cache_groups=groups,
        vllm_pin="0.11.0",
    )
    result = verify(None, "v1-engine", num_ops=2000, seed=seed, config=config)
    assert result.identical, result.summary()
    assert result.op_counts.get("get_computed_blocks", 0) > 100


def test_kvsim_verify_hybrid_10000_operations():
    """`kvsim verify --design v1-engine --hybrid`: random hybrid configs (1-3 sliding groups
    and a full group, either order, caching or not), >= 10,000 operations, >= 50 workloads."""
    for mark in V011:
        if mark.name == "skip":
            pytest.skip(mark.kwargs["reason"])
    from typer.testing import CliRunner

    from sim.cli.main import app

    result = CliRunner().invoke(
        app, ["verify", "--design", "v1-engine", "--hybrid", "--num-ops", "10000", "--seed", "4"]
    )
    assert result.exit_code == 0, result.output
    found = re.search(r"identical over (\d+) operations \((\d+) workloads", result.output)
    assert found, result.output
    assert int(found[1]) >= 10_000 and int(found[2]) >= 50


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2"])
def test_verify_hybrid_on_a_v0_design_is_bad_input(design):
    from typer.testing import CliRunner

    from sim.cli.main import app

    result = CliRunner().invoke(app, ["verify", "--design", design, "--hybrid", "--num-ops", "1"])
    assert result.exit_code == 2
    assert "--hybrid: KV-cache groups exist only in the V1 engine" in result.output


def test_real_hybrid_coordinator_under_kvsims_scheduler_gives_identical_tables():
    """`kvsim run --vllm-root .vllm/0.11.0` on a Gemma-2 scenario: vLLM's real hybrid
    coordinator under kvsim's scheduler gives the same request and step tables as kvsim's
    model. A 1,000-block pool, prompts past the 4,096-token window (the sliding group frees
    blocks) and a shared prefix (hits in both groups), so requests are preempted."""
    for mark in V011:
        if mark.name == "skip":
            pytest.skip(mark.kwargs["reason"])
    from sim.engine.run import run
    from sim.scenario.schema import scenario_from_dict
    from sim.vllm_real.loader import resolve_root

    requests = [
        {
            "arrival_s": 0.01 * i,
            "prompt_tokens": 1500 + 900 * (i % 6),
            "output_tokens": 300,
            "prefix_id": 7,
            "prefix_tokens": 1024,
        }
        for i in range(16)
    ]
    scenario = scenario_from_dict(
        {
            "name": "gemma2-real-vs-model",
            "model": "gemma-2-9b",
            "cache": {"num_gpu_blocks": 1000, "enable_prefix_caching": True},
            "scheduler": {
                "design": "v1-engine",
                "vllm_version": "0.11.0",
                "max_model_len": 8192,
                "max_num_batched_tokens": 2048,
                # vLLM refuses a budget below max_model_len without it (SchedulerConfig)
                "enable_chunked_prefill": True,
            },
            "workload": {"kind": "inline", "requests": requests},
            "step_time": {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001}},
        }
    )
    model = run(scenario)
    real = run(scenario, vllm_root=resolve_root(vllm_version="0.11.0"))
    assert real.inputs["block_manager"]["kind"] == "real"
    assert model.summary["num_preemptions"] > 0
    assert model.requests["num_prefix_hit_tokens"].sum() > 0
    assert model.requests.equals(real.requests)
    assert model.steps.equals(real.steps)
