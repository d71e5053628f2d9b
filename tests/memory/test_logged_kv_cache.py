"""`sim.memory.logged`: the pool as each release logs it ("GPU KV cache size", "Maximum
concurrency"), and `kvsim run`'s record of it."""

from __future__ import annotations

import pytest

from sim.memory.logged import logged_kv_cache
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict


def test_one_group_logs_the_same_tokens_either_way():
    for from_concurrency in (False, True):
        logged = logged_kv_cache(28_138, 1, 16, 16_384, 1_024, from_concurrency=from_concurrency)
        assert logged.kv_cache_tokens == 450_208
        assert logged.lines()[1] == "Maximum concurrency for 16,384 tokens per request: 27.48x"


def test_a_hybrid_pool_logs_different_tokens_before_and_from_0_25_1():
    before = logged_kv_cache(20_108, 2, 16, 8_192, 1_025, from_concurrency=False)
    after = logged_kv_cache(20_108, 2, 16, 8_192, 1_025, from_concurrency=True)
    assert (before.kv_cache_tokens, after.kv_cache_tokens) == (160_864, 160_707)
    assert before.max_concurrency == after.max_concurrency == pytest.approx(19.6176, abs=1e-4)
    assert before.lines()[0] == "GPU KV cache size: 160,864 tokens"


def _grouped(release: str) -> dict:
    """Full attention + a 32-token window, bs 16, T 64, max_model_len 256: startup charges
    16 + cdiv(31 + 64, 16) + 1 = 23 blocks per request; 100 blocks."""
    return {
        "name": "logged",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": 100,
            "num_cpu_blocks": 0,
            "kv_cache_groups": [{"sliding_window": 32}, {}],
        },  # fmt: skip
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": release,
            "max_model_len": 256,
            "max_num_batched_tokens": 64,
            "async_scheduling": False,
        },  # fmt: skip
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 1}],
        },  # fmt: skip
        "step_time": {"linear": {"fixed_s": 0.01}},
    }


@pytest.mark.parametrize(
    ("release", "tokens"),
    [("0.20.0", 100 // 2 * 16), ("0.25.1", int(100 / 23 * 256)), ("0.33.0", int(100 / 23 * 256))],
)
def test_a_run_records_what_its_release_would_log(release, tokens):
    lines = resolve(scenario_from_dict(_grouped(release))).inputs["vllm_kv_cache_log"]
    assert lines == [
        f"GPU KV cache size: {tokens:,} tokens",
        f"Maximum concurrency for 256 tokens per request: {100 / 23:.2f}x",
    ]
