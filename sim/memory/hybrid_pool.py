"""A catalog model's KV-cache groups and block pool as a V1 release builds them at startup.

From the model's per-layer types (`sim.catalog_layers`), for one pinned release:

1. **Layer specs.** Each layer's KV-cache spec: full attention, a sliding window, chunked-local
   attention, a Mamba state, or none (`kv_cache_spec` of every layer, as the model runner
   collects it). 0.11.0 turns chunked-local layers into full attention in one group: its
   `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE` defaults to 0, which disables the
   hybrid manager for Llama-4 (`VllmPin.chunked_local_hybrid_by_default`).
2. **Page-size unification** (a model with Mamba layers): the attention block size is raised
   until one attention page holds a Mamba state, and the Mamba page is padded to it. 0.11.0
   `HybridAttentionMambaModelConfig.verify_and_update_config`
   (`model_executor/models/config.py:L314-397`), 0.19.1 (`L156-316`, mode "none"), and from
   0.20.0 `Platform._align_hybrid_block_size` (`platforms/interface.py:L502-630 @0.20.0`,
   `L940-1135 @0.33.0`)::

       align      = 16, or from 0.20.0 max(16, block_size)    (`aligns_mamba_block_to_block_size`)
       needed     = align * cdiv(mamba_page, align * attention_bytes_per_token)
       block_size = max(block_size, needed)
       page       = block_size * attention_bytes_per_token    (the Mamba page is padded to it)

3. **Groups** (`sim.kv.v1_engine.hybrid_layout.group_layers`, the release's group-size rule)
   and the **pool**: `num_blocks = available // page // group_size` (`get_num_blocks`,
   0.11.0 `kv_cache_utils.py:L813-827`; 0.33.0 `kv_cache_planning.py:L642-741`). vLLM logs
   "GPU KV cache size" from the smallest block size of any group, the Mamba groups' being
   max_model_len (`L1078-1080 @0.11.0`; `sim.memory.logged`).

Worked example, Qwen3-Next-80B-A3B on 0.33.0 (bf16, TP 1, `--block-size` unset = 16): a full
layer holds ``2 x 2 heads x 256 x 2 B = 2,048 B`` a token; a Gated-DeltaNet state is
1,097,728 B. ``needed = 16 x cdiv(1,097,728, 16 x 2,048) = 16 x 34 = 544`` tokens, so the
page is ``544 x 2,048 = 1,114,112 B`` and each state is padded by 16,384 B (1.49%). Layer 0
is linear, so the Mamba spec comes first: 36 Mamba layers and 12 full give ``group_size =
12``: groups 0-2 Mamba (layers 0, 4, 8, ... / 1, 5, 9, ... / 2, 6, 10, ...), group 3 full
(layers 3, 7, ..., 47). 40 GiB available -> ``42,949,672,960 // 1,114,112 // 12 = 3,212``
blocks. With ``--block-size 64`` 0.19.1 keeps 544 (a multiple of 16 above 64) and 0.20.0 on
take ``64 x cdiv(1,097,728, 131,072) = 576``.

Left out: MLA models, speculative decoding (wider conv states, EAGLE layers), the "align" and
"all" Mamba cache modes (prefix caching over Mamba, which round to the Mamba2 chunk size),
`--disable-hybrid-kv-cache-manager` and what turns the hybrid manager off on its own (a KV
connector, KV events), FP8 scales, attention backends whose smallest kernel block is not 16
(e.g. FlashInfer on Blackwell preferring 64 from 0.33.0 unless `--block-size` is given), and
pipeline parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.catalog import ModelSpec, dtype_bytes
from sim.catalog_layers import LayerType
from sim.kv.config import KVCacheGroupSpec
from sim.kv.pins import V1_BASELINE, VllmPin
from sim.kv.types import cdiv
from sim.kv.v1_engine.hybrid_layout import HybridLayout, group_layers

#: The smallest kernel block of vLLM's CUDA attention backends (FlashAttention's
#: `MultipleOf(16)`; 0.11.0 and 0.19.1 hard-code it, `config.py:L367 @0.11.0`).
KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True, slots=True)
class HybridPool:
    """The groups, unified block size and page of one model on one release (module doc)."""

    pin: VllmPin
    layout: HybridLayout
    #: Attention tokens per block after unification (a Mamba group's are max_model_len).
    block_size: int
    #: One layer's page (every group's, after the Mamba padding), bytes.
    page_bytes: int
    #: One request's unpadded Mamba state in one layer; None without Mamba layers.
    mamba_state_bytes: int | None
    max_model_len: int

    @property
    def groups(self) -> tuple[KVCacheGroupSpec, ...]:
        return self.layout.groups

    @property
    def group_size(self) -> int:
        return self.layout.group_size

    @property
    def mamba_padding_bytes(self) -> int:
        """Bytes each Mamba page is padded by (0 without Mamba layers): 16,384 (Qwen3-Next)."""
        return 0 if self.mamba_state_bytes is None else self.page_bytes - self.mamba_state_bytes

    @property
    def block_bytes(self) -> int:
        """One block of the shared pool: a page in each of `group_size` layers."""
        return self.page_bytes * self.group_size

    def num_blocks(self, available_bytes: int) -> int:
        """``available // page // group_size`` (`get_num_blocks`): 3,212 for Qwen3-Next in
        40 GiB (module docstring)."""
        return max(int(available_bytes // self.page_bytes // self.group_size), 0)

    @property
    def reported_block_size(self) -> int:
        """The smallest block size of any group, which the logged token count multiplies by
        (a Mamba group's is max_model_len)."""
        has_mamba = any(g.mamba for g in self.groups)
        return min(self.block_size, self.max_model_len) if has_mamba else self.block_size

    def as_dict(self) -> dict[str, Any]:
        """Plain values for a run's inputs."""
        return {
            "vllm_version": self.pin.value,
            "block_size": self.block_size,
            "page_bytes": self.page_bytes,
            "group_size": self.group_size,
            "num_groups": self.layout.num_groups,
            "num_padding_layers": self.layout.num_padding_layers,
            "mamba_state_bytes": self.mamba_state_bytes,
            "mamba_padding_bytes": self.mamba_padding_bytes,
        }


def layer_specs(model: ModelSpec, pin: VllmPin) -> list[KVCacheGroupSpec | None]:
    """Each layer's KV-cache spec on `pin` (None: no cache), or the one-line refusal of a
    layer type the release (as kvsim models it) cannot run. Example: Llama-4-Scout on 0.11.0
    -> 48 full-attention specs; on 0.19.1 -> chunked 8,192 x 3, full, chunked x 3, ..."""
    kinds = model.layer_kinds
    if "mamba" in kinds and not pin.models_mamba_groups:
        raise ValueError(
            f"{model.name!r} has Mamba layers, which kvsim models from vLLM 0.11.0 on; "
            f"pin one (this is {pin.words})"
        )
    if "chunked" in kinds and pin is V1_BASELINE:
        raise ValueError(
            f"{model.name!r} has chunked-local attention layers, which kvsim models "
            f"from vLLM 0.11.0 on; pin one (this is {pin.words})"
        )
    chunked_hybrid = pin.chunked_local_hybrid_by_default
    return [_spec_of(kind, model, chunked_hybrid) for kind in kinds]


def _spec_of(kind: LayerType, model: ModelSpec, chunked_hybrid: bool) -> KVCacheGroupSpec | None:
    """One layer's spec (0.11.0 merges chunked-local layers into full attention)."""
    if kind == "sliding":
        return KVCacheGroupSpec(sliding_window=model.sliding_window)
    if kind == "chunked" and chunked_hybrid:
        return KVCacheGroupSpec(attention_chunk_size=model.attention_chunk_size)
    if kind == "mamba":
        return KVCacheGroupSpec(mamba=True)
    if kind == "none":
        return None
    return KVCacheGroupSpec()


def unified_block_size(
    pin: VllmPin, block_size: int, attention_bytes_per_token: int, mamba_page_bytes: int
) -> int:
    """The attention block size after page-size unification (module docstring, step 2).

    Example: Nemotron-H-8B (4,096 B a token, 2,158,592 B a state), block size 16, any
    release: ``16 x cdiv(2,158,592, 65,536) = 16 x 33 = 528``.
    """
    align = KERNEL_BLOCK_ALIGNMENT
    if pin.aligns_mamba_block_to_block_size:
        align = max(align, block_size)
    needed = align * cdiv(mamba_page_bytes, align * attention_bytes_per_token)
    return max(block_size, needed)


def hybrid_pool(
    model: ModelSpec,
    pin: VllmPin,
    *,
    block_size: int,
    max_model_len: int,
    kv_dtype: str | None = None,
    tp: int = 1,
) -> HybridPool:
    """`model`'s groups and pool on `pin` (module docstring). Raises ValueError (one line)
    for a layer type the release cannot run, or a TP size that does not divide the state."""
    specs = layer_specs(model, pin)
    layout = group_layers(specs, pad_to_largest=pin.pads_hybrid_groups_to_largest)
    per_token = model.kv_bytes_per_token_per_layer(kv_dtype, tp)
    state = None
    if model.mamba_state is not None:
        state = model.mamba_state.state_bytes(dtype_bytes(model.dtype), tp)
        block_size = unified_block_size(pin, block_size, per_token, state)
    return HybridPool(
        pin=pin,
        layout=layout,
        block_size=block_size,
        page_bytes=block_size * per_token,
        mamba_state_bytes=state,
        max_model_len=max_model_len,
    )
