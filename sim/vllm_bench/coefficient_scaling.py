"""The factors a `--from-bench` calibration fits, and the coefficients they scale.

  gpu_scale        every GPU term of the measured model (GEMMs, attention, elementwise ops,
                   NCCL all-reduce, the CUDA-graph launch) x this factor: a slower or faster
                   card, kernel, driver or clock than the shipped fit saw
  overhead_scale   the engine's CPU work per step (`engine_overhead_s`, fixed + per sequence)
                   x this factor: a slower host, another release's scheduler

With `per_term` (`--per-term`) the GPU factor splits in two, so that a model whose prefill and
decode are off by different amounts (a MoE kernel, a quantized GEMM) can be fitted:

  compute_scale    the compute-bound terms: the GEMMs' and prefill attention's compute
                   efficiencies (what a long prefill chunk takes)
  memory_scale     everything else on the GPU: the GEMMs' weight reads, decode attention, the
                   elementwise ops, launch floors, the all-reduce and the CUDA-graph launch
                   (what a decode step takes)

`scaled_coefficients` applies them to a coefficients document in the layout of
`sim/data/steptime_coefficients.json` (every shipped GPU kept; the scenario's GPU gets the
nearest fitted entry with its terms scaled, so a GPU the shipped fit extrapolates to becomes a
fitted one).

Worked example: a GEMM at compute efficiency 0.77 and launch floor 5.4 us, scaled by
gpu_scale 1.25, becomes 0.77 / 1.25 = 0.616 and 6.75 us: every GEMM takes 1.25x as long (the
compute/memory blend is a p-norm, so scaling both times scales it). Per term, compute_scale
1.25 and memory_scale 1: compute efficiency 0.616, memory efficiency and floor as shipped, so a
4,096-token prefill GEMM (compute-bound) takes about 1.25x as long and a batch-8 decode GEMM
(its weight reads) about as long as before.

What it leaves out: a factor per kernel (GEMM apart from attention: the results of a serving
benchmark rarely separate them; only compute-bound from memory-bound, with `per_term`), the
fused-MoE layer's own fixed cost per layer (`sim.latency.moe.FIXED_S`, a constant; its GEMMs use
the scaled dense coefficients), and the all-reduce without peer access (`hardware.p2p: false`, a
constant of its own, not scaled).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.catalog import GpuSpec
from sim.latency import load_coefficients
from sim.latency.measured import nearest_fitted_gpu, shipped_coefficients
from sim.latency.measured_terms import V1_WORKER_STEP_S
from sim.scenario.schema import Scenario

#: Coefficient names that are efficiencies (time ~ 1 / value) and floors (time ~ value).
_COMPUTE_EFFICIENCIES = ("compute_efficiency",)
_EFFICIENCIES = ("memory_efficiency", "bandwidth_efficiency", "query_bandwidth_efficiency")
_TIMES = ("launch_floor_s", "call_floor_s", "per_seq_s", "latency_s")


@dataclass(frozen=True, slots=True)
class Factors:
    """The scale factors of a calibration (see the module docstring); all 1: the shipped fit."""

    compute_scale: float = 1.0
    memory_scale: float = 1.0
    overhead_scale: float = 1.0

    @classmethod
    def single(cls, gpu_scale: float, overhead_scale: float) -> Factors:
        """One GPU factor for every GPU term."""
        return cls(gpu_scale, gpu_scale, overhead_scale)

    @property
    def per_term(self) -> bool:
        return self.compute_scale != self.memory_scale

    def described(self) -> str:
        gpu = (f"compute_scale {self.compute_scale:g}, memory_scale {self.memory_scale:g}"
               if self.per_term else f"gpu_scale {self.compute_scale:g}")  # fmt: skip
        return f"{gpu}, overhead_scale {self.overhead_scale:g}"

    def as_dict(self) -> dict[str, float]:
        if self.per_term:
            return {"compute_scale": self.compute_scale, "memory_scale": self.memory_scale,
                    "overhead_scale": self.overhead_scale}  # fmt: skip
        return {"gpu_scale": self.compute_scale, "overhead_scale": self.overhead_scale}


def scaled_coefficients(base: dict[str, Any], gpu: GpuSpec, factors: Factors) -> dict[str, Any]:
    """`base` with `gpu`'s entry (its own, or the nearest fitted one's) scaled: each
    efficiency divided by its factor, each time multiplied (module docstring's example)."""
    out = copy.deepcopy(base)
    gpu_name = gpu.name
    source = nearest_fitted_gpu(gpu, base["gpus"])
    entry = copy.deepcopy(base["gpus"][source])
    compute, memory = factors.compute_scale, factors.memory_scale

    def scale(terms: dict[str, Any]) -> None:
        for key, value in terms.items():
            if isinstance(value, dict):
                scale(value)
            elif key in _COMPUTE_EFFICIENCIES:
                terms[key] = value / compute
            elif key in _EFFICIENCIES or key == "algbw_GBps":
                terms[key] = value / memory
            elif key in _TIMES:
                terms[key] = value * memory

    for term in ("gemm", "elementwise", "decode_attention", "prefill_attention", "allreduce"):
        scale(entry[term])
    out["gpus"][gpu_name] = entry
    for engine in out["engine"].values():
        engine["fixed_s"] *= factors.overhead_scale
        engine["per_seq_s"] *= factors.overhead_scale
        engine["graph_launch_s"] *= memory
    # V1's model-runner CPU term is part of the overhead the factor scales (measured.py)
    out["engine"]["v1"]["worker_step_s"] = V1_WORKER_STEP_S * factors.overhead_scale
    band = out.setdefault("band", {})
    band[gpu_name] = dict(band.get(source, band.get("extrapolated", {})))
    return out


def base_coefficients(scenario: Scenario, base_dir: Path) -> dict[str, Any]:
    """What the factors scale: the scenario's own `measured.coefficients` file, else the
    shipped fit."""
    measured = scenario.step_time.measured if scenario.step_time is not None else None
    if measured is None or measured.coefficients is None:
        return shipped_coefficients()
    path = Path(measured.coefficients)
    return load_coefficients(path if path.is_absolute() else base_dir / path)
