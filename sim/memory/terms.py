"""The terms vLLM subtracts before sizing the KV pool: weights, activation peak, non-torch memory.

`sim.memory` combines them; this module says how big each one is and where the numbers come
from. vLLM measures all three on the GPU during its profiling run; kvsim estimates them from the
model geometry, the launch settings and constants fitted on real vLLM startup logs
(`sim/data/vllm_startup_logs.yaml`, fitted half only; see `sim.memory.validation`).

What vLLM does (read from the wheels, not copied):

- V1 engine (0.11.0, `vllm/v1/worker/gpu_worker.py:L222-302`): available KV memory =
  `total * gpu_memory_utilization - (weights + torch activation peak + non-torch increase)`,
  where `total` is the DRIVER's figure (`torch.cuda.mem_get_info`), the activation peak is
  measured over `profile_run` (`vllm/v1/worker/gpu_model_runner.py:L3325-3400`: one forward
  pass at `max_num_batched_tokens` tokens, then `_dummy_sampler_run` (L3183) on
  `min(max_num_batched_tokens, max_num_seqs)` rows of full-vocabulary fp32 logits with top-k /
  top-p; which top-k/top-p code that runs, and so its peak, differs by release:
  `sim.memory.sampler_release`) and non-torch memory is what NCCL, cuBLAS and the CUDA
  context add outside PyTorch's allocator. Through 0.19.x CUDA-graph memory is captured after
  the pool is sized and does not shrink it; from 0.20.0 the profiler subtracts an estimate
  of it first (`sim.memory.cudagraph`).
- v0 engine (0.5.4, `vllm/worker/worker.py:L161-206`): `num_gpu_blocks = (total * util -
  peak) // block_bytes` with `peak = free memory before - free memory after profile_run`, which
  already holds weights, activations and non-torch allocations; 0.6.4+ reports the same three
  terms separately (vLLM PR #10511).

Worked example (Llama-3.1-8B on one H100, V1 engine, 8192 batched tokens, 1024 sequences)::

    weights    = 8,030,261,248 params x 2 B                        = 14.96 GiB
    forward    = 8192 tok x 2 B x (2x4096 + 3x14336)               =  0.78 GiB
    sampler    = 1024 rows x 128,256 vocab x 4 B                   =  0.49 GiB
    activation = max(1.1 x 0.78, 9.75 x 0.49)                     =  4.77 GiB
    non-torch  = NON_TORCH_GIB[(v1, TP 1)]                        =  0.13 GiB
    (vLLM 0.11 logged 14.99, 4.76 and 0.13 GiB for this launch: llmd-llama31-8b-h100 in
    sim/data/vllm_startup_logs.yaml)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sim import catalog_params
from sim.catalog import GpuSpec, ModelSpec, dtype_bytes

GIB = 2**30


class VllmEngine(enum.Enum):
    """vLLM engine generation: which profiler sized the pool."""

    V0 = "v0"
    V1 = "v1"


class WeightFormat(enum.Enum):
    """How the checkpoint stores its weights (`model_dtype` in a scenario).

    Quantized formats store the decoder's linear layers in fewer bytes; the input embedding,
    lm_head and norms stay in the model's 16-bit dtype (vLLM's fp8 / AWQ / GPTQ methods leave
    them unquantized). MXFP4 (gpt-oss) quantizes only the MoE experts.
    """

    AUTO = "auto"  # the model's own dtype
    BFLOAT16 = "bfloat16"
    FLOAT16 = "float16"
    FP8 = "fp8"
    INT8 = "int8"
    AWQ_INT4 = "awq-int4"
    GPTQ_INT4 = "gptq-int4"
    MXFP4 = "mxfp4"


#: Bytes per quantized parameter, scales included. Int4 with group size 128 stores a 16-bit
#: scale and a 4-bit zero point per 128 weights: 0.5 + 2/128 + 0.5/128 = 0.51953 B. MXFP4
#: stores one 8-bit scale per 32 four-bit values: 0.5 + 1/32 = 0.53125 B. fp8 / int8 scales are
#: per tensor or per channel (negligible).
QUANTIZED_BYTES: dict[WeightFormat, float] = {
    WeightFormat.FP8: 1.0,
    WeightFormat.INT8: 1.0,
    WeightFormat.AWQ_INT4: 0.5 + 2 / 128 + 0.5 / 128,
    WeightFormat.GPTQ_INT4: 0.5 + 2 / 128 + 0.5 / 128,
    WeightFormat.MXFP4: 0.5 + 1 / 32,
}


def weight_format(name: str | WeightFormat | None) -> WeightFormat:
    """Parse a `model_dtype` value; aliases bf16 / fp16 / awq / gptq are accepted."""
    if isinstance(name, WeightFormat):
        return name
    if name is None:
        return WeightFormat.AUTO
    aliases = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "awq": "awq-int4",
               "gptq": "gptq-int4", "fp8_e4m3": "fp8"}  # fmt: skip
    key = aliases.get(name.lower(), name.lower())
    try:
        return WeightFormat(key)
    except ValueError:
        known = sorted(f.value for f in WeightFormat)
        raise ValueError(f"unknown model_dtype {name!r}; known: {known}") from None


def weight_bytes(
    model: ModelSpec,
    fmt: str | WeightFormat | None = None,
    tp: int = 1,
    compute_capability: tuple[int, int] | None = None,
) -> int:
    """Weight bytes on one tensor-parallel rank.

    Example: Llama-3.1-8B bf16 = 8,030,261,248 x 2 B = 16,060,522,496 B (14.96 GiB, what vLLM
    logs as "model weights take 14.96GiB"); fp8 = 6,979,321,856 linear body params x 1 B +
    1,050,939,392 embedding / lm_head / norm params x 2 B = 9,081,200,640 B (8.46 GiB).
    Norms are replicated across ranks but are ~0.003% of the weights: everything is divided.
    MXFP4 experts are stored padded for the GPU's MoE kernel (`compute_capability`,
    `mxfp4_padding_bytes`); None stores them as the checkpoint has them.
    """
    fmt = weight_format(fmt)
    if fmt in (WeightFormat.AUTO, WeightFormat.BFLOAT16, WeightFormat.FLOAT16):
        b = dtype_bytes(model.dtype if fmt is WeightFormat.AUTO else fmt.value)
        return model.total_params * b // tp
    if fmt is WeightFormat.MXFP4:  # the experts' matrices; their biases stay bf16 (gpt-oss)
        experts = catalog_params.num_moe_layers(model) * model.num_experts
        quantized = experts * catalog_params.expert_weight_params(model)
    else:
        quantized = model.body_linear_params
    rest = model.total_params - quantized
    total = quantized * QUANTIZED_BYTES[fmt] + rest * dtype_bytes(model.dtype)
    if fmt is WeightFormat.MXFP4:
        return int(total) // tp + mxfp4_padding_bytes(model, tp, compute_capability)
    return int(total) // tp


def mxfp4_expert_dims(
    model: ModelSpec, tp: int, compute_capability: tuple[int, int] | None
) -> tuple[int, int]:
    """(hidden size, expert width per rank) of MXFP4 experts as vLLM allocates them.

    vLLM pads both for the MoE kernel the GPU gets (0.11.0 `vllm/model_executor/layers/
    quantization/mxfp4.py`: backend L59-102, padding L190-226; 0.19.1 `vllm/model_executor/
    layers/fused_moe/oracle/mxfp4.py`: Triton needs capability 9.0-10.x L204-207, padding
    L376-400):

    - below 9.0 (A100, L4, L40S): Marlin, hidden to a multiple of 256, width to 128;
    - 9.x (H100, H200): Triton, width to a multiple of 64;
    - otherwise as stored: Blackwell's FlashInfer layout (256 / 256) depends on FlashInfer
      being installed in 0.11.0, and ROCm is not modelled.

    Example: gpt-oss-20b (2880, 2880) -> A100 (3072, 2944), H100 (2880, 2880); gpt-oss-120b
    at TP 4 -> A100 (3072, 768), H100 (2880, 768).
    """
    hidden, width = model.hidden_size, model.intermediate_size // tp
    if compute_capability is None or compute_capability[0] >= 10:
        return hidden, width
    if compute_capability[0] < 9:
        return _round_up(hidden, 256), _round_up(width, 128)
    return hidden, _round_up(width, 64)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def mxfp4_padding_bytes(
    model: ModelSpec, tp: int, compute_capability: tuple[int, int] | None
) -> int:
    """Bytes the padding adds to one rank's MXFP4 experts: matrices at 0.53125 B a value
    (scales included) and, for gpt-oss, the bf16 biases (2 widths + hidden per expert).

    gpt-oss-20b on an A100: 768 experts x (3 x (3072 x 2944 - 2880 x 2880) x 0.53125 B
    + (2 x 64 + 192) x 2 B) = 917,471,232 + 491,520 = 917,962,752 B (0.85 GiB).
    """
    hidden, width = mxfp4_expert_dims(model, tp, compute_capability)
    h, i = model.hidden_size, model.intermediate_size / tp
    if (hidden, width) == (h, i):
        return 0
    experts = catalog_params.num_moe_layers(model) * model.num_experts
    factor = 3 if model.mlp_kind == "gated" else 2
    values = factor * (hidden * width - h * i)
    biases = ((factor - 1) * (width - i) + (hidden - h)) if model.moe_bias else 0
    per_expert = values * QUANTIZED_BYTES[WeightFormat.MXFP4] + biases * dtype_bytes(model.dtype)
    return int(experts * per_expert)


def forward_activation_bytes(model: ModelSpec, num_tokens: int, tp: int = 1) -> int:
    """The largest live set of one forward pass over `num_tokens` tokens (one rank).

    Inside the MLP: residual and normed hidden states (2 * T * h), the gate/up output
    (2 * T * I/tp) and the activated half (T * I/tp), in the activation dtype. A MoE layer's
    fused kernel keeps three caches per routed copy of a token (k = experts per token):
    gate/up (2 * I/tp), activated (I/tp) and the down output (h): T * k * (3 * I/tp + h).
    Llama-3.1-8B, 2048 tokens: 2048 x 2 B x (8192 + 43,008) = 209,715,200 B. An up/down MLP
    (Nemotron-H's relu^2) keeps two I-wide tensors, not three. The Mamba / Gated-DeltaNet
    mixers of the catalog's hybrids are narrower than their MLPs (all projection widths plus
    the conv output: Nemotron-H 36,992 < 43,008; Qwen3-Next 24,640 < 10 x (1,536 + 2,048)),
    so the MLP stays the peak (`tests/memory/test_mamba_derive.py` checks it).
    """
    b = dtype_bytes(model.dtype)
    per_token = (3 if model.mlp_kind == "gated" else 2) * model.intermediate_size // tp
    if model.is_moe:
        per_token = model.num_experts_per_token * (per_token + model.hidden_size)
    return num_tokens * b * (2 * model.hidden_size + per_token)


def sampler_logits_bytes(model: ModelSpec, num_tokens: int, num_seqs: int) -> int:
    """One fp32 copy of the full-vocabulary logits the profiling run samples from.

    Rows = min(max_num_batched_tokens, max_num_seqs) (`_dummy_sampler_run`, 0.11.0); the
    lm_head output is gathered across ranks, so TP does not divide it.
    Llama-3.1-8B, 1024 rows: 1024 x 128,256 x 4 B = 525,336,576 B (0.49 GiB).
    """
    return min(num_tokens, num_seqs) * model.vocab_size * 4


class SamplerPath(enum.Enum):
    """Which sampler the profiling run exercised; its top-k/top-p memory differs ~3x.

    v0 always samples in PyTorch (FlashInfer only with VLLM_USE_FLASHINFER_SAMPLER=1). V1
    uses FlashInfer's top-k/top-p kernels when FlashInfer is installed and the variable is not
    0, else PyTorch's sort-based path (0.11.0 `vllm/v1/sample/ops/topk_topp_sampler.py:L32-75`;
    the log says "Using FlashInfer for top-p & top-k sampling").
    """

    V0 = "v0"
    V1_PYTORCH = "v1-pytorch"
    V1_FLASHINFER = "v1-flashinfer"
    #: 0.19.1+: top-k/top-p masked in place by a Triton kernel (`sim.memory.sampler_release`).
    V1_TRITON = "v1-triton"


#: The paths startup logs exist for: `fit_activation` fits their copies; V1_TRITON has no log
#: and is derived from the code (`triton_sampler_bytes`).
FITTED_SAMPLER_PATHS = (SamplerPath.V0, SamplerPath.V1_PYTORCH, SamplerPath.V1_FLASHINFER)


@dataclass(frozen=True)
class ActivationFit:
    """activation = max(hidden_factor * forward, sampler_copies[path] * one logits copy).

    The sampler runs after the forward pass has freed its intermediates, so the peak is the
    larger of the two, not their sum. Example (V1, PyTorch sampler, Llama-3.1-8B, 8192
    tokens, 1024 rows): max(a x 0.78 GiB, c x 0.49 GiB); with c near 10 the sampler wins, as
    in vLLM's logs (4.76 GiB) where the forward pass is far smaller.
    """

    hidden_factor: float
    sampler_copies: dict[SamplerPath, float]


#: Fitted on the `fit` half of sim/data/vllm_startup_logs.yaml by
#: `python benchmarks/memory_accuracy.py --fit` (sim.memory.validation.fit_activation);
#: tests/memory/test_memory_logs.py fails when these drift from what the logs give.
ACTIVATION_FIT = ActivationFit(
    hidden_factor=1.1,
    sampler_copies={
        SamplerPath.V0: 10.25,
        SamplerPath.V1_PYTORCH: 9.75,
        SamplerPath.V1_FLASHINFER: 3.25,
    },
)

#: Streaming multiprocessors of an H100 SXM: the Triton top-k/top-p kernel keeps one
#: vocab-wide fp32 row per program, min(SMs, rows) programs, rounded up to a power of two but
#: capped at the SM count (0.19.1 `vllm/v1/sample/ops/topk_topp_triton.py:L1010-1021`; 0.33.0
#: L1688-1695). The catalog has no SM counts; other data-center GPUs have 108-148, a
#: difference of at most 40 rows (under 35 MB at a 201k vocabulary).
TRITON_BUFFER_PROGRAMS = 132


def triton_sampler_bytes(
    model: ModelSpec, num_tokens: int, num_seqs: int, fit: ActivationFit | None = None
) -> int:
    """Peak of the Triton top-k/top-p path (0.19.1+), which no startup log measures.

    Live at its peak: the model-dtype logits `_dummy_sampler_run` holds, their fp32 copy
    (masked in place), the softmax probabilities and the exponential noise `random_sample`
    draws (0.19.1 `topk_topp_sampler.py:L94-113, L325-346`): the same live set as
    FlashInfer's `top_k_top_p_sampling_from_logits` (logits, fp32 copy, masked logits,
    probabilities), so it takes FlashInfer's fitted copies, plus the kernel's per-program
    buffer. Qwen2.5-72B, 1024 rows: 3.25 x 1024 x 152,064 x 4 B + 132 x 152,064 x 4 B =
    2,024,275,968 + 80,289,792 = 2,104,565,760 B (1.96 GiB; the sort path: 6.07 GB).
    """
    fit = fit or ACTIVATION_FIT
    rows = min(num_tokens, num_seqs)
    programs = min(TRITON_BUFFER_PROGRAMS, rows)
    buffer_rows = min(1 << (programs - 1).bit_length(), TRITON_BUFFER_PROGRAMS)
    copies = fit.sampler_copies[SamplerPath.V1_FLASHINFER]
    logits = sampler_logits_bytes(model, num_tokens, num_seqs)
    return int(copies * logits) + buffer_rows * model.vocab_size * 4


#: Non-torch memory (GiB) by engine and "TP > 1": medians of the `non_torch_gib` vLLM logged
#: in the fit half (NCCL buffers appear at TP >= 2); a cell with one fit log takes its TP
#: class's median over both engines (sim.memory.validation.fit_non_torch_gib). Same
#: provenance as ACTIVATION_FIT. v0 at TP 1 is median(0.16, 0.35, 1.79) since the 25th log
#: (2026-12) moved pr10511-llama3-8b-h100-tp1 into the fit half by the id-order split (each
#: log's side is now recorded in the YAML, so a new log moves none; sim/data/split.py).
NON_TORCH_GIB: dict[tuple[VllmEngine, bool], float] = {
    (VllmEngine.V0, False): 0.35,
    (VllmEngine.V0, True): 0.55,
    (VllmEngine.V1, False): 0.13,
    (VllmEngine.V1, True): 0.55,
}


def estimate_peak_activation_bytes(
    model: ModelSpec,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    tp: int = 1,
    sampler: SamplerPath | tuple[SamplerPath, ...] = SamplerPath.V1_PYTORCH,
    fit: ActivationFit = ACTIVATION_FIT,
) -> int:
    """Peak activation of vLLM's profiling run, estimated (see the module docstring).

    `sampler`: the path, or the paths one release's profiling run takes in turn (0.33.0 samples
    twice, `sim.memory.sampler_release`); each frees its tensors, so the peak is the largest.
    """
    if max_num_batched_tokens <= 0 or max_num_seqs <= 0:
        raise ValueError("max_num_batched_tokens and max_num_seqs must be positive")
    forward = forward_activation_bytes(model, max_num_batched_tokens, tp)
    paths = (sampler,) if isinstance(sampler, SamplerPath) else sampler
    samplers = [_sampler_bytes(model, max_num_batched_tokens, max_num_seqs, p, fit) for p in paths]
    return int(max(fit.hidden_factor * forward, *samplers))


def _sampler_bytes(
    model: ModelSpec, num_tokens: int, num_seqs: int, path: SamplerPath, fit: ActivationFit
) -> float:
    if path is SamplerPath.V1_TRITON:
        return triton_sampler_bytes(model, num_tokens, num_seqs, fit)
    return fit.sampler_copies[path] * sampler_logits_bytes(model, num_tokens, num_seqs)


def estimate_non_torch_bytes(engine: VllmEngine, tp: int) -> int:
    """NCCL / CUDA-context memory outside PyTorch, from the fitted table (GiB -> bytes)."""
    return int(NON_TORCH_GIB[(engine, tp > 1)] * GIB)


#: Driver-visible / datasheet memory of the one GPU measured in the catalog (H100 80GB:
#: 79.19 GiB). Applied to GPUs without a measured `memory_visible_gib`, and flagged.
VISIBLE_FRACTION_ESTIMATE = 79.19 / 80


class MemorySource(enum.Enum):
    MEASURED = "measured"  # memory_visible_gib from a vLLM log / driver
    ESTIMATED = "estimated"  # datasheet x VISIBLE_FRACTION_ESTIMATE
    GIVEN = "given"  # total_memory_bytes passed by the caller


def visible_memory(gpu: GpuSpec) -> tuple[int, MemorySource]:
    """What `torch.cuda.mem_get_info` reports as total: measured, or estimated from the H100.

    H100 SXM: 79.19 GiB = 85,029,615,042 B (measured); A100 80GB: 80 x 79.19/80 = 79.19 GiB
    (estimated: its figure is not in the catalog).
    """
    if gpu.memory_visible_gib is not None:
        return int(gpu.memory_visible_gib * GIB), MemorySource.MEASURED
    return int(gpu.memory_gb * VISIBLE_FRACTION_ESTIMATE * GIB), MemorySource.ESTIMATED
