"""What a quantized checkpoint changes in a step's GEMMs: the bytes of weights read, and the
tensor-core rate they run at.

The measured model's GEMM term (`sim.latency.measured_terms.gemm_time_s`) blends compute time
(FLOPs / peak) with memory time (bytes / bandwidth); its efficiencies were fitted on bf16 GEMMs.
A checkpoint whose decoder linear layers are quantized (`model_dtype` in a scenario; the memory
derivation already stores them in fewer bytes, `sim.memory.terms.weight_bytes`) reads fewer
weight bytes per GEMM, and, where vLLM runs it on low-precision tensor cores, computes faster:

- **fp8** on a GPU with fp8 tensor cores (Ada / Hopper / Blackwell: `fp8_tflops` in the
  catalog): W8A8, weights and activations in fp8 on the fp8 tensor cores (vLLM's
  `Fp8LinearMethod` with CUTLASS `scaled_mm`), 1 byte a weight at the fp8 peak. On a GPU
  without them (Ampere), vLLM falls back to weight-only fp8 with the Marlin kernel (its log:
  "Your GPU does not have native support for FP8 computation ... Weight-only FP8 compression
  will be used leveraging the Marlin kernel", 0.11.0
  `vllm/model_executor/layers/quantization/fp8.py`), 1 byte a weight at the bf16 peak.
- **int8**: 1 byte a weight at the bf16 peak (the catalog has no int8 figure: an upper bound
  where a GEMM is compute-bound).
- **awq-int4 / gptq-int4**: weight-only (Marlin), 0.52 bytes a weight (scales included) at the
  bf16 peak.
- **mxfp4** (gpt-oss): the MoE experts only, 0.53 bytes a weight at the bf16 peak.

The embedding, lm_head and norms stay 16-bit (as vLLM's methods leave them), and so do the
activations the GEMM reads and writes. The kernels' efficiencies are the bf16 fit's: no
quantized kernel was measured, so a quantized step is flagged `extrapolated`.

Example: Llama-3.1-8B fp8 on an H100, one decode token: the gate+up GEMM reads 4096 x 28,672
weights = 117 MB in fp8 instead of 235 MB in bf16, so its memory time halves; at 8,192
tokens it is compute-bound and runs at 1,979 instead of 989 TFLOP/s.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.catalog import GpuSpec, ModelSpec
from sim.latency.measured_terms import BF16_BYTES
from sim.memory.terms import QUANTIZED_BYTES, WeightFormat, weight_format


@dataclass(frozen=True, slots=True)
class GemmFormat:
    """Bytes per weight and the peak FLOP/s of one group of GEMMs."""

    weight_bytes: float
    peak_flops: float


@dataclass(frozen=True, slots=True)
class BodyGemmFormats:
    """The attention projections' and the MLP's (or MoE experts') GEMM formats."""

    attention: GemmFormat
    mlp: GemmFormat
    quantized: bool


def body_gemm_formats(model: ModelSpec, gpu: GpuSpec, fmt: str | None) -> BodyGemmFormats:
    """The formats of a step's decoder GEMMs for checkpoint format `fmt` (see the module
    docstring; None, auto, bfloat16 and float16 are the model's own 16-bit GEMMs)."""
    parsed = weight_format(fmt)
    plain = GemmFormat(float(BF16_BYTES), gpu.peak_flops(model.dtype))
    if parsed in (WeightFormat.AUTO, WeightFormat.BFLOAT16, WeightFormat.FLOAT16):
        return BodyGemmFormats(plain, plain, quantized=False)
    peak = plain.peak_flops
    if parsed is WeightFormat.FP8 and gpu.fp8_tflops is not None:
        peak = gpu.peak_flops("fp8")
    quant = GemmFormat(QUANTIZED_BYTES[parsed], peak)
    if parsed is WeightFormat.MXFP4:
        return BodyGemmFormats(plain, quant if model.is_moe else plain, quantized=model.is_moe)
    return BodyGemmFormats(quant, quant, quantized=True)
