"""The MoE layer as vLLM's fused-MoE kernel runs it (`sim.latency.moe`): arithmetic, invariants,
public kernel times, and the per-expert charging it replaced."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import ModelSpec, get_gpu
from sim.latency import BatchShape, MeasuredStepTime
from sim.latency import measured_terms as terms
from sim.latency.measured import shipped_coefficients
from sim.latency.moe import FusedMoe, block_size_m, experts_touched, routed_rows

A100 = get_gpu("a100-80gb-sxm")
A100_CO = shipped_coefficients()["gpus"]["a100-80gb-sxm"]
#: Qwen3-30B-A3B's config.json (as in sim/data/vllm_serving_measurements.yaml)
QWEN3_30B_A3B = ModelSpec(
    name="qwen3-30b-a3b",
    num_layers=48,
    hidden_size=2048,
    num_attention_heads=32,
    num_kv_heads=4,
    head_dim=128,
    intermediate_size=768,
    vocab_size=151936,
    max_position_embeddings=40960,
    num_experts=128,
    num_experts_per_token=8,
)


def _qwen_moe(gemm: dict[str, float] | None = None) -> FusedMoe:
    return FusedMoe(
        128,
        8,
        2048,
        768,
        2.0,
        A100.peak_flops("bfloat16"),
        A100.bandwidth_Bps,
        gemm or A100_CO["gemm"],
        A100_CO["elementwise"],
    )


def test_docstring_worked_example():
    """sim.latency.moe's worked example, number by number."""
    assert experts_touched(64, 128, 8) == pytest.approx(125.9, abs=0.05)
    assert experts_touched(1, 128, 8) == pytest.approx(8.0)
    assert routed_rows(1, 128, 8) == pytest.approx(68.0)
    assert routed_rows(2048, 128, 8) == pytest.approx(20416.0, abs=0.5)
    assert (block_size_m(128, 128), block_size_m(129, 128)) == (16, 64)
    moe = _qwen_moe()
    us = 1e6
    assert us * moe.grouped_gemm_s(1, 2048, 1536) == pytest.approx(32.9, abs=0.05)
    assert us * moe.grouped_gemm_s(1, 768, 2048) == pytest.approx(19.1, abs=0.05)
    assert us * moe.experts_s(1) == pytest.approx(91.0, abs=0.05)
    assert us * moe.grouped_gemm_s(2048, 2048, 1536) == pytest.approx(888, abs=0.5)
    assert us * moe.grouped_gemm_s(2048, 768, 2048) == pytest.approx(462, abs=0.5)
    assert us * moe.experts_s(2048) == pytest.approx(1389, abs=0.5)
    # the gate+up weight stream: 50.3 MB at 1.085 x 0.837 of 2,039 GB/s = 27.2 us
    eff = 1.085 * A100_CO["gemm"]["memory_efficiency"]
    assert 8 * 2048 * 1536 * 2 / (eff * A100.bandwidth_Bps) * us == pytest.approx(27.2, abs=0.05)


def _bound_s(moe: FusedMoe, tokens: int, experts_read: float) -> float:
    """The two grouped GEMMs, written out, with `experts_read` experts' weights read."""
    c = dict(moe.gemm)
    c["memory_efficiency"] = min(1.0, c["memory_efficiency"] * moe.memory_efficiency_ratio)
    total = moe.fixed_s
    rows = routed_rows(tokens, moe.num_experts, moe.top_k)
    for k, n in ((moe.hidden, 2 * moe.inter), (moe.inter, moe.hidden)):
        nbytes = experts_read * k * n * moe.weight_bytes + 2 * tokens * moe.top_k * (k + n)
        total += terms.gemm_time_s(2 * rows * k * n, nbytes, moe.peak_flops, moe.bandwidth_Bps, c)
    return float(total)


@settings(max_examples=150, deadline=None)
@given(
    experts=st.integers(2, 512),
    data=st.data(),
    tokens=st.integers(1, 20_000),
    more=st.integers(1, 5_000),
)
def test_moe_time_monotone_in_tokens_and_between_active_and_all_experts(
    experts, data, tokens, more
):
    """More tokens never cost less; and a step reads at least one token's k experts and at most
    all E, so its time lies between those two weight reads at the same FLOPs."""
    top_k = data.draw(st.integers(1, experts))
    moe = FusedMoe(
        experts, top_k, 1024, 512, 2.0, A100.peak_flops("bfloat16"), A100.bandwidth_Bps,
        A100_CO["gemm"], A100_CO["elementwise"],
    )  # fmt: skip
    assert moe.experts_s(tokens + more) >= moe.experts_s(tokens)
    assert moe.fused_experts_s(tokens + more) >= moe.fused_experts_s(tokens)
    low, high = _bound_s(moe, tokens, top_k), _bound_s(moe, tokens, experts)
    assert low * (1 - 1e-12) <= moe.experts_s(tokens) <= high * (1 + 1e-12)


def test_moe_prefill_not_charged_per_token_experts():
    """Regression: a 2,048-token prefill of Qwen3-30B-A3B was charged 128 touched experts x 2
    GEMMs x 48 layers of launch floors (64 ms of a 184 ms step). vLLM's fused MoE launches two
    grouped GEMMs a layer whatever the tokens, so the GEMM term holds 5 floors a layer: QKV, O,
    router, gate+up, down."""
    co = copy.deepcopy(shipped_coefficients())
    co["gpus"]["a100-80gb-sxm"]["gemm"]["launch_floor_s"] = 0.0
    floor = A100_CO["gemm"]["launch_floor_s"]
    for tokens in (1, 64, 2048, 8192):
        step = BatchShape((), ((0, tokens),))
        with_floors = MeasuredStepTime(QWEN3_30B_A3B, A100).breakdown(step)["gemm_s"]
        without = MeasuredStepTime(QWEN3_30B_A3B, A100, coefficients=co).breakdown(step)["gemm_s"]
        assert with_floors - without == pytest.approx(48 * 5 * floor, rel=1e-9)


def test_moe_activation_is_one_call_over_routed_rows():
    """SiLU-and-mul runs once a layer over the T x k routed rows, not once per expert: the
    non-GEMM term with the activation's floor zeroed drops by one floor a layer."""
    co = copy.deepcopy(shipped_coefficients())
    co["gpus"]["a100-80gb-sxm"]["elementwise"]["activation"]["launch_floor_s"] = 0.0
    act_floor = A100_CO["elementwise"]["activation"]["launch_floor_s"]
    step = BatchShape((), ((0, 512),))
    full = MeasuredStepTime(QWEN3_30B_A3B, A100).breakdown(step)["non_gemm_s"]
    without = MeasuredStepTime(QWEN3_30B_A3B, A100, coefficients=co).breakdown(step)["non_gemm_s"]
    # per layer: the activation, top-k and align (charged at the activation kind's floor)
    assert full - without == pytest.approx(48 * 3 * act_floor, rel=1e-9)
