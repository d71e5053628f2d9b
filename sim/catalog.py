"""GPU datasheets and model geometries: data with sources, validated by pydantic.

The figures live in `sim/data/gpus.yaml` and `sim/data/models.yaml`, each with the document it
was read from. `get_gpu("h100-sxm")` and `get_model("llama-3.1-8b")` look them up (names are
case-insensitive); `get_model` also accepts a dict or a `ModelSpec`, so a scenario can define
its own model with the same fields.

Parameter counts are derived from the geometry, not copied. Worked example, Llama-3.1-8B
(h=4096, Hq=32, Hkv=8, D=128, I=14336, V=128256, L=32):

    attention / layer = h*Hq*D + 2*h*Hkv*D + Hq*D*h = 16.8M + 8.4M + 16.8M = 41.9M
    MLP / layer       = 3*h*I                                            = 176.2M
    body              = 32 * 218.1M                                      = 6.98 B
    lm_head           = V*h                                              = 0.525 B
    linear (body + lm_head, what a step multiplies by)                  = 7.50 B
    total (+ input embedding 0.525 B + norms)                           = 8.03 B

A model with per-layer types (Mamba / Gated-DeltaNet mixers, MLP-only layers, shared experts,
a vision tower) is counted layer by layer by `sim.catalog_params`, whose docstring works
Nemotron-H-8B through.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim import catalog_params
from sim.catalog_layers import LayerType, MambaState
from sim.errors import InputError
from sim.scenario.fields import Bool, Float, Int

#: Bytes per element of the dtypes the simulator knows.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "bfloat16": 2,
    "float16": 2,
    "fp8": 1,
    "fp8_e4m3": 1,
    "fp8_e5m2": 1,
}


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of `dtype` ("bfloat16" -> 2, "fp8" -> 1); aliases bf16/fp16/auto-free."""
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32"}
    key = aliases.get(dtype, dtype)
    if key not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[key]


class GpuSpec(BaseModel):
    """Datasheet ceilings of one accelerator (dense figures, no sparsity)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    display_name: str = ""
    memory_gb: Float = Field(gt=0)
    #: What the driver reports (GiB), which vLLM multiplies by gpu_memory_utilization; None
    #: where not measured (sim.memory.terms.visible_memory then estimates it and says so).
    memory_visible_gib: Float | None = Field(default=None, gt=0)
    memory_visible_source: str | None = None
    hbm_bandwidth_GBps: Float = Field(gt=0)
    bf16_tflops: Float = Field(gt=0)
    fp16_tflops: Float = Field(gt=0)
    fp8_tflops: Float | None = Field(default=None, gt=0)
    interconnect_GBps: Float = Field(gt=0)
    source: str
    #: CUDA compute capability (major, minor); None for a non-CUDA part or where not given.
    #: It picks the layout vLLM stores MXFP4 experts in (`sim.memory.terms.mxfp4_expert_dims`).
    compute_capability: tuple[int, int] | None = None

    @model_validator(mode="after")
    def _check_memory(self) -> GpuSpec:
        if self.memory_visible_gib is not None and self.memory_visible_gib > self.memory_gb:
            raise ValueError(
                f"memory_visible_gib ({self.memory_visible_gib}) exceeds memory_gb ({self.memory_gb})"
            )
        return self

    @property
    def memory_bytes(self) -> int:
        """Datasheet capacity as memory_gb GiB (DRAM sizes are binary): 80 -> 85,899,345,920."""
        return int(self.memory_gb * 2**30)

    @property
    def bandwidth_Bps(self) -> float:
        return self.hbm_bandwidth_GBps * 1e9

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core FLOP/s for the compute dtype; ValueError where the GPU has none."""
        key = {"bf16": "bfloat16", "fp16": "float16"}.get(dtype, dtype)
        if key == "bfloat16":
            return self.bf16_tflops * 1e12
        if key == "float16":
            return self.fp16_tflops * 1e12
        if key.startswith("fp8"):
            if self.fp8_tflops is None:
                raise ValueError(f"GPU {self.name!r} has no fp8 tensor cores")
            return self.fp8_tflops * 1e12
        raise ValueError(f"no datasheet throughput for dtype {dtype!r} on {self.name!r}")


class ModelSpec(BaseModel):
    """Geometry of a decoder-only transformer, as in its HF config.json."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str = "user-defined"
    num_layers: Int = Field(gt=0)
    hidden_size: Int = Field(gt=0)
    num_attention_heads: Int = Field(gt=0)
    num_kv_heads: Int = Field(gt=0)
    head_dim: Int = Field(gt=0)
    intermediate_size: Int = Field(gt=0)
    vocab_size: Int = Field(gt=0)
    max_position_embeddings: Int = Field(gt=0)
    sliding_window: Int | None = Field(default=None, gt=0)
    #: "per_layer": `layer_types` lists each layer's type (`sim.catalog_layers`).
    layer_pattern: Literal["full", "sliding", "alternating", "per_layer"] = "full"
    layer_types: tuple[LayerType, ...] | None = None
    #: Llama-4's chunked-local attention (the `chunked` layers), tokens per chunk.
    attention_chunk_size: Int | None = Field(default=None, gt=0)
    #: The recurrent state of the `mamba` layers.
    mamba_state: MambaState | None = None
    tie_word_embeddings: Bool = False
    qkv_bias: Bool = False
    num_experts: Int = Field(default=1, gt=0)
    num_experts_per_token: Int = Field(default=1, gt=0)
    dtype: str = "bfloat16"
    # -- parameter-count details (`sim.catalog_params`); the defaults are a Llama layer ----
    #: "gated": gate, up, down (3 h I); "up_down": Nemotron-H's relu^2 MLP (2 h I).
    mlp_kind: Literal["gated", "up_down"] = "gated"
    #: "mixer_and_mlp": each layer an attention / Mamba mixer and an MLP; "mixer_or_mlp":
    #: each layer one block, the MLP-only ones typed `none` (Nemotron-H).
    layer_blocks: Literal["mixer_and_mlp", "mixer_or_mlp"] = "mixer_and_mlp"
    #: One always-on shared expert beside the routed ones (Llama-4, Qwen3-Next), and its
    #: h x 1 sigmoid gate (Qwen3-Next).
    shared_expert_intermediate_size: Int | None = Field(default=None, gt=0)
    shared_expert_gate: Bool = False
    #: gpt-oss: biases on every expert's projections and on the router.
    moe_bias: Bool = False
    #: Qwen3-Next's gated attention: q_proj also emits a gate per head (2 x Hq x D outputs).
    attention_output_gate: Bool = False
    o_proj_bias: Bool = False
    attention_sinks: Bool = False
    qk_norm: Bool = False
    norms_per_layer: Int = Field(default=2, ge=0)
    #: A multimodal checkpoint's vision encoder, which vLLM loads with the text model.
    #: `kind: siglip` (the default: Gemma-3) or `llama4`.
    vision: catalog_params.VisionTower | catalog_params.Llama4VisionTower | None = None

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.num_attention_heads % self.num_kv_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.layer_pattern == "per_layer":
            self._check_layer_types()
        elif self.layer_types is not None:
            raise ValueError("layer_types needs layer_pattern: per_layer")
        elif (self.layer_pattern == "full") != (self.sliding_window is None):
            raise ValueError(
                f"layer_pattern {self.layer_pattern!r} and sliding_window "
                f"{self.sliding_window!r} disagree (full <=> no window)"
            )
        if self.num_experts_per_token > self.num_experts:
            raise ValueError("num_experts_per_token exceeds num_experts")
        dtype_bytes(self.dtype)
        return self

    def _check_layer_types(self) -> None:
        """One type per layer, and each windowed / chunked / state type with its geometry."""
        types = self.layer_types or ()
        if len(types) != self.num_layers:
            raise ValueError(f"layer_types has {len(types)} entries for {self.num_layers} layers")
        for kind, field, value in (
            ("sliding", "sliding_window", self.sliding_window),
            ("chunked", "attention_chunk_size", self.attention_chunk_size),
            ("mamba", "mamba_state", self.mamba_state),
        ):
            if (kind in types) != (value is not None):
                raise ValueError(f"layer_types and {field} disagree ({kind} layers <=> {field})")

    # -- layers ---------------------------------------------------------------------------
    @property
    def layer_kinds(self) -> tuple[LayerType, ...]:
        """Each layer's type: the list itself, or the pattern spelt out (Gemma-2's
        "alternating": sliding, full, sliding, ...)."""
        if self.layer_types is not None:
            return self.layer_types
        sliding: LayerType = "sliding"
        full: LayerType = "full"
        if self.layer_pattern == "sliding":
            return (sliding,) * self.num_layers
        if self.layer_pattern == "alternating":
            return tuple(sliding if i % 2 == 0 else full for i in range(self.num_layers))
        return (full,) * self.num_layers

    @property
    def num_sliding_layers(self) -> int:
        """Layers with a window: all (sliding), even-indexed (alternating: 21 of 42), none."""
        return self.layer_kinds.count("sliding")

    @property
    def num_full_layers(self) -> int:
        """Layers that keep K/V for the whole context; a chunked-local layer counts as one
        (its reads are bounded by the chunk, which the latency models leave out)."""
        kinds = self.layer_kinds
        return kinds.count("full") + kinds.count("chunked")

    @property
    def num_mamba_layers(self) -> int:
        """Mamba / linear-attention layers (a fixed state per request, no K/V)."""
        return self.layer_kinds.count("mamba")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 1

    # -- parameters (`sim.catalog_params`) ------------------------------------------------
    @property
    def attention_params_per_layer(self) -> int:
        """One attention layer's projections (+ biases): Llama-3.1-8B 41,943,040."""
        return catalog_params.attention_linear_params(self)

    @property
    def expert_params(self) -> int:
        """One gated MLP (gate, up, down): 3 * h * I (2 * h * I up/down only; + gpt-oss biases)."""
        return catalog_params.expert_params(self)

    @property
    def mlp_params_per_layer(self) -> int:
        """All experts plus the router (h * E) and shared expert for MoE; one MLP otherwise."""
        return catalog_params.mlp_params(self)

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def body_linear_params(self) -> int:
        """Projection weights of all decoder layers, each by its type (every expert counted)."""
        return catalog_params.body_linear_params(self)

    @property
    def linear_params(self) -> int:
        """Body plus lm_head: Llama-3.1-8B 7,504,658,432."""
        return self.body_linear_params + self.lm_head_params

    @property
    def total_params(self) -> int:
        """Everything held in memory: linear + input embedding (unless tied) + norms and the
        Mamba layers' conv / A / D: Llama-3.1-8B 8,030,261,248."""
        return catalog_params.total_params(self)

    @property
    def active_params(self) -> int:
        """What one token reads: the total less the routed experts it skips."""
        return catalog_params.active_params(self)

    def kv_bytes_per_token_per_layer(self, kv_dtype: str | None = None, tp: int = 1) -> int:
        """K and V of one token in one layer on one TP rank: 2 * Hkv/tp * D * bytes."""
        b = dtype_bytes(kv_dtype or self.dtype)
        return 2 * kv_heads_per_rank(self.num_kv_heads, tp) * self.head_dim * b


def kv_heads_per_rank(num_kv_heads: int, tp: int) -> int:
    """`max(1, Hkv // tp)`: KV heads are replicated when tp exceeds them (vLLM config.py)."""
    if tp <= 0:
        raise ValueError(f"tensor_parallel_size must be positive, got {tp}")
    return max(1, num_kv_heads // tp)


def _load_yaml(file_name: str) -> dict[str, Any]:
    text = resources.files("sim.data").joinpath(file_name).read_text()
    return yaml.safe_load(text)


@functools.cache
def _gpus() -> dict[str, GpuSpec]:
    raw = _load_yaml("gpus.yaml")["gpus"]
    try:
        return {name: GpuSpec(name=name, **fields) for name, fields in raw.items()}
    except ValidationError as exc:
        raise ValueError(f"sim/data/gpus.yaml is invalid: {exc}") from exc


@functools.cache
def _models() -> dict[str, ModelSpec]:
    raw = _load_yaml("models.yaml")["models"]
    try:
        return {name: ModelSpec(name=name, **fields) for name, fields in raw.items()}
    except ValidationError as exc:
        raise ValueError(f"sim/data/models.yaml is invalid: {exc}") from exc


class CatalogError(InputError):
    """An unknown catalog name, or a user-defined model / GPU geometry that is invalid."""


def _user_defined(cls, fields: dict[str, Any], what: str):
    try:
        return cls.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        message = first["msg"].removeprefix("Value error, ")
        if first["type"] == "extra_forbidden":
            where, message = "", f"unknown key '{where}' (extra keys are not allowed)"
        raise CatalogError(
            f"user-defined {what}: {where + ': ' if where else ''}{message}"
        ) from None


def gpu_names() -> list[str]:
    return sorted(_gpus())


def model_names() -> list[str]:
    return sorted(_models())


def get_gpu(name: str | GpuSpec | dict[str, Any]) -> GpuSpec:
    """The catalog entry `name` (case-insensitive), or a user-defined GPU given as a dict."""
    if isinstance(name, GpuSpec):
        return name
    if isinstance(name, dict):
        return _user_defined(
            GpuSpec, {"source": "user-defined", "name": "user-defined", **name}, "GPU"
        )
    gpus = _gpus()
    key = name.lower()
    if key not in gpus:
        raise CatalogError(f"unknown GPU {name!r}; the catalog has {sorted(gpus)}")
    return gpus[key]


def get_model(name: str | ModelSpec | dict[str, Any]) -> ModelSpec:
    """The catalog entry `name` (case-insensitive), or a user-defined model given as a dict."""
    if isinstance(name, ModelSpec):
        return name
    if isinstance(name, dict):
        return _user_defined(ModelSpec, name, "model")
    models = _models()
    key = name.lower()
    if key not in models:
        raise CatalogError(f"unknown model {name!r}; the catalog has {sorted(models)}")
    return models[key]
