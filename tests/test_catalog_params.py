"""Parameter counts of the catalog's hybrid and MoE models (`sim.catalog_params`), each against
the total its publisher states, with the tolerance that the published figure's rounding (or
what it counts beyond the language model) allows."""

from __future__ import annotations

import pytest

from sim import catalog_params
from sim.catalog import get_model
from sim.catalog_params import Llama4VisionTower

B = 1e9


def test_nemotron_h_worked_example_term_by_term() -> None:
    """The module docstring's arithmetic, term by term."""
    model = get_model("nemotron-h-8b")
    state = model.mamba_state
    assert state is not None
    assert catalog_params.mamba_linear_params(state, 4096) == 76_021_760 + 33_554_432
    assert catalog_params.mamba_other_params(state) == 59_776
    assert model.attention_params_per_layer == 41_943_040
    assert model.mlp_params_per_layer == 176_160_768
    assert model.body_linear_params == 7_025_459_200
    assert model.total_params == 8_100_852_736
    assert model.active_params == model.total_params  # no experts


def test_dense_models_keep_their_counts() -> None:
    """The per-layer counting leaves a Llama layer as it was (sim.catalog's worked example)."""
    assert get_model("llama-3.1-8b").total_params == 8_030_261_248
    mixtral = get_model("mixtral-8x7b-v0.1")  # Mistral: 46.7B total, 12.9B active
    assert mixtral.total_params / B == pytest.approx(46.7, abs=0.05)
    assert mixtral.active_params / B == pytest.approx(12.9, abs=0.05)


def test_gpt_oss_20b_matches_openais_model_card() -> None:
    """OpenAI's gpt-oss model card (Table 1): 20.91B total, 3.61B active per token, the
    active count taking the unembedding but not the input embedding. Given to 0.01B: 0.01B."""
    model = get_model("gpt-oss-20b")
    assert model.total_params / B == pytest.approx(20.91, abs=0.01)
    embedding = model.vocab_size * model.hidden_size
    assert (model.active_params - embedding) / B == pytest.approx(3.61, abs=0.01)


def test_qwen3_next_matches_qwens_model_card() -> None:
    """Qwen's card: 80B total, 3B activated (one significant figure: within 0.5B)."""
    model = get_model("qwen3-next-80b-a3b")
    assert model.total_params / B == pytest.approx(80, abs=0.5)
    embeddings = 2 * model.vocab_size * model.hidden_size
    assert (model.active_params - embeddings) / B == pytest.approx(3, abs=0.5)
    # Each of the 48 MoE layers: 512 experts + router + shared expert + its gate.
    assert model.mlp_params_per_layer == 1_614_809_088


def test_nemotron_h_8b_is_8b() -> None:
    """NVIDIA names it 8B (to the billion: within 2%)."""
    assert get_model("nemotron-h-8b").total_params / B == pytest.approx(8, rel=0.02)


def test_scout_counts_its_llama4_vision_tower() -> None:
    """sim.catalog_params' worked example: encoder 811,115,008, with the pixel-shuffle adapter
    and projector 871,932,416; Scout loads 108.64B (Meta's card: 109B total, vision
    included)."""
    model = get_model("llama-4-scout-17b-16e")
    assert isinstance(model.vision, Llama4VisionTower)
    assert model.vision.encoder_params() == 809_473_280 + 1_641_728
    assert model.vision.params(model.hidden_size) == 871_932_416
    assert model.total_params == 107_769_861_120 + 871_932_416
    assert model.total_params / B == pytest.approx(109, abs=0.5)


def test_a_projector_bias_adds_one_per_adapter_output() -> None:
    tower = Llama4VisionTower(
        num_layers=1, hidden_size=8, intermediate_size=32, patch_size=2, image_size=4,
        projector_input_dim=16, projector_output_dim=12, vision_output_dim=12,
    )  # fmt: skip
    biased = tower.model_copy(update={"multi_modal_projector_bias": True})
    assert biased.params(10) - tower.params(10) == 16 + 12


def test_gemma_3_27b_counts_its_siglip_tower() -> None:
    """Google's Gemma 3 report: a 417M vision encoder; the Hub's count for
    google/gemma-3-27b-it: 27.4B (text 27.01B + encoder + projector)."""
    model = get_model("gemma-3-27b")
    assert model.vision is not None
    assert model.vision.encoder_params() / 1e6 == pytest.approx(417, abs=0.5)
    assert model.total_params == 27_009_346_304 + 423_060_336
    assert model.total_params / B == pytest.approx(27.4, abs=0.05)


def test_scout_active_is_17b() -> None:
    """One routed + one shared expert per layer: 17B active (Meta's card; within 0.5B)."""
    assert get_model("llama-4-scout-17b-16e").active_params / B == pytest.approx(17, abs=0.5)


def test_gpt_oss_20b_mxfp4_weights_match_the_checkpoint_size() -> None:
    """OpenAI's card: a 12.8 GiB checkpoint (the experts' matrices in MXFP4, 4.25 bits a
    weight; everything else, expert biases included, in bf16). Given to 0.1 GiB: 0.05 GiB."""
    from sim.memory.terms import weight_bytes

    assert weight_bytes(get_model("gpt-oss-20b"), "mxfp4") / 2**30 == pytest.approx(12.8, abs=0.05)


def test_both_towers_count_a_vit_layer_alike() -> None:
    """`_ViT.layer_params`' examples: Gemma-3's SigLIP layer 15,239,504, Scout's 23,807,872
    (sim.catalog_params' worked example)."""
    gemma, scout = get_model("gemma-3-27b").vision, get_model("llama-4-scout-17b-16e").vision
    assert gemma is not None and scout is not None
    assert (gemma.layer_params(), scout.layer_params()) == (15_239_504, 23_807_872)
