"""What `kvsim calibrate --from-bench` writes and prints from a fit (`sim.vllm_bench.calibrate`).

The output is a coefficients JSON in the layout of `sim/data/steptime_coefficients.json`
(`sim.vllm_bench.coefficient_scaling.scaled_coefficients`: every shipped GPU kept, the
scenario's GPU scaled by the fitted factors), used as `step_time: {measured: {coefficients:
FILE}}`, with the factors, files, split and errors in its `provenance` and `calibration`; the
report is one line of factors, then a table of every file's predicted and measured metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from sim.latency.measured import MeasuredStepTime
from sim.scenario.schema import Scenario
from sim.vllm_bench.bench import prepared
from sim.vllm_bench.bench_files import FIT_METRICS
from sim.vllm_bench.calibrate import BenchFit
from sim.vllm_bench.coefficient_scaling import base_coefficients, scaled_coefficients


def coefficients_document(
    fit: BenchFit,
    scenario: Scenario,
    base_dir: Path,
    scenario_path: Path,
    pool_from_log: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The coefficients JSON the fit writes: the scaled entry plus its provenance."""
    resolved_gpu = prepared(scenario, base_dir).step_time
    assert isinstance(resolved_gpu, MeasuredStepTime)
    base = base_coefficients(scenario, base_dir)
    doc = scaled_coefficients(base, resolved_gpu.gpu, fit.factors)
    band_key = resolved_gpu.with_coefficients(doc).band_key
    ratios = held_out_step_ratios(fit)
    doc.setdefault("band", {})[band_key] = band_containing(doc["band"].get(band_key), ratios)

    def summary(files: list[Path]) -> dict[str, Any]:
        errors = fit.errors(files)
        return {
            metric: {
                "median_abs": round(float(np.median(np.abs(values))), 4) if values else None,
                "n": len(values),
            }
            for metric, values in errors.items()
        }

    doc["provenance"] = {
        "source": "kvsim calibrate --from-bench (sim.vllm_bench.calibrate)",
        "scenario": str(scenario_path),
        "gpu": resolved_gpu.gpu.name,
        "scaled_from": base.get("provenance", {}).get("source", "shipped fit"),
        **fit.factors.as_dict(),
        "fit_files": [str(p) for p in fit.fit_files],
        "held_out_files": [str(p) for p in fit.held_out_files],
        "note": (
            "compute-bound GPU terms x compute_scale, the other GPU terms x memory_scale"
            if fit.factors.per_term
            else "every GPU term x gpu_scale"
        )
        + ", the engine overhead x overhead_scale; "
        + (
            f"the band ({band_key!r}) is the shipped op-level one widened to contain the "
            f"{len(ratios)} held-out TPOT/ITL ratios (measured / predicted)"
            if ratios
            else "the band is the shipped op-level one, not re-validated (nothing held out)"
        ),
        "pool_from_log": pool_from_log,
    }
    doc["calibration"] = {
        "fit": summary(fit.fit_files),
        "held_out": summary(fit.held_out_files),
        "loss": round(fit.loss, 6),
    }
    return doc


#: The metrics whose measured / predicted ratio is a step-time multiplier (as in the shipped
#: end-to-end band, `sim.latency.serving_band`).
STEP_METRICS = ("mean_tpot_ms", "mean_itl_ms")


def held_out_step_ratios(fit: BenchFit) -> list[float]:
    """measured / predicted TPOT and ITL of every held-out file, at the fitted factors."""
    return [
        measured / predicted
        for path in fit.held_out_files
        for metric, (predicted, measured) in fit.compared[path].items()
        if metric in STEP_METRICS
    ]


def band_containing(op_band: dict[str, float] | None, ratios: list[float]) -> dict[str, float]:
    """`op_band` widened to contain every ratio (and 1). The held-out files of one server are
    few (every other one of three or more), too few for quantiles such as the shipped
    end-to-end band's p10-p90, so the band takes their extremes.

    Example: op band x0.924-x1.0566 and held-out ratios 0.97, 1.12 give x0.924-x1.12."""
    low = op_band["low_factor"] if op_band else 1.0
    high = op_band["high_factor"] if op_band else 1.0
    return {"low_factor": min([low, *ratios]), "high_factor": max([high, *ratios])}


def report_lines(fit: BenchFit) -> list[str]:
    """What `kvsim calibrate --from-bench` prints: the factors, then per file and metric."""
    lines = [
        f"fitted on {len(fit.fit_files)} file(s): {fit.factors.described()} "
        f"(mean |ln ratio| {fit.loss:.4f})",
        "| file | split | " + " | ".join(FIT_METRICS) + " |",
        "|---|---|" + "---|" * len(FIT_METRICS),
    ]
    for path, rows in fit.compared.items():
        split = "held out" if path in fit.held_out_files else "fit"
        cells = [
            f"{rows[m][0]:.4g} vs {rows[m][1]:.4g} ({100 * (rows[m][0] / rows[m][1] - 1):+.1f}%)"
            if m in rows
            else "-"
            for m in FIT_METRICS
        ]
        lines.append(f"| {path.name} | {split} | " + " | ".join(cells) + " |")
    if not fit.held_out_files:
        lines.append("nothing held out (give 3 or more result files to hold every other one out)")
    return lines
