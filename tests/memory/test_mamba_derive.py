"""`num_gpu_blocks: derive` for a catalog Mamba hybrid: the weights each layer type holds
(`sim.catalog_params`), the usual activation / non-torch terms, then the release's hybrid pool
(`available // page // group_size`)."""

from __future__ import annotations

import pytest

from sim import catalog_params
from sim.catalog import get_gpu, get_model
from sim.kv.pins import VllmPin
from sim.memory.derive import derive_num_gpu_blocks
from sim.memory.hybrid_pool import hybrid_pool
from sim.scenario.resolve import resolve
from sim.scenario.schema import ScenarioError, scenario_from_dict


def _scenario(model: str, tp: int = 1) -> dict:
    return {
        "name": "mamba-derive",
        "model": model,
        "hardware": {"gpu": "h100-sxm", "tensor_parallel_size": tp},
        "cache": {"num_gpu_blocks": "derive", "enable_prefix_caching": False},
        "scheduler": {"design": "v1-engine", "vllm_version": "0.33.0", "max_model_len": 8192},
        "workload": {"kind": "inline", "requests": [
            {"arrival_s": 0.0, "prompt_tokens": 3000, "output_tokens": 8}]},
    }  # fmt: skip


@pytest.mark.parametrize(("name", "tp"), [("nemotron-h-8b", 1), ("qwen3-next-80b-a3b", 4)])
def test_a_mamba_hybrid_pool_is_derived_from_its_weights(name: str, tp: int) -> None:
    """The derived count is the memory left after every layer type's weights, cut into the
    release's unified pages: Nemotron-H-8B on one H100 -> 6,875 blocks of 4 layers x 528
    tokens; Qwen3-Next at TP 4 -> 10,501 blocks of 12 layers x 272 tokens (0.33.0's sampler
    peak: FlashInfer, then Triton; `sim.memory.sampler_release`; less its CUDA-graph estimate,
    `sim.memory.cudagraph`: 6,944 and 10,680 before it was modelled)."""
    model = get_model(name)
    inputs = resolve(scenario_from_dict(_scenario(name, tp))).inputs
    memory = inputs["memory"]
    assert memory["weight_bytes"] == model.total_params * 2 // tp
    budget = derive_num_gpu_blocks(
        model, get_gpu("h100-sxm"), tp=tp, engine="v1", gpu_memory_utilization=0.92,
        max_num_batched_tokens=8192, max_num_seqs=1024, vllm_release="0.33.0",
    )  # fmt: skip
    assert memory["available_kv_bytes"] == budget.available_kv_bytes
    pool = hybrid_pool(model, VllmPin("0.33.0"), block_size=16, max_model_len=8192, tp=tp)
    expected = budget.available_kv_bytes // pool.page_bytes // pool.group_size
    assert inputs["num_gpu_blocks"] == expected == {"nemotron-h-8b": 6_875}.get(name, 10_501)
    assert memory["block_bytes"] == pool.block_bytes


def test_a_model_that_does_not_fit_is_refused_in_one_line() -> None:
    """Qwen3-Next's 159 GB of bf16 weights on one 80 GB H100."""
    with pytest.raises(ScenarioError, match="no memory left for KV-cache blocks") as info:
        resolve(scenario_from_dict(_scenario("qwen3-next-80b-a3b")))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", ["nemotron-h-8b", "qwen3-next-80b-a3b"])
def test_the_mlp_not_the_mamba_mixer_is_the_forward_peak(name: str) -> None:
    """`forward_activation_bytes` sizes the MLP's live set; a bound on a Mamba / Gated-DeltaNet
    mixer's (every projection's width plus the conv output, per token: Nemotron-H 36,992,
    Qwen3-Next 24,640) must stay below it (43,008; 35,840), or the estimate would miss the
    peak."""
    model = get_model(name)
    state = model.mamba_state
    assert state is not None
    conv_dim = state.shapes()[0][0]
    widths = catalog_params.mamba_linear_params(state, model.hidden_size) // model.hidden_size
    mixer_live = widths + conv_dim
    width = 3 if model.mlp_kind == "gated" else 2
    mlp_live = width * model.intermediate_size
    if model.is_moe:
        mlp_live = model.num_experts_per_token * (mlp_live + model.hidden_size)
    assert mixer_live < mlp_live
