"""The step-time interface the engine calls once per simulated step."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from sim.latency.batch import BatchShape


@runtime_checkable
class StepTimeModel(Protocol):
    """Seconds one engine step takes for a batch. Pure: same batch, same answer."""

    def predict_s(self, batch: BatchShape) -> float: ...
