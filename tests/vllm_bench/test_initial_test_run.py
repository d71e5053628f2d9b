"""`vllm bench serve`'s initial single-prompt test run (serve.py L875-921 @0.33.0): kvsim runs it
before the benchmark, so the first prompt is a prefix-cache hit, and excludes it from the
result."""

from __future__ import annotations

import math

import pytest

from sim.engine.api_server import VLLM_API_SERVER
from sim.kv.types import Segment
from sim.scenario.schema import scenario_from_dict
from sim.vllm_bench.bench import WorkloadOptions, run_bench, with_test_run
from sim.vllm_bench.metrics import BenchSettings
from sim.workload.request import UNIQUE_KEY_BASE, RequestSpec

ONE = WorkloadOptions(num_prompts=1, random_input_len=1024, random_output_len=16)


def _scenario(prefix_caching: bool, release: str = "0.33.0"):
    return scenario_from_dict(
        {
            "name": "test-run",
            "model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm"},
            "cache": {"enable_prefix_caching": prefix_caching},
            "scheduler": {"design": "v1-engine", "vllm_version": release},
            "workload": {
                "kind": "inline",
                "requests": [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}],
            },  # fmt: skip
        },
        "test-run.yaml",
    )


def _ttft_ms(
    prefix_caching: bool, ready_check: int, frontend=None, release="0.33.0", python="3.12"
) -> float:
    settings = BenchSettings(
        request_rate=math.inf,
        ready_check_timeout_sec=ready_check,
        frontend=frontend,
        server_python=python,
    )
    result = run_bench(_scenario(prefix_caching, release), ".", ONE, settings, band=False).result
    assert result["completed"] == 1
    return float(result["mean_ttft_ms"])


def test_the_test_runs_prompt_is_cached_for_the_first_request():
    cold = _ttft_ms(prefix_caching=True, ready_check=0)
    warm = _ttft_ms(prefix_caching=True, ready_check=600)
    assert warm < 0.5 * cold  # 1,024 tokens, all but the last block cached
    off = _ttft_ms(prefix_caching=False, ready_check=600)
    assert off == pytest.approx(cold, rel=1e-9)  # no cache: the test run changes nothing


def test_the_api_server_adds_the_same_latency_to_a_lone_cached_or_cold_prompt():
    """One request alone never queues for the API server's loop: its TTFT grows by its own
    input work, hand-off and first token's streaming (`sim.engine.frontend`), cached or not."""
    costs = VLLM_API_SERVER
    added_ms = 1e3 * (costs.input_s(1024) + costs.hand_off_s + costs.lone_stream_s(1))
    for ready_check in (0, 600):
        bare = _ttft_ms(prefix_caching=True, ready_check=ready_check)
        served = _ttft_ms(prefix_caching=True, ready_check=ready_check, frontend=VLLM_API_SERVER)
        assert served - bare == pytest.approx(added_ms, rel=1e-6)


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_a_microbatching_release_adds_its_tokenizers_window_to_a_lone_prompt(python: str):
    """0.19.1 tokenizes through `AsyncMicrobatchTokenizer` (`sim.engine.microbatch`): a lone
    prompt waits out the 2 ms window for company, whatever the server's Python (vllm PR #44172:
    "adds about 2ms of frontend latency for low-concurrency" workloads); 0.33.0 has none."""
    costs = VLLM_API_SERVER
    added_ms = 1e3 * (costs.input_s(1024) + costs.hand_off_s + costs.lone_stream_s(1))
    bare = _ttft_ms(prefix_caching=True, ready_check=0, release="0.19.1")
    served = _ttft_ms(True, 0, frontend=costs, release="0.19.1", python=python)
    assert served - bare == pytest.approx(added_ms + 2.0, rel=1e-6)


def test_with_test_run_gives_the_first_request_the_tests_tokens():
    specs = [
        RequestSpec(0, 0.0, 100, 4, prefix=(Segment(7, 10),)),
        RequestSpec(1, 0.5, 50, 4),
    ]
    test, main = with_test_run(specs)
    assert (test.request_id, test.arrival_s, test.prefix) == (0, 0.0, (Segment(7, 10),))
    assert [s.request_id for s in main] == [1, 2]
    assert main[0].prefix == (Segment(7, 10), Segment(UNIQUE_KEY_BASE + 0, 90))
    assert main[1].prefix == () and main[1].arrival_s == 0.5
