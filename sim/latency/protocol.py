"""The step-time interface the engine calls once per simulated step."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sim.latency.batch import BatchShape


@runtime_checkable
class StepTimeModel(Protocol):
    """Seconds one engine step takes for a batch. Pure: same batch, same answer."""

    def predict_s(self, batch: BatchShape) -> float: ...


@runtime_checkable
class WindowedStepTime(StepTimeModel, Protocol):
    """A step-time model whose attention reads at most `decode_window` tokens of a decode's
    context (a sliding window; None: the whole context). The decode cohort
    (`sim.scheduler.fast.cohort`) sums decode contexts capped at it."""

    @property
    def decode_window(self) -> int | None: ...


def decode_window_of(model: StepTimeModel) -> int | None:
    """`model.decode_window`, or None for a model without one (every context read whole)."""
    return model.decode_window if isinstance(model, WindowedStepTime) else None
