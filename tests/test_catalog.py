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
