"""Parameter counts of a catalog model, layer by layer: attention, Mamba / Gated-DeltaNet mixers,
dense and MoE MLPs (routed experts, shared expert, router), norms and embeddings.

A dense model (every layer attention + gated MLP) keeps the formula of `sim.catalog`'s module
docstring. A model with per-layer types counts each layer by its type, as vLLM builds it at
0.33.0 (`vllm/model_executor/models/`):

* attention (`full`, `sliding`, `chunked`): q/k/v/o projections; `attention_output_gate` doubles
  q (Qwen3-Next, `qwen3_next.py:L315-332`), `qkv_bias` / `o_proj_bias` add biases (gpt-oss,
  `gpt_oss.py:L131-151`), `attention_sinks` one value per head (`L131`), `qk_norm` two
  head_dim norms (Gemma-3, Qwen3-Next `L370-371`);
* Mamba2 (Nemotron-H, `MambaMixer2`, `layers/mamba/mamba_mixer2.py:L340-515`): in_proj
  ``h x (2 I + 2 G N + H)`` (I = heads x head_dim), out_proj ``I x h``, conv1d ``conv_dim x K``
  (+ ``conv_dim`` bias), A, D, dt_bias ``H`` each, gated norm ``I``;
* Gated DeltaNet (Qwen3-Next, `layers/mamba/gdn/qwen_gdn_linear_attn.py:L595-683`):
  in_proj_qkvz ``h x (2 key_dim + 2 value_dim)``, in_proj_ba ``h x 2 Hv``, out_proj
  ``value_dim x h``, conv1d ``conv_dim x K`` (no bias), A_log and dt_bias ``Hv`` each, norm
  ``head_v_dim``;
* MLP: gated (gate, up, down: ``3 h I``) or up/down only (Nemotron-H's relu^2,
  `nemotron_h.py:L92-125`: ``2 h I``); MoE: ``E`` experts, router ``h x E`` (+ ``E`` bias and
  per-expert biases ``2 I + h`` for gpt-oss, `gpt_oss.py:L382-399`), a shared expert of
  `shared_expert_intermediate_size` (Llama-4 `llama4.py:L100-113`, Qwen3-Next
  `qwen3_next.py:L191-221` with its ``h x 1`` gate);
* which layers carry an MLP: all (`layer_blocks: mixer_and_mlp`), or only the MLP-only layers
  (`none`) where each layer is one block (Nemotron-H, `mixer_or_mlp`, `nemotron_h.py:L278-530`);
* norms: `norms_per_layer` x h per layer (2; Gemma-3 4; Nemotron-H 1) plus the final norm.

Worked example, Nemotron-H-8B (h 4,096; 24 Mamba2 layers of 128 heads x 64, 8 groups, state
128, kernel 4, conv bias; 4 attention layers 32/8 heads x 128; 24 MLP layers of 21,504):

    Mamba in_proj  = 4,096 x (2 x 8,192 + 2 x 8 x 128 + 128)       =    76,021,760
    Mamba out_proj = 8,192 x 4,096                                  =    33,554,432
    attention      = 4,096 x (32 + 16) x 128 + 32 x 128 x 4,096     =    41,943,040
    MLP            = 2 x 4,096 x 21,504                             =   176,160,768
    body (linear)  = 24 x 109,576,192 + 4 x 41,943,040 + 24 x 176,160,768
                                                                    = 7,025,459,200
    Mamba rest     = 24 x (10,240 x 4 + 10,240 + 3 x 128 + 8,192)   =     1,434,624
    norms          = (52 + 1) x 4,096                               =       217,088
    embeddings     = 2 x 131,072 x 4,096 (untied)                   = 1,073,741,824
    total                                                           = 8,100,852,736

A multimodal checkpoint's vision tower is loaded with the language model, so it is counted
where the catalog describes it (`vision`): Gemma-3's SigLIP encoder (`siglip.py:L260-700`,
every projection with a bias, two LayerNorms a layer, no pooling head) and its projector
(`gemma3_mm.py:L451-466`): Gemma-3-27B (27 layers of 1,152, MLP 4,304, 14-pixel patches of
896-pixel images) 416,866,032 + 6,194,304 = 423,060,336, the 417M encoder of Google's
Gemma 3 report. Llama-4's encoder (`mllama4.py:L123-550`) is a ViT of the same shape with
bias-free 14-pixel unfold patches, a class token, 577 positions, LayerNorms before and after,
then a pixel-shuffle adapter (fc1 ``4 d x P_in``, fc2 ``P_in x P_out``, no biases: Scout's
`multi_modal_projector_bias` false) and a bias-free projector ``vision_output_dim x h``.
Llama-4-Scout (34 layers of 1,408, MLP 5,632, 336-pixel images, adapter 4,096 / 4,096):

    patch + class + positions = 3 x 14 x 14 x 1,408 + 1,408 + 577 x 1,408 =     1,641,728
    one layer = 4 x (1,408^2 + 1,408) + 2 x 1,408 x 5,632 + 5,632 + 1,408
                + 2 x 2 x 1,408                                        =    23,807,872
    34 layers + two LayerNorms                                          =   809,473,280
    adapter = 5,632 x 4,096 + 4,096 x 4,096                             =    39,845,888
    projector = 4,096 x 5,120                                           =    20,971,520
    total                                                               =   871,932,416

so Scout loads 107,769,861,120 + 871,932,416 = 108,641,793,536 parameters (Meta's card: 109B).
Left out: Qwen3-Next's multi-token-prediction layer, which vLLM loads only for speculative
decoding (`qwen3_next_mtp.py`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from sim.catalog_layers import LayerType, MambaState
from sim.scenario.fields import Bool, Int

if TYPE_CHECKING:
    from sim.catalog import ModelSpec

ATTENTION_KINDS: frozenset[str] = frozenset({"full", "sliding", "chunked"})


class _ViT(BaseModel):
    """The ViT fields both towers share (HF `vision_config`) and one encoder layer's count:
    four attention projections and the two MLP matrices, each with a bias, and two
    LayerNorms with biases."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    num_layers: Int = Field(gt=0)  # num_hidden_layers
    hidden_size: Int = Field(gt=0)
    intermediate_size: Int = Field(gt=0)
    patch_size: Int = Field(gt=0)
    image_size: Int = Field(gt=0)
    num_channels: Int = Field(default=3, gt=0)

    def layer_params(self) -> int:
        """Gemma-3's SigLIP layer (1,152, MLP 4,304): 15,239,504; Scout's (1,408 / 5,632):
        23,807,872."""
        d, m = self.hidden_size, self.intermediate_size
        return 4 * (d * d + d) + (d * m + m) + (m * d + d) + 2 * 2 * d


class VisionTower(_ViT):
    """A SigLIP vision encoder and the projector into the text model (HF `vision_config`)."""

    kind: Literal["siglip"] = "siglip"

    def encoder_params(self) -> int:
        """Patch and position embeddings, the layers, the post-LayerNorm: 416,866,032 for
        Gemma-3's (module docstring)."""
        d = self.hidden_size
        patch = self.num_channels * self.patch_size**2 * d + d
        positions = (self.image_size // self.patch_size) ** 2 * d
        return patch + positions + self.num_layers * self.layer_params() + 2 * d

    def params(self, text_hidden_size: int) -> int:
        """Encoder + Gemma-3's projector (a d x h matrix and an RMSNorm of d)."""
        d = self.hidden_size
        return self.encoder_params() + d * text_hidden_size + d


class Llama4VisionTower(_ViT):
    """Llama-4's vision encoder, pixel-shuffle adapter and projector (HF `vision_config`;
    vLLM 0.33.0 `mllama4.py:L123-550`, counts in the module docstring)."""

    kind: Literal["llama4"] = "llama4"
    projector_input_dim: Int = Field(gt=0)
    projector_output_dim: Int = Field(gt=0)
    vision_output_dim: Int = Field(gt=0)
    multi_modal_projector_bias: Bool = False

    def encoder_params(self) -> int:
        """Unfold patches (no bias), class token, positions, the layers, pre and post
        LayerNorms: 809,473,280 + 1,641,728 for Scout."""
        d = self.hidden_size
        positions = ((self.image_size // self.patch_size) ** 2 + 1) * d
        patch = self.num_channels * self.patch_size**2 * d
        return patch + d + positions + self.num_layers * self.layer_params() + 2 * 2 * d

    def params(self, text_hidden_size: int) -> int:
        """Encoder + pixel-shuffle adapter + projector: 871,932,416 for Scout."""
        mid, out = self.projector_input_dim, self.projector_output_dim
        adapter = self.intermediate_size * mid + mid * out
        if self.multi_modal_projector_bias:
            adapter += mid + out
        return self.encoder_params() + adapter + self.vision_output_dim * text_hidden_size


def attention_linear_params(model: ModelSpec) -> int:
    """One attention layer's projections and biases: Llama-3.1-8B 41,943,040."""
    h, d = model.hidden_size, model.head_dim
    q_out = model.num_attention_heads * d * (2 if model.attention_output_gate else 1)
    qkv_out = q_out + 2 * model.num_kv_heads * d
    bias = qkv_out if model.qkv_bias else 0
    o_bias = h if model.o_proj_bias else 0
    return h * qkv_out + bias + model.num_attention_heads * d * h + o_bias


def attention_other_params(model: ModelSpec) -> int:
    """Per attention layer, outside the projections: q/k norms and sink scalars."""
    qk = 2 * model.head_dim if model.qk_norm else 0
    return qk + (model.num_attention_heads if model.attention_sinks else 0)


def mamba_linear_params(state: MambaState, hidden_size: int) -> int:
    """in_proj(s) + out_proj of one Mamba2 / Gated-DeltaNet layer (module docstring).

    Nemotron-H-8B: 76,021,760 + 33,554,432 = 109,576,192; Qwen3-Next (16 key heads, 32 value
    heads of 128, h 2,048): 2,048 x (4,096 + 8,192) + 2,048 x 64 + 4,096 x 2,048 = 33,685,504.
    """
    h = hidden_size
    if state.kind == "mamba2":
        assert state.num_heads and state.head_dim and state.state_size and state.n_groups
        inner = state.num_heads * state.head_dim
        in_out = 2 * inner + 2 * state.n_groups * state.state_size + state.num_heads
        return h * in_out + inner * h
    assert state.num_k_heads and state.num_v_heads and state.head_k_dim and state.head_v_dim
    key_dim, value_dim = state.num_k_heads * state.head_k_dim, state.num_v_heads * state.head_v_dim
    return h * (2 * key_dim + 2 * value_dim) + h * 2 * state.num_v_heads + value_dim * h


def mamba_other_params(state: MambaState) -> int:
    """conv1d (+ bias), A / D / dt_bias and the gated norm: Nemotron-H-8B 59,776, Qwen3-Next
    8,192 x 4 + 2 x 32 + 128 = 32,960."""
    conv_dim, _ = state.shapes()[0]
    conv = conv_dim * state.conv_kernel + (conv_dim if state.conv_bias else 0)
    if state.kind == "mamba2":
        assert state.num_heads and state.head_dim
        return conv + 3 * state.num_heads + state.num_heads * state.head_dim
    assert state.num_v_heads and state.head_v_dim
    return conv + 2 * state.num_v_heads + state.head_v_dim


def expert_weight_params(model: ModelSpec) -> int:
    """One routed expert's projection matrices: 3 h I (gated) or 2 h I (up/down)."""
    width = 3 if model.mlp_kind == "gated" else 2
    return width * model.hidden_size * model.intermediate_size


def expert_params(model: ModelSpec) -> int:
    """One routed expert: its matrices plus gpt-oss's 2 I + h biases (24,891,840 there)."""
    bias = 2 * model.intermediate_size + model.hidden_size if model.moe_bias else 0
    return expert_weight_params(model) + bias


def mlp_params(model: ModelSpec) -> int:
    """One MLP layer: a dense MLP, or every expert + router (+ bias) + shared expert (+ gate).

    Qwen3-Next: 512 x 3,145,728 + 2,048 x 512 + 3 x 2,048 x 512 + 2,048 = 1,614,809,088.
    """
    if not model.is_moe:
        return expert_params(model)
    h, e = model.hidden_size, model.num_experts
    router = h * e + (e if model.moe_bias else 0)
    shared = 0
    if model.shared_expert_intermediate_size:
        shared = 3 * h * model.shared_expert_intermediate_size
        shared += h if model.shared_expert_gate else 0
    return e * expert_params(model) + router + shared


def has_mlp(model: ModelSpec, kind: LayerType) -> bool:
    """Every layer has an MLP, or (Nemotron-H) only the MLP-only layers."""
    return model.layer_blocks == "mixer_and_mlp" or kind == "none"


def layer_linear_params(model: ModelSpec, kind: LayerType) -> int:
    """Projection weights of one layer of type `kind` (mixer + MLP)."""
    mixer = 0
    if kind in ATTENTION_KINDS:
        mixer = attention_linear_params(model)
    elif kind == "mamba":
        assert model.mamba_state is not None
        mixer = mamba_linear_params(model.mamba_state, model.hidden_size)
    return mixer + (mlp_params(model) if has_mlp(model, kind) else 0)


def layer_other_params(model: ModelSpec, kind: LayerType) -> int:
    """Norms and the mixer's non-projection parameters of one layer."""
    other = model.norms_per_layer * model.hidden_size
    if kind in ATTENTION_KINDS:
        other += attention_other_params(model)
    elif kind == "mamba":
        assert model.mamba_state is not None
        other += mamba_other_params(model.mamba_state)
    return other


def body_linear_params(model: ModelSpec) -> int:
    """Projection weights of every decoder layer (every expert counted)."""
    return sum(layer_linear_params(model, kind) for kind in model.layer_kinds)


def total_params(model: ModelSpec) -> int:
    """Everything vLLM loads (language model and any vision tower described): Nemotron-H-8B
    8,100,852,736."""
    embed = 0 if model.tie_word_embeddings else model.vocab_size * model.hidden_size
    other = sum(layer_other_params(model, kind) for kind in model.layer_kinds)
    vision = model.vision.params(model.hidden_size) if model.vision is not None else 0
    body = body_linear_params(model) + model.lm_head_params + embed + other + model.hidden_size
    return body + vision


def num_moe_layers(model: ModelSpec) -> int:
    """Layers with routed experts (0 for a dense model)."""
    if not model.is_moe:
        return 0
    return sum(1 for kind in model.layer_kinds if has_mlp(model, kind))


def active_params(model: ModelSpec) -> int:
    """Parameters one text token reads: the total less the experts it is not routed to and
    any vision tower (it encodes images only).

    gpt-oss-20b: 20,914,757,184 - 24 x 28 x 24,891,840 = 4,187,440,704 (with the input
    embedding; OpenAI's 3.6B counts the unembedding only: 3,608,307,264).
    """
    idle = model.num_experts - model.num_experts_per_token
    vision = model.vision.params(model.hidden_size) if model.vision is not None else 0
    return total_params(model) - vision - num_moe_layers(model) * idle * expert_params(model)
