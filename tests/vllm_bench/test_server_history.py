"""Benchmark runs on a server earlier runs left warm (`sim.vllm_bench.server_history`).

The evidence is dennislee22's Test 4 server (README @b474d1e, Qwen2-7B on an A100 at
`--gpu-memory-utilization 0.25`, one `vllm serve` process, pid 113): it took runs of 10, 1, 20
and 30 prompts of `--random-input-len 1024 --random-output-len 1024` in that order, and after
each its log printed the prefix cache hit rate since start: 8.9%, 22.7%, 40.6%, 53.0%. Those
are the rates of a server where every run's prompt i is the earlier runs' prompt i (a cold run
would hit only its test request's prompt: 8.9% for the first, falling after). kvsim replaying
the same runs on one engine must print the same rates."""

from __future__ import annotations

import math

import pytest

from sim.kv.types import Segment
from sim.vllm_bench.bench import (
    WorkloadOptions,
    prepared,
    request_specs,
    run_bench,
    sample_requests,
    simulate,
)
from sim.vllm_bench.metrics import BenchSettings
from sim.vllm_bench.server_history import RUN_GAP_S, lay_out_runs
from sim.workload.request import UNIQUE_KEY_BASE, RequestSpec
from tests.benchmarks.scripts import load_script

POINT = "dl-qwen2-7b-a100-tp1-u025-in1024-out1024-n50"
#: The server's log after each run (README L1347-1517 @b474d1e): runs, cumulative hit rate.
LOGGED = (((10,), 0.089), ((10, 1), 0.227), ((10, 1, 20), 0.406), ((10, 1, 20, 30), 0.530))


def _point_setup():
    accuracy = load_script("serving_accuracy")
    point = next(p for p in accuracy.load_points() if p.id == POINT)
    scenario = accuracy.scenario_for(point, accuracy.kvsim_release("0.10.1.1"))
    options, _ = accuracy.workload_options(point)
    return point, scenario, options


def _hit_rate(scenario, options: WorkloadOptions, runs: tuple[int, ...]) -> float:
    specs = []
    for n in runs:
        requests = sample_requests(WorkloadOptions(**{**_fields(options), "num_prompts": n}))
        specs.append(request_specs(requests, [0.0] * n))
    laid, _, _ = lay_out_runs(specs, test_run=True)
    sim = simulate(prepared(scenario, "."), laid, None)
    table = sim.requests
    assert (table["state"] == "finished").all()
    return float(table["num_prefix_hit_tokens"].sum() / table["prompt_tokens"].sum())


def _fields(options: WorkloadOptions) -> dict:
    return {name: getattr(options, name) for name in WorkloadOptions.__dataclass_fields__}


@pytest.mark.parametrize(("runs", "logged"), LOGGED)
def test_the_logged_prefix_cache_hit_rates_of_a_server_taking_runs_in_turn(runs, logged):
    _, scenario, options = _point_setup()
    assert _hit_rate(scenario, options, runs) == pytest.approx(logged, abs=0.005)


def test_the_point_records_the_runs_its_server_took_before_it():
    point, _, _ = _point_setup()
    assert point.raw["server_history"]["num_prompts"] == [10, 1, 20, 30]


def test_a_warm_server_gives_a_lower_ttft_and_the_same_requests():
    _, scenario, options = _point_setup()
    settings = BenchSettings(request_rate=math.inf)
    cold = run_bench(scenario, ".", options, settings, band=False).result
    warm = run_bench(scenario, ".", options, settings, band=False, earlier_runs=(10, 1, 20, 30))
    assert warm.result["completed"] == cold["completed"] == 50
    assert warm.result["total_input_tokens"] == cold["total_input_tokens"]
    # 30 of 50 prompts cached: TTFT falls to well under two thirds of the cold one
    assert warm.result["mean_ttft_ms"] < 0.67 * cold["mean_ttft_ms"]


def test_runs_are_laid_out_one_gap_apart_with_prompt_i_keyed_by_its_index():
    run_a = [RequestSpec(0, 0.0, 100, 4, prefix=(Segment(7, 10),)), RequestSpec(1, 0.5, 50, 4)]
    run_b = [RequestSpec(0, 0.0, 100, 4, prefix=(Segment(7, 10),))]
    laid, first_id, start_s = lay_out_runs([run_a, run_b], test_run=True)
    assert [s.request_id for s in laid] == [0, 1, 2, 3, 4]
    assert [s.arrival_s for s in laid] == [0.0, RUN_GAP_S / 2, RUN_GAP_S / 2 + 0.5, RUN_GAP_S,
                                           1.5 * RUN_GAP_S]  # fmt: skip
    assert (first_id, start_s) == (4, 1.5 * RUN_GAP_S)
    prompt0 = (Segment(7, 10), Segment(UNIQUE_KEY_BASE + 0, 90))
    assert laid[0].prefix == laid[1].prefix == laid[3].prefix == laid[4].prefix == prompt0
    assert laid[2].prefix == (Segment(UNIQUE_KEY_BASE + 1, 50),)
