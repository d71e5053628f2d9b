"""How many KV-cache blocks fit on a GPU: vLLM's `num_gpu_blocks` derivation.

vLLM profiles a dummy forward pass at the token budget, then (v0: `vllm/worker/worker.py:
L161-206` in the 0.5.4 wheel; V1: `vllm/v1/worker/gpu_worker.py:L222-302` and
`vllm/v1/core/kv_cache_utils.py:L813-827` in the 0.11.0 wheel):

    available_kv   = total_visible * gpu_memory_utilization
                     - (weights + peak activation + non-torch allocations)
                     - CUDA-graph estimate (V1, 0.20.0+: `sim.memory.cudagraph`)
    block_bytes    = 2 * layers_per_block * (Hkv // tp, at least 1) * head_dim
                     * kv_dtype_bytes * block_size
    num_gpu_blocks = floor(available_kv / block_bytes)

`total_visible` is what the driver reports (an "80 GB" H100: 79.19 GiB), not the datasheet.
The three subtracted terms are estimated by `sim.memory.terms` (or given, e.g. measured by
calibrate/ on the GPU). Tensor parallelism divides the weights and the KV heads. Pipeline
parallelism is not modelled.

With the V1 engine's hybrid allocator (0.11.0 `kv_cache_utils.py:L894-1003`), a model with
both sliding-window and full layers is split into groups of `group_size = min(layers per type)`
layers that share one block pool, so one block spans `group_size` layers, not all of them
(`kv_layout="hybrid"`; Gemma-2-9B: 21 of 42 layers, so twice as many, half-size blocks). vLLM
reports that pool as `num_blocks // num_groups * block_size` tokens (`kv_cache_utils.py:L1080`):
the same token capacity as the uniform layout until a request outgrows the window.

Worked example (`derive_num_gpu_blocks(get_model("llama-3.1-8b"), get_gpu("h100-sxm"))`:
v0 engine (kvsim's default design), 2048 batched tokens, 256 sequences; tests/memory/test_memory.py
checks it):

    total        = 79.19 GiB (the H100's driver figure)    = 85,029,615,042 B
    x 0.90                                                 = 76,526,653,537 B
    weights      = 8,030,261,248 params x 2 B              = 16,060,522,496 B
    activation   = max(1.1 x 209,715,200 forward,
                       10.25 x 131,334,144 sampler logits) =  1,346,174,976 B
    non-torch    = 0.35 GiB (v0, TP 1)                     =    375,809,638 B
    available_kv                                           = 58,744,146,427 B
    block_bytes  = 2 x 32 x 8 x 128 x 2 B x 16             =      2,097,152 B
    num_gpu_blocks = floor(58,744,146,427 / 2,097,152)     = 28,011 blocks (448,176 tokens)
"""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

from sim.catalog import GpuSpec, ModelSpec, dtype_bytes, kv_heads_per_rank
from sim.errors import InputError
from sim.kv.v1_engine.hybrid_layout import HybridLayout, alternating_layer_windows, hybrid_layout
from sim.memory.cudagraph import cudagraph_estimate_bytes
from sim.memory.sampler_release import release_of, sampler_paths
from sim.memory.terms import (
    MemorySource,
    VllmEngine,
    WeightFormat,
    estimate_non_torch_bytes,
    estimate_peak_activation_bytes,
    visible_memory,
    weight_bytes,
    weight_format,
)

KvLayout = Literal["uniform", "hybrid"]


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
    num_kv_groups: int
    num_kv_heads_per_rank: int
    head_dim: int
    kv_dtype: str
    kv_dtype_bytes: int
    tensor_parallel_size: int
    total_memory_bytes: int
    total_memory_source: str
    gpu_memory_utilization: float
    weight_format: str
    weight_bytes: int
    peak_activation_bytes: int
    activation_source: ActivationSource
    non_torch_bytes: int
    non_torch_source: str
    engine: str
    available_kv_bytes: int
    #: What the release subtracts for CUDA graphs (0 before 0.20.0, under --enforce-eager,
    #: or with VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0; `sim.memory.cudagraph`).
    cudagraph_bytes: int = 0

    @property
    def num_kv_tokens(self) -> int:
        """Tokens the pool holds, as vLLM reports it: blocks // KV groups * block_size."""
        return self.num_gpu_blocks // self.num_kv_groups * self.block_size

    def as_dict(self) -> dict[str, Any]:
        """Plain values (enums as strings) for a run report."""
        out = asdict(self)
        out["source"] = self.source.value
        out["activation_source"] = self.activation_source.value
        out["num_kv_tokens"] = self.num_kv_tokens
        return out


def num_layers_per_block(model: ModelSpec, kv_layout: KvLayout) -> int:
    """Layers one block spans: all of them, or the hybrid group size (Gemma-2-9B: 21)."""
    if kv_layout == "uniform":
        return model.num_layers
    if kv_layout == "hybrid":
        counts = [n for n in (model.num_full_layers, model.num_sliding_layers) if n > 0]
        return min(counts)
    raise ValueError(f"kv_layout must be 'uniform' or 'hybrid', got {kv_layout!r}")


def num_kv_groups(model: ModelSpec, kv_layout: KvLayout) -> int:
    """KV-cache groups sharing the pool: 1, or layers of each type / group size (Gemma-2: 2)."""
    size = num_layers_per_block(model, kv_layout)
    if kv_layout == "uniform":
        return 1
    return sum(-(-n // size) for n in (model.num_full_layers, model.num_sliding_layers) if n > 0)


def hybrid_layout_of(model: ModelSpec) -> HybridLayout:
    """The V1 engine's KV-cache groups for a hybrid model (`sim.kv.v1_engine.hybrid_layout`).

    Example: Gemma-2-9B -> group 0 = 21 sliding layers (W=4096), group 1 = 21 full layers;
    its `group_size` and group count equal `num_layers_per_block` / `num_kv_groups` "hybrid".
    """
    if not is_hybrid_model(model) or model.sliding_window is None:
        raise ValueError(f"{model.layer_pattern!r} layers are not a hybrid model")
    if model.layer_types is None:
        return hybrid_layout(alternating_layer_windows(model.num_layers, model.sliding_window))
    if set(model.layer_kinds) - {"sliding", "full"}:  # chunked / Mamba: the release decides
        raise ValueError(f"{model.name!r}: use sim.memory.hybrid_pool for its layer types")
    window = model.sliding_window
    return hybrid_layout([window if kind == "sliding" else None for kind in model.layer_kinds])


def is_hybrid_model(model: ModelSpec) -> bool:
    """Both sliding-window and full-attention layers (Gemma-2, gpt-oss): V1 groups them."""
    return model.num_full_layers > 0 and model.num_sliding_layers > 0


def block_bytes(
    model: ModelSpec,
    *,
    block_size: int = 16,
    kv_dtype: str | None = None,
    tp: int = 1,
    kv_layout: KvLayout = "uniform",
) -> int:
    """`2 * layers * Hkv/tp * D * bytes * block_size`: 2,097,152 B for Llama-3.1-8B bf16, bs 16."""
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    per_token_layer = model.kv_bytes_per_token_per_layer(kv_dtype, tp)
    return per_token_layer * num_layers_per_block(model, kv_layout) * block_size


def derive_num_gpu_blocks(
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    tp: int = 1,
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    kv_dtype: str | None = None,
    weight_dtype: str | WeightFormat | None = None,
    max_num_batched_tokens: int = 2048,
    max_num_seqs: int = 256,
    peak_activation_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    total_memory_bytes: int | None = None,
    kv_layout: KvLayout = "uniform",
    engine: VllmEngine | str = VllmEngine.V0,
    flashinfer_sampler: bool | None = None,
    vllm_release: str | None = None,
    enforce_eager: bool = False,
    estimate_cudagraphs: bool | None = None,
) -> MemoryBudget:
    """num_gpu_blocks as vLLM derives it (see the module docstring for a worked example).

    Every term left as None is estimated (`sim.memory.terms`) and its source recorded. The
    default engine is v0, as kvsim's default design (v0-v2); pass the scenario's.
    `vllm_release` (a release or pin name, "0.33.0") picks the top-k/top-p sampler its
    profiling run exercises (`sim.memory.sampler_release`); None is read as 0.11.
    `flashinfer_sampler`: FlashInfer's sampler was on (True) or off (False); None takes the
    release's default: off up to 0.20 (0.11: PyTorch's sort, whose larger profile leaves a
    smaller, safer pool; 0.19.1 / 0.20.0: the Triton kernel), on from 0.25.
    From 0.20.0 the V1 engine also subtracts its CUDA-graph estimate
    (`sim.memory.cudagraph`): none under `enforce_eager`; `estimate_cudagraphs` is
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as set (None: the release's default).
    Raises ValueError, as vLLM does, when no block fits.
    """
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    engine = VllmEngine(engine)
    fmt = weight_format(weight_dtype)
    if total_memory_bytes is None:
        total, total_source = visible_memory(gpu)
    else:
        total, total_source = int(total_memory_bytes), MemorySource.GIVEN
    weights = weight_bytes(model, fmt, tp, gpu.compute_capability)
    if peak_activation_bytes is None:
        sampler = sampler_paths(engine, release_of(vllm_release),
                                min(max_num_batched_tokens, max_num_seqs), flashinfer_sampler)  # fmt: skip
        activation = estimate_peak_activation_bytes(
            model, max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
            tp=tp, sampler=sampler,
        )  # fmt: skip
        activation_source = ActivationSource.ESTIMATED
    else:
        activation, activation_source = int(peak_activation_bytes), ActivationSource.MEASURED
    non_torch, non_torch_source = _non_torch(engine, tp, non_torch_bytes)
    kv_dtype = kv_dtype or model.dtype
    one_block = block_bytes(
        model, block_size=block_size, kv_dtype=kv_dtype, tp=tp, kv_layout=kv_layout
    )
    cudagraphs = 0
    if engine is VllmEngine.V1:  # 0.20.0 gpu_worker.py:L420-425
        cudagraphs = cudagraph_estimate_bytes(
            release=release_of(vllm_release), max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, enforce_eager=enforce_eager,
            env_override=estimate_cudagraphs, compute_capability=gpu.compute_capability,
        )  # fmt: skip
    # vLLM computes this in floating point then floors (int(...) in worker.py; // in V1).
    available = int(total * gpu_memory_utilization) - weights - activation - non_torch
    available -= cudagraphs
    num_blocks = math.floor(available / one_block) if available > 0 else 0
    if num_blocks <= 0:
        raise InputError(
            f"no memory left for KV-cache blocks: {total} B x {gpu_memory_utilization} - weights "
            f"{weights} B - activation {activation} B - non-torch {non_torch} B - CUDA graphs "
            f"{cudagraphs} B = "
            f"{available} B < one block of {one_block} B (raise gpu_memory_utilization or tp)"
        )
    return MemoryBudget(
        source=BlockCountSource.DERIVED,
        num_gpu_blocks=num_blocks,
        **_block_geometry(model, one_block, block_size, kv_dtype, tp, kv_layout),
        total_memory_bytes=total,
        total_memory_source=total_source.value,
        gpu_memory_utilization=gpu_memory_utilization,
        weight_format=fmt.value,
        weight_bytes=weights,
        peak_activation_bytes=activation,
        activation_source=activation_source,
        non_torch_bytes=non_torch,
        non_torch_source=non_torch_source,
        engine=engine.value,
        available_kv_bytes=available,
        cudagraph_bytes=cudagraphs,
    )


def _non_torch(engine: VllmEngine, tp: int, given_bytes: int | None) -> tuple[int, str]:
    """The non-torch memory (NCCL buffers, CUDA context) and where it came from: `given_bytes`
    as given, None estimated (`sim.memory.terms.estimate_non_torch_bytes`)."""
    if given_bytes is None:
        return estimate_non_torch_bytes(engine, tp), "estimated"
    if given_bytes < 0:
        raise ValueError(f"non_torch_bytes must be >= 0, got {given_bytes}")
    return int(given_bytes), "given"


def _block_geometry(
    model: ModelSpec, one_block: int, block_size: int, kv_dtype: str, tp: int, kv_layout: KvLayout
) -> dict[str, Any]:
    """The MemoryBudget fields that describe one block, whether the count is derived or given."""
    return {
        "block_size": block_size,
        "block_bytes": one_block,
        "num_layers_per_block": num_layers_per_block(model, kv_layout),
        "num_kv_groups": num_kv_groups(model, kv_layout),
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
    kv_layout: KvLayout = "uniform",
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
        total_memory_source="not-used",
        gpu_memory_utilization=0.0,
        weight_format="not-used",
        weight_bytes=0,
        peak_activation_bytes=0,
        activation_source=ActivationSource.NOT_USED,
        non_torch_bytes=0,
        non_torch_source="not-used",
        engine="not-used",
        available_kv_bytes=num_gpu_blocks * one_block,
    )
