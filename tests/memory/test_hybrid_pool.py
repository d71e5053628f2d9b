"""`sim.memory.hybrid_pool`: each catalog hybrid's groups and pool per release (the worked
examples in its docstrings, hand-computed there), the refusals, and hypothesis invariants.
The same numbers against the releases' own functions: tests/vllm_real/test_hybrid_pool_lockstep.py.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_model
from sim.kv.pins import VllmPin
from sim.kv.v1_engine.hybrid_layout import group_layers
from sim.memory.hybrid_pool import KERNEL_BLOCK_ALIGNMENT, hybrid_pool, unified_block_size

V1_RELEASES = [VllmPin(v) for v in ("0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0")]
GiB = 2**30


def _pool(name: str, version: str, block_size: int = 16, tp: int = 1):
    return hybrid_pool(
        get_model(name), VllmPin(version), block_size=block_size, max_model_len=8192, tp=tp
    )


def _kinds(pool) -> list[str]:
    return [
        "mamba" if g.mamba else "chunked" if g.attention_chunk_size else
        "sliding" if g.sliding_window else "full"
        for g in pool.groups
    ]  # fmt: skip


def test_qwen3_next_worked_example():
    """hybrid_pool's docstring: 2,048 B a token, a 1,097,728 B state -> 544-token blocks,
    1,114,112 B pages (16,384 B padding), 4 groups of 12, 3,212 blocks in 40 GiB."""
    pool = _pool("qwen3-next-80b-a3b", "0.33.0")
    assert (pool.block_size, pool.page_bytes, pool.mamba_padding_bytes) == (544, 1_114_112, 16_384)
    assert _kinds(pool) == ["mamba", "mamba", "mamba", "full"] and pool.group_size == 12
    assert pool.layout.group_layers[0] == tuple(range(0, 48, 4))
    assert pool.layout.group_layers[3] == tuple(range(3, 48, 4))
    assert pool.num_blocks(40 * GiB) == 3_212


def test_block_alignment_follows_the_block_size_from_0_20_0():
    """--block-size 64: 0.11.0 and 0.19.1 keep 16 x 34 = 544; 0.20.0 on 64 x 9 = 576."""
    sizes = {
        pin.value: _pool("qwen3-next-80b-a3b", pin.value, 64).block_size for pin in V1_RELEASES
    }
    assert sizes == {"0.11.0": 544, "0.19.1": 544, "0.20.0": 576, "0.25.1": 576,
                     "0.26.0": 576, "0.33.0": 576}  # fmt: skip


def test_nemotron_h_mamba2_layout():
    """24 Mamba2 layers (2,158,592 B states), 4 attention layers (4,096 B a token), 24 MLP
    layers in no group: 16 x cdiv(2,158,592, 65,536) = 528-token blocks, 6 Mamba groups of 4
    and the attention group (7, 18, 29, 40)."""
    pool = _pool("nemotron-h-8b", "0.33.0")
    assert pool.mamba_state_bytes == 2_158_592 and pool.block_size == 528
    assert pool.page_bytes == 528 * 4_096 and pool.mamba_padding_bytes == 4_096
    assert _kinds(pool) == ["mamba"] * 6 + ["full"] and pool.group_size == 4
    assert pool.layout.group_layers[-1] == (7, 18, 29, 40)
    grouped = {layer for layers in pool.layout.group_layers for layer in layers}
    assert len(grouped) == 28 and not grouped & {1, 3, 5, 8}  # MLP layers hold no cache


def test_llama4_chunked_groups_only_from_0_19_1():
    """0.11.0 defaults VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE to 0: one full group
    of 48 layers; from 0.19.1, 3 chunked-local groups of 12 then the NoPE group."""
    old, new = _pool("llama-4-scout-17b-16e", "0.11.0"), _pool("llama-4-scout-17b-16e", "0.19.1")
    assert _kinds(old) == ["full"] and old.group_size == 48
    assert _kinds(new) == ["chunked"] * 3 + ["full"] and new.group_size == 12
    assert new.groups[0].attention_chunk_size == 8192
    assert new.layout.group_layers[3] == tuple(range(3, 48, 4))
    # The same memory holds 4x the blocks, each spanning a quarter of the layers.
    memory = 48 * 65_536 * 1_000  # 1,000 blocks of 48 layers x 16 tokens x 4 KiB
    assert (old.num_blocks(memory), new.num_blocks(memory)) == (1_000, 4_000)


def test_gemma3_pads_its_sixth_sliding_group():
    """52 sliding + 10 full: group_size 10, 6 sliding groups (4 of 9 layers, 2 of 8: 8 padding
    slots) then the full group (5, 11, ..., 59)."""
    pool = _pool("gemma-3-27b", "0.33.0")
    assert _kinds(pool) == ["sliding"] * 6 + ["full"] and pool.group_size == 10
    assert [len(g) for g in pool.layout.group_layers] == [9, 9, 9, 9, 8, 8, 10]
    assert pool.layout.num_padding_layers == 8
    assert pool.layout.group_layers[-1] == tuple(range(5, 62, 6))
    assert pool.groups[0].sliding_window == 1024 and pool.page_bytes == 16 * 2 * 16 * 128 * 2


def test_gpt_oss_two_groups():
    pool = _pool("gpt-oss-20b", "0.11.0")
    assert _kinds(pool) == ["sliding", "full"] and pool.group_size == 12
    assert pool.groups[0].sliding_window == 128


def test_group_size_rule_per_release():
    """12 sliding + 13 full (gpt-oss + an EAGLE layer): 0.11.0 takes 12 (1 + 2 groups, 11
    padding slots), 0.19.1 on 13 (2 groups, 1 padding slot)."""
    from sim.kv.config import KVCacheGroupSpec

    specs = [KVCacheGroupSpec(sliding_window=128)] * 12 + [KVCacheGroupSpec()] * 13
    old = group_layers(specs, pad_to_largest=VllmPin.V0_11_0.pads_hybrid_groups_to_largest)
    new = group_layers(specs, pad_to_largest=VllmPin.V0_19_1.pads_hybrid_groups_to_largest)
    assert (old.group_size, old.num_groups, old.num_padding_layers) == (12, 3, 11)
    assert (new.group_size, new.num_groups, new.num_padding_layers) == (13, 2, 1)


def test_refusals_name_the_model_and_the_release():
    with pytest.raises(ValueError, match="'qwen3-next-80b-a3b' has Mamba layers.*4ac7713"):
        _pool("qwen3-next-80b-a3b", "4ac7713")
    with pytest.raises(ValueError, match="'llama-4-scout-17b-16e' has chunked-local.*4ac7713"):
        _pool("llama-4-scout-17b-16e", "4ac7713")
    with pytest.raises(ValueError, match="tensor_parallel_size 3 does not divide"):
        _pool("nemotron-h-8b", "0.33.0", tp=3)


def test_logged_block_size_is_the_smallest_group_block():
    """A Mamba group's block is max_model_len: vLLM multiplies by the smaller."""
    model = get_model("qwen3-next-80b-a3b")
    short = hybrid_pool(model, VllmPin.V0_20_0, block_size=16, max_model_len=512)
    assert short.block_size == 544 and short.reported_block_size == 512
    assert _pool("qwen3-next-80b-a3b", "0.20.0").reported_block_size == 544


# -- invariants -------------------------------------------------------------------------------
_KINDS = st.sampled_from(["full", "sliding", "chunked", "mamba", "none"])


@st.composite
def _models(draw):
    kinds = draw(st.lists(_KINDS, min_size=1, max_size=40))
    if not set(kinds) - {"none", "mamba"}:
        kinds.append("full")  # a Mamba model alone is not modelled
    heads = draw(st.sampled_from([1, 2, 4, 8]))
    fields = {
        "name": "drawn", "num_layers": len(kinds), "hidden_size": 256,
        "num_attention_heads": 8, "num_kv_heads": heads,
        "head_dim": draw(st.sampled_from([32, 64, 128, 256])), "intermediate_size": 512,
        "vocab_size": 1000, "max_position_embeddings": 65536, "layer_pattern": "per_layer",
        "layer_types": kinds,
        "sliding_window": draw(st.integers(1, 4096)) if "sliding" in kinds else None,
        "attention_chunk_size": draw(st.integers(1, 8192)) if "chunked" in kinds else None,
    }  # fmt: skip
    if "mamba" in kinds:
        fields["mamba_state"] = {
            "kind": "mamba2", "conv_kernel": draw(st.integers(2, 4)),
            "num_heads": draw(st.sampled_from([8, 32, 128])), "head_dim": 64,
            "state_size": draw(st.sampled_from([16, 64, 128])), "n_groups": 8,
        }  # fmt: skip
    return get_model(fields)


@settings(max_examples=200, deadline=None)
@given(
    model=_models(),
    pin=st.sampled_from(V1_RELEASES),
    block_size=st.sampled_from([16, 32, 64, 128]),
    tp=st.sampled_from([1, 2]),
    available=st.integers(0, 80 * GiB),
)
def test_pool_invariants(model, pin, block_size, tp, available):
    """Every layer with a cache in exactly one group, of its own type, none without one; no
    group over group_size; equal pages after unification, the smallest aligned block that
    holds a state; and num_blocks x page x group_size within the memory, one more beyond it."""
    pool = hybrid_pool(model, pin, block_size=block_size, max_model_len=8192, tp=tp)
    kinds = model.layer_kinds
    seen = [layer for layers in pool.layout.group_layers for layer in layers]
    assert sorted(seen) == [i for i, kind in enumerate(kinds) if kind != "none"]
    for group, layers in zip(pool.groups, pool.layout.group_layers, strict=True):
        assert 0 < len(layers) <= pool.group_size
        want = {"mamba"} if group.mamba else {"sliding"} if group.sliding_window else (
            {"chunked"} if group.attention_chunk_size else {"full", "chunked"})  # fmt: skip
        assert {kinds[i] for i in layers} <= want
    per_token = model.kv_bytes_per_token_per_layer(tp=tp)
    assert pool.page_bytes == pool.block_size * per_token and pool.block_size >= block_size
    if pool.mamba_state_bytes is not None:
        align = KERNEL_BLOCK_ALIGNMENT
        if pin.aligns_mamba_block_to_block_size:
            align = max(align, block_size)
        # The padded state page is the attention page (>= the state).
        assert pool.mamba_state_bytes + pool.mamba_padding_bytes == pool.page_bytes
        assert pool.mamba_padding_bytes >= 0
        assert pool.block_size == block_size or (
            pool.block_size % align == 0
            and (pool.block_size - align) * per_token < pool.mamba_state_bytes
        )
    blocks = pool.num_blocks(available)
    assert blocks * pool.page_bytes * pool.group_size <= available
    assert (blocks + 1) * pool.page_bytes * pool.group_size > available


@given(
    pin=st.sampled_from(V1_RELEASES),
    block_size=st.integers(1, 1024),
    per_token=st.integers(1, 1 << 16),
    state=st.integers(1, 1 << 24),
)
def test_unified_block_size_holds_a_state(pin, block_size, per_token, state):
    """An attention page at the unified size holds one state, and is never below the given
    block size."""
    size = unified_block_size(pin, block_size, per_token, state)
    assert size >= block_size and size * per_token >= state
