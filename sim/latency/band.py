"""How sure a step-time prediction is: a relative band around the central value.

A step-time model that knows its own error (from validation residuals against measurements it
was not fitted on) exposes `band() -> StepTimeBand`. Consumers (summary.json, capacity) scale the
central step time by `low_factor` / `high_factor` to get optimistic / pessimistic answers.

Example: a model whose held-out whole-step errors have a p10 of -6% and a p90 of +9% reports
`StepTimeBand(low_factor=0.94, high_factor=1.09, ...)`; a 20 ms predicted step then reads
18.8-21.8 ms. A GPU or model outside the fitted data widens the band and sets `extrapolated`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class StepTimeBand:
    """Multiplicative band around a central step time (low_factor <= 1 <= high_factor)."""

    low_factor: float
    high_factor: float
    extrapolated: bool
    source: str

    def __post_init__(self) -> None:
        if not 0 < self.low_factor <= 1 <= self.high_factor:
            raise ValueError(
                f"band factors must satisfy 0 < low <= 1 <= high: "
                f"{self.low_factor}, {self.high_factor}"
            )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


#: What a model without a validated error says: no claim of accuracy.
UNKNOWN_BAND = StepTimeBand(1.0, 1.0, extrapolated=True, source="no validation data")


@runtime_checkable
class HasBand(Protocol):
    """A step-time model that knows how sure it is."""

    def band(self) -> StepTimeBand: ...


def band_of(model: object) -> StepTimeBand:
    """The model's band, or UNKNOWN_BAND when it does not report one."""
    return model.band() if isinstance(model, HasBand) else UNKNOWN_BAND
