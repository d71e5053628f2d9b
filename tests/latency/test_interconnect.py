"""All-reduce without GPU peer access (`hardware.p2p: false`, sim.latency.interconnect)."""

from __future__ import annotations

import pytest

from sim.catalog import get_gpu, get_model
from sim.errors import InputError
from sim.latency import BatchShape, make_step_time
from sim.latency.interconnect import (
    HOST_STAGED_ALGBW_GBPS,
    HOST_STAGED_LATENCY_S,
    host_staged_allreduce,
)
from sim.latency.measured import MeasuredStepTime
from sim.scenario.resolve import step_time_model
from sim.scenario.schema import scenario_from_dict


def test_ring_over_more_ranks_scales_latency_and_bandwidth_as_the_docstring_says():
    assert host_staged_allreduce(2) == {"latency_s": 39e-6, "algbw_GBps": 6.5}
    four = host_staged_allreduce(4)
    assert four["latency_s"] == pytest.approx(117e-6)
    assert four["algbw_GBps"] == pytest.approx(6.5 * 4 / 6)
    with pytest.raises(ValueError, match="tp >= 2"):
        host_staged_allreduce(1)


def test_docstring_prefill_example_is_what_the_term_gives():
    """An 8,192-token chunk of a 3,584-wide model all-reduces 58.7 MB: 9.07 ms."""
    nbytes = 8192 * 3584 * 2
    c = host_staged_allreduce(2)
    assert c["latency_s"] + nbytes / (c["algbw_GBps"] * 1e9) == pytest.approx(9.073e-3, rel=1e-3)


def test_without_p2p_only_the_allreduce_term_changes_and_by_the_host_staged_formula():
    model, gpu = get_model("qwen2.5-7b"), get_gpu("a100-80gb-sxm")
    batch = BatchShape((1024,) * 64, ((0, 512),))
    direct = MeasuredStepTime(model, gpu, tp=2).breakdown(batch)
    host = MeasuredStepTime(model, gpu, tp=2, p2p=False)
    staged = host.breakdown(batch)
    for term in direct:
        if term != "allreduce_s":
            assert staged[term] == direct[term], term
    tokens = 64 + 512
    expected = (
        2
        * model.num_layers
        * (HOST_STAGED_LATENCY_S + tokens * model.hidden_size * 2 / (HOST_STAGED_ALGBW_GBPS * 1e9))
    )
    assert staged["allreduce_s"] == pytest.approx(expected)
    assert staged["allreduce_s"] > 3 * direct["allreduce_s"]
    assert host.extrapolated and "peer access" in host.band().source


def test_p2p_false_at_tp1_changes_nothing():
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    batch = BatchShape((2048,) * 8, ())
    assert MeasuredStepTime(model, gpu, p2p=False).predict_s(batch) == MeasuredStepTime(
        model, gpu
    ).predict_s(batch)
    assert not MeasuredStepTime(model, gpu, p2p=False).extrapolated


def test_models_without_an_allreduce_term_refuse_p2p_false_at_tp2():
    with pytest.raises(InputError, match="hardware.p2p"):
        make_step_time({"roofline": {}}, "qwen2.5-7b", "a100-80gb-sxm", tp=2, p2p=False)
    make_step_time({"roofline": {}}, "qwen2.5-7b", "a100-80gb-sxm", tp=1, p2p=False)


def test_scenario_hardware_p2p_reaches_the_step_time_model():
    base = {
        "name": "p2p",
        "model": "qwen2.5-7b",
        "hardware": {"gpu": "a100-80gb-sxm", "tensor_parallel_size": 2, "p2p": False},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0, "prompt_tokens": 16, "output_tokens": 2}],
        },
    }
    model = step_time_model(scenario_from_dict(base, "p2p.yaml"))
    assert isinstance(model, MeasuredStepTime) and model.p2p is False
    base["hardware"]["p2p"] = True
    assert step_time_model(scenario_from_dict(base, "p2p.yaml")).p2p is True
