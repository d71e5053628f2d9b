"""Quantized checkpoints in the measured step time (`sim.latency.quantized`): fewer weight bytes
per decoder GEMM, fp8 tensor cores where the GPU has them, 16-bit lm_head, and the step flagged
`extrapolated`."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.latency import BatchShape, MeasuredStepTime
from sim.latency import measured_terms as terms
from sim.latency.band import band_of
from sim.latency.quantized import body_gemm_formats
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict

LLAMA = get_model("llama-3.1-8b")
H100, A100 = get_gpu("h100-sxm"), get_gpu("a100-80gb-sxm")


def test_the_docstring_example_gate_up_weights_halve_in_fp8():
    k, n = LLAMA.hidden_size, 2 * LLAMA.intermediate_size
    _, bf16_bytes = terms.gemm_flops_bytes(1, k, n)
    _, fp8_bytes = terms.gemm_flops_bytes(1, k, n, weight_bytes=1.0)
    assert round(k * n * 1.0 / 1e6) == 117 and round(k * n * 2.0 / 1e6) == 235
    assert bf16_bytes - fp8_bytes == k * n  # the activations stay 16-bit
    fp8 = body_gemm_formats(LLAMA, H100, "fp8")
    assert fp8.mlp.peak_flops == 1979e12 and fp8.attention.weight_bytes == 1.0


def test_fp8_without_fp8_tensor_cores_is_weight_only_at_the_bf16_peak():
    on_a100 = body_gemm_formats(LLAMA, A100, "fp8")
    assert on_a100.quantized and on_a100.mlp.weight_bytes == 1.0
    assert on_a100.mlp.peak_flops == A100.peak_flops("bfloat16")
    awq = body_gemm_formats(LLAMA, H100, "awq")
    assert awq.mlp.peak_flops == H100.peak_flops("bfloat16")
    assert awq.mlp.weight_bytes == pytest.approx(0.5 + 2 / 128 + 0.5 / 128)
    for plain in (None, "auto", "bf16", "float16"):
        assert not body_gemm_formats(LLAMA, H100, plain).quantized


def test_mxfp4_quantizes_only_moe_experts():
    dense = body_gemm_formats(LLAMA, H100, "mxfp4")
    assert not dense.quantized and dense.mlp.weight_bytes == 2.0
    moe = body_gemm_formats(get_model("mixtral-8x7b-v0.1"), H100, "mxfp4")
    assert moe.quantized and moe.attention.weight_bytes == 2.0 and moe.mlp.weight_bytes < 1.0


@settings(max_examples=40, deadline=None)
@given(
    fmt=st.sampled_from(["fp8", "int8", "awq-int4", "gptq-int4"]),
    gpu=st.sampled_from(["h100-sxm", "a100-80gb-sxm", "l40s", "h200"]),
    decodes=st.integers(1, 256),
    chunk=st.integers(0, 8192),
)
def test_a_quantized_step_is_never_slower_and_its_lm_head_is_unchanged(fmt, gpu, decodes, chunk):
    spec = get_gpu(gpu)
    plain = MeasuredStepTime(LLAMA, spec)
    quant = MeasuredStepTime(LLAMA, spec, weight_dtype=fmt)
    batch = BatchShape((1024,) * decodes, ((0, chunk),) if chunk else ())
    q, p = quant.breakdown(batch), plain.breakdown(batch)
    assert q["gemm_s"] < p["gemm_s"]
    assert q["lm_head_s"] == p["lm_head_s"] and q["decode_attention_s"] == p["decode_attention_s"]
    assert quant.predict_s(batch) < plain.predict_s(batch)
    assert quant.extrapolated and band_of(quant).extrapolated


def test_memory_bound_decode_gemms_take_about_half_the_time_in_fp8():
    batch = BatchShape((1024,), ())
    plain = MeasuredStepTime(LLAMA, H100).breakdown(batch)["gemm_s"]
    fp8 = MeasuredStepTime(LLAMA, H100, weight_dtype="fp8").breakdown(batch)["gemm_s"]
    assert 0.45 < fp8 / plain < 0.6  # launch floors do not halve


def test_a_scenarios_model_dtype_reaches_the_step_time():
    doc = {
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "l40s"},
        "scheduler": {"design": "v1-engine"},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0, "prompt_tokens": 8, "output_tokens": 2}],
        },  # fmt: skip
    }
    plain = resolve(scenario_from_dict(doc), ".").step_time
    fp8 = resolve(scenario_from_dict({**doc, "model_dtype": "fp8"}), ".").step_time
    assert isinstance(fp8, MeasuredStepTime) and fp8.gemm_formats.quantized
    batch = BatchShape((512,) * 32, ())
    assert fp8.predict_s(batch) < plain.predict_s(batch)
    assert "GPU not in the fit" in band_of(fp8).source  # the L40S is extrapolated anyway
    on_h100 = band_of(MeasuredStepTime(LLAMA, H100, weight_dtype="fp8"))
    assert on_h100.extrapolated and "quantized weights" in on_h100.source
