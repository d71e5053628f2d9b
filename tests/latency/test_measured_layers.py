"""The token-count terms of the measured model (`sim.latency.measured_layers`)."""

from __future__ import annotations

import pytest

from sim.catalog import get_gpu, get_model
from sim.latency import measured_terms as terms
from sim.latency.measured import MeasuredStepTime, shipped_coefficients
from sim.latency.measured_layers import LayerKernels, fitted_allreduce_cost


def _kernels(model_name: str, gpu_name: str, tp: int = 1) -> LayerKernels:
    step = MeasuredStepTime(get_model(model_name), get_gpu(gpu_name), tp=tp)
    return step._kernels  # noqa: SLF001 - the model's own layer terms


def test_worked_example_in_the_module_docstring():
    """Llama-3.1-8B, H100 SXM, 64 tokens: the figures the docstring quotes."""
    model, gpu = get_model("llama-3.1-8b"), get_gpu("h100-sxm")
    c = shipped_coefficients()["gpus"]["h100-sxm"]["gemm"]
    k = _kernels("llama-3.1-8b", "h100-sxm")
    gemm_s, _, allreduce_s = k.body(64)
    assert gemm_s == pytest.approx(5.70e-3, abs=0.005e-3)
    assert allreduce_s == 0.0
    assert k.lm_head(64) == pytest.approx(0.38e-3, abs=0.005e-3)
    flops = nbytes = 0.0
    for k_in, n_out in k._attn_shapes + k._mlp_shapes:  # noqa: SLF001
        f, b = terms.gemm_flops_bytes(64.0, k_in, n_out)
        flops, nbytes = flops + f * model.num_layers, nbytes + b * model.num_layers
    assert nbytes == pytest.approx(14.2e9, rel=0.005)
    assert flops == pytest.approx(0.89e12, rel=0.005)
    t_m = nbytes / (c["memory_efficiency"] * gpu.bandwidth_Bps)
    t_c = flops / (c["compute_efficiency"] * gpu.peak_flops(model.dtype))
    assert (t_m, t_c) == pytest.approx((4.31e-3, 1.17e-3), abs=0.005e-3)
    floors_s = 4 * model.num_layers * c["launch_floor_s"]
    assert floors_s == pytest.approx(0.69e-3, abs=0.005e-3)
    assert gemm_s - floors_s == pytest.approx(5.01e-3, abs=0.005e-3)


def test_allreduce_cost_example_and_tp_one():
    """The L4 example of `fitted_allreduce_cost`; no all-reduce at tp 1."""
    a100 = shipped_coefficients()["gpus"]["a100-80gb-sxm"]
    l4 = get_gpu("l4")
    assert fitted_allreduce_cost(a100, l4, 1, p2p=True, release=None) is None
    cost = fitted_allreduce_cost(a100, l4, 2, p2p=True, release=None)
    assert cost is not None
    assert cost.nccl["algbw_GBps"] == pytest.approx(16.86, abs=0.005)
    assert cost.nccl["algbw_GBps"] == pytest.approx(a100["allreduce"]["2"]["algbw_GBps"] * 64 / 600)


def test_a_repeated_count_is_served_from_the_cache_unchanged():
    k = _kernels("qwen2.5-7b", "a100-80gb-sxm", tp=2)
    first = k.body(2112), k.lm_head(65)
    fresh = _kernels("qwen2.5-7b", "a100-80gb-sxm", tp=2)
    assert (fresh.lm_head(65), fresh.body(2112)) == (first[1], first[0])
    assert (k.body(2112), k.lm_head(65)) == first
    assert first[0][2] > 0.0  # tp 2: two all-reduces a layer
