"""Calibrate the measured step time from a user's own `vllm bench serve` results.

`kvsim calibrate --from-bench A.json --from-bench B.json ... --scenario S.yaml` replays each
result's benchmark (its `num_prompts`, `request_rate`, `burstiness` and `max_concurrency` as the
result file saved them, `sim.vllm_bench.bench_files`; the dataset options, which vLLM does not
save, from the command line) through `kvsim bench serve`'s simulation, and fits two factors
(`sim.vllm_bench.coefficient_scaling`: a GPU factor and an engine-overhead factor; with
`per_term`, the GPU factor split into compute and memory) so that the replays reproduce the
measured TTFT, TPOT, ITL and output throughput.

Each result file times both (its TTFT is mostly prefill, its TPOT decode), so three factors are
identifiable from files whose batches differ; with a single file the fit says so only through
its held-out errors (none).

The loss is the mean over the fit files of the mean |ln(predicted / measured)| over the four
metrics (a ratio error: 2x too slow and 2x too fast cost the same), minimised by Nelder-Mead
in log space from (1, 1). Files are sorted by name; with three or more, every other one (the
2nd, 4th, ...) is held out and reported, never fitted; with one or two, all are fitted and the
report says that nothing was held out.

Example: five result files a.json ... e.json are fitted on a, c, e; b and d are held out and
their errors reported. The output, a coefficients JSON used as
`step_time: {measured: {coefficients: FILE}}`, and the printed report are
`sim.vllm_bench.calibrate_output`'s; `--from-log` is `sim.vllm_bench.log_pool`'s.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.errors import InputError
from sim.latency.measured import MeasuredStepTime
from sim.latency.measured_fit import nelder_mead
from sim.scenario.schema import Scenario
from sim.vllm_bench.arrivals import send_times
from sim.vllm_bench.bench import (
    outcomes,
    prepared,
    request_specs,
    sample_requests,
    simulate_bench,
)
from sim.vllm_bench.bench_files import FIT_METRICS, BenchFile, positive_number
from sim.vllm_bench.coefficient_scaling import Factors, base_coefficients, scaled_coefficients
from sim.vllm_bench.metrics import benchmark_result


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
        # The scenario's own model with only the coefficients swapped: its weight dtype, KV
        # dtype, release and worker form stay (rebuilding it from a list of options dropped the
        # weight dtype, so a quantized scenario was calibrated as bf16).
        model = base.with_coefficients(coefficients)
        run = dataclasses.replace(self.resolved, step_time=model)
        out = []
        for f, (requests, specs) in zip(self.files, self._inputs, strict=True):
            sim = simulate_bench(run, specs, f.settings)
            result, _ = benchmark_result(*outcomes(sim, requests), f.settings)
            out.append({k: float(result[k]) for k in f.measured if positive_number(result.get(k))})
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
    #: Loss per factors already replayed: the simplex keeps landing on the same factors once it
    #: is smaller than their 4-decimal rounding (half of a one-file fit's points), and a replay
    #: is deterministic, so each is replayed once.
    losses: dict[Factors, float] = {}

    def objective(x: np.ndarray) -> float:
        factors = _factors(x, per_term)
        if factors not in losses:
            losses[factors] = _loss(fitter.replay(factors), fit)
        return losses[factors]

    start = np.zeros(3 if per_term else 2)
    # Three factors take four times the rounds: on decode steps memory_scale and
    # overhead_scale trade off along a shallow valley, and at twice the rounds the simplex
    # stopped in it (x0.66 memory, x1.90 overhead for a true x0.9, x1.5; the slow test
    # `..._regression_per_term_fit_stopped_short`). Once the simplex is below the factors'
    # rounding the rounds hit `losses`, so the extra ones replay little.
    best = nelder_mead(objective, start, iters=iters * (4 if per_term else 1), step=0.4)
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
