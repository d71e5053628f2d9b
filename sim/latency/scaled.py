"""A step-time model scaled by a constant factor: the step-time band's ends, or a what-if.

`ScaledStepTime(model, 1.3).predict_s(batch) == 1.3 * model.predict_s(batch)` for every batch.
Capacity answers at the low / high end of a model's band (`sim.latency.band`) run the same
scenario with the model scaled by `band.low_factor` / `band.high_factor`.

Example: a roofline predicting 17.64 ms for 64 decodes at 4k context on an H100, scaled by its
band's high factor 1.67, gives 29.46 ms: the step a pessimistic planner plans for.

The wrapper keeps what the engine reads from a step-time model besides `predict_s`:
`decode_window` (the cohort sums decode contexts capped at it) and `band()` (the band describes
the wrapped model's error, which scaling does not change).
"""

from __future__ import annotations

from sim.latency.band import StepTimeBand, band_of
from sim.latency.batch import BatchShape
from sim.latency.protocol import StepTimeModel, decode_window_of


class ScaledStepTime:
    """`model`'s step time multiplied by `factor` (> 0)."""

    __slots__ = ("model", "factor")

    def __init__(self, model: StepTimeModel, factor: float) -> None:
        if not factor > 0:  # also rejects NaN
            raise ValueError(f"step-time factor must be positive, got {factor}")
        self.model, self.factor = model, float(factor)

    def predict_s(self, batch: BatchShape) -> float:
        return self.model.predict_s(batch) * self.factor

    @property
    def decode_window(self) -> int | None:
        return decode_window_of(self.model)

    def band(self) -> StepTimeBand:
        return band_of(self.model)


def scaled(model: StepTimeModel, factor: float) -> StepTimeModel:
    """`model` itself at factor 1 (no wrapper on the hot path), else a `ScaledStepTime`."""
    return model if factor == 1.0 else ScaledStepTime(model, factor)
