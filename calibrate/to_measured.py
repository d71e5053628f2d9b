"""A calibration's measurements -> coefficients of the measured step-time model (the default).

`kvsim calibrate` times one layer's GEMMs, decode attention (batch x context) and prefill
attention (chunk x prior) on its device. This module turns those samples into the tables that
`sim.latency.measured_fit` takes (the converter, `to_tables`), fits the same terms with the same
functions as `scripts/fit_steptime.py` does on Vidur's public profiles, and writes a JSON in the
layout of `sim/data/steptime_coefficients.json`, which a scenario then names with
`step_time: {measured: {coefficients: PATH}}`. So a GPU run refines the shipped coefficients
rather than replacing the model.

What is measured and what is carried over (each said in the file's provenance):

  gemm, decode_attention, prefill_attention   fitted here, on this device
  elementwise (norms, RoPE, activation, ...)  carried over: calibrate does not time them
  allreduce (tp > 1)                          carried over, its bandwidth scaled by the
                                              interconnect ratio (one device cannot measure it)
  engine (per-step CPU overhead, v0 / V1)     carried over: calibrate times kernels, no engine
  band                                        carried over: no held-out split here

Carried-over terms come from the shipped fit of the GPU nearest the calibrated one (by
datasheet FLOP/s and bandwidth, `sim.latency.measured.nearest_fitted_gpu`). The file keeps
every shipped GPU and adds (or replaces) the calibrated one, so scenarios on other GPUs are
unchanged.

Features are computed exactly as `MeasuredStepTime` computes them when it predicts (bf16 GEMM
and query bytes, KV bytes in the model's dtype), against the ceilings it predicts with (the
catalog GPU's datasheet peak for the model's dtype and its HBM bandwidth), so the fitted
efficiencies reproduce the measured times. Example: a decode case of 64 sequences at 4,096
tokens of Llama-3.1-8B (8 KV heads of 128, bf16: 4,096 B of K and V per token and layer) reads
64 x 4,096 x 4,096 B = 1.07 GB; timed at 0.30 ms on an H200 (4.8 TB/s) that is 75% of the
datasheet bandwidth.

Without a catalog GPU (a CPU run without `--gpu`) the ceilings are the probed copy bandwidth
and matmul rate and the entry is named after the device. A CPU run is plumbing: the file says
so (`provenance.plumbing_only`). No torch here: `python -m calibrate.to_measured PROFILE.json`
redoes the fit from a saved profile on any machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.catalog import GpuSpec, ModelSpec, dtype_bytes, get_gpu
from sim.latency import measured_fit as mf
from sim.latency import measured_terms as terms
from sim.latency.measured import nearest_fitted_gpu, shipped_coefficients
from sim.latency.profile import StepTimeProfile, load_profile

#: calibrate's GEMM names -> the measured model's (Vidur's op names in `measured_fit`).
GEMM_NAMES = {
    "qkv_proj": "attn_pre_proj",
    "o_proj": "attn_post_proj",
    "gate_up_proj": "mlp_up_proj",
    "down_proj": "mlp_down_proj",
    "lm_head": "lm_head",
}
MEASURED_TERMS = ("gemm", "decode_attention", "prefill_attention")
CARRIED_TERMS = ("elementwise", "allreduce")
PLUMBING_NOTE = (
    "CPU timings: this file exercises the calibrate -> measured-model path; it is not a GPU "
    "fit (run calibrate/gpu_run.sh on a GPU for coefficients to plan with)"
)


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


def fit_terms(tables: mf.Tables, target: Target) -> dict[str, dict[str, float]]:
    """gemm / decode_attention / prefill_attention with `measured_fit`'s own fitters."""
    ceiling = target.probed or (target.peak_flops, target.bandwidth_Bps)
    gemm_start = _gemm_start(tables.gemm, *ceiling)
    fitted = {
        "gemm": mf.fit_gemm(tables.gemm, target.name, datasheet=ceiling, x0=gemm_start),
        "decode_attention": mf.fit_decode(tables.decode, target.name, datasheet=ceiling),
        "prefill_attention": mf.fit_prefill(tables.prefill, target.name, datasheet=ceiling),
    }
    if target.probed is None:
        return fitted
    return _rescale(fitted, ceiling[0] / target.peak_flops, ceiling[1] / target.bandwidth_Bps)


#: The efficiencies of each fitted term that are fractions of peak FLOP/s or of bandwidth.
_COMPUTE_KEYS = {"gemm": ("compute_efficiency",), "prefill_attention": ("compute_efficiency",)}
_MEMORY_KEYS = {
    "gemm": ("memory_efficiency",),
    "decode_attention": ("bandwidth_efficiency",),
    "prefill_attention": ("query_bandwidth_efficiency",),
}


def _rescale(fitted: dict, compute_ratio: float, memory_ratio: float) -> dict:
    """Efficiencies against probed ceilings -> against the datasheet (4 significant digits).

    A CPU reaches ~0.01% of a GPU datasheet: the fitters' 4-decimal rounding would make that
    0, so a CPU run keyed to a catalog GPU fits against its probed ceilings, then converts.
    Example: 0.35 of a 20 GB/s probe is 0.35 x 20 / 3,350 = 0.00209 of an H100's bandwidth.
    """
    out = copy.deepcopy(fitted)
    for keys, ratio in ((_COMPUTE_KEYS, compute_ratio), (_MEMORY_KEYS, memory_ratio)):
        for term, names in keys.items():
            for name in names:
                out[term][name] = float(f"{out[term][name] * ratio:.4g}")
    return out


def _gemm_start(gemm: pd.DataFrame, peak_flops: float, bandwidth_Bps: float) -> np.ndarray:
    """Where the GEMM search starts: the best compute and memory efficiency any case reached.

    The shipped fit starts at GPU-like efficiencies (~0.7 / 0.8); a CPU reaches ~1% of a GPU's
    datasheet and the simplex would not walk that far. Example: a case at 0.5 of peak FLOP/s
    starts compute efficiency at 0.5 (logit 0); the exponent starts at 1 + e^0.7 = 3.0 and the
    floor at half the fastest case.
    """
    compute = float(np.max(gemm.flops / peak_flops / gemm.time_s))
    memory = float(np.max(gemm.bytes / bandwidth_Bps / gemm.time_s))

    def logit(e: float) -> float:
        e = min(max(e, 1e-6), 0.999)
        return float(np.log(e / (1 - e)))

    floor_us = max(0.5 * float(gemm.time_s.min()) * 1e6, 1e-3)
    return np.array([logit(compute), logit(memory), 0.7, np.log(floor_us)])


def in_sample_errors(tables: mf.Tables, fitted: dict, target: Target) -> dict[str, np.ndarray]:
    """Signed relative errors (predicted / measured - 1) of the fit on its own cases."""
    peak, bw = target.peak_flops, target.bandwidth_Bps
    g, d, p = tables.gemm, tables.decode, tables.prefill
    preds = {
        "GEMM": (terms.gemm_time_s(g.flops, g.bytes, peak, bw, fitted["gemm"]), g.time_s),
        "decode attention": (
            terms.decode_attention_time_s(d.batch, d.kv_bytes, bw, fitted["decode_attention"]),
            d.time_s,
        ),
        "prefill attention": (
            terms.prefill_attention_time_s(
                p.flops, p.q_bytes, peak, bw, fitted["prefill_attention"]
            ),
            p.time_s,
        ),
    }
    return {
        k: np.asarray(pred, float) / np.asarray(meas, float) - 1.0
        for k, (pred, meas) in preds.items()
    }


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


def _nearest_shipped(target: Target, shipped: dict) -> str:
    probe = GpuSpec.model_construct(
        name=target.name,
        bf16_tflops=target.peak_flops / 1e12,
        hbm_bandwidth_GBps=target.bandwidth_Bps / 1e9,
    )
    return nearest_fitted_gpu(probe, shipped["gpus"])


def _summary(errors: np.ndarray) -> dict[str, float | None]:
    e = np.abs(errors)
    if not len(e):
        return {"median_abs": None, "p90_abs": None, "n": 0}
    return {
        "median_abs": round(float(np.median(e)), 4),
        "p90_abs": round(float(np.quantile(e, 0.9)), 4),
        "n": len(e),
    }


def decode_bandwidth_fraction(profile: StepTimeProfile, bandwidth_Bps: float) -> dict[str, float]:
    """The decode kernel's achieved fraction of `bandwidth_Bps`: ideal bytes / median time.

    Ideal bytes are K and V read once plus the query and output (the profile's `bytes`).
    """
    fracs = [p.bytes / p.median_s / bandwidth_Bps for p in profile.decode_attention.points]
    return {"median": round(float(np.median(fracs)), 4), "max": round(float(max(fracs)), 4)}


def coefficients_doc(
    profile: StepTimeProfile, profile_path: str | Path, shipped: dict | None = None
) -> dict[str, Any]:
    """The coefficients JSON (shipped layout) refined by `profile`'s measurements."""
    shipped = shipped or shipped_coefficients()
    target = target_of(profile)
    source = _nearest_shipped(target, shipped)
    src = shipped["gpus"][source]
    tables = to_tables(samples_from_profile(profile), target.name)
    fitted = fit_terms(tables, target)
    interconnect = target.interconnect_GBps or src["datasheet"]["interconnect_GBps"]
    scale = interconnect / src["datasheet"]["interconnect_GBps"]
    allreduce = {
        tp: {**c, "algbw_GBps": round(c["algbw_GBps"] * scale, 2)}
        for tp, c in src["allreduce"].items()
    }
    entry = {
        **fitted,
        "elementwise": copy.deepcopy(src["elementwise"]),
        "allreduce": allreduce,
        "datasheet": {
            "bf16_tflops": round(target.peak_flops / 1e12, 6),
            "hbm_bandwidth_GBps": round(target.bandwidth_Bps / 1e9, 6),
            "interconnect_GBps": interconnect,
        },
    }
    on_cpu = profile.metadata.device == "cpu"
    meta = profile.metadata
    carried = f"shipped fit of {source} (sim/data/steptime_coefficients.json)"
    provenance = {
        "source": f"kvsim calibrate on {meta.device_name} ({meta.device})",
        "profile": Path(profile_path).name,
        "device_name": meta.device_name,
        "torch": meta.torch,
        "cuda": meta.cuda,
        "driver": meta.driver,
        "measured_on": meta.date,
        "fitted": meta.date[:10],  # the measurement's day: the same profile, the same file
        "model": profile.model.name,
        "tp": profile.tp,
        "dtype": profile.dtype,
        "decode_kernel": profile.decode_attention.kernel,
        "ceilings": _ceilings_text(target, profile.model.dtype),
        "measured": {
            "gemm": f"{len(tables.gemm)} cases ({', '.join(profile.gemms)} by tokens)",
            "decode_attention": f"{len(tables.decode)} cases (batch x context)",
            "prefill_attention": f"{len(tables.prefill)} cases (chunk x prior)",
        },
        "carried_over": {
            "elementwise": f"{carried}: calibrate does not time norms, RoPE, activation, adds",
            "allreduce": f"{carried}, algbw x {scale:.4g} (interconnect ratio): not measured",
            "engine": "shipped engine overhead (v0 / V1): calibrate times kernels, not an engine",
            "band": f"{carried}: not re-validated on this device (no held-out split)",
            "other_gpus": "every other GPU's entry is the shipped one, unchanged",
        },
        "shipped_provenance": shipped["provenance"],
        "plumbing_only": on_cpu,
    }
    if on_cpu:
        provenance["warning"] = PLUMBING_NOTE
    errors = in_sample_errors(tables, fitted, target)
    validation = copy.deepcopy(shipped.get("validation", {}))
    validation.pop(target.name, None)  # scored the shipped entry this file replaces
    band = dict(shipped.get("band", {}))
    band[target.name] = dict(band.get(source, band.get("extrapolated", {})))
    return {
        "schema": shipped.get("schema", 1),
        "provenance": provenance,
        "gpus": {**copy.deepcopy(shipped["gpus"]), target.name: entry},
        "engine": copy.deepcopy(shipped["engine"]),
        "band": band,
        "validation": {
            **validation,
            f"{target.name} (calibrate, in-sample)": {k: _summary(e) for k, e in errors.items()},
        },
        "calibration": {
            "gpu": target.name,
            "carried_from": source,
            "decode_bandwidth_fraction": decode_bandwidth_fraction(profile, target.bandwidth_Bps),
        },
    }


def _ceilings_text(target: Target, model_dtype: str) -> str:
    if not target.catalog_gpu:
        return "probed on the device (copy bandwidth, matmul rate): no catalog GPU"
    text = f"datasheet of {target.name} (catalog), peak for {model_dtype}"
    if target.probed is not None:
        text += "; fitted against the probed ceilings, then rescaled to the datasheet"
    return text


def coefficients_path(profile_path: str | Path) -> Path:
    """Where the coefficients go, next to the profile: `h200.json` -> `h200.coefficients.json`."""
    path = Path(profile_path)
    return path.with_name(f"{path.stem}.coefficients.json")


def write_coefficients(profile: StepTimeProfile, profile_path: str | Path) -> Path:
    """Fit and write the coefficients next to `profile_path`; returns the file written."""
    out = coefficients_path(profile_path)
    doc = coefficients_doc(profile, profile_path)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def usage_lines(coefficients_file: str | Path) -> list[str]:
    """What `kvsim calibrate` prints about the coefficients it wrote."""
    doc = json.loads(Path(coefficients_file).read_text())
    cal, prov = doc["calibration"], doc["provenance"]
    gpu = cal["gpu"]
    dec = doc["gpus"][gpu]["decode_attention"]
    frac = cal["decode_bandwidth_fraction"]
    of = f"{gpu} datasheet HBM bandwidth" if "datasheet" in prov["ceilings"] else (
        "the probed copy bandwidth")  # fmt: skip
    lines = [
        f"measured-model coefficients for {gpu} written to {coefficients_file}",
        f"  use them with: step_time: {{measured: {{coefficients: {coefficients_file}}}}}",
        f"  decode kernel {prov['decode_kernel']}: {100 * frac['median']:.1f}% median, "
        f"{100 * frac['max']:.1f}% max of {of} (fitted bandwidth efficiency "
        f"{dec['bandwidth_efficiency']:.3g})",
        f"  carried over from the shipped {cal['carried_from']} fit: "
        f"{', '.join(CARRIED_TERMS)}, engine overhead, band",
    ]
    if prov["plumbing_only"]:
        lines.append(f"  note: {PLUMBING_NOTE}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calibrate.to_measured", description=__doc__.splitlines()[0]
    )
    parser.add_argument("profile", type=Path, help="a profile JSON written by kvsim calibrate")
    args = parser.parse_args(argv)
    out = write_coefficients(load_profile(args.profile), args.profile)
    print("\n".join(usage_lines(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
