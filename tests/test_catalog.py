"""Catalog: the data files load, validate, and derive the published parameter counts."""

import pytest

from sim.catalog import dtype_bytes, get_gpu, get_model, gpu_names, kv_heads_per_rank, model_names


def test_every_entry_loads_and_has_a_source():
    for name in gpu_names():
        gpu = get_gpu(name)
        assert gpu.source and gpu.bandwidth_Bps > 0 and gpu.peak_flops("bfloat16") > 0
    for name in model_names():
        assert get_model(name).source.startswith("https://huggingface.co/")


@pytest.mark.parametrize(
    ("name", "total_b"),
    [  # published sizes (billions of parameters)
        ("llama-3.1-8b", 8.03),
        ("llama-3.1-70b", 70.55),
        ("mistral-7b-v0.1", 7.24),
        ("qwen2.5-7b", 7.62),
        ("gemma-2-9b", 9.24),
        ("mixtral-8x7b-v0.1", 46.70),
    ],
)
def test_parameter_counts_match_published_sizes(name, total_b):
    assert get_model(name).total_params / 1e9 == pytest.approx(total_b, abs=0.01)


def test_llama_linear_params_worked_example():
    assert get_model("llama-3.1-8b").linear_params == 7_504_658_432


def test_datasheet_figures_are_dense():
    h100 = get_gpu("H100-SXM")  # case-insensitive
    assert h100.peak_flops("bf16") == 989e12 and h100.peak_flops("fp8") == 1979e12
    assert get_gpu("h200").hbm_bandwidth_GBps == 4800
    with pytest.raises(ValueError, match="no fp8"):
        get_gpu("a100-80gb-sxm").peak_flops("fp8")


def test_windows_and_layer_patterns():
    assert get_model("mistral-7b-v0.1").num_sliding_layers == 32
    gemma = get_model("gemma-2-9b")
    assert (gemma.sliding_window, gemma.num_sliding_layers, gemma.num_full_layers) == (4096, 21, 21)
    assert get_model("llama-3.1-8b").num_sliding_layers == 0


def test_user_defined_model_from_dict_and_validation():
    m = get_model(dict(name="toy", num_layers=2, hidden_size=64, num_attention_heads=4,
                       num_kv_heads=2, head_dim=16, intermediate_size=128, vocab_size=256,
                       max_position_embeddings=1024))  # fmt: skip
    assert m.source == "user-defined" and m.kv_bytes_per_token_per_layer() == 2 * 2 * 16 * 2
    with pytest.raises(ValueError, match="multiple of"):
        get_model({**m.model_dump(), "num_kv_heads": 3})
    with pytest.raises(ValueError, match="disagree"):
        get_model({**m.model_dump(), "sliding_window": 64})
    with pytest.raises(ValueError, match="extra"):
        get_model({**m.model_dump(), "num_heads": 4})
    with pytest.raises(ValueError, match="unknown model"):
        get_model("llama-9")


def test_kv_heads_replicate_beyond_tp_and_dtype_bytes():
    assert kv_heads_per_rank(8, 4) == 2 and kv_heads_per_rank(8, 16) == 1
    assert dtype_bytes("fp8") == 1 and dtype_bytes("bf16") == 2
    with pytest.raises(ValueError):
        dtype_bytes("int3")


# -- per-layer types (issue #23 item 1) -------------------------------------------------------
def test_per_layer_types_follow_each_configs_own_field():
    """Each list is what its config's per-layer field says (models.yaml cites each config):
    Llama-4's default `no_rope_layers` (interval 4: NoPE every 4th layer), Gemma-3's
    `sliding_window_pattern: 6`, gpt-oss's alternating `layer_types`, Qwen3-Next's
    `full_attention_interval: 4`, Nemotron-H's `hybrid_override_pattern`."""
    scout = get_model("llama-4-scout-17b-16e").layer_kinds
    assert [i for i, k in enumerate(scout) if k == "full"] == list(range(3, 48, 4))
    assert scout.count("chunked") == 36
    gemma = get_model("gemma-3-27b").layer_kinds
    assert [i for i, k in enumerate(gemma) if k == "full"] == list(range(5, 62, 6))
    assert get_model("gpt-oss-20b").layer_kinds == ("sliding", "full") * 12
    assert get_model("qwen3-next-80b-a3b").layer_kinds == ("mamba", "mamba", "mamba", "full") * 12
    pattern = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    symbol = {"mamba": "M", "full": "*", "none": "-"}
    assert "".join(symbol[k] for k in get_model("nemotron-h-8b").layer_kinds) == pattern


def test_per_layer_counts_and_state_geometry():
    qwen = get_model("qwen3-next-80b-a3b")
    assert (qwen.num_mamba_layers, qwen.num_full_layers, qwen.num_sliding_layers) == (36, 12, 0)
    # Gated DeltaNet: conv (128*16*2 + 128*32) x 3, SSM 32 x 128 x 128 (catalog_layers doc).
    assert qwen.mamba_state.shapes() == ((8192, 3), (32, 128, 128))
    assert qwen.mamba_state.state_bytes(2) == 1_097_728
    nemotron = get_model("nemotron-h-8b")
    assert nemotron.mamba_state.shapes(tp=2) == ((5120, 3), (64, 64, 128))
    gemma3 = get_model("gemma-3-27b")
    assert (gemma3.num_sliding_layers, gemma3.num_full_layers) == (52, 10)
    # The older patterns spell out as before.
    assert get_model("gemma-2-9b").layer_kinds[:3] == ("sliding", "full", "sliding")
    assert set(get_model("llama-3.1-8b").layer_kinds) == {"full"}


def test_per_layer_validation():
    base = get_model("qwen3-next-80b-a3b").model_dump()
    with pytest.raises(ValueError, match="48 entries for 47 layers"):
        get_model({**base, "num_layers": 47})
    with pytest.raises(ValueError, match="mamba_state"):
        get_model({**base, "mamba_state": None})
    with pytest.raises(ValueError, match="needs layer_pattern: per_layer"):
        get_model({**base, "layer_pattern": "full"})
    with pytest.raises(ValueError, match="attention_chunk_size"):
        get_model({**base, "attention_chunk_size": 8192})
    with pytest.raises(ValueError, match="exactly num_heads"):
        get_model({**base, "mamba_state": {"kind": "mamba2", "conv_kernel": 4, "num_heads": 8}})
