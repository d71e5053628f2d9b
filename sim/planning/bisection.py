"""The bisection of one capacity search: one configuration, one replicate, one step-time factor.

Runs in a worker (`sim.planning.executor.map_tasks`) and returns plain data. The search and its
worked example are described in `sim.planning.capacity`: probe the start scale, double (or
halve) to bracket [good, bad), then bisect until `(bad - good) / good <= tolerance`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from sim.planning.executor import run_point
from sim.planning.grid import scenario_key
from sim.planning.replicates import closed_loop
from sim.planning.slo import Slo, check_slos
from sim.scenario.schema import scenario_from_dict


def search_capacity(
    scenario_data: dict[str, Any],
    slo_pairs: list[tuple[str, float]],
    tolerance: float,
    start_scale: float,
    min_scale: float,
    max_scale: float,
    labels: dict[str, Any],
    step_time_factor: float = 1.0,
) -> dict[str, Any]:
    """Bisection for one configuration and replicate (runs in a worker; returns plain data)."""
    slos = [Slo(m, v) for m, v in slo_pairs]
    probes: list[dict[str, Any]] = []
    probe = partial(_probe, scenario_data, slos, labels, step_time_factor, probes)
    good, bad = _bracket(probe, start_scale, min_scale, max_scale)
    status = "ok"
    if good is None:
        status = _never_passes(probes, slos, min_scale)
    elif bad is None:
        status = f"passes at the maximum scale {max_scale:g} (capacity is at least this)"
    else:
        good, bad = _bisect(probe, good, bad, tolerance)
    base_rate = _base_rate(probes)
    rate = (good or 0.0) * base_rate
    if closed_loop(scenario_from_dict(scenario_data).workload):
        rate, status = measured_capacity(probes, good, status, max_scale)
    return {
        **labels,
        "step_time_factor": step_time_factor,
        "status": status,
        "capacity_scale": good if good is not None else 0.0,
        "bracket_high_scale": bad,
        "base_rate_req_per_s": base_rate,
        "capacity_rate_req_per_s": rate,
        "num_probes": len(probes),
        "probes": probes,
    }


def _probe(
    scenario_data: dict[str, Any],
    slos: list[Slo],
    labels: dict[str, Any],
    step_time_factor: float,
    probes: list[dict[str, Any]],
    scale: float,
) -> bool:
    """Run the scenario at rate scale `scale`; its row (SLO verdict and labels added) is
    appended to `probes`, the search's record. True when every SLO holds."""
    data = {**scenario_data, "workload": {**scenario_data["workload"], "rate_scale": scale}}
    row = run_point(data, {}, scenario_key(data), len(probes), step_time_factor)
    reason = check_slos(row, slos)
    row.update(
        labels,
        step_time_factor=step_time_factor,
        rate_scale=scale,
        passed=reason is None,
        reason=reason,
    )
    probes.append(row)
    return reason is None


def _bracket(
    probe: Callable[[float], bool], start_scale: float, min_scale: float, max_scale: float
) -> tuple[float | None, float | None]:
    """[good, bad): probe the start scale, then double while it passes (or halve while it
    fails) until one passes and one fails. None on a side the scale bounds never reached:
    good None, nothing passes down to `min_scale`; bad None, everything passes up to
    `max_scale`."""
    good = bad = None
    scale = start_scale
    if probe(scale):
        good = scale
        while bad is None and scale * 2 <= max_scale:
            scale *= 2
            if probe(scale):
                good = scale
            else:
                bad = scale
    else:
        bad = scale
        while good is None and scale / 2 >= min_scale:
            scale /= 2
            if probe(scale):
                good = scale
            else:
                bad = scale
    return good, bad


def _bisect(
    probe: Callable[[float], bool], good: float, bad: float, tolerance: float
) -> tuple[float, float]:
    """Halve the bracket [good, bad) until ``(bad - good) / good <= tolerance``. Example (the
    D/D/1 scenario of `sim.planning.capacity`, threshold scale 2.0102, tolerance 0.01, [2, 4)):
    probes 3, 2.5, 2.25, 2.125, 2.0625, 2.03125 and 2.015625 all fail -> [2, 2.015625)."""
    while (bad - good) / good > tolerance:
        mid = (good + bad) / 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    return good, bad


def _base_rate(probes: list[dict[str, Any]]) -> float:
    """The scale-1 rate: the first probe's offered rate divided by its scale (the same for
    all, open loop; closed loop it falls with the scale, see `measured_capacity`); NaN when no
    probe offered a rate."""
    rates = [
        p["offered_rate_req_per_s"] / p["rate_scale"]
        for p in probes
        if p.get("offered_rate_req_per_s")
    ]
    return rates[0] if rates else math.nan


#: How a closed-loop capacity reads (a status prefix; the capacity table's note explains it).
CLOSED_LOOP_STATUS = "closed loop, rate measured at the passing probe"


def measured_capacity(
    probes: list[dict[str, Any]], good: float | None, status: str, max_scale: float
) -> tuple[float, str]:
    """A closed-loop search's answer: the arrival rate MEASURED at the highest passing probe.

    A closed-loop turn arrives a think time after its previous turn finished, so dividing
    arrival and think times by k does not multiply the offered rate by k: the service time in
    the loop does not shrink. Example (`scenarios/sessions_chat_v1.yaml`, TTFT p99 <= 2 s):
    every scale up to 64 passes, offering 3.25 req/s at scale 1 and 6.90 at 64; "64 x 3.25" =
    208 req/s was never offered, the answer is 6.90. When even the largest scale passes, the
    load is bounded by the number of sessions, not the rate: more load needs more sessions.
    """
    if good is None:
        return 0.0, status
    passing = [p for p in probes if p["passed"] and p["rate_scale"] == good]
    rate = float(passing[-1]["offered_rate_req_per_s"])
    if status.startswith("passes at the maximum scale"):
        status = (
            f"passes at the maximum scale {max_scale:g}: the sessions bound the load "
            "(more load needs more workload.sessions.num_sessions)"
        )
    return rate, f"{CLOSED_LOOP_STATUS}; {status}"


def _never_passes(probes: list[dict[str, Any]], slos: list[Slo], min_scale: float) -> str:
    """Why no rate passes: the last (lowest) probe's reason, and whether load is to blame.

    A latency that does not fall as the rate falls is set by the requests themselves (prompts
    too long to prefill within the SLO, or many requests stamped with the same arrival time,
    which rate scaling cannot pull apart: the Mooncake traces use 3 s buckets), not by the
    load, so no replica count meets that SLO. Example: TTFT p99 16.3 s at scale 0.25 and at
    0.0156, against 2 s -> "... ttft_p99 barely falls with the rate (16.3s at scale 0.25, 16.3s
    at 0.015625): the requests themselves ... break this SLO at any load".
    """
    first, last = probes[0], probes[-1]
    text = f"fails at the minimum scale {min_scale:g}: {last['reason']}"
    for slo in slos:
        high, low = first.get(slo.column), last.get(slo.column)
        if high is None or low is None or math.isnan(high) or math.isnan(low):
            continue
        if low > slo.limit_s and low >= 0.9 * high:
            return (
                f"{text}, and {slo.metric} barely falls with the rate ({high:.3g}s at scale "
                f"{first['rate_scale']:g}, {low:.3g}s at {last['rate_scale']:g}): the requests "
                "themselves (long prompts, simultaneous arrivals) break this SLO at any load"
            )
    return text
