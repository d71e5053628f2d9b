"""One measured `vllm bench serve --save-result` JSON, as `kvsim calibrate --from-bench` reads it.

A result file saves the benchmark's `num_prompts`, `request_rate`, `burstiness` and
`max_concurrency` beside the metrics it measured; the dataset options it does not save come
from the command line (`workload`). A file without a positive value of any `FIT_METRICS`, or
with a rate, burstiness or concurrency that is not a positive number, is refused in one line
naming the file and the field (`sim.errors.InputError`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.vllm_bench.bench import WorkloadOptions
from sim.vllm_bench.compare import read_result
from sim.vllm_bench.metrics import BenchSettings

#: The metrics the fit reproduces, as vLLM's result keys.
FIT_METRICS = ("mean_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "output_throughput")


@dataclass(frozen=True, slots=True)
class BenchFile:
    """One measured result and the benchmark that produced it."""

    path: Path
    measured: dict[str, float]
    settings: BenchSettings
    workload: WorkloadOptions


def read_bench_file(path: Path, workload: WorkloadOptions) -> BenchFile:
    """A measured result with its rate, burstiness and concurrency; `workload` gives the
    dataset (vLLM does not save it), its `num_prompts` replaced by the file's."""
    data = read_result(path)
    measured = {k: float(data[k]) for k in FIT_METRICS if positive_number(data.get(k))}
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
    if not positive_number(burstiness):
        raise InputError(f"{path}: burstiness: must be a positive number, got {burstiness!r}")
    settings = BenchSettings(request_rate=rate_value, burstiness=float(burstiness),
                             max_concurrency=concurrency)  # fmt: skip
    return BenchFile(
        path, measured, settings, dataclasses.replace(workload, num_prompts=num_prompts)
    )


def positive_number(value: Any) -> bool:
    """A finite number above 0 (not a bool): what a result's metric or setting must be."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value) and value > 0)  # fmt: skip
