"""Fit/validation splits and errors of the measured step-time model (fit script + benchmark).

Three splits, each fitting on one part of Vidur's measurements and scoring the rest:

- `rows`: every 5th measured point held out (token counts, batch sizes, chunk sizes, message
  sizes), on every GPU and model: the band shipped with the coefficients.
- `gpu`: fit on the A100 only, score the H100 (the H100 is then extrapolated by datasheet).
- `model`: fit on Llama-2 only (and attention on contexts <= 2048), score Llama-3 (and longer
  contexts).

A *whole step* is scored against a step assembled from measured operators: per layer the
measured GEMMs, norms, RoPE, activation and two residual adds at the step's token count plus
the measured attention call, times the layers, plus the measured embedding, final norm,
all-reduces (interpolated by size), CPU overhead (by batch size) and graph launch. The logits
GEMM was not measured, so both sides leave it out (vocab_size = 1). Attention was measured
only on an A100 with 70B geometry at TP 2, so whole steps exist only for Llama-2/3-70B there.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sim.catalog import GpuSpec, ModelSpec, get_gpu
from sim.latency import measured_fit as mf
from sim.latency import measured_terms as terms
from sim.latency.batch import BatchShape
from sim.latency.measured import MeasuredStepTime
from sim.latency.roofline import RooflineStepTime

#: Layers and context of the Vidur models (the CSVs carry the rest of the geometry).
NUM_LAYERS = {
    "Llama-2-7b-hf": 32,
    "Llama-2-70b-hf": 80,
    "Meta-Llama-3-8B": 32,
    "Meta-Llama-3-70B": 80,
}
HOLDOUT_EVERY = 5

#: A row selector of every measurement table: (table name, frame) -> boolean mask.
TableFilter = Callable[[str, pd.DataFrame], np.ndarray]


def held_out(values: pd.Series) -> np.ndarray:
    """True for every 5th distinct value (by rank): the validation rows of the `rows` split.

    Example: token counts 1, 2, 4, 8, 16, 24 -> ranks 0..5 -> only 4 (rank 2) is held out.
    """
    distinct = np.sort(values.unique())
    rank = {v: i for i, v in enumerate(distinct)}
    mask: np.ndarray = values.map(rank).to_numpy() % HOLDOUT_EVERY == 2
    return mask


def _datasheet(name: str) -> dict[str, float]:
    g = get_gpu(name)
    return {
        "bf16_tflops": g.bf16_tflops,
        "hbm_bandwidth_GBps": g.hbm_bandwidth_GBps,
        "interconnect_GBps": g.interconnect_GBps,
    }


def subset(t: mf.Tables, keep: TableFilter) -> mf.Tables:
    """Apply `keep(name, frame) -> bool mask` to every table."""
    frames = {n: f[keep(n, f)] for n, f in vars(t).items() if isinstance(f, pd.DataFrame)}
    return mf.Tables(**frames, raw_geometry=t.raw_geometry)


def _rows_val(name: str, f: pd.DataFrame) -> np.ndarray:
    column = {"decode": "batch", "prefill": "chunk", "allreduce": "bytes", "overhead": "batch"}
    return held_out(f[column.get(name, "tokens")])


def _model_val(name: str, f: pd.DataFrame) -> np.ndarray:
    mask: np.ndarray
    if name in ("gemm", "elementwise"):
        mask = ~f.model.str.startswith("Llama-2").to_numpy()
    elif name == "decode":
        mask = (f.context > 2048).to_numpy()
    elif name == "prefill":
        mask = (f.prior + f.chunk > 2048).to_numpy()
    else:
        mask = _rows_val(name, f)
    return mask


SPLITS = {
    "rows": _rows_val,
    "gpu": lambda name, f: (f.gpu == "h100-sxm").to_numpy() if "gpu" in f else _rows_val(name, f),
    "model": _model_val,
}
SPLIT_TEXT = {
    "rows": "every 5th token count / batch / chunk / message size held out, all GPUs and models",
    "gpu": "fit on A100 80GB SXM, validated on H100 SXM (extrapolated by datasheet)",
    "model": "fit on Llama-2-7B/70B (attention on contexts <= 2048), validated on Llama-3-8B/70B"
    " (attention on longer contexts)",
}


def split(tables: mf.Tables, name: str) -> tuple[mf.Tables, mf.Tables]:
    """(fit, validation) tables of split `name` (see the module docstring)."""
    val = SPLITS[name]
    return subset(tables, lambda n, f: ~val(n, f)), subset(tables, val)


def overhead_keep(name: str, validation: bool) -> mf.RowFilter:
    """Row selector of cpu_overheads.csv for split `name`: every 5th batch size held out, or
    (split `model`) the Llama-2 rows fitted and the other models validated."""

    def keep(raw: pd.DataFrame) -> np.ndarray:
        mask: np.ndarray
        if name == "model":
            mask = ~raw.model_name.str.contains("Llama-2").to_numpy()
        else:
            mask = held_out(raw.batch_size)
        chosen: np.ndarray = mask if validation else ~mask
        return chosen

    return keep


def fit_coefficients(
    tables: mf.Tables, root: str | Path, keep: mf.RowFilter | None = None
) -> dict[str, Any]:
    """The coefficient document (without band/validation) from `tables`."""
    gpus = sorted(tables.gemm.gpu.unique())
    attention_gpu = sorted(tables.decode.gpu.unique())[0]
    out: dict[str, dict[str, Any]] = {}
    for gpu in gpus:
        out[gpu] = mf.fit_gpu(tables, gpu, attention_gpu)
        out[gpu]["datasheet"] = _datasheet(gpu)
    return {"gpus": out, "engine": mf.fit_engine(root, keep)}


# -- per-category errors -----------------------------------------------------------------------
def _rel(pred: Any, meas: Any) -> np.ndarray:
    """pred / meas - 1, element by element (lists, Series or arrays)."""
    errors: np.ndarray = np.asarray(pred, dtype=float) / np.asarray(meas, dtype=float) - 1.0
    return errors


def category_errors(tables: mf.Tables, co: dict[str, Any], gpu_name: str) -> dict[str, np.ndarray]:
    """Signed relative errors (pred/measured - 1) per category on `gpu_name`'s rows of `tables`.

    Coefficients come from the nearest fitted GPU of `co`, applied to `gpu_name`'s datasheet
    (exactly what `MeasuredStepTime` does), so a GPU missing from `co` is scored extrapolated.
    """
    from sim.latency.measured import nearest_fitted_gpu

    gpu = get_gpu(gpu_name)
    c = co["gpus"][nearest_fitted_gpu(gpu, co["gpus"])]
    peak, bw = gpu.bf16_tflops * 1e12, gpu.bandwidth_Bps
    out: dict[str, np.ndarray] = {}
    g = tables.gemm[tables.gemm.gpu == gpu_name]
    if len(g):
        out["GEMM"] = _rel(terms.gemm_time_s(g.flops, g.bytes, peak, bw, c["gemm"]), g.time_s)
        e = tables.elementwise[tables.elementwise.gpu == gpu_name]
        pred = np.concatenate(
            [
                terms.elementwise_time_s(p.bytes, bw, c["elementwise"][k])
                for k, p in e.groupby("kind")
            ]
        )
        meas = np.concatenate([p.time_s for _, p in e.groupby("kind")])
        out["non-GEMM"] = _rel(pred, meas)
        out["layer (GEMM + non-GEMM)"] = _layer_errors(g, e, c, peak, bw)
    d = tables.decode[tables.decode.gpu == gpu_name]
    if len(d):
        pred = terms.decode_attention_time_s(d.batch, d.kv_bytes, bw, c["decode_attention"])
        out["decode attention"] = _rel(pred, d.time_s)
    p = tables.prefill[tables.prefill.gpu == gpu_name]
    if len(p):
        pred = terms.prefill_attention_time_s(p.flops, p.q_bytes, peak, bw, c["prefill_attention"])
        out["prefill attention"] = _rel(pred, p.time_s)
    a = tables.allreduce[tables.allreduce.gpu == gpu_name]
    if len(a):
        scale = gpu.interconnect_GBps / c["datasheet"]["interconnect_GBps"]
        preds = []
        for tp, part in a.groupby("tp"):
            ac = dict(c["allreduce"][str(int(tp))])
            ac["algbw_GBps"] *= scale
            preds.append(_rel(terms.allreduce_time_s(part.bytes, ac), part.time_s))
        out["all-reduce"] = np.concatenate(preds)
    return out


#: How many calls of each elementwise op a layer makes (two residual adds).
_LAYER_CALLS = {"input_layernorm": 1, "post_attention_layernorm": 1, "attn_rope": 1}
_LAYER_CALLS |= {"mlp_act": 1, "add": 2}


def _layer_errors(
    g: pd.DataFrame, e: pd.DataFrame, c: dict[str, Any], peak: float, bw: float
) -> np.ndarray:
    key = ["model", "tp", "tokens"]
    g = g.assign(pred=terms.gemm_time_s(g.flops, g.bytes, peak, bw, c["gemm"]))
    e = e[e.op.isin(_LAYER_CALLS)]
    calls = e.op.map(_LAYER_CALLS)
    e = e.assign(
        time_s=e.time_s * calls,
        pred=[
            n * terms.elementwise_time_s(b, bw, c["elementwise"][k])
            for n, b, k in zip(calls, e.bytes, e.kind, strict=True)
        ],
    )
    both = pd.concat([g[[*key, "time_s", "pred"]], e[[*key, "time_s", "pred"]]])
    sums = both.groupby(key)[["time_s", "pred"]].sum()
    return _rel(sums.pred, sums.time_s)


def overhead_errors(
    root: str | Path, co: dict[str, Any], keep: mf.RowFilter | None = None
) -> np.ndarray:
    """v0 engine overhead against the measured phases (rows selected by `keep`)."""
    raw = pd.read_csv(Path(root) / "data/profiling/a100/cpu_overheads.csv")
    if keep is not None:
        raw = raw[keep(raw)]
    meas = raw[list(mf.OVERHEAD_PHASES)].sum(axis=1) * 1e-3
    return _rel(terms.engine_overhead_s(raw.batch_size, co["engine"]["v0"]), meas)


# -- whole steps -----------------------------------------------------------------------------
def vidur_model(tables: mf.Tables, model: str, vocab_size: int = 1) -> ModelSpec:
    """A catalog-style geometry of a Vidur model (vocab 1: the logits GEMM left out)."""
    row = tables.raw_geometry[model]
    return ModelSpec(
        name=model,
        num_layers=NUM_LAYERS[model],
        hidden_size=row["n_embd"],
        num_attention_heads=row["n_head"],
        num_kv_heads=row["n_kv_head"],
        head_dim=row["n_embd"] // row["n_head"],
        intermediate_size=row["n_expanded_embd"],
        vocab_size=vocab_size,
        max_position_embeddings=4096,
    )


def measured_steps(
    tables: mf.Tables, full: mf.Tables, root: str | Path, model: str, gpu: str, tp: int
) -> tuple[ModelSpec, list[tuple[BatchShape, float]]]:
    """(BatchShape, measured seconds) for each attention row of `tables` a step can be built of.

    `full` supplies the operator rows (GEMM, elementwise, all-reduce) at the step's tokens.
    """
    spec = vidur_model(full, model)
    layer_ops = pd.concat(
        [
            full.gemm.assign(calls=1),
            full.elementwise[full.elementwise.op.isin(_LAYER_CALLS)].assign(
                calls=lambda f: f.op.map(_LAYER_CALLS)
            ),
        ]
    )
    layer_ops = layer_ops[
        (layer_ops.gpu == gpu) & (layer_ops.model == model) & (layer_ops.tp == tp)
    ]
    per_layer = (layer_ops.time_s * layer_ops.calls).groupby(layer_ops.tokens).sum()
    ew = full.elementwise
    ew = ew[(ew.gpu == gpu) & (ew.model == model) & (ew.tp == tp)]
    per_step = ew[ew.op.isin(("emb", "input_layernorm"))].groupby("tokens").time_s.sum()
    ar = full.allreduce[(full.allreduce.gpu == gpu) & (full.allreduce.tp == tp)].sort_values(
        "bytes"
    )
    raw = pd.read_csv(Path(root) / "data/profiling/a100/cpu_overheads.csv")
    over = (raw[list(mf.OVERHEAD_PHASES)].sum(axis=1) * 1e-3).groupby(raw.batch_size).mean()
    launch = float(raw.model_execution_launch_median.median()) * 1e-3
    L = spec.num_layers

    def step(tokens: int, attention_s: float, num_seqs: int) -> float:
        nbytes = tokens * spec.hidden_size * terms.BF16_BYTES
        allreduce = np.interp(nbytes, ar.bytes, ar.time_s) if tp > 1 else 0.0
        overhead = np.interp(num_seqs, over.index, over.to_numpy())
        step_s: float = (
            L * (per_layer[tokens] + attention_s + 2 * allreduce)
            + per_step[tokens]
            + (overhead + launch)
        )
        return step_s

    out: list[tuple[BatchShape, float]] = []
    for row in tables.decode[tables.decode.gpu == gpu].itertuples():
        if row.batch in per_layer.index:
            batch = BatchShape((int(row.context),) * int(row.batch), ())
            out.append((batch, step(int(row.batch), row.time_s, int(row.batch))))
    for row in tables.prefill[tables.prefill.gpu == gpu].itertuples():
        if row.chunk in per_layer.index:
            batch = BatchShape((), ((int(row.prior), int(row.chunk)),))
            out.append((batch, step(int(row.chunk), row.time_s, 1)))
    return spec, out


def whole_step_errors(
    tables: mf.Tables,
    full: mf.Tables,
    root: str | Path,
    co: dict[str, Any],
    model: str,
    gpu: str,
    tp: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(measured-model errors, roofline errors) of whole steps, v0 engine, no logits GEMM."""
    spec, steps = measured_steps(tables, full, root, model, gpu, tp)
    gspec: GpuSpec = get_gpu(gpu)
    ours = MeasuredStepTime(spec, gspec, tp=tp, engine="v0", coefficients=co)
    roof = RooflineStepTime(spec, gspec, tp=tp)
    meas = np.array([m for _, m in steps])
    pred = np.array([ours.predict_s(b) - ours.breakdown(b)["lm_head_s"] for b, _ in steps])
    return _rel(pred, meas), _rel([roof.predict_s(b) for b, _ in steps], meas)


def band_from(errors: np.ndarray) -> dict[str, float]:
    """Multiplicative band: the central 80% of measured / predicted (1 / (1 + error)).

    Example: errors -10% .. +5% (p10 -0.10, p90 +0.05) -> measured is 0.952x .. 1.111x the
    prediction: low_factor 0.952, high_factor 1.111.
    """
    ratio = 1.0 / (1.0 + np.asarray(errors))
    return {
        "low_factor": round(min(1.0, float(np.quantile(ratio, 0.1))), 4),
        "high_factor": round(max(1.0, float(np.quantile(ratio, 0.9))), 4),
    }


def provenance(root: str | Path, split: str) -> dict[str, Any]:
    return {
        "source": "github.com/microsoft/vidur (MIT licence, sim/data/licenses/vidur-MIT.txt)",
        "files": [{"path": p, "commit": c} for p, c in mf.SOURCES],
        "gpus": dict(mf.VIDUR_GPU),
        "fitted": _dt.date.today().isoformat(),
        "split": split,
        "refit": "python scripts/fit_steptime.py VIDUR_DIR (see its docstring)",
    }
