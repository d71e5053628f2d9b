"""`kvsim compare-bench PREDICTED.json MEASURED.json`: a kvsim prediction beside a measurement.

Both files are `vllm bench serve --save-result` JSON (kvsim's carries a `kvsim` block). For
every scalar metric the two have in common (throughputs, duration, token totals and each
`mean_/median_/std_/p<P>_<metric>_ms`): the predicted and measured values, the error
`(predicted - measured) / measured`, and, where the `kvsim` block has a band for the metric
(the values at the two ends of the step-time model's band), whether the measurement lies in it.

Example row::

    metric             predicted   measured   error   in band
    mean_ttft_ms           42.08      45.10   -6.7%   yes (38.90 .. 46.31)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.files.inputs import read_capped_bytes, refuse_non_regular

#: A result file is a few MB at most (its per-request lists with --save-detailed).
MAX_RESULT_BYTES = 256 << 20
#: Scalars that describe the run rather than measure it.
_SETTINGS = {"num_prompts", "burstiness", "max_concurrency", "request_rate", "rtfx"}


@dataclass(frozen=True, slots=True)
class MetricRow:
    metric: str
    predicted: float
    measured: float
    band: tuple[float, float] | None

    @property
    def error(self) -> float:
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else math.inf
        return (self.predicted - self.measured) / self.measured

    @property
    def in_band(self) -> bool | None:
        if self.band is None:
            return None
        return self.band[0] <= self.measured <= self.band[1]


def read_result(path: Path) -> dict[str, Any]:
    """A result JSON; a missing, non-regular or malformed file is bad input naming it."""
    if not path.exists():
        raise InputError(f"{path}: no such file")
    refuse_non_regular(path, lambda reason: InputError(f"{path}: {reason} (a result JSON)"))
    raw = read_capped_bytes(
        path, MAX_RESULT_BYTES, lambda n: InputError(f"{path}: {n} bytes, too big")
    )
    try:
        data = json.loads(raw.decode("utf-8").strip().splitlines()[-1] if raw.strip() else "")
    except (json.JSONDecodeError, UnicodeDecodeError, IndexError) as error:
        raise InputError(f"{path}: not a vllm bench serve result JSON: {error}") from None
    if not isinstance(data, dict) or "duration" not in data:
        raise InputError(f"{path}: not a vllm bench serve result JSON (no 'duration')")
    return data


def _scalar(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def compare(predicted: dict[str, Any], measured: dict[str, Any]) -> list[MetricRow]:
    """One row per scalar metric both results have (predicted's key order)."""
    bands = (predicted.get("kvsim") or {}).get("band", {})
    rows = []
    for key, value in predicted.items():
        if (
            key in _SETTINGS
            or key == "kvsim"
            or not _scalar(value)
            or not _scalar(measured.get(key))
        ):
            continue
        band = bands.get(key)
        rows.append(
            MetricRow(key, float(value), float(measured[key]), tuple(band) if band else None)
        )
    return rows


def render(rows: list[MetricRow], predicted: Path, measured: Path) -> list[str]:
    """The table as text lines, then how many measurements fall in the band."""
    width = max([len(r.metric) for r in rows] + [6])
    lines = [f"predicted: {predicted}", f"measured:  {measured}",
             f"{'metric':<{width}}  {'predicted':>12}  {'measured':>12}  {'error':>8}  in band"]  # fmt: skip
    for r in rows:
        verdict = "-"
        if r.band is not None:
            verdict = f"{'yes' if r.in_band else 'no'} ({r.band[0]:.2f} .. {r.band[1]:.2f})"
        lines.append(f"{r.metric:<{width}}  {r.predicted:>12.2f}  {r.measured:>12.2f}  "
                     f"{r.error:>+8.1%}  {verdict}")  # fmt: skip
    banded = [r for r in rows if r.in_band is not None]
    inside = sum(bool(r.in_band) for r in banded)
    lines.append(f"{inside} of {len(banded)} banded metrics inside kvsim's band; "
                 f"{len(rows)} metrics compared")  # fmt: skip
    return lines
