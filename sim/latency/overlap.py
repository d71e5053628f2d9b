"""Which part of a predicted step is engine CPU work that async scheduling hides behind the GPU.

A synchronous V1 engine core runs `schedule()`, the model and `update_from_output()` one after
the other (`vllm/v1/engine/core.py` `step`, 0.11.0 L272-291, 0.33.0 L667-700): a step's wall
time is its GPU time plus the engine's CPU work. With async scheduling the batch queue
(`step_with_batch_queue`, 0.11.0 L300-352, 0.33.0 L708-822) schedules step N+1 while step N
runs and applies step N's output while N+1 runs, so the CPU work overlaps the GPU, and a busy
engine steps at max(GPU time, CPU time) (`sim.engine.step_loop`).

The split, per step-time model:

* measured (`MeasuredStepTime`, the default): its named term `engine_overhead_s` is the CPU
  work (V1: vLLM's scheduling and sampler-side phases, `sim/data/steptime_coefficients.json`,
  "engine" -> "v1", itself an assumption from v0 measurements, plus the model runner's input
  preparation and output sync, `measured_terms.V1_WORKER_STEP_S`); it overlaps. Every other term
  (`gemm_s` ... `launch_s`, the CUDA-graph launch included) is GPU time and does not.
* scaled (`ScaledStepTime`): the wrapped model's split, times the factor.
* linear, roofline, calibrated profile: no CPU term is named, so nothing overlaps (async then
  changes the scheduler's decisions, not the step's time).

Example (Llama-3.1-8B, H100, 64 decodes at 4k, V1): 24.7 ms predicted, 4.20 ms of it engine
overhead: synchronous steps take 24.7 ms, async ones max(20.54, 4.20) = 20.54 ms.

Left out: the GIL contention between the scheduler and the output processing.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.latency.batch import BatchShape
from sim.latency.measured import MeasuredStepTime
from sim.latency.protocol import StepTimeModel
from sim.latency.scaled import ScaledStepTime


def _none(batch: BatchShape) -> float:
    return 0.0


def overlapped_cpu_s(model: StepTimeModel) -> Callable[[BatchShape], float]:
    """Seconds of `model.predict_s(batch)` that are engine CPU work (see the module doc)."""
    factor = 1.0
    while isinstance(model, ScaledStepTime):
        factor *= model.factor
        model = model.model
    if isinstance(model, MeasuredStepTime):
        overhead = model.engine_overhead_s
        if factor == 1.0:
            return overhead
        return lambda batch: overhead(batch) * factor
    return _none
