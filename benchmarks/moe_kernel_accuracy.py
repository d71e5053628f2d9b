"""The measured step-time model's MoE layer against public timings of vLLM's fused-MoE kernel.

    python benchmarks/moe_kernel_accuracy.py          # measured beside the two charges
    python benchmarks/moe_kernel_accuracy.py --fit    # refit the kernel's two terms

For each run of `sim/data/fused_moe_kernel_times.yaml` (vLLM `benchmark_moe.py` kernel times,
each with its source) and each batch size, prints the measured time beside two predictions on
the run's GPU datasheet with the shipped coefficients of its nearest fitted GPU, bf16:

- `grouped`: `sim.latency.moe.FusedMoe.fused_experts_s`, what the model charges now (two grouped
  GEMMs a layer over the touched experts, routing and activation kernels);
- `per-expert`: what it charged before (each touched expert its own pair of GEMMs on
  T x k / touched tokens, each with a launch floor; the activation as k calls).

Last, the median |error| of the held-out rows: the first run's odd-indexed batch sizes and every
other run (A100 SXM, H100, H200; up to 4,096 tokens). `--fit` refits `sim.latency.moe.FIXED_S`
and `MEMORY_EFFICIENCY_RATIO` on the first run's even-indexed batch sizes (least squares of the
relative error over a grid) and prints the held-out odd ones' errors. No GPU needed; the table and the fit each in about a second.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import sys
from importlib import resources
from typing import Any

import yaml

from sim.catalog import get_gpu
from sim.latency import measured_terms as terms
from sim.latency.measured import nearest_fitted_gpu, shipped_coefficients
from sim.latency.moe import FusedMoe, experts_touched

DATA_FILE = "fused_moe_kernel_times.yaml"


def load_runs() -> list[dict[str, Any]]:
    text = resources.files("sim.data").joinpath(DATA_FILE).read_text()
    runs: list[dict[str, Any]] = yaml.safe_load(text)["runs"]
    return runs


def fused_moe_for(run: dict[str, Any]) -> FusedMoe:
    """The model's MoE layer for a run: its geometry per rank, bf16, its GPU's coefficients."""
    gpu = get_gpu(run["gpu"])
    co = shipped_coefficients()
    c = co["gpus"][nearest_fitted_gpu(gpu, co["gpus"])]
    m = run["model"]
    return FusedMoe(
        num_experts=m["num_experts"],
        top_k=m["num_experts_per_tok"],
        hidden=m["hidden_size"],
        inter=m["moe_intermediate_size"] // run["tp"],
        weight_bytes=float(terms.BF16_BYTES),
        peak_flops=gpu.peak_flops("bfloat16"),
        bandwidth_Bps=gpu.bandwidth_Bps,
        gemm=c["gemm"],
        elementwise=c["elementwise"],
    )


def per_expert_s(moe: FusedMoe, tokens: float) -> float:
    """The charge this replaced: every touched expert a separate (gate+up, down) GEMM pair."""
    touched = experts_touched(tokens, moe.num_experts, moe.top_k)
    per_expert = tokens * moe.top_k / touched
    h, i = moe.hidden, moe.inter
    gemms = sum(
        terms.gemm_time_s(
            *terms.gemm_flops_bytes(per_expert, k, n), moe.peak_flops, moe.bandwidth_Bps, moe.gemm
        )
        for k, n in ((h, 2 * i), (i, h))
    )
    act = moe.elementwise["activation"]
    one_act = terms.BF16_BYTES * 3 * i * tokens
    activation = moe.top_k * terms.elementwise_time_s(one_act, moe.bandwidth_Bps, act)
    return touched * gemms + activation


def rows(run: dict[str, Any]) -> list[tuple[int, float, float, float]]:
    """(batch, measured us, grouped us, per-expert us) for each timed batch size."""
    moe = fused_moe_for(run)
    return [
        (int(b), float(us), 1e6 * moe.fused_experts_s(b), 1e6 * per_expert_s(moe, b))
        for b, us in sorted(run["kernel_time_us"].items())
    ]


def held_out_rows(runs: list[dict[str, Any]]) -> list[tuple[int, float, float, float]]:
    """The rows no fit saw: the first run's odd-indexed batch sizes and every other run's."""
    return rows(runs[0])[1::2] + [row for run in runs[1:] for row in rows(run)]


def held_out_summary(runs: list[dict[str, Any]]) -> dict[str, tuple[int, float, float]]:
    """(n, grouped, per-expert median |error|) of the held-out rows: all, and prefill-sized
    batches (256 tokens and more)."""
    out = {}
    for name, keep in (("all", 1), ("batch >= 256", 256)):
        chosen = [r for r in held_out_rows(runs) if r[0] >= keep]
        grouped = statistics.median(abs(g / us - 1.0) for _, us, g, _ in chosen)
        old = statistics.median(abs(o / us - 1.0) for _, us, _, o in chosen)
        out[name] = (len(chosen), grouped, old)
    return out


def fit(run: dict[str, Any]) -> tuple[float, float]:
    """(fixed_s, memory-efficiency ratio) minimising the squared relative error on the
    even-indexed batch sizes; prints every batch size's error with its split."""
    base = fused_moe_for(run)
    points = sorted((int(b), float(us)) for b, us in run["kernel_time_us"].items())
    fitted = points[0::2]

    def error(moe: FusedMoe, b: int, us: float) -> float:
        return 1e6 * moe.fused_experts_s(b) / us - 1.0

    best = (math.inf, 0.0, 1.0)
    for fixed_us in range(0, 81):
        for step in range(0, 61):
            moe = dataclasses.replace(
                base, fixed_s=fixed_us * 1e-6, memory_efficiency_ratio=0.9 + 0.005 * step
            )
            score = sum(error(moe, b, us) ** 2 for b, us in fitted)
            if score < best[0]:
                best = (score, moe.fixed_s, moe.memory_efficiency_ratio)
    moe = dataclasses.replace(base, fixed_s=best[1], memory_efficiency_ratio=best[2])
    for b, us in points:
        split = "fit" if (b, us) in fitted else "held_out"
        print(f"batch {b}: {split} {100 * error(moe, b, us):+.1f}%")
    print(f"best: fixed_s {1e6 * best[1]:.0f} us, memory_efficiency_ratio {best[2]:.3f}")
    return best[1], best[2]


def main() -> int:
    if "--fit" in sys.argv[1:]:
        fit(load_runs()[0])
        return 0
    for run in load_runs():
        print(f"{run['id']} ({run['device']}, {run['source']})")
        print("| batch | measured us | grouped us | error | per-expert us | error |")
        print("|---|---|---|---|---|---|")
        errs: dict[str, list[float]] = {"grouped": [], "per-expert": []}
        for b, us, grouped, old in rows(run):
            e_new, e_old = grouped / us - 1.0, old / us - 1.0
            errs["grouped"].append(abs(e_new))
            errs["per-expert"].append(abs(e_old))
            print(f"| {b} | {us:.1f} | {grouped:.1f} | {100 * e_new:+.1f}% | {old:.1f} | "
                  f"{100 * e_old:+.1f}% |")  # fmt: skip
        print(
            "median |error|: "
            + ", ".join(f"{k} {100 * statistics.median(v):.1f}%" for k, v in errs.items())
        )
    print("\nheld out (no fit saw them): median |error| grouped / per-expert")
    for name, (n, grouped, old) in held_out_summary(load_runs()).items():
        print(f"{name} (n={n}): {100 * grouped:.1f}% / {100 * old:.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
