"""How many KV-cache blocks fit on a GPU: vLLM's `num_gpu_blocks` derivation.

vLLM profiles a dummy forward pass at the token budget, then (v0, `vllm/worker/worker.py:
L173-218 @fc93e56`; V1 engine, `vllm/v1/worker/gpu_worker.py:L201-249 @4ac7713`):

    available_kv   = total_gpu_memory * gpu_memory_utilization - (weights + peak activation
                     + non-torch allocations)
    block_bytes    = 2 * num_layers * (Hkv // tp, at least 1) * head_dim * kv_dtype_bytes
                     * block_size                       (`cache_engine.py:L105-123 @fc93e56`)
    num_gpu_blocks = floor(available_kv / block_bytes)

We cannot run the profile, so the peak activation is either given (measured by calibrate/ on
the GPU) or estimated from the token budget (see `estimate_peak_activation_bytes`). Tensor
parallelism divides the weights and the KV heads. Pipeline parallelism is not modelled.

With the V1 engine's hybrid allocator (`kv_cache_utils.py:L864-1003 @4ac7713`), a model with
both sliding-window and full layers is split into groups of `group_size = min(layers per type)`
layers that share one block pool, so one block spans `group_size` layers, not all of them
(`kv_layout="hybrid"`; Gemma-2-9B: 21 of 42 layers, so twice as many, half-size blocks).

Worked example (`derive_num_gpu_blocks(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))`):

    total        = 80 GiB                                  = 85,899,345,920 B
    x 0.90                                                 = 77,309,411,328 B
    weights      = 8,030,261,248 params x 2 B              = 16,060,522,496 B
    activation   = 2048 tok x 2 B x (2x4096 + 3x14336)     =    209,715,200 B
                 + logits 256 seqs x 128,256 x 4 B (fp32)  =    131,334,144 B
    available_kv                                           = 60,907,839,488 B
    block_bytes  = 2 x 32 x 8 x 128 x 2 B x 16             =      2,097,152 B
    num_gpu_blocks = floor(60,907,839,488 / 2,097,152)     = 29,043 blocks (464,688 tokens)
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from sim.catalog import GpuSpec, ModelSpec, dtype_bytes, kv_heads_per_rank


class BlockCountSource(enum.Enum):
    """Where num_gpu_blocks came from."""

    GIVEN = "given"  # the scenario set num_gpu_blocks directly
    DERIVED = "derived"  # computed here from memory


class ActivationSource(enum.Enum):
    ESTIMATED = "estimated"  # estimate_peak_activation_bytes from the token budget
    MEASURED = "measured"  # supplied by the caller (e.g. calibrate/ on a GPU)
    NOT_USED = "not-used"  # num_gpu_blocks was given


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """Every input and intermediate of one num_gpu_blocks derivation (all byte counts per rank)."""

    source: BlockCountSource
    num_gpu_blocks: int
    block_size: int
    block_bytes: int
    num_layers_per_block: int
    num_kv_heads_per_rank: int
    head_dim: int
    kv_dtype: str
    kv_dtype_bytes: int
    tensor_parallel_size: int
    total_memory_bytes: int
    gpu_memory_utilization: float
    weight_bytes: int
    peak_activation_bytes: int
    activation_source: ActivationSource
    non_torch_bytes: int
    available_kv_bytes: int

    @property
    def num_kv_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def as_dict(self) -> dict[str, Any]:
        """Plain values (enums as strings) for a run report."""
        out = asdict(self)
        out["source"] = self.source.value
        out["activation_source"] = self.activation_source.value
        out["num_kv_tokens"] = self.num_kv_tokens
        return out


def num_layers_per_block(model: ModelSpec, kv_layout: Literal["uniform", "hybrid"]) -> int:
    """Layers one block spans: all of them, or the hybrid group size (Gemma-2-9B: 21)."""
    if kv_layout == "uniform":
        return model.num_layers
    if kv_layout == "hybrid":
        counts = [n for n in (model.num_full_layers, model.num_sliding_layers) if n > 0]
        return min(counts)
    raise ValueError(f"kv_layout must be 'uniform' or 'hybrid', got {kv_layout!r}")


def block_bytes(
    model: ModelSpec,
    *,
    block_size: int = 16,
    kv_dtype: str | None = None,
    tp: int = 1,
    kv_layout: Literal["uniform", "hybrid"] = "uniform",
) -> int:
    """`2 * layers * Hkv/tp * D * bytes * block_size`: 2,097,152 B for Llama-3.1-8B bf16, bs 16."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    per_token_layer = model.kv_bytes_per_token_per_layer(kv_dtype, tp)
    return per_token_layer * num_layers_per_block(model, kv_layout) * block_size


def estimate_peak_activation_bytes(
    model: ModelSpec, *, max_num_batched_tokens: int, max_num_seqs: int, tp: int = 1
) -> int:
    """Peak activation of vLLM's profiling forward pass, estimated (not measured).

    The largest live set is inside the MLP: the residual and the normed hidden states
    (2 * T * h), the gate/up output (2 * T * I/tp per routed expert) and the activated half
    (T * I/tp), all in the model dtype; plus fp32 logits for one sampled token per sequence
    (`max_num_seqs * V * 4`; vLLM gathers the full vocabulary before sampling). Allocator
    fragmentation, cuBLAS workspaces and CUDA graphs are not included: measure them instead.
    """
    if max_num_batched_tokens <= 0 or max_num_seqs <= 0:
        raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
    b = dtype_bytes(model.dtype)
    mlp_width = 3 * model.intermediate_size * model.num_experts_per_token // tp
    hidden = max_num_batched_tokens * b * (2 * model.hidden_size + mlp_width)
    logits = max_num_seqs * model.vocab_size * 4
    return hidden + logits


def derive_num_gpu_blocks(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    tp: int = 1,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    kv_dtype: str | None = None,
    weight_dtype: str | None = None,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    peak_activation_bytes: int | None = None,
    non_torch_bytes: int = 0,
    total_memory_bytes: int | None = None,
    kv_layout: Literal["uniform", "hybrid"] = "uniform",
) -> MemoryBudget:
    """num_gpu_blocks as vLLM derives it (see the module docstring for a worked example).

    Raises ValueError, as vLLM does, when no block fits.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if non_torch_bytes < 0:
        raise ValueError(f"non_torch_bytes must be >= 0, got {non_torch_bytes}")
    total = gpu.memory_bytes if total_memory_bytes is None else int(total_memory_bytes)
    # Norms are replicated across ranks, but they are ~0.003% of the weights: divide everything.
    weight_bytes = model.total_params * dtype_bytes(weight_dtype or model.dtype) // tp
    if peak_activation_bytes is None:
        activation = estimate_peak_activation_bytes(
            model, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs, tp=tp
        )
        activation_source = ActivationSource.ESTIMATED
    else:
        activation, activation_source = int(peak_activation_bytes), ActivationSource.MEASURED
    kv_dtype = kv_dtype or model.dtype
    one_block = block_bytes(
        model, block_size=block_size, kv_dtype=kv_dtype, tp=tp, kv_layout=kv_layout
    )
    # vLLM computes this in floating point then floors (int(...) in worker.py; // in V1).
    available = int(total * gpu_memory_utilization) - weight_bytes - activation - non_torch_bytes
    num_blocks = math.floor(available / one_block) if available > 0 else 0
    if num_blocks <= 0:
        raise ValueError(
            f"no memory left for KV-cache blocks: {total} B x {gpu_memory_utilization} - weights "
            f"{weight_bytes} B - activation {activation} B - non-torch {non_torch_bytes} B = "
            f"{available} B < one block of {one_block} B (raise gpu_memory_utilization or tp)"
        )
    return MemoryBudget(
        source=BlockCountSource.DERIVED,
        num_gpu_blocks=num_blocks,
        **_block_geometry(model, one_block, block_size, kv_dtype, tp, kv_layout),
        total_memory_bytes=total,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_bytes=weight_bytes,
        peak_activation_bytes=activation,
        activation_source=activation_source,
        non_torch_bytes=non_torch_bytes,
        available_kv_bytes=available,
    )


def _block_geometry(
    model: ModelSpec, one_block: int, block_size: int, kv_dtype: str, tp: int, kv_layout: str
) -> dict[str, Any]:
    """The MemoryBudget fields that describe one block, whether the count is derived or given."""
    return {
        "block_size": block_size,
        "block_bytes": one_block,
        "num_layers_per_block": num_layers_per_block(model, kv_layout),  # type: ignore[arg-type]  # checked there
        "num_kv_heads_per_rank": kv_heads_per_rank(model.num_kv_heads, tp),
        "head_dim": model.head_dim,
        "kv_dtype": kv_dtype,
        "kv_dtype_bytes": dtype_bytes(kv_dtype),
        "tensor_parallel_size": tp,
    }


def given_num_gpu_blocks(
    num_gpu_blocks: int,
    model: ModelSpec,
    *,
    tp: int = 1,
    block_size: int = 16,
    kv_dtype: str | None = None,
    kv_layout: Literal["uniform", "hybrid"] = "uniform",
) -> MemoryBudget:
    """A budget for a scenario that sets num_gpu_blocks directly (nothing is derived)."""
    if num_gpu_blocks <= 0:
        raise ValueError(f"num_gpu_blocks must be positive, got {num_gpu_blocks}")
    kv_dtype = kv_dtype or model.dtype
    one_block = block_bytes(
        model, block_size=block_size, kv_dtype=kv_dtype, tp=tp, kv_layout=kv_layout
    )
    return MemoryBudget(
        source=BlockCountSource.GIVEN,
        num_gpu_blocks=num_gpu_blocks,
        **_block_geometry(model, one_block, block_size, kv_dtype, tp, kv_layout),
        total_memory_bytes=0,
        gpu_memory_utilization=0.0,
        weight_bytes=0,
        peak_activation_bytes=0,
        activation_source=ActivationSource.NOT_USED,
        non_torch_bytes=0,
        available_kv_bytes=num_gpu_blocks * one_block,
    )
