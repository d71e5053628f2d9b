"""Step-time accuracy against public GPU measurements, held out of the fit, before and after.

Usage: python benchmarks/steptime_accuracy.py VIDUR_DIR
(VIDUR_DIR as for scripts/fit_steptime.py; `--export-from-git` there fills it.)

For each split of `sim.latency.measured_check` (rows held out; fit on A100 -> test on H100;
fit on Llama-2 -> test on Llama-3) it refits the measured model on the fit part and prints the
median and p90 |relative error| per category on the validation part, next to kvsim's roofline
(default efficiencies) on the same rows. Categories with no validation rows in a split print
"n/a" (Vidur has no public H100 attention profile in the stored copy).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from sim.catalog import get_gpu
from sim.latency import measured_check as mc
from sim.latency import measured_fit as mf
from sim.latency import measured_terms as terms
from sim.latency.roofline import Efficiencies

EFF = Efficiencies()
CATEGORIES = (
    "GEMM",
    "non-GEMM",
    "layer (GEMM + non-GEMM)",
    "decode attention",
    "prefill attention",
    "all-reduce",
    "engine overhead (v0)",
    "whole step",
)


def roofline_errors(val: mf.Tables, gpu_name: str) -> dict[str, np.ndarray]:
    """kvsim's roofline (default efficiencies) on the same rows, category by category."""
    gpu = get_gpu(gpu_name)
    peak, bw = gpu.bf16_tflops * 1e12, gpu.bandwidth_Bps
    out: dict[str, np.ndarray] = {}
    g = val.gemm[val.gemm.gpu == gpu_name]
    if len(g):
        pred = np.maximum(g.flops / (EFF.compute * peak), g.bytes / (EFF.memory * bw))
        out["GEMM"] = mc._rel(pred, g.time_s)
        e = val.elementwise[val.elementwise.gpu == gpu_name]
        out["non-GEMM"] = mc._rel(np.zeros(len(e)), e.time_s)  # not modelled by the roofline
        key = ["model", "tp", "tokens"]
        sums = g.groupby(key)[["flops", "bytes"]].sum()
        pred = np.maximum(sums.flops / (EFF.compute * peak), sums.bytes / (EFF.memory * bw))
        layer_ops = e[e.op.isin(mc._LAYER_CALLS)]
        meas = (
            g.groupby(key).time_s.sum()
            + (layer_ops.time_s * layer_ops.op.map(mc._LAYER_CALLS))
            .groupby([layer_ops[k] for k in key])
            .sum()
        )
        out["layer (GEMM + non-GEMM)"] = mc._rel(pred, meas.loc[sums.index])
    d = val.decode[val.decode.gpu == gpu_name]
    if len(d):
        # 70B geometry at TP 2 (the only attention profile): 32 q heads, 4 kv heads, d 128.
        kv_tok = d.kv_bytes / (d.batch * d.context)
        flops = 4.0 * 32 * 128 * d.batch * (d.context + 1)
        nbytes = d.kv_bytes + kv_tok * d.batch
        pred = np.maximum(flops / (EFF.attention_compute * peak), nbytes / (EFF.memory * bw))
        out["decode attention"] = mc._rel(pred, d.time_s)
    p = val.prefill[val.prefill.gpu == gpu_name]
    if len(p):
        flops = 4.0 * 32 * 128 * p.chunk * (p.prior + (p.chunk + 1) / 2)
        nbytes = (p.prior + p.chunk) * 2 * 4 * 128 * 2
        pred = np.maximum(flops / (EFF.attention_compute * peak), nbytes / (EFF.memory * bw))
        out["prefill attention"] = mc._rel(pred, p.time_s)
    a = val.allreduce[val.allreduce.gpu == gpu_name]
    if len(a):
        per_direction = EFF.network * gpu.interconnect_GBps * 1e9 / 2
        pred = EFF.allreduce_latency_s + 2 * (a.tp - 1) / a.tp * a.bytes / per_direction
        out["all-reduce"] = mc._rel(pred, a.time_s)
    return out


def evaluate(tables: mf.Tables, root: Path, split: str) -> dict[str, tuple]:
    """{category: (measured-model errors, roofline errors)} on the validation part of `split`."""
    fit, val = mc.split(tables, split)
    co = mc.fit_coefficients(fit, root, mc.overhead_keep(split, validation=False))
    ours: dict[str, list] = {c: [] for c in CATEGORIES}
    roof: dict[str, list] = {c: [] for c in CATEGORIES}
    for gpu in sorted(val.gemm.gpu.unique()):
        for cat, e in mc.category_errors(val, co, gpu).items():
            ours[cat].append(e)
        for cat, e in roofline_errors(val, gpu).items():
            roof[cat].append(e)
    over = mc.overhead_errors(root, co, mc.overhead_keep(split, validation=True))
    ours["engine overhead (v0)"].append(over)
    roof["engine overhead (v0)"].append(_roofline_overhead(root, split))
    if (val.decode.gpu == "a100-80gb-sxm").any():
        models = (
            ("Meta-Llama-3-70B",) if split == "model" else ("Llama-2-70b-hf", "Meta-Llama-3-70B")
        )
        for model in models:
            e_ours, e_roof = mc.whole_step_errors(val, tables, root, co, model, "a100-80gb-sxm", 2)
            ours["whole step"].append(e_ours)
            roof["whole step"].append(e_roof)
    return {
        c: (
            np.concatenate(ours[c]) if ours[c] else None,
            np.concatenate(roof[c]) if roof[c] else None,
        )
        for c in CATEGORIES
    }


def _roofline_overhead(root: Path, split: str) -> np.ndarray:
    co = {"engine": {"v0": {"fixed_s": EFF.overhead_s, "per_seq_s": 0.0}}}
    return mc.overhead_errors(root, co, mc.overhead_keep(split, validation=True))


#: Decode-kernel HBM utilisation read off the FlashInfer blog's figures (2024-02, nvbench, fp16,
#: +-3 points; summarised in /work/shared/design/calibration.md): (gpu, q heads, kv heads,
#: batch, context, kernel, utilisation). A cross-check on GPUs/geometries the fit never saw.
FLASHINFER_DECODE = (
    ("h100-sxm", 32, 32, 64, 1024, "FlashInfer", 0.88),
    ("h100-sxm", 32, 32, 64, 1024, "vLLM PagedAttention v2", 0.85),
    ("h100-sxm", 32, 4, 64, 2048, "FlashInfer GQA", 0.73),
    ("h100-sxm", 32, 4, 64, 4096, "FlashInfer GQA", 0.82),
    ("h100-sxm", 32, 4, 64, 8192, "FlashInfer GQA", 0.88),
    ("a100-80gb-pcie", 32, 32, 64, 1024, "FlashInfer", 0.87),
    ("a100-80gb-pcie", 32, 32, 64, 1024, "vLLM PagedAttention v2", 0.81),
    ("a100-80gb-pcie", 32, 4, 64, 2048, "FlashInfer GQA", 0.71),
    ("a100-80gb-pcie", 32, 4, 64, 4096, "FlashInfer GQA", 0.77),
    ("a100-80gb-pcie", 32, 4, 64, 8192, "FlashInfer GQA", 0.79),
)


def flashinfer_crosscheck(co: dict) -> None:
    """Predicted decode-attention HBM utilisation of one layer vs the published kernels."""
    from sim.latency.measured import nearest_fitted_gpu

    print("\n== decode attention vs FlashInfer blog figures (2024-02; kernels kvsim never fitted)")
    print(f"{'gpu':15} {'q/kv':>6} {'batch x ctx':>12} {'kernel':24} {'pub':>5} {'kvsim':>6}")
    for gpu_name, hq, hkv, batch, ctx, kernel, published in FLASHINFER_DECODE:
        gpu = get_gpu(gpu_name)
        c = co["gpus"][nearest_fitted_gpu(gpu, co["gpus"])]["decode_attention"]
        kv_bytes = batch * ctx * 2 * hkv * 128 * 2
        t = terms.decode_attention_time_s(batch, kv_bytes, gpu.bandwidth_Bps, c)
        util = kv_bytes / t / gpu.bandwidth_Bps
        print(
            f"{gpu_name:15} {hq:>3}/{hkv:<2} {batch:>5} x {ctx:<5} {kernel:24} "
            f"{published:5.2f} {util:6.2f}"
        )


def _cell(errors) -> str:
    if errors is None or not len(errors):
        return f"{'n/a':>16}"
    e = np.abs(errors)
    return f"{np.median(e) * 100:7.1f}%{np.quantile(e, 0.9) * 100:7.1f}%"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    root = Path(argv[0])
    tables = mf.load_tables(root)
    for split in ("rows", "gpu", "model"):
        print(f"\n== split {split!r}: {mc.SPLIT_TEXT[split]}")
        print(
            f"{'category':26} {'measured: median    p90':>24} {'roofline: median    p90':>24} {'n':>6}"
        )
        for cat, (ours, roof) in evaluate(tables, root, split).items():
            n = 0 if ours is None else len(ours)
            print(f"{cat:26} {_cell(ours):>24} {_cell(roof):>24} {n:>6}")
    flashinfer_crosscheck(mc.fit_coefficients(mc.split(tables, "rows")[0], root))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
