"""The end-to-end band: how far public `vllm bench serve` results fall from kvsim's replay.

The measured model's own band (`sim.latency.measured`, `band` in
`sim/data/steptime_coefficients.json`) comes from per-operator validation residuals: x0.92-x1.09.
End to end, against public serving results (docs/accuracy.md "Serving, end to end"), kvsim's
TPOT/ITL misses by more than that. The rule below turns those misses into a step-time band and
widens the shipped measured model's band to contain it.

The rule, pre-registered (committed 2026-12-06 before any quantile was computed; the textbook
choice, not tuned on the data):

- Data: every point of `sim/data/vllm_serving_measurements.yaml` on the FIT side for which the
  serving replay (`benchmarks/serving_accuracy.py`) predicts a TPOT/ITL value (that script's
  TPOT/ITL metric group). For each, ratio = measured / predicted, a step-time multiplier (> 1:
  the real server was slower than kvsim said).
- Serving band: low = the 10th percentile, high = the 90th percentile of those ratios
  (`numpy.quantile`, its default linear method), clipped so that low <= 1 <= high.
- Applied: the shipped measured model's band becomes low = min(op band low, serving low),
  high = max(op band high, serving high), on every fitted GPU and for the `extrapolated` case
  (the flag itself is unchanged). Other models (linear, calibrated, roofline) and a measured
  model given its own coefficients file keep their own band: a file that carries a `band`
  (e.g. `kvsim calibrate --from-bench`'s, fitted on the user's own server) keeps it.
- Check (reported, not tuned): the fraction of HELD-OUT TPOT/ITL points whose ratio lies in
  the widened band of their own setup; nominal 80%.

The band is data (`sim/data/serving_band.json`, written by `python benchmarks/serving_band.py
--write`); loading it here is one small JSON read, no replay.

Example: fit ratios [0.8, 0.9, 1.0, 1.1, 1.5] give p10 = 0.8 + 0.4 x 0.1 = 0.84 and p90 =
1.1 + 0.6 x 0.4 = 1.34; with an op band x0.924-x1.0566 the applied band is x0.84-x1.34.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sim.latency.band import StepTimeBand

#: The quantiles of measured / predicted that bound the serving band (pre-registered).
SERVING_BAND_QUANTILES = (0.10, 0.90)
#: The metric group of benchmarks/serving_accuracy.py whose ratios make the band.
SERVING_BAND_METRIC_GROUP = "TPOT/ITL"
#: The side of the split the band is computed on; the other side only checks it.
SERVING_BAND_SIDE = "fit"
#: The check's nominal coverage (the quantiles' spread).
NOMINAL_COVERAGE = SERVING_BAND_QUANTILES[1] - SERVING_BAND_QUANTILES[0]
DATA_FILE = "serving_band.json"


@dataclass(frozen=True, slots=True)
class ServingBand:
    """The end-to-end band as stored: factors and how many points made them."""

    low_factor: float
    high_factor: float
    n: int

    def describe(self) -> str:
        """What a widened band's `source` adds."""
        low, high = (round(100 * q) for q in SERVING_BAND_QUANTILES)
        return (
            f"widened to the end-to-end band of {self.n} public vllm bench serve points "
            f"(fit half, {SERVING_BAND_METRIC_GROUP} p{low}-p{high} of measured/predicted; "
            f"sim/data/{DATA_FILE})"
        )


def quantile_factors(ratios: Sequence[float]) -> tuple[float, float]:
    """The serving band of `ratios` (measured / predicted): their p10 and p90 by numpy's
    linear method, clipped so that low <= 1 <= high. Example: [1.1, 1.2, 1.3] gives p10 =
    1.12, clipped to 1.0, and p90 = 1.28: (1.0, 1.28)."""
    import numpy as np  # only the script that writes the band needs it

    if not ratios:
        raise ValueError("no ratios: a band needs at least one point")
    if any(not r > 0 for r in ratios):
        raise ValueError(f"ratios must be positive, got {sorted(ratios)[:3]}...")
    low, high = (float(q) for q in np.quantile(np.asarray(ratios, float), SERVING_BAND_QUANTILES))
    return min(low, 1.0), max(high, 1.0)


def widened(op_band: StepTimeBand, serving: ServingBand) -> StepTimeBand:
    """The op-level band widened to contain the serving band (the ends' min and max), the
    `extrapolated` flag kept, its `source` naming both. Example: x0.924-x1.0941 and a serving
    band x0.85-x1.30 give x0.85-x1.30; x0.80-x1.0941 would keep its 0.80."""
    return StepTimeBand(
        min(op_band.low_factor, serving.low_factor),
        max(op_band.high_factor, serving.high_factor),
        op_band.extrapolated,
        f"{op_band.source}; {serving.describe()}",
    )


def covered(ratio: float, band: StepTimeBand) -> bool:
    """Whether a measured / predicted ratio lies in the band (ends included)."""
    return band.low_factor <= ratio <= band.high_factor


def serving_band_from(document: dict[str, Any]) -> ServingBand:
    """The `ServingBand` of a `serving_band.json` document."""
    return ServingBand(
        float(document["low_factor"]), float(document["high_factor"]), int(document["n"])
    )


@functools.cache
def shipped_serving_band() -> ServingBand:
    """The committed `sim/data/serving_band.json` (a small read, cached)."""
    text = resources.files("sim.data").joinpath(DATA_FILE).read_text()
    document: dict[str, Any] = json.loads(text)
    return serving_band_from(document)
