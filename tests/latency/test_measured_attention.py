"""The attention terms of the measured model (`sim.latency.measured_attention`)."""

from __future__ import annotations

import pytest

from sim.catalog import get_gpu, get_model
from sim.latency.batch import BatchShape
from sim.latency.measured import MeasuredStepTime, shipped_coefficients
from sim.latency.measured_attention import AttentionKernels


def _attention(model_name: str, gpu_name: str) -> AttentionKernels:
    model, gpu = get_model(model_name), get_gpu(gpu_name)
    c = shipped_coefficients()["gpus"][gpu_name]
    return AttentionKernels(
        model, model.num_attention_heads, model.num_kv_heads, None,
        c["decode_attention"], c["prefill_attention"], gpu.peak_flops(model.dtype),
        gpu.bandwidth_Bps,
    )  # fmt: skip


def test_worked_example_in_the_module_docstring():
    """Llama-3.1-8B, H100 SXM, 64 decodes at 4,096: 34.4 GB of KV in 13.41 ms, 13.83 ms in
    all, the decode attention term `MeasuredStepTime.breakdown` reports."""
    attention = _attention("llama-3.1-8b", "h100-sxm")
    batch = BatchShape((4096,) * 64, ())
    assert attention.kv_read_full * batch.decode_context_sum == pytest.approx(34.4e9, abs=0.05e9)
    assert attention.decode_kv_s(batch) == pytest.approx(13.41e-3, abs=0.005e-3)
    assert attention.decode_fixed_s(64) == pytest.approx(32 * 13.4e-6, rel=1e-2)
    assert attention.decode_s(batch, 64) == pytest.approx(13.83e-3, abs=0.005e-3)
    step = MeasuredStepTime(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))
    assert step.breakdown(batch)["decode_attention_s"] == attention.decode_s(batch, 64)


def test_a_sliding_layer_reads_no_more_than_its_window():
    """Mistral-7B-v0.1 (every layer sliding, 4,096 window): a decode at 8,192 context reads as
    much KV as one at 4,096, and a prefill chunk's keys stop at the window too."""
    attention = _attention("mistral-7b-v0.1", "h100-sxm")
    assert attention.window == 4096 and attention.kv_read_full == 0.0
    at_window = attention.decode_kv_s(BatchShape((4096,), ()))
    assert attention.decode_kv_s(BatchShape((8192,), ())) == at_window
    assert attention.prefill_s(((8192, 512),)) == attention.prefill_s(((4096, 512),))
    assert attention.prefill_s(((0, 512),)) < attention.prefill_s(((4096, 512),))
