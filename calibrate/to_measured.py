"""A calibration's measurements -> coefficients of the measured step-time model (the default).

`kvsim calibrate` times one layer's GEMMs, decode attention (batch x context) and prefill
attention (chunk x prior) on its device. `calibrate.profile_tables` turns those samples into
the tables that `sim.latency.measured_fit` takes; this module fits the same terms with the same
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

The converter's names (`Samples`, `Target`, `to_tables`, `gemm_shapes`, ...) are re-exported
here, so `calibrate.to_measured.to_tables` keeps working.

Without a catalog GPU (a CPU run without `--gpu`) the ceilings are the probed copy bandwidth
and matmul rate and the entry is named after the device. A CPU run is plumbing: the file says
so (`provenance.plumbing_only`). No torch here: `python -m calibrate.to_measured PROFILE.json`
redoes the fit from a saved profile on any machine.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calibrate.profile_tables import GEMM_NAMES as GEMM_NAMES
from calibrate.profile_tables import Samples as Samples
from calibrate.profile_tables import Target as Target
from calibrate.profile_tables import gemm_shapes as gemm_shapes
from calibrate.profile_tables import samples_from_profile as samples_from_profile
from calibrate.profile_tables import target_of as target_of
from calibrate.profile_tables import to_tables as to_tables
from sim.catalog import GpuSpec
from sim.errors import InputError, one_line
from sim.files.outdir import write_text_atomic
from sim.latency import measured_fit as mf
from sim.latency import measured_terms as terms
from sim.latency.measured import nearest_fitted_gpu, shipped_coefficients
from sim.latency.profile import StepTimeProfile, load_profile

MEASURED_TERMS = ("gemm", "decode_attention", "prefill_attention")
CARRIED_TERMS = ("elementwise", "allreduce")
#: A term whose fit misses its own cases by more than this (median relative error) is flagged:
#: the shipped fits reach a few percent on public GPU data (`validation` in the shipped file).
POOR_FIT_MEDIAN_ABS = 0.25

PLUMBING_NOTE = (
    "CPU timings: this file exercises the calibrate -> measured-model path; it is not a GPU "
    "fit (run calibrate/gpu_run.sh on a GPU for coefficients to plan with)"
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
    write_text_atomic(out, json.dumps(doc, indent=1) + "\n")
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
    fit = doc["validation"].get(f"{gpu} (calibrate, in-sample)", {})
    scored = {term: e for term, e in fit.items() if e["n"]}
    if scored:
        lines.append(
            "  in-sample fit error, median / p90 of |predicted/measured - 1|: "
            + ", ".join(
                f"{term} {100 * e['median_abs']:.0f}% / {100 * e['p90_abs']:.0f}%"
                for term, e in scored.items()
            )
        )
    for term, e in scored.items():
        if e["median_abs"] > POOR_FIT_MEDIAN_ABS:
            lines.append(
                f"  warning: the {term} fit misses its own {e['n']} cases by a median "
                f"{100 * e['median_abs']:.0f}%: noisy timings (a busy device?) or a kernel the "
                "model's form does not describe; re-run on an idle device before planning with it"
            )
    if prov["plumbing_only"]:
        lines.append(f"  note: {PLUMBING_NOTE}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calibrate.to_measured", description=__doc__.splitlines()[0]
    )
    parser.add_argument("profile", type=Path, help="a profile JSON written by kvsim calibrate")
    args = parser.parse_args(argv)
    try:
        out = write_coefficients(load_profile(args.profile), args.profile)
    except InputError as error:  # a missing, non-regular or invalid profile: one line, as kvsim
        print(f"error: {one_line(str(error))}", file=sys.stderr)
        return 2
    print("\n".join(usage_lines(out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
