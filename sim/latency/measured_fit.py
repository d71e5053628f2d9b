"""Fit the measured-efficiency step-time model from Vidur's public GPU profiles.

Takes the tables `sim.latency.measured_tables` reads from Vidur's raw CSVs and fits each
term's coefficients by minimising the squared *relative* error (a 10 us op and a 10 ms op count
alike). Used by `scripts/fit_steptime.py` (writes `sim/data/steptime_coefficients.json`), by
`benchmarks/steptime_accuracy.py` (held-out splits) and by `calibrate.to_measured` (one
device's own measurements). Needs numpy and pandas, not scipy.

The loader's names (`Tables`, `load_tables`, `SOURCES`, `VIDUR_GPU`, `OVERHEAD_PHASES`) are
re-exported here, so `measured_fit.load_tables(root)` and `measured_fit.Tables` keep working.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.latency import measured_terms as terms
from sim.latency.measured_tables import OVERHEAD_PHASES as OVERHEAD_PHASES
from sim.latency.measured_tables import SOURCES as SOURCES
from sim.latency.measured_tables import VIDUR_GPU as VIDUR_GPU
from sim.latency.measured_tables import Tables as Tables
from sim.latency.measured_tables import load_tables as load_tables

#: A row selector of a measurement table: frame -> boolean mask (e.g. the validation split).
RowFilter = Callable[[pd.DataFrame], Any]

#: (peak FLOP/s, bandwidth B/s) a fit turns times into efficiencies against.
Ceiling = tuple[float, float]
#: Datasheet ceilings used to turn times into efficiencies (kvsim's gpus.yaml figures); the
#: `fit_*` functions take another GPU's as `datasheet` (calibrate/ fits its own device's).
DATASHEET: dict[str, Ceiling] = {"a100-80gb-sxm": (312e12, 2039e9), "h100-sxm": (989e12, 3350e9)}


def relative_lstsq(features: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative beta minimising sum(((X @ beta) / y - 1)^2): least squares on ratios.

    A negative coefficient (a cost cannot be negative) drops its column and refits.
    """
    cols = list(range(features.shape[1]))
    while True:
        a = features[:, cols] / y[:, None]
        beta_sub, *_ = np.linalg.lstsq(a, np.ones_like(y), rcond=None)
        if (beta_sub >= 0).all() or len(cols) == 1:
            beta = np.zeros(features.shape[1])
            beta[cols] = np.maximum(beta_sub, 0.0)
            return beta
        cols.pop(int(np.argmin(beta_sub)))


def nelder_mead(
    fun: Callable[[np.ndarray], float], x0: np.ndarray, iters: int = 600, step: float = 0.3
) -> np.ndarray:
    """Minimise `fun` from `x0` with the Nelder-Mead simplex (deterministic; no scipy)."""
    n = len(x0)
    simplex = [x0] + [x0 + step * np.eye(n)[i] for i in range(n)]
    values = [fun(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(values)
        simplex, values = [simplex[i] for i in order], [values[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        f_r = fun(reflected)
        if f_r < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            f_e = fun(expanded)
            simplex[-1], values[-1] = (expanded, f_e) if f_e < f_r else (reflected, f_r)
        elif f_r < values[-2]:
            simplex[-1], values[-1] = reflected, f_r
        else:
            contracted = centroid + 0.5 * (simplex[-1] - centroid)
            f_c = fun(contracted)
            if f_c < values[-1]:
                simplex[-1], values[-1] = contracted, f_c
            else:  # shrink towards the best point
                simplex = [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex]
                values = [fun(s) for s in simplex]
    best: np.ndarray = simplex[int(np.argmin(values))]
    return best


def _sigmoid(x: float) -> float:
    return float(1.0 / (1.0 + np.exp(-x)))


def _blend_params(x: np.ndarray) -> dict[str, float]:
    """Unconstrained vector -> efficiencies in (0, 1), exponent >= 1, floor >= 0."""
    return {
        "compute_efficiency": _sigmoid(x[0]),
        "memory_efficiency": _sigmoid(x[1]),
        "blend_exponent": 1.0 + float(np.exp(x[2])),
        "floor_s": float(np.exp(x[3])) * 1e-6,
    }


def _fit_blend(
    flops: np.ndarray,
    nbytes: np.ndarray,
    time_s: np.ndarray,
    peak: float,
    bw: float,
    x0: np.ndarray | None = None,
) -> dict[str, float]:
    """Fit floor + (t_c^p + t_m^p)^(1/p) by relative error (log-ratio, robust to outliers)."""

    def loss(x: np.ndarray) -> float:
        c = _blend_params(x)
        pred = c["floor_s"] + terms.blend_s(
            flops / (c["compute_efficiency"] * peak),
            nbytes / (c["memory_efficiency"] * bw),
            c["blend_exponent"],
        )
        return float(np.mean(np.log(pred / time_s) ** 2))

    x = nelder_mead(loss, np.array([1.0, 1.5, 0.7, 1.5]) if x0 is None else np.asarray(x0))
    x = nelder_mead(loss, x, step=0.1)
    return {k: round(v, 9) for k, v in _blend_params(x).items()}


def fit_gemm(
    rows: pd.DataFrame, gpu: str, datasheet: Ceiling | None = None, x0: np.ndarray | None = None
) -> dict[str, float]:
    """Fit the GEMM term; `x0` starts the search elsewhere than at GPU-like efficiencies
    (logit compute and memory efficiency, log(p - 1), log floor in us: `_blend_params`)."""
    peak, bw = datasheet or DATASHEET[gpu]
    c = _fit_blend(
        rows.flops.to_numpy(), rows.bytes.to_numpy(), rows.time_s.to_numpy(), peak, bw, x0
    )
    c["launch_floor_s"] = c.pop("floor_s")
    return c


def fit_elementwise(
    rows: pd.DataFrame, gpu: str, datasheet: Ceiling | None = None
) -> dict[str, dict[str, float]]:
    bw = (datasheet or DATASHEET[gpu])[1]
    out = {}
    for kind, part in rows.groupby("kind"):
        x = np.column_stack([np.ones(len(part)), part.bytes.to_numpy() / bw])
        floor, inv_eff = relative_lstsq(x, part.time_s.to_numpy())
        out[str(kind)] = {
            "launch_floor_s": round(float(floor), 9),
            "bandwidth_efficiency": round(1.0 / inv_eff, 4) if inv_eff > 0 else 1.0,
        }
    return out


def fit_decode(rows: pd.DataFrame, gpu: str, datasheet: Ceiling | None = None) -> dict[str, float]:
    bw = (datasheet or DATASHEET[gpu])[1]
    x = np.column_stack([np.ones(len(rows)), rows.batch.to_numpy(float), rows.kv_bytes / bw])
    floor, per_seq, inv_eff = relative_lstsq(x, rows.time_s.to_numpy())
    return {
        "call_floor_s": round(float(floor), 9),
        "per_seq_s": round(float(per_seq), 10),
        # No byte term left (noisy times that do not grow with the KV read): 1.0, as prefill does.
        "bandwidth_efficiency": round(1.0 / inv_eff, 4) if inv_eff > 0 else 1.0,
    }


def fit_prefill(rows: pd.DataFrame, gpu: str, datasheet: Ceiling | None = None) -> dict[str, float]:
    peak, bw = datasheet or DATASHEET[gpu]
    x = np.column_stack([np.ones(len(rows)), rows.q_bytes / bw, rows.flops / peak])
    floor, inv_q, inv_c = relative_lstsq(x, rows.time_s.to_numpy())
    return {
        "call_floor_s": round(float(floor), 9),
        "query_bandwidth_efficiency": round(1.0 / inv_q, 4) if inv_q > 0 else 1.0,
        "compute_efficiency": round(1.0 / inv_c, 4) if inv_c > 0 else 1.0,
    }


def fit_allreduce(rows: pd.DataFrame) -> dict[str, dict[str, float]]:
    out = {}
    for tp, part in rows.groupby("tp"):
        x = np.column_stack([np.ones(len(part)), part.bytes.to_numpy() / 1e9])
        latency, inv_bw = relative_lstsq(x, part.time_s.to_numpy())
        out[str(int(tp))] = {
            "latency_s": round(float(latency), 9),
            "algbw_GBps": round(1.0 / inv_bw, 2),
        }
    return out


def fit_overhead(rows: pd.DataFrame) -> dict[str, float]:
    x = np.column_stack([np.ones(len(rows)), rows.batch.to_numpy(float)])
    fixed, per_seq = relative_lstsq(x, rows.time_s.to_numpy())
    return {"fixed_s": round(float(fixed), 9), "per_seq_s": round(float(per_seq), 9)}


#: Phases V1 keeps on the step's critical path (assumption, see `fit_engine`).
V1_PHASES = ("schedule_median", "sampler_e2e_median")


def fit_engine(root: str | Path, keep: RowFilter | None = None) -> dict[str, dict[str, Any]]:
    """Per-step CPU overhead by engine generation, plus the launch of one CUDA graph.

    v0: all four CPU phases Vidur timed per step (schedule, sampler, prepare inputs, process
    outputs; an engine of the vLLM 0.2-0.4 era). V1 (ASSUMPTION, not measured here): only
    schedule + sampler stay on the critical path, because V1 keeps a persistent input batch and
    moves output processing into a separate process that overlaps the GPU (vLLM V1 alpha
    announcement, blog.vllm.ai 2025-01-27). `graph_launch_s` is the median CPU time Vidur
    measured to launch a whole forward pass (`model_execution_launch`), ~0.08 ms whatever the
    model size: one CUDA-graph launch.
    """
    raw = pd.read_csv(Path(root) / "data/profiling/a100/cpu_overheads.csv")
    if keep is not None:  # a row selector of cpu_overheads.csv: frame -> bool mask
        raw = raw[keep(raw)]
    out: dict[str, dict[str, Any]] = {}
    for gen, phases in (("v0", OVERHEAD_PHASES), ("v1", V1_PHASES)):
        rows = pd.DataFrame(dict(batch=raw.batch_size, time_s=raw[list(phases)].sum(axis=1) * 1e-3))
        out[gen] = fit_overhead(rows)
        out[gen]["graph_launch_s"] = round(
            float(raw.model_execution_launch_median.median()) * 1e-3, 9
        )
        out[gen]["phases"] = list(phases)
    out["v1"]["assumption"] = (
        "V1 overhead = v0's schedule + sampler phases only (persistent batch, output "
        "processing overlapped in a separate process: vLLM V1 alpha blog 2025-01-27); "
        "not measured on a V1 engine"
    )
    return out


def fit_gpu(tables: Tables, gpu: str, attention_gpu: str) -> dict[str, dict[str, Any]]:
    """Every GPU-side term for one GPU (attention from `attention_gpu` when `gpu` has none)."""
    has_attention = (tables.decode.gpu == gpu).any()
    att = gpu if has_attention else attention_gpu
    coeffs: dict[str, dict[str, Any]] = {
        "gemm": fit_gemm(tables.gemm[tables.gemm.gpu == gpu], gpu),
        "elementwise": fit_elementwise(tables.elementwise[tables.elementwise.gpu == gpu], gpu),
        "decode_attention": fit_decode(tables.decode[tables.decode.gpu == att], att),
        "prefill_attention": fit_prefill(tables.prefill[tables.prefill.gpu == att], att),
        "allreduce": fit_allreduce(tables.allreduce[tables.allreduce.gpu == gpu]),
    }
    if not has_attention:
        for term in ("decode_attention", "prefill_attention"):
            coeffs[term]["fitted_on"] = att  # efficiencies carried over; floors as measured
    return coeffs
