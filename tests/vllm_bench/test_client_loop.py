"""sim.vllm_bench.client_loop: the bench client's loop stamps each SSE message after its
cost, first come first served; free, it changes nothing."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.scenario.schema import scenario_from_dict
from sim.vllm_bench.bench import WorkloadOptions, run_bench
from sim.vllm_bench.client_loop import VLLM_BENCH_CLIENT, ClientLoop, client_stamped
from sim.vllm_bench.metrics import BenchSettings


def test_the_docstring_example():
    # 100 us a message: two first tokens at 0 go out at 0.1 and 0.2 ms; request 0's next
    # token, delivered at 0.15 ms, waits for the loop until 0.2 ms: stamped at 0.3 ms.
    out = client_stamped({0: [0.0, 0.15e-3], 1: [0.0]}, ClientLoop(100e-6))
    assert out[0] == pytest.approx([0.1e-3, 0.3e-3])
    assert out[1] == pytest.approx([0.2e-3])


def test_tokens_delivered_together_are_one_message():
    # Request 0's three tokens merged into one chunk at 1 s: one 50 us message, one stamp.
    out = client_stamped({0: [1.0, 1.0, 1.0, 2.0]}, ClientLoop(50e-6))
    assert out[0] == pytest.approx([1.00005, 1.00005, 1.00005, 2.00005])


def test_the_shipped_client_is_free_and_free_changes_nothing():
    times = {3: [0.5, 0.5, 0.7], 4: [0.6]}
    assert VLLM_BENCH_CLIENT.free
    assert client_stamped(times, VLLM_BENCH_CLIENT) == times


@pytest.mark.parametrize("bad", [-1e-6, math.nan])
def test_a_negative_or_nan_cost_is_refused(bad):
    with pytest.raises(ValueError, match="chunk_s"):
        ClientLoop(bad)


deliveries = st.dictionaries(
    st.integers(0, 20),
    st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=8).map(sorted),
    min_size=1,
    max_size=10,
)


@given(deliveries, st.floats(0.0, 1e-3, allow_nan=False))
def test_stamps_never_precede_delivery_keep_order_and_the_loop_serves_one_at_a_time(times, cost):
    out = client_stamped(times, ClientLoop(cost))
    for rid, ts in times.items():
        assert len(out[rid]) == len(ts)
        assert all(s >= t + cost - 1e-12 for s, t in zip(out[rid], ts, strict=True))
        assert out[rid] == sorted(out[rid])  # a stream's tokens stay in order
    # One loop: distinct message stamps are at least `cost` apart.
    stamps = sorted({(rid, s) for rid, ss in out.items() for s in ss}, key=lambda x: x[1])
    gaps = [b[1] - a[1] for a, b in zip(stamps, stamps[1:], strict=False)]
    assert all(g >= cost - 1e-9 for g in gaps)


@given(deliveries)
def test_a_dearer_loop_never_stamps_earlier(times):
    cheap = client_stamped(times, ClientLoop(10e-6))
    dear = client_stamped(times, ClientLoop(50e-6))
    for rid in times:
        assert all(d >= c for c, d in zip(cheap[rid], dear[rid], strict=True))


def _bench(client_loop: ClientLoop, ready_check: int = 600) -> dict:
    scenario = scenario_from_dict(
        {
            "name": "client-loop",
            "model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm"},
            "scheduler": {"design": "v1-engine", "vllm_version": "0.33.0"},
            "workload": {
                "kind": "inline",
                "requests": [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}],
            },  # fmt: skip
        },
        "client-loop.yaml",
    )
    workload = WorkloadOptions(num_prompts=20, random_input_len=256, random_output_len=8)
    settings = BenchSettings(ready_check_timeout_sec=ready_check, client_loop=client_loop)
    return run_bench(scenario, ".", workload, settings, band=False).result


@pytest.mark.parametrize("ready_check", [0, 600])
def test_a_burst_through_a_dear_client_loop_stamps_later_and_the_free_one_changes_nothing(
    ready_check,
):
    free = _bench(VLLM_BENCH_CLIENT, ready_check)
    assert _bench(ClientLoop(0.0), ready_check) == free
    dear = _bench(ClientLoop(1e-3), ready_check)  # 1 ms a message: 20 first tokens queue
    # The 20 first messages of a burst cannot all be stamped within less than 20 x 1 ms.
    assert dear["mean_ttft_ms"] >= free["mean_ttft_ms"] + 1.0
    assert dear["duration"] > free["duration"]
    assert dear["completed"] == free["completed"] == 20
