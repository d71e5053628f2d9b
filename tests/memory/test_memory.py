"""Memory model: num_gpu_blocks as vLLM derives it, and the terms it subtracts."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.memory.derive import (
    ActivationSource,
    BlockCountSource,
    block_bytes,
    derive_num_gpu_blocks,
    given_num_gpu_blocks,
    num_kv_groups,
)
from sim.memory.terms import (
    ACTIVATION_FIT,
    GIB,
    NON_TORCH_GIB,
    SamplerPath,
    VllmEngine,
    estimate_peak_activation_bytes,
    forward_activation_bytes,
    sampler_logits_bytes,
    visible_memory,
    weight_bytes,
    weight_format,
)

LLAMA = get_model("llama-3.1-8b")
H100 = get_gpu("h100-sxm")


def test_worked_example_llama_8b_h100():
    """The module docstring's example, number for number."""
    b = derive_num_gpu_blocks(LLAMA, H100)
    assert b.total_memory_bytes == 85_029_615_042
    assert b.weight_bytes == 16_060_522_496
    assert b.peak_activation_bytes == 1_346_174_976  # 10.25 x 131,334,144 (the sampler wins)
    assert b.non_torch_bytes == 375_809_638
    assert b.available_kv_bytes == 58_744_146_427
    assert b.block_bytes == 2_097_152
    assert b.num_gpu_blocks == 28_011
    assert b.source is BlockCountSource.DERIVED
    assert b.activation_source is ActivationSource.ESTIMATED
    assert b.as_dict()["num_kv_tokens"] == 28_011 * 16


def test_h100_pool_uses_driver_visible_79_19_gib_not_80():
    """vLLM multiplies the driver's 79.19 GiB by the utilization, not the datasheet's 80."""
    derived = derive_num_gpu_blocks(LLAMA, H100)
    assert derived.total_memory_bytes == int(79.19 * GIB)
    assert derived.total_memory_source == "measured"
    datasheet = derive_num_gpu_blocks(LLAMA, H100, total_memory_bytes=80 * GIB)
    assert datasheet.total_memory_source == "given"
    lost = datasheet.available_kv_bytes - derived.available_kv_bytes
    assert lost == int(80 * GIB * 0.9) - int(int(79.19 * GIB) * 0.9)  # 0.73 GiB less pool


def test_unmeasured_gpu_memory_is_estimated_and_flagged():
    total, source = visible_memory(get_gpu("a100-80gb-sxm"))
    assert source.value == "estimated"
    assert total == int(80 * (79.19 / 80) * GIB)


def test_geometry_dict_gpu_uses_its_visible_memory():
    card = {"name": "rtx-3090", "memory_gb": 24, "memory_visible_gib": 23.58,
            "hbm_bandwidth_GBps": 936, "bf16_tflops": 71, "fp16_tflops": 71,
            "interconnect_GBps": 64}  # fmt: skip
    b = derive_num_gpu_blocks(LLAMA, get_gpu(card), max_num_seqs=256)
    assert b.total_memory_bytes == int(23.58 * GIB)
    assert b.total_memory_source == "measured"
    with pytest.raises(ValueError, match="exceeds memory_gb"):
        get_gpu({**card, "memory_visible_gib": 25})


def test_vllm_formula_with_measured_peak():
    """floor((total * util - peak) / (dtype * layers * 2 * bs * Hkv * D)), vLLM worker.py."""
    total, peak = 24_000_000_000, 17_000_000_000
    b = derive_num_gpu_blocks(LLAMA, get_gpu("l4"), total_memory_bytes=total, non_torch_bytes=0,
                              gpu_memory_utilization=0.95, peak_activation_bytes=peak - LLAMA.total_params * 2)  # fmt: skip
    cache_block_size = 2 * 32 * 2 * 16 * 8 * 128
    assert b.num_gpu_blocks == (int(total * 0.95) - peak) // cache_block_size
    assert b.activation_source is ActivationSource.MEASURED
    assert b.non_torch_source == "given"


def test_tp_divides_weights_and_kv_heads_and_fp8_halves_blocks():
    tp4 = derive_num_gpu_blocks(get_model("llama-3.1-70b"), H100, tp=4, kv_dtype="fp8")
    assert tp4.num_kv_heads_per_rank == 2
    assert tp4.block_bytes == 2 * 80 * 2 * 128 * 1 * 16
    assert tp4.weight_bytes == get_model("llama-3.1-70b").total_params * 2 // 4
    assert block_bytes(LLAMA, kv_dtype="fp8") * 2 == block_bytes(LLAMA)


def test_gemma2_hybrid_blocks_span_one_group():
    gemma = get_model("gemma-2-9b")
    assert block_bytes(gemma, kv_layout="hybrid") * 2 == block_bytes(gemma)
    assert num_kv_groups(gemma, "hybrid") == 2
    assert num_kv_groups(gemma, "uniform") == 1


def test_gemma2_hybrid_pool_has_twice_the_blocks_and_the_same_tokens():
    """vLLM's hybrid pool: 2x half-size blocks, reported as blocks // 2 x 16 tokens."""
    gemma = get_model("gemma-2-9b")
    uniform = derive_num_gpu_blocks(gemma, H100)
    hybrid = derive_num_gpu_blocks(gemma, H100, kv_layout="hybrid")
    assert hybrid.num_gpu_blocks in (2 * uniform.num_gpu_blocks, 2 * uniform.num_gpu_blocks + 1)
    assert hybrid.num_kv_tokens == uniform.num_kv_tokens


def test_no_memory_left_is_an_error():
    with pytest.raises(ValueError, match="no memory left"):
        derive_num_gpu_blocks(get_model("llama-3.1-70b"), H100)


def test_given_num_gpu_blocks_reports_source():
    b = given_num_gpu_blocks(1000, LLAMA)
    assert b.source is BlockCountSource.GIVEN
    assert b.activation_source is ActivationSource.NOT_USED
    assert b.available_kv_bytes == 1000 * b.block_bytes


# -- weights ---------------------------------------------------------------------------------


def test_quantized_weights_reduce_weight_bytes():
    bf16 = weight_bytes(LLAMA, "bfloat16")
    fp8 = weight_bytes(LLAMA, "fp8")
    int4 = weight_bytes(LLAMA, "awq-int4")
    assert bf16 == LLAMA.total_params * 2 == 16_060_522_496
    # Linear body in 1 B, embeddings / lm_head / norms stay 16-bit (module docstring example).
    assert fp8 == 6_979_321_856 + 1_050_939_392 * 2 == 9_081_200_640
    rest = LLAMA.total_params - LLAMA.body_linear_params
    assert int4 == int(LLAMA.body_linear_params * (0.5 + 2 / 128 + 0.5 / 128) + rest * 2)
    assert int4 < fp8 < bf16


def test_quantized_weights_grow_the_pool_by_exactly_the_bytes_saved():
    bf16 = derive_num_gpu_blocks(LLAMA, H100)
    fp8 = derive_num_gpu_blocks(LLAMA, H100, weight_dtype="fp8")
    assert fp8.weight_format == "fp8"
    saved = bf16.weight_bytes - fp8.weight_bytes
    assert fp8.available_kv_bytes - bf16.available_kv_bytes == saved


def test_mxfp4_quantizes_only_the_moe_experts():
    mixtral = get_model("mixtral-8x7b-v0.1")
    experts = mixtral.num_layers * mixtral.num_experts * mixtral.expert_params
    rest = mixtral.total_params - experts
    assert weight_bytes(mixtral, "mxfp4") == int(experts * (0.5 + 1 / 32) + rest * 2)


def test_mxfp4_marlin_padding_on_an_a100_regression():
    """Bug: kvsim stored MXFP4 experts unpadded, 0.92 GiB short of vLLM 0.19.0's 13.72 GiB for
    gpt-oss-20b on an A100 (Marlin pads hidden to 256, width to 128), 2 GiB short for
    gpt-oss-120b at TP 4 under 0.10.1. The docstring's arithmetic, byte for byte."""
    from sim.memory.terms import mxfp4_expert_dims, mxfp4_padding_bytes

    gpt_oss = get_model("gpt-oss-20b")  # 24 MoE layers x 32 experts, h = I = 2880
    a100, h100 = get_gpu("a100-80gb-sxm"), get_gpu("h100-sxm")
    assert (a100.compute_capability, h100.compute_capability) == ((8, 0), (9, 0))
    assert mxfp4_expert_dims(gpt_oss, 1, a100.compute_capability) == (3072, 2944)
    assert mxfp4_expert_dims(gpt_oss, 1, h100.compute_capability) == (2880, 2880)
    assert mxfp4_expert_dims(gpt_oss, 4, a100.compute_capability) == (3072, 768)
    assert mxfp4_expert_dims(gpt_oss, 4, h100.compute_capability) == (2880, 768)  # 720 -> 64s
    assert mxfp4_expert_dims(gpt_oss, 1, None) == (2880, 2880)
    assert mxfp4_expert_dims(gpt_oss, 1, (10, 0)) == (2880, 2880)  # Blackwell: not modelled
    values = 768 * 3 * (3072 * 2944 - 2880 * 2880) * 0.53125
    biases = 768 * (2 * 64 + 192) * 2 if gpt_oss.moe_bias else 0
    assert mxfp4_padding_bytes(gpt_oss, 1, (8, 0)) == int(values + biases)
    assert mxfp4_padding_bytes(gpt_oss, 1, (9, 0)) == 0
    unpadded = weight_bytes(gpt_oss, "mxfp4")
    assert weight_bytes(gpt_oss, "mxfp4", 1, (9, 0)) == unpadded
    assert weight_bytes(gpt_oss, "mxfp4", 1, (8, 0)) == unpadded + int(values + biases)
    # derive passes the GPU's capability; other formats ignore it
    derived = derive_num_gpu_blocks(gpt_oss, a100, weight_dtype="mxfp4", engine="v1")
    assert derived.weight_bytes == unpadded + int(values + biases)
    assert weight_bytes(LLAMA, "fp8", 1, (8, 0)) == weight_bytes(LLAMA, "fp8")


def test_unknown_weight_format_is_an_error():
    with pytest.raises(ValueError, match="unknown model_dtype 'int3'"):
        weight_format("int3")
    assert weight_format("AWQ").value == "awq-int4"


# -- activation and non-torch ----------------------------------------------------------------


def test_activation_is_the_larger_of_forward_and_sampler():
    forward = forward_activation_bytes(LLAMA, 8192)
    logits = sampler_logits_bytes(LLAMA, 8192, 1024)
    assert logits == 1024 * 128_256 * 4
    expected = int(
        max(
            ACTIVATION_FIT.hidden_factor * forward,
            ACTIVATION_FIT.sampler_copies[SamplerPath.V1_PYTORCH] * logits,
        )
    )
    got = estimate_peak_activation_bytes(
        LLAMA, max_num_batched_tokens=8192, max_num_seqs=1024, sampler=SamplerPath.V1_PYTORCH
    )
    assert got == expected
    assert round(got / GIB, 2) == 4.77  # sim.memory.terms docstring; vLLM 0.11 logged 4.76


def test_large_vocabulary_costs_more_activation():
    """Gemma-2's 256k vocabulary makes 2x Llama-3's logits at the same rows."""
    gemma = get_model("gemma-2-9b")
    assert sampler_logits_bytes(gemma, 2048, 256) == 2 * 256 * 128_000 * 4
    assert sampler_logits_bytes(gemma, 2048, 256) > sampler_logits_bytes(LLAMA, 2048, 256)


def test_moe_forward_counts_every_routed_copy():
    mixtral = get_model("mixtral-8x7b-v0.1")  # h 4096, I 14336, top-2
    per_token = 2 * 4096 + 2 * (3 * 14336 + 4096)
    assert forward_activation_bytes(mixtral, 1024) == 1024 * 2 * per_token


def test_flashinfer_sampler_leaves_a_bigger_pool():
    setup = {"max_num_seqs": 1024, "max_num_batched_tokens": 8192, "engine": "v1"}
    pytorch = derive_num_gpu_blocks(LLAMA, H100, **setup)
    flashinfer = derive_num_gpu_blocks(LLAMA, H100, **setup, flashinfer_sampler=True)
    assert flashinfer.peak_activation_bytes < pytorch.peak_activation_bytes
    assert flashinfer.num_gpu_blocks > pytorch.num_gpu_blocks


def test_non_torch_memory_grows_with_tensor_parallelism():
    for engine in VllmEngine:
        assert NON_TORCH_GIB[(engine, True)] >= NON_TORCH_GIB[(engine, False)]
    tp2 = derive_num_gpu_blocks(get_model("llama-3.1-70b"), H100, tp=2, engine="v1")
    assert tp2.non_torch_bytes == int(NON_TORCH_GIB[(VllmEngine.V1, True)] * GIB)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(256, 32768),
    seqs=st.integers(1, 1024),
    util=st.floats(0.5, 0.95),
    more_tokens=st.integers(0, 8192),
    more_util=st.floats(0.0, 0.04),
)
def test_pool_shrinks_with_the_budget_and_grows_with_utilization(
    tokens, seqs, util, more_tokens, more_util
):
    base = derive_num_gpu_blocks(
        LLAMA, H100, gpu_memory_utilization=util, max_num_batched_tokens=tokens, max_num_seqs=seqs
    )
    bigger_budget = derive_num_gpu_blocks(
        LLAMA, H100, gpu_memory_utilization=util, max_num_batched_tokens=tokens + more_tokens,
        max_num_seqs=seqs,
    )  # fmt: skip
    more_memory = derive_num_gpu_blocks(
        LLAMA, H100, gpu_memory_utilization=util + more_util, max_num_batched_tokens=tokens,
        max_num_seqs=seqs,
    )  # fmt: skip
    assert bigger_budget.num_gpu_blocks <= base.num_gpu_blocks <= more_memory.num_gpu_blocks
    assert base.available_kv_bytes == (
        int(base.total_memory_bytes * util)
        - base.weight_bytes
        - base.peak_activation_bytes
        - base.non_torch_bytes
    )
