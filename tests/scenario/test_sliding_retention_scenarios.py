"""Scenarios pick up `vllm serve`'s sparse retention for sliding windows on 0.33.0
(`sim/scenario/retention.py`, `sim.kv.v1_engine.sliding_retention`): the resolved interval per
release and caching setting, and what it does end to end to a full + sliding hybrid."""

from __future__ import annotations

import pytest

from sim.engine.run import run
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict


def _scenario(version: str, caching: bool = True) -> dict:
    """full + sliding (W=32, bs=16: 2 blocks a hit); three 100-token prompts sharing their
    first 64 tokens, each arriving after the one before has finished."""
    return {
        "name": "sliding-retention",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": 200,
            "num_cpu_blocks": 0,
            "enable_prefix_caching": caching,
            "kv_cache_groups": [{}, {"sliding_window": 32}],
        },
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": version,
            "max_model_len": 256,
            "max_num_batched_tokens": 256,
            "max_num_seqs": 8,
            "async_scheduling": False,
        },
        "engine": {"violation_policy": "record", "audit_level": "full"},
        "workload": {
            "kind": "inline",
            "requests": [
                {
                    "arrival_s": 1.0 * i,
                    "prompt_tokens": 100,
                    "output_tokens": 4,
                    "prefix_id": 5,
                    "prefix_tokens": 64,
                }
                for i in range(3)
            ],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }


@pytest.mark.parametrize(
    ("version", "caching", "interval"),
    [("0.33.0", True, 0), ("0.33.0", False, None), ("0.26.0", True, None)],
)
def test_the_serve_default_reaches_the_manager(version, caching, interval):
    resolved = resolve(scenario_from_dict(_scenario(version, caching)))
    assert resolved.engine.kv.prefix_cache_retention_interval == interval
    assert resolved.inputs.get("prefix_cache_retention_interval") == interval


@pytest.mark.parametrize(("version", "hits"), [("0.33.0", [0, 0, 64]), ("0.26.0", [0, 64, 64])])
def test_the_second_sharer_leaves_the_junction_the_third_hits(version, hits):
    """Dense (0.26.0): the first prompt caches its whole window history, so the second hits
    the 64 shared tokens. Sparse (0.33.0): the first keeps only sliding blocks 4-5 (the window
    at its replay boundary 99), so the second hits nothing (full group 64, sliding 0) but its
    junction, 64, keeps its sliding blocks 2-3; the third hits 64. The audit holds."""
    result = run(scenario_from_dict(_scenario(version)))
    assert len(result.violations) == 0, result.violations
    assert list(result.requests["num_prefix_hit_tokens"]) == hits
