"""Per-layer types of a catalog model, and the recurrent state of its Mamba / linear layers.

A model whose layers differ (Gemma-3, gpt-oss, Llama-4, Qwen3-Next, Nemotron-H) lists one
type per decoder layer in `layer_types` (with `layer_pattern: per_layer`):

* ``full``: attention over the whole context (one K/V entry per token);
* ``sliding``: attention over the last `sliding_window` tokens;
* ``chunked``: Llama-4's chunked-local attention, chunks of `attention_chunk_size` tokens;
* ``mamba``: a Mamba2 or Gated-DeltaNet (linear attention) layer, one fixed-size state per
  request (`MambaState`);
* ``none``: a layer without any cache (Nemotron-H's MLP-only layers, ``-`` in its
  `hybrid_override_pattern`).

The state sizes follow vLLM's `MambaStateShapeCalculator` (`vllm/model_executor/layers/
mamba/mamba_utils.py:L186-211` `mamba2_state_shape` and `L272-293` `gated_delta_net_state_shape`
@0.33.0), fed as the models feed it (`nemotron_h.py:L780-810`: ``intermediate_size =
mamba_num_heads * mamba_head_dim``; `qwen3_next.py:L893-912`). Both state tensors take the
model dtype (`_mamba_state_dtype`, `L98-110`: `mamba_cache_dtype` and
`mamba_ssm_cache_dtype` "auto"). Left out: speculative tokens (`num_spec` widens the conv
state), `--mamba-ssm-cache-dtype` overrides, and the extra groups vLLM adds when `n_groups`
does not divide the TP size (`extra_groups_for_head_shards`): a TP size that does not divide
the heads or groups is refused instead.

Worked example, Qwen3-Next-80B-A3B (Gated DeltaNet: 16 key heads and 32 value heads of 128,
conv kernel 4, bf16, TP 1): conv state ``(128*16*2 + 128*32) x 3 = 8,192 x 3`` elements, SSM
state ``32 x 128 x 128``; ``(24,576 + 524,288) x 2 B = 1,097,728 B`` per layer per request.
Nemotron-H-8B (Mamba2: 128 heads of 64, state 128, 8 groups, kernel 4): conv
``(8,192 + 2*8*128) x 3 = 30,720``, SSM ``128 x 64 x 128 = 1,048,576``; 2,158,592 B.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sim.scenario.fields import Bool, Int

LayerType = Literal["full", "sliding", "chunked", "mamba", "none"]


class MambaState(BaseModel):
    """The config fields vLLM sizes one Mamba / linear-attention layer's state from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: "mamba2" (Nemotron-H, Granite-4.0-H, Jamba-1.5's successors) or "gated_delta_net"
    #: (Qwen3-Next's linear attention).
    kind: Literal["mamba2", "gated_delta_net"]
    conv_kernel: Int = Field(gt=1)
    #: The conv1d has a bias (HF `use_conv_bias`: Nemotron-H true; Qwen3-Next's has none).
    conv_bias: Bool = False
    # Mamba2 (HF: mamba_num_heads, mamba_head_dim, ssm_state_size, n_groups)
    num_heads: Int | None = Field(default=None, gt=0)
    head_dim: Int | None = Field(default=None, gt=0)
    state_size: Int | None = Field(default=None, gt=0)
    n_groups: Int | None = Field(default=None, gt=0)
    # Gated DeltaNet (HF: linear_num_key_heads, linear_num_value_heads, linear_*_head_dim)
    num_k_heads: Int | None = Field(default=None, gt=0)
    num_v_heads: Int | None = Field(default=None, gt=0)
    head_k_dim: Int | None = Field(default=None, gt=0)
    head_v_dim: Int | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _fields_of_kind(self) -> MambaState:
        mamba2 = (self.num_heads, self.head_dim, self.state_size, self.n_groups)
        gdn = (self.num_k_heads, self.num_v_heads, self.head_k_dim, self.head_v_dim)
        mine, other = (mamba2, gdn) if self.kind == "mamba2" else (gdn, mamba2)
        if any(v is None for v in mine) or any(v is not None for v in other):
            names = (
                "num_heads, head_dim, state_size, n_groups"
                if self.kind == "mamba2"
                else "num_k_heads, num_v_heads, head_k_dim, head_v_dim"
            )
            raise ValueError(f"a {self.kind} state takes exactly {names}")
        return self

    def shapes(self, tp: int = 1) -> tuple[tuple[int, int], tuple[int, int, int]]:
        """(conv state, SSM state) shapes on one TP rank, as vLLM's calculator gives them
        (the conv state's orientation does not change its size). Example: Nemotron-H-8B ->
        ((10240, 3), (128, 64, 128))."""
        if self.kind == "mamba2":
            assert self.num_heads and self.head_dim and self.state_size and self.n_groups
            conv_dim = self.num_heads * self.head_dim + 2 * self.n_groups * self.state_size
            heads = self.num_heads
            ssm = (_split(heads, tp, "heads"), self.head_dim, self.state_size)
            _split(self.n_groups, tp, "groups")
        else:
            assert self.num_k_heads and self.num_v_heads and self.head_k_dim and self.head_v_dim
            conv_dim = self.head_k_dim * self.num_k_heads * 2 + self.head_v_dim * self.num_v_heads
            ssm = (_split(self.num_v_heads, tp, "value heads"), self.head_v_dim, self.head_k_dim)
        return (_split(conv_dim, tp, "conv channels"), self.conv_kernel - 1), ssm

    def state_bytes(self, dtype_bytes: int, tp: int = 1) -> int:
        """One request's state in one layer on one rank (vLLM's unpadded `MambaSpec` page):
        Qwen3-Next 1,097,728 B, Nemotron-H-8B 2,158,592 B in bf16 (module docstring)."""
        conv, ssm = self.shapes(tp)
        return (math.prod(conv) + math.prod(ssm)) * dtype_bytes


def _split(n: int, tp: int, what: str) -> int:
    """`divide(n, tp)` as vLLM shards it; a remainder is refused (vLLM asserts)."""
    if n % tp:
        raise ValueError(f"tensor_parallel_size {tp} does not divide the {n} Mamba {what}")
    return n // tp
