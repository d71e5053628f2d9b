"""A calibration profile -> the tables and ceilings the measured step-time fit takes.

`kvsim calibrate` times one layer's GEMMs, decode attention (batch x context) and prefill
attention (chunk x prior) on its device. This module takes each case's median (`Samples`),
turns the samples into `sim.latency.measured_fit.Tables` (the converter, `to_tables`) and
names the ceilings the fitted efficiencies are relative to (`Target`, `target_of`). The fit
and the coefficients file are `calibrate.to_measured`.

Features are computed exactly as `MeasuredStepTime` computes them when it predicts (bf16 GEMM
and query bytes, KV bytes in the model's dtype), against the ceilings it predicts with (the
catalog GPU's datasheet peak for the model's dtype and its HBM bandwidth), so the fitted
efficiencies reproduce the measured times. Example: a decode case of 64 sequences at 4,096
tokens of Llama-3.1-8B (8 KV heads of 128, bf16: 4,096 B of K and V per token and layer) reads
64 x 4,096 x 4,096 B = 1.07 GB; timed at 0.30 ms on an H200 (4.8 TB/s) that is 75% of the
datasheet bandwidth.

Without a catalog GPU (a CPU run without `--gpu`) the ceilings are the probed copy bandwidth
and matmul rate and the target is named after the device. No torch here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pandas as pd

from sim.catalog import ModelSpec, dtype_bytes, get_gpu
from sim.latency import measured_fit as mf
from sim.latency import measured_terms as terms
from sim.latency.profile import StepTimeProfile

#: calibrate's GEMM names -> the measured model's (Vidur's op names in `measured_fit`).
GEMM_NAMES = {
    "qkv_proj": "attn_pre_proj",
    "o_proj": "attn_post_proj",
    "gate_up_proj": "mlp_up_proj",
    "down_proj": "mlp_down_proj",
    "lm_head": "lm_head",
}


@dataclass(frozen=True, slots=True)
class Samples:
    """A calibration's medians, one layer on one tensor-parallel rank, in seconds."""

    model: ModelSpec
    tp: int
    gemm: dict[str, list[tuple[int, float]]]  # calibrate GEMM name -> (tokens, median_s)
    decode: list[tuple[int, int, float]]  # (num_seqs, context tokens per seq, median_s)
    prefill: list[tuple[int, int, float]]  # (prior tokens, chunk tokens, median_s)


@dataclass(frozen=True, slots=True)
class Target:
    """The name the fit is stored under and the ceilings its efficiencies are relative to."""

    name: str
    peak_flops: float
    bandwidth_Bps: float
    interconnect_GBps: float | None  # None: take the nearest shipped GPU's
    catalog_gpu: bool  # False: ceilings probed on the device (no datasheet)
    #: The device's probed (peak, bandwidth) where the fit runs against them first (a CPU
    #: keyed to a catalog GPU), None to fit against the ceilings above directly.
    probed: tuple[float, float] | None = None


def samples_from_profile(profile: StepTimeProfile) -> Samples:
    """Each timed case's median (of its raw samples) keyed by the case's parameters."""

    def ints(p, *keys: str) -> tuple[int, ...]:
        return tuple(int(p.params[k]) for k in keys)

    decode = []
    for p in profile.decode_attention.points:
        num_seqs, total = ints(p, "num_seqs", "context_tokens")
        decode.append((num_seqs, total // num_seqs, p.median_s))
    return Samples(
        model=profile.model,
        tp=profile.tp,
        gemm={
            name: [(ints(p, "tokens")[0], p.median_s) for p in op.points]
            for name, op in profile.gemms.items()
        },
        decode=decode,
        prefill=[
            (*ints(p, "prior_tokens", "chunk_tokens"), p.median_s)
            for p in profile.prefill_attention.points
        ],
    )


def gemm_shapes(model: ModelSpec, tp: int) -> dict[str, tuple[int, int]]:
    """(K, N) per rank of each GEMM, as `MeasuredStepTime` shapes them when it predicts."""
    h, d = model.hidden_size, model.head_dim
    hq, hkv = max(1, model.num_attention_heads // tp), max(1, model.num_kv_heads // tp)
    inter = model.intermediate_size // tp
    return {
        "qkv_proj": (h, (hq + 2 * hkv) * d),
        "o_proj": (hq * d, h),
        "gate_up_proj": (h, 2 * inter),
        "down_proj": (inter, h),
        "lm_head": (h, model.vocab_size // tp),
    }


def to_tables(samples: Samples, gpu: str) -> mf.Tables:
    """The converter: samples -> `measured_fit.Tables` (terms calibrate does not time empty)."""
    m, tp = samples.model, samples.tp
    shapes = gemm_shapes(m, tp)
    gemm_rows = []
    for name, points in samples.gemm.items():
        k, n = shapes[name]
        for tokens, time_s in points:
            flops, nbytes = terms.gemm_flops_bytes(float(tokens), k, n)
            gemm_rows.append((gpu, m.name, tp, GEMM_NAMES[name], tokens, flops, nbytes, time_s))
    gemm = pd.DataFrame(
        gemm_rows, columns=["gpu", "model", "tp", "op", "tokens", "flops", "bytes", "time_s"]
    )
    hq, hkv = max(1, m.num_attention_heads // tp), max(1, m.num_kv_heads // tp)
    kv_tok = 2 * hkv * m.head_dim * dtype_bytes(m.dtype)
    decode = pd.DataFrame(
        [(gpu, b, c, float(b * c * kv_tok), t) for b, c, t in samples.decode],
        columns=["gpu", "batch", "context", "kv_bytes", "time_s"],
    )
    prefill_rows = []
    for prior, chunk, time_s in samples.prefill:
        flops, q_bytes = terms.prefill_attention_work(hq, m.head_dim, chunk, prior + chunk)
        prefill_rows.append((gpu, chunk, prior, flops, q_bytes, time_s))
    prefill = pd.DataFrame(
        prefill_rows, columns=["gpu", "chunk", "prior", "flops", "q_bytes", "time_s"]
    )
    empty = pd.DataFrame
    return mf.Tables(
        gemm=gemm,
        elementwise=empty(columns=["gpu", "model", "tp", "op", "kind", "tokens", "bytes"]),
        decode=decode,
        prefill=prefill,
        allreduce=empty(columns=["gpu", "tp", "bytes", "time_s"]),
        overhead=empty(columns=["model", "tp", "batch", "time_s"]),
        raw_geometry={},
    )


def target_of(profile: StepTimeProfile) -> Target:
    """The catalog GPU the profile was taken on (its datasheet), else the probed device."""
    c = profile.ceilings
    if c.datasheet_gpu:
        gpu = get_gpu(c.datasheet_gpu)
        probed = (
            (c.matmul_flops, c.copy_bandwidth_Bps) if profile.metadata.device == "cpu" else None
        )
        return Target(gpu.name, gpu.peak_flops(profile.model.dtype), gpu.bandwidth_Bps,
                      gpu.interconnect_GBps, catalog_gpu=True, probed=probed)  # fmt: skip
    name = re.sub(r"[^a-z0-9]+", "-", profile.metadata.device_name.lower()).strip("-")
    name = f"measured-{name or profile.metadata.device}"
    return Target(name, c.matmul_flops, c.copy_bandwidth_Bps, None, catalog_gpu=False)
