"""The end-to-end step-time band from the public serving points (issue #24).

    python benchmarks/serving_band.py           # the ratio table, the band, the held-out check
    python benchmarks/serving_band.py --write   # and update sim/data/serving_band.json

Applies the pre-registered rule of `sim.latency.serving_band` (docs/accuracy.md, "The
end-to-end band"): every FIT point of `sim/data/vllm_serving_measurements.yaml` with a TPOT/ITL
measurement that `benchmarks/serving_accuracy.py` replays gives ratio = measured / predicted;
the band is their p10-p90, clipped to contain 1. The HELD-OUT points with a TPOT/ITL
measurement check it: the fraction whose ratio lies in the widened band of their own setup (the
op-level band of the model their scenario builds, merged with the serving band), beside the
fraction inside the op-level band alone. A selected point whose replay is refused or predicts no
TPOT/ITL is an error, never dropped. Replays as serving_accuracy.py does (the nominal step time,
the API server): about a minute on 2 shared cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import serving_accuracy as acc  # benchmarks/, beside this script

from sim.latency import band_of, serving_band
from sim.latency.band import StepTimeBand
from sim.latency.measured import MeasuredStepTime
from sim.latency.serving_band import (
    DATA_FILE,
    SERVING_BAND_METRIC_GROUP,
    SERVING_BAND_QUANTILES,
    SERVING_BAND_SIDE,
    ServingBand,
    covered,
    quantile_factors,
    widened,
)
from sim.scenario.resolve import step_time_model

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "sim" / "data" / DATA_FILE
COMMAND = "python benchmarks/serving_band.py --write"
GROUP_KEYS = acc.GROUPS[SERVING_BAND_METRIC_GROUP]


def has_group_metric(point: acc.Point) -> bool:
    """Whether the source measured a key of the TPOT/ITL group (an unnamed `tpot_ms` counts)."""
    return any(key in point.measured for key in GROUP_KEYS)


def band_points(points: list[acc.Point], side: str) -> list[acc.Point]:
    """The points of `side` the rule reads: a TPOT/ITL measurement, and replayable."""
    return [
        p
        for p in points
        if p.split == side and has_group_metric(p) and not acc.why_not_replayable(p)
    ]


def op_band(point: acc.Point, release: str) -> tuple[StepTimeBand, bool]:
    """The op-level band of the step-time model the point's scenario builds (the measured
    model's `op_band`; another model's own band), and whether the rule widens it."""
    model = step_time_model(acc.scenario_for(point, release))
    if isinstance(model, MeasuredStepTime):
        return model.op_band(), model.band_widened
    return band_of(model), False


def point_row(point: acc.Point) -> dict[str, Any]:
    """The point's replayed TPOT/ITL row and op band, as the JSON stores it."""
    done = acc.replay(point)
    found = done.group(SERVING_BAND_METRIC_GROUP)
    if done.skipped or found is None:
        raise SystemExit(f"{point.id}: selected by the rule but not replayed ({done.skipped})")
    key, row = found
    band, widens = op_band(point, done.release)
    return {
        "id": point.id,
        "metric": key,
        "predicted_ms": row.predicted,
        "measured_ms": row.measured,
        "ratio": row.measured / row.predicted,
        "op_band": [band.low_factor, band.high_factor],
        "widened": widens,
    }


def held_out_check(rows: list[dict[str, Any]], serving: ServingBand) -> dict[str, Any]:
    """How many held-out ratios lie in their op band, and in the widened band."""
    in_op = in_new = 0
    for row in rows:
        op = StepTimeBand(*row["op_band"], extrapolated=False, source="")
        new = widened(op, serving) if row["widened"] else op
        in_op += covered(row["ratio"], op)
        in_new += covered(row["ratio"], new)
    n = len(rows)
    return {
        "n": n,
        "covered_op_band": in_op,
        "covered_widened_band": in_new,
        "coverage_op_band": in_op / n,
        "coverage_widened_band": in_new / n,
        "points": rows,
    }


@contextlib.contextmanager
def neutral_shipped_band() -> Iterator[None]:
    """While replaying, the shipped serving band reads x1-x1: a replay's predictions do not
    depend on it (a run only records its band), so the script gives the same JSON whether the
    committed one is missing, stale or current."""
    saved = serving_band.shipped_serving_band
    serving_band.shipped_serving_band = lambda: ServingBand(1.0, 1.0, 0)  # type: ignore[assignment]
    try:
        yield
    finally:
        serving_band.shipped_serving_band = saved  # type: ignore[assignment]


def document(points: list[acc.Point]) -> dict[str, Any]:
    """The serving band's JSON (everything but `date`) from the replays of `points`."""
    with neutral_shipped_band():
        fit = [point_row(p) for p in band_points(points, SERVING_BAND_SIDE)]
        held = [point_row(p) for p in band_points(points, "held_out")]
    low, high = quantile_factors([r["ratio"] for r in fit])
    serving = ServingBand(low, high, len(fit))
    raw = [float(q) for q in np.quantile([r["ratio"] for r in fit], SERVING_BAND_QUANTILES)]
    return {
        "low_factor": low,
        "high_factor": high,
        "quantiles": list(SERVING_BAND_QUANTILES),
        "quantile_ratios_unclipped": raw,
        "metric_group": SERVING_BAND_METRIC_GROUP,
        "side": SERVING_BAND_SIDE,
        "n": len(fit),
        "ratio": "measured / predicted (a step-time multiplier)",
        "rule": "pre-registered in docs/accuracy.md, 'The end-to-end band' "
        "(sim/latency/serving_band.py)",
        "command": COMMAND,
        "source_file": f"sim/data/{acc.DATA_FILE}",
        "points": fit,
        "held_out_check": held_out_check(held, serving),
    }


def report(doc: dict[str, Any]) -> str:
    """The ratio table, the band and the held-out check, as the script prints them."""
    lines = ["| id | side | metric | predicted ms | measured ms | ratio | op band |",
             "|---|---|---|---:|---:|---:|---|"]  # fmt: skip
    for side, rows in (("fit", doc["points"]), ("held_out", doc["held_out_check"]["points"])):
        for r in rows:
            lines.append(
                f"| {r['id']} | {side} | {r['metric']} | {r['predicted_ms']:.2f} | "
                f"{r['measured_ms']:.2f} | {r['ratio']:.3f} | "
                f"x{r['op_band'][0]:.3f}-x{r['op_band'][1]:.4f} |"
            )
    check = doc["held_out_check"]
    raw_low, raw_high = doc["quantile_ratios_unclipped"]
    lines += [
        "",
        f"serving band (fit, n={doc['n']}): x{doc['low_factor']:.4f}-x{doc['high_factor']:.4f}"
        f" (p10 {raw_low:.4f}, p90 {raw_high:.4f} before clipping to contain 1)",
        f"held-out coverage (n={check['n']}, nominal 80%): widened band "
        f"{check['covered_widened_band']}/{check['n']} = {check['coverage_widened_band']:.1%}; "
        f"op-level band {check['covered_op_band']}/{check['n']} = "
        f"{check['coverage_op_band']:.1%}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update sim/data/{DATA_FILE}")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    doc = document(acc.load_points())
    print(report(doc))
    if args.write:
        doc["date"] = time.strftime("%Y-%m-%d", time.gmtime())
        OUT.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)}")
    print(f"{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
