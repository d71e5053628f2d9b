"""kvsim's `vllm bench serve` result has the keys vLLM's has, read from the release's source.

The key list comes from vllm/benchmarks/serve.py by AST (`source_ast.bench_result_keys`): the
generation result dict of `benchmark`, the keys `main_async` sets, the per-metric templates of
`process_one_metric` for the metrics it is called with, and the per-request fields dropped
without --save-detailed. The conditional extras kvsim never produces (speculative decoding,
diffusion, probes, ramp-up, server-side timings, --metadata) are not in that list.
"""

from __future__ import annotations

import math

import pytest

from sim.vllm_bench.metrics import BenchSettings, RequestOutcome, benchmark_result, result_json
from tests.harness.vllm_install import root_or_skip
from tests.vllm_bench.source_ast import bench_result_keys


def _expected(source: dict, settings: BenchSettings) -> set[str]:
    keys = set(source["main_async"]) | set(source["result"])
    for metric in source["metrics"]:
        if metric not in settings.selected_metrics:
            continue
        for template in source["templates"]:
            if template.count("{}") == 1:
                keys.add(template.format(metric))
            else:
                for p in settings.percentiles:
                    keys.add(template.format(str(int(p)) if int(p) == p else str(p), metric))
    if not settings.save_detailed:
        keys -= set(source["detailed"])
    return keys


OUTCOMES = [RequestOutcome(True, 10, 3, 0.1, (0.05, 0.05), 0.2, 0.0),
            RequestOutcome(True, 12, 1, 0.2, (), 0.2, 0.5, 0.1),
            RequestOutcome(False, 9, error="ignored")]  # fmt: skip


@pytest.mark.parametrize(
    "settings",
    [
        BenchSettings(),
        BenchSettings(request_rate=4.0, metric_percentiles="50,90,99.9", save_detailed=True),
        BenchSettings(
            percentile_metrics="ttft,tpot,itl,e2el,client_queue_time,e2el_including_client_queue",
            max_concurrency=2,
            request_rate=2.0,
            goodput={"ttft": 150.0},
        ),
    ],  # fmt: skip
    ids=["defaults", "detailed-percentiles", "all-metrics-concurrency"],
)
def test_kvsim_result_keys_are_the_release_keys(settings: BenchSettings) -> None:
    source = bench_result_keys(root_or_skip("0.33.0"))
    benchmark, _ = benchmark_result(OUTCOMES, 1.0, settings)
    ours = result_json(benchmark, settings, date="20260101-000000", model_id="m", num_prompts=3)
    assert set(ours) == _expected(source, settings)


def test_the_source_lists_what_this_test_relies_on() -> None:
    """A release that renamed these would make the diff above vacuous."""
    source = bench_result_keys(root_or_skip("0.33.0"))
    assert {"duration", "ttfts", "itls", "request_goodput"} <= set(source["result"])
    assert {"ttft", "tpot", "itl", "e2el"} <= set(source["metrics"])
    assert "p{}_{}_ms" in source["templates"]
    assert "date" in source["main_async"] and "itls" in source["detailed"]


def test_worked_example_of_the_metrics() -> None:
    """The module docstring's request (0.1, 0.15, 0.2 s) and one single-token request."""
    settings = BenchSettings(percentile_metrics="ttft,tpot,itl,e2el", goodput={"ttft": 150.0})
    result, lines = benchmark_result(OUTCOMES, 2.0, settings)
    assert result["completed"] == 2 and result["failed"] == 1
    assert result["total_input_tokens"] == 22 and result["total_output_tokens"] == 4
    assert result["request_throughput"] == 1.0 and result["output_throughput"] == 2.0
    assert result["request_goodput"] == 0.5  # only the first meets ttft <= 150 ms
    assert math.isclose(result["mean_ttft_ms"], 150.0)
    assert math.isclose(result["mean_tpot_ms"], 50.0)  # the 1-token request has no TPOT
    assert math.isclose(result["p99_itl_ms"], 50.0)
    assert math.isclose(result["median_e2el_ms"], 200.0)
    assert lines[0] == "=" * 12 + " Serving Benchmark Result " + "=" * 12
    assert "Mean TTFT (ms):                          150.00    " in lines
