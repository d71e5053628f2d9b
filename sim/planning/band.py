"""Capacity at the ends of the step-time band: which step-time factors to search, and the columns.

A capacity search (`sim.planning.capacity`) runs each configuration at the central step time
and at the step times scaled by its model's band (`sim.latency.band`): `low_factor` (the fast
end, an optimistic capacity) and `high_factor` (the slow end, a pessimistic one). The seed
interval is kept at each end, so `capacity_slow_step_ci_low` is the answer that survives both
uncertainties.

Example: band x0.8-x1.5 and replicate capacities [100, 110, 120] req/s at the slow end give
capacity_slow_step_req_per_s 110, capacity_slow_step_ci_low 85.16 (the 95 % t-interval) and
capacity_slow_step_min 100.
"""

from __future__ import annotations

import math
from typing import Any

from sim.latency.band import StepTimeBand


def model_band(scenario_data: dict[str, Any], label: str) -> StepTimeBand:
    """The band of the step-time model a configuration runs."""
    from sim.engine.run import step_time_model
    from sim.latency.band import band_of
    from sim.scenario.schema import scenario_from_dict

    scenario = scenario_from_dict(scenario_data, label or "capacity scenario")
    return band_of(step_time_model(scenario))


def band_factors(band: StepTimeBand) -> list[float]:
    """The step-time factors to search, each once: central 1.0 and the band's two ends."""
    return sorted({band.low_factor, 1.0, band.high_factor})


def band_columns(
    results: list[dict[str, Any]], config_index: int, band: StepTimeBand, searched: bool
) -> dict[str, Any]:
    """The band and the capacity at its fast (low factor) and slow (high factor) step times.

    `capacity_fast_step_ci_high` and `capacity_slow_step_ci_low` bound both uncertainties at
    once: the seed interval at the band's ends.
    """
    from sim.planning.interval import confidence_interval

    columns: dict[str, Any] = {
        "step_time_low_factor": band.low_factor,
        "step_time_high_factor": band.high_factor,
        "step_time_band_extrapolated": band.extrapolated,
        "step_time_band_source": band.source,
    }
    for end, factor, ci_side in (("fast", band.low_factor, 2), ("slow", band.high_factor, 1)):
        capacities = [
            r["capacity_rate_req_per_s"]
            for r in results
            if r["config_index"] == config_index and r["step_time_factor"] == factor
        ]
        if not searched or not capacities:
            columns.update(
                {f"capacity_{end}_step_{k}": math.nan for k in ("req_per_s", "ci", "min")}
            )
            continue
        interval = confidence_interval(capacities)
        columns[f"capacity_{end}_step_req_per_s"] = interval[0]
        columns[f"capacity_{end}_step_ci"] = max(interval[ci_side], 0.0)
        columns[f"capacity_{end}_step_min"] = min(capacities)
    columns["capacity_fast_step_ci_high"] = columns.pop("capacity_fast_step_ci")
    columns["capacity_slow_step_ci_low"] = columns.pop("capacity_slow_step_ci")
    return columns
