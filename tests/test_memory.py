"""Memory model: num_gpu_blocks as vLLM derives it."""

import pytest

from sim.catalog import get_gpu, get_model
from sim.memory import (
    ActivationSource,
    BlockCountSource,
    block_bytes,
    derive_num_gpu_blocks,
    given_num_gpu_blocks,
)

LLAMA = get_model("llama-3.1-8b")
H100 = get_gpu("h100-sxm")


def test_worked_example_llama_8b_h100():
    b = derive_num_gpu_blocks(LLAMA, H100)
    assert b.total_memory_bytes == 80 * 2**30
    assert b.weight_bytes == 16_060_522_496
    assert b.peak_activation_bytes == 209_715_200 + 131_334_144
    assert b.available_kv_bytes == 60_907_839_488
    assert b.block_bytes == 2_097_152
    assert b.num_gpu_blocks == 29_043
    assert b.source is BlockCountSource.DERIVED
    assert b.activation_source is ActivationSource.ESTIMATED
    assert b.as_dict()["num_kv_tokens"] == 29_043 * 16


def test_vllm_formula_with_measured_peak():
    """floor((total * util - peak) / (dtype * layers * 2 * bs * Hkv * D)), vLLM worker.py."""
    total, peak = 24_000_000_000, 17_000_000_000
    b = derive_num_gpu_blocks(LLAMA, get_gpu("l4"), total_memory_bytes=total,
                              gpu_memory_utilization=0.95, peak_activation_bytes=peak - LLAMA.total_params * 2)  # fmt: skip
    cache_block_size = 2 * 32 * 2 * 16 * 8 * 128
    assert b.num_gpu_blocks == (int(total * 0.95) - peak) // cache_block_size
    assert b.activation_source is ActivationSource.MEASURED


def test_tp_divides_weights_and_kv_heads_and_fp8_halves_blocks():
    tp2 = derive_num_gpu_blocks(get_model("llama-3.1-70b"), H100, tp=4, kv_dtype="fp8")
    assert tp2.num_kv_heads_per_rank == 2
    assert tp2.block_bytes == 2 * 80 * 2 * 128 * 1 * 16
    assert tp2.weight_bytes == get_model("llama-3.1-70b").total_params * 2 // 4
    assert block_bytes(LLAMA, kv_dtype="fp8") * 2 == block_bytes(LLAMA)


def test_gemma2_hybrid_blocks_span_one_group():
    gemma = get_model("gemma-2-9b")
    assert block_bytes(gemma, kv_layout="hybrid") * 2 == block_bytes(gemma)


def test_no_memory_left_is_an_error():
    with pytest.raises(ValueError, match="no memory left"):
        derive_num_gpu_blocks(get_model("llama-3.1-70b"), H100)


def test_given_num_gpu_blocks_reports_source():
    b = given_num_gpu_blocks(1000, LLAMA)
    assert b.source is BlockCountSource.GIVEN and b.num_gpu_blocks == 1000
    assert b.as_dict()["source"] == "given"
    with pytest.raises(ValueError):
        given_num_gpu_blocks(0, LLAMA)
