"""Calibrate the measured step time from a user's own `vllm bench serve` results.

`kvsim calibrate --from-bench A.json --from-bench B.json ... --scenario S.yaml` replays each
result's benchmark (its `num_prompts`, `request_rate`, `burstiness` and `max_concurrency` as the
result file saved them; the dataset options, which vLLM does not save, from the command line)
through `kvsim bench serve`'s simulation, and fits two factors so that the replays reproduce
the measured TTFT, TPOT, ITL and output throughput:

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

Each result file times both (its TTFT is mostly prefill, its TPOT decode), so three factors are
identifiable from files whose batches differ; with a single file the fit says so only through
its held-out errors (none).

The loss is the mean over the fit files of the mean |ln(predicted / measured)| over the four
metrics (a ratio error: 2x too slow and 2x too fast cost the same), minimised by Nelder-Mead
in log space from (1, 1). Files are sorted by name; with three or more, every other one (the
2nd, 4th, ...) is held out and reported, never fitted; with one or two, all are fitted and the
report says that nothing was held out.

The output is a coefficients JSON in the layout of `sim/data/steptime_coefficients.json` (every
shipped GPU kept; the scenario's GPU gets the nearest fitted entry with its terms scaled, so a
GPU the shipped fit extrapolates to becomes a fitted one), used as
`step_time: {measured: {coefficients: FILE}}`, with the factors, files, split and errors in
its `provenance` and `calibration`.

Worked example: a GEMM at compute efficiency 0.77 and launch floor 5.4 us, scaled by
gpu_scale 1.25, becomes 0.77 / 1.25 = 0.616 and 6.75 us: every GEMM takes 1.25x as long (the
compute/memory blend is a p-norm, so scaling both times scales it). Per term, compute_scale
1.25 and memory_scale 1: compute efficiency 0.616, memory efficiency and floor as shipped, so a
4,096-token prefill GEMM (compute-bound) takes about 1.25x as long and a batch-8 decode GEMM
(its weight reads) about as long as before.

`--from-log SERVER_LOG` (`sim.vllm_bench.server_log`) replaces the scenario's pool with the one the
server logged ("GPU KV cache size: N tokens"), so the replays queue as the measured server did;
the log's release is recorded beside the one the scenario models. Without `--scenario`, the
log's "non-default args" on `--gpu` are the server (`sim.cli.calibrate._bench_scenario`).

What it leaves out: a factor per kernel (GEMM apart from attention: the results of a serving
benchmark rarely separate them; only compute-bound from memory-bound, with `per_term`), the
fused-MoE layer's own fixed cost per layer (`sim.latency.moe.FIXED_S`, a constant; its GEMMs use
the scaled dense coefficients), and the all-reduce without peer access (`hardware.p2p: false`, a
constant of its own, not scaled).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sim.catalog import GpuSpec
from sim.errors import InputError
from sim.kv.pins import resolve_pin
from sim.latency import load_coefficients
from sim.latency.measured import MeasuredStepTime, nearest_fitted_gpu, shipped_coefficients
from sim.latency.measured_fit import nelder_mead
from sim.latency.measured_terms import V1_WORKER_STEP_S
from sim.scenario.configs import kv_dtype_of
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario
from sim.vllm_bench.arrivals import send_times
from sim.vllm_bench.bench import (
    WorkloadOptions,
    outcomes,
    prepared,
    request_specs,
    sample_requests,
    simulate_bench,
)
from sim.vllm_bench.compare import read_result
from sim.vllm_bench.metrics import BenchSettings, benchmark_result
from sim.vllm_bench.server_log import ServerLog

#: The metrics the fit reproduces, as vLLM's result keys.
FIT_METRICS = ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "output_throughput")
#: Coefficient names that are efficiencies (time ~ 1 / value) and floors (time ~ value).
_COMPUTE_EFFICIENCIES = ("compute_efficiency",)
_EFFICIENCIES = ("memory_efficiency", "bandwidth_efficiency", "query_bandwidth_efficiency")
_TIMES = ("launch_floor_s", "call_floor_s", "per_seq_s", "latency_s")


@dataclass(frozen=True, slots=True)
class BenchFile:
    """One measured result and the benchmark that produced it."""

    path: Path
    measured: dict[str, float]
    settings: BenchSettings
    workload: WorkloadOptions


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


@dataclass(slots=True)
class BenchFit:
    factors: Factors
    fit_files: list[Path]
    held_out_files: list[Path]
    #: per file: metric -> (predicted, measured), at the fitted factors
    compared: dict[Path, dict[str, tuple[float, float]]] = field(default_factory=dict)
    loss: float = math.nan

    @property
    def gpu_scale(self) -> float:
        """The one GPU factor (a per-term fit has two: `factors`)."""
        assert not self.factors.per_term, "a per-term fit has compute and memory scales"
        return self.factors.compute_scale

    @property
    def overhead_scale(self) -> float:
        return self.factors.overhead_scale

    def errors(self, files: list[Path]) -> dict[str, list[float]]:
        """Signed relative errors (predicted / measured - 1) per metric over `files`."""
        out: dict[str, list[float]] = {m: [] for m in FIT_METRICS}
        for path in files:
            for metric, (pred, meas) in self.compared[path].items():
                out[metric].append(pred / meas - 1.0)
        return out


def read_bench_file(path: Path, workload: WorkloadOptions) -> BenchFile:
    """A measured result with its rate, burstiness and concurrency; `workload` gives the
    dataset (vLLM does not save it), its `num_prompts` replaced by the file's."""
    data = read_result(path)
    measured = {k: float(data[k]) for k in FIT_METRICS if _positive(data.get(k))}
    if not measured:
        raise InputError(f"{path}: none of {', '.join(FIT_METRICS)} is a positive number")
    num_prompts = data.get("num_prompts", data.get("completed"))
    if not isinstance(num_prompts, int) or num_prompts < 1:
        raise InputError(f"{path}: num_prompts: a positive integer is needed, got {num_prompts!r}")
    rate = data.get("request_rate", "inf")
    try:
        rate_value = math.inf if str(rate) == "inf" else float(rate)
    except ValueError:
        raise InputError(f"{path}: request_rate: not a number: {rate!r}") from None
    if not rate_value > 0:
        raise InputError(f"{path}: request_rate: must be positive, got {rate!r}")
    concurrency = data.get("max_concurrency")
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency < 1):
        raise InputError(
            f"{path}: max_concurrency: a positive integer or null, got {concurrency!r}"
        )
    burstiness = data.get("burstiness", 1.0)
    if not _positive(burstiness):
        raise InputError(f"{path}: burstiness: must be a positive number, got {burstiness!r}")
    settings = BenchSettings(request_rate=rate_value, burstiness=float(burstiness),
                             max_concurrency=concurrency)  # fmt: skip
    return BenchFile(
        path, measured, settings, dataclasses.replace(workload, num_prompts=num_prompts)
    )


def _positive(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)  # fmt: skip


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


class Replayer:
    """Replays bench files on one scenario with a step-time model built per factor pair."""

    def __init__(self, scenario: Scenario, base_dir: Path, files: list[BenchFile]) -> None:
        self.resolved = prepared(scenario, base_dir)
        if not isinstance(self.resolved.step_time, MeasuredStepTime):
            raise InputError(
                "--from-bench calibrates the measured step time: the scenario's step_time must be "
                "measured (the default)"
            )
        self.scenario, self.files = scenario, files
        self.base_coefficients = base_coefficients(scenario, base_dir)
        base = self.resolved.step_time
        self._model_args: dict[str, Any] = dict(
            tp=base.tp, engine=base.engine, p2p=base.p2p, release=base.release,
            kv_dtype=kv_dtype_of(scenario.cache),
        )  # fmt: skip
        self._inputs = []
        for f in files:
            requests = sample_requests(f.workload)
            times = send_times(len(requests), request_rate=f.settings.request_rate,
                               burstiness=f.settings.burstiness, seed=f.workload.seed)  # fmt: skip
            self._inputs.append((requests, request_specs(requests, times)))

    def replay(self, factors: Factors) -> list[dict[str, float]]:
        """Each file's predicted metrics at `factors`."""
        base = self.resolved.step_time
        assert isinstance(base, MeasuredStepTime)
        coefficients = scaled_coefficients(self.base_coefficients, base.gpu, factors)
        model = MeasuredStepTime(base.model, base.gpu, coefficients=coefficients,
                                 **self._model_args)  # fmt: skip
        run = dataclasses.replace(self.resolved, step_time=model)
        out = []
        for f, (requests, specs) in zip(self.files, self._inputs, strict=True):
            sim = simulate_bench(run, specs, f.settings)
            result, _ = benchmark_result(*outcomes(sim, requests), f.settings)
            out.append({k: float(result[k]) for k in f.measured if _positive(result.get(k))})
        return out


def _loss(predicted: list[dict[str, float]], files: list[BenchFile]) -> float:
    per_file = []
    for pred, f in zip(predicted, files, strict=True):
        terms = [abs(math.log(pred[k] / v)) for k, v in f.measured.items() if k in pred]
        per_file.append(sum(terms) / len(terms) if terms else 10.0)
    return sum(per_file) / len(per_file)


def _factors(x: np.ndarray, per_term: bool) -> Factors:
    """Log-space parameters -> factors, each kept within x0.05-x20 (outside is not a fit)."""
    scales = [round(float(math.exp(v)), 4) for v in np.clip(x, math.log(0.05), math.log(20.0))]
    if per_term:
        return Factors(scales[0], scales[1], scales[2])
    return Factors.single(scales[0], scales[1])


def fit_from_bench(
    scenario: Scenario,
    base_dir: Path,
    files: list[BenchFile],
    *,
    iters: int = 40,
    per_term: bool = False,
) -> BenchFit:
    """Fit (gpu_scale, overhead_scale), or with `per_term` (compute_scale, memory_scale,
    overhead_scale), on the fit files; compare every file at the result."""
    files = sorted(files, key=lambda f: str(f.path))
    held = files[1::2] if len(files) >= 3 else []
    fit = [f for f in files if f not in held]
    fitter = Replayer(scenario, base_dir, fit)

    def objective(x: np.ndarray) -> float:
        return _loss(fitter.replay(_factors(x, per_term)), fit)

    start = np.zeros(3 if per_term else 2)
    best = nelder_mead(objective, start, iters=iters * (2 if per_term else 1), step=0.4)
    return evaluate(scenario, base_dir, files, _factors(best, per_term))


def evaluate(
    scenario: Scenario, base_dir: Path, files: list[BenchFile], factors: Factors | None = None
) -> BenchFit:
    """Every file compared at `factors` (default all 1: the model as it ships), with the split
    `fit_from_bench` uses."""
    factors = factors or Factors()
    files = sorted(files, key=lambda f: str(f.path))
    held = files[1::2] if len(files) >= 3 else []
    fit = [f for f in files if f not in held]
    result = BenchFit(factors, [f.path for f in fit], [f.path for f in held])
    predicted = Replayer(scenario, base_dir, files).replay(factors)
    result.loss = _loss([p for p, f in zip(predicted, files, strict=True) if f in fit], fit)
    for pred, f in zip(predicted, files, strict=True):
        result.compared[f.path] = {k: (pred[k], v) for k, v in f.measured.items() if k in pred}
    return result


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
        + ", the engine overhead x overhead_scale; the band is the shipped one, not re-validated",
        "pool_from_log": pool_from_log,
    }
    doc["calibration"] = {
        "fit": summary(fit.fit_files),
        "held_out": summary(fit.held_out_files),
        "loss": round(fit.loss, 6),
    }
    return doc


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


def apply_server_log(
    scenario: Scenario, base_dir: Path, log: ServerLog
) -> tuple[Scenario, dict[str, Any]]:
    """The scenario with the log's KV pool as `cache.num_gpu_blocks`, and what was applied."""
    resolved = prepared(scenario, base_dir)
    kv = resolved.engine.kv
    groups = len(resolved.inputs.get("kv_cache_groups") or ()) or 1
    blocks = log.pool_blocks(
        kv.block_size,
        groups,
        from_concurrency=resolve_pin(
            scenario.scheduler.design, resolved.inputs["vllm_version"]
        ).logs_capacity_from_concurrency,
        blocks_per_request=resolved.inputs.get("startup_blocks_per_request"),
        max_model_len=resolved.inputs.get("max_model_len"),
    )
    applied = {
        "log": str(log.path),
        "kv_cache_tokens": log.kv_cache_tokens,
        "gpu_blocks_logged": log.gpu_blocks,
        "num_gpu_blocks": blocks,
        "kvsim_num_gpu_blocks": kv.num_gpu_blocks,
        "vllm_version_logged": log.vllm_version,
        "vllm_version_modelled": resolved.inputs.get("vllm_version"),
    }
    overridden = apply_overrides(scenario, {"cache.num_gpu_blocks": blocks}, source=str(log.path))
    return overridden, applied
