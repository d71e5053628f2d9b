"""Capacity under SLOs: the highest arrival rate one replica sustains, by bisection.

The search scales the workload's arrival rate (`workload.rate_scale`, arrivals divided by k)
and runs one replica (`engine.num_replicas` forced to 1) at each probe. A probe PASSES when
the run ended cleanly (no fatal engine error, nothing aborted) and every SLO holds, e.g.
``ttft_p99_s <= 2`` and ``tpot_p99_s <= 0.1``. Auditor violations are reported, not failed.

Search (assuming pass/fail is monotone in the rate): probe the start scale; double until a
probe fails (or halve until one passes) to bracket [good, bad); then bisect until
``(bad - good) / good <= tolerance``. The answer is `good`, a LOWER bound within the stated
relative tolerance of the true threshold. Rates are the offered rates of the scaled workload:
``(n - 1) / arrival span`` (see `sim.planning.executor.offered_rate`).

Worked example (the D/D/1 scenario of tests/test_capacity.py): 200 requests every 20 ms
(50 req/s), each served alone in one 10 ms step, so TTFT_i = 10 ms + i * (10 ms - 1/rate)
once rate > 100 req/s. numpy's p99 of i in 0..199 is i = 197.01; with ttft_p99 <= 20 ms:
10 ms - 1/rate <= 10 ms / 197.01 -> rate* = 100.51 req/s (scale 2.0102). With tolerance 0.01
the search brackets it as [good, bad) = [2.0, 2.015625) x 50 req/s.

Replicates (seeds, or trace windows via `replicates=`) give a spread: the mean and a 95 %
Student-t confidence interval of the per-replicate capacities. Replicas for a target rate R:
``ceil(R / capacity)`` using the worst replicate (conservative; with two or three replicates
the t-interval's low end is often near zero) and the mean; this assumes the router splits the
load evenly, which round robin does only on average.

Step-time band: the step-time model says how sure it is (`sim.latency.band`), e.g. the roofline
runs whole steps up to 40% fast, so its band is x1.00-x1.67. Each search is repeated with every
step time multiplied by the band's low and high factors (a factor already searched, e.g. 1.0, is
not searched twice), giving the capacity at a fast, the central and a slow step time, each over
the same replicates. Example (the D/D/1 scenario above, band x0.8-x1.5): 8 / 10 / 15 ms steps
give thresholds 1 / (step - (20 ms - step) / 197.01) = 125.96 / 100.51 / 66.78 req/s.
A planner reads the slow-step CI low as the conservative answer.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import InputError
from sim.latency.band import StepTimeBand
from sim.planning.band import band_columns, band_factors, model_band
from sim.planning.executor import map_tasks, run_point
from sim.planning.grid import expand_grid, resolved_data, scenario_key, validate_axes
from sim.scenario import ScenarioError

#: SLO metrics: summary columns (seconds).
SLO_METRICS = tuple(f"{m}_{q}" for m in ("ttft", "tpot", "e2e") for q in ("p50", "p99"))
_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
#: Two-sided 95 % Student-t quantiles by degrees of freedom (beyond 30: the normal 1.96).
_T95 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    12: 2.179,
    15: 2.131,
    20: 2.086,
    30: 2.042,
}


@dataclass(frozen=True, slots=True)
class Slo:
    """`metric` (e.g. ttft_p99) at most `limit_s` seconds."""

    metric: str
    limit_s: float

    @property
    def column(self) -> str:
        return f"{self.metric}_s"

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit_s:g}s"


class SloError(InputError):
    """A bad `--slo`, seed list, tolerance or target rate (one line, exit 2 at the CLI)."""


def parse_duration_s(text: str) -> float:
    """'2s' -> 2.0, '100ms' -> 0.1, '250us' -> 0.00025 (seconds); the unit is required.

    A bare number is refused: `tpot_p99=100` could mean 100 ms as easily as 100 s.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us)?\s*", text)
    if match is None:
        raise SloError(f"{text!r}: expected a duration like 2s, 100ms or 250us")
    if match.group(2) is None:
        raise SloError(
            f"{text!r}: a duration needs a unit (s, ms or us), e.g. {match.group(1)}ms "
            f"or {match.group(1)}s"
        )
    return float(match.group(1)) * _UNITS_S[match.group(2)]


def parse_slo(text: str) -> Slo:
    """'ttft_p99=2s' -> Slo('ttft_p99', 2.0)."""
    metric, sep, value = text.partition("=")
    metric = metric.strip().removesuffix("_s")
    if not sep:
        raise SloError(f"--slo {text!r}: expected METRIC=DURATION, e.g. ttft_p99=2s")
    if metric not in SLO_METRICS:
        raise SloError(
            f"--slo {text!r}: unknown metric '{metric}' (one of {', '.join(SLO_METRICS)})"
        )
    try:
        limit_s = parse_duration_s(value)
    except SloError as error:
        raise SloError(f"--slo {error}") from None
    if limit_s <= 0:
        raise SloError(f"--slo {text!r}: the limit must be positive")
    return Slo(metric, limit_s)


def as_slos(slos: Any) -> list[Slo]:
    """Slo objects from ['ttft_p99=2s'], {'ttft_p99': '2s'} / {'ttft_p99_s': 2.0}, or Slo objects.

    A number (no unit) is accepted only under a key that names its unit (`ttft_p99_s`).
    """
    if isinstance(slos, dict):
        slos = [_slo_item(k, v) for k, v in slos.items()]
    result = [s if isinstance(s, Slo) else parse_slo(s) for s in slos]
    for slo in result:
        if slo.metric not in SLO_METRICS:
            raise SloError(f"unknown SLO metric '{slo.metric}' (one of {', '.join(SLO_METRICS)})")
    if not result:
        raise SloError("give at least one SLO, e.g. --slo ttft_p99=2s")
    return result


def _slo_item(key: str, value: Any) -> str | Slo:
    if isinstance(value, str):
        return f"{key}={value}"
    if not key.endswith("_s"):
        raise SloError(
            f"SLO {key}: {value!r} has no unit; give a string ('{value}ms' or '{value}s') "
            f"or name the unit in the key ({key}_s)"
        )
    return Slo(key.removesuffix("_s"), float(value))


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2] (the `--seeds` option)."""
    seeds = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            seed = int(item)
        except ValueError:
            raise SloError(f"--seeds {text!r}: {item.strip()!r} is not an integer") from None
        if seed < 0:
            raise SloError(f"--seeds {text!r}: seeds must be >= 0, got {seed}")
        seeds.append(seed)
    if not seeds:
        raise SloError(f"--seeds {text!r}: give at least one seed, e.g. --seeds 0,1,2")
    return seeds


def check_slos(row: dict[str, Any], slos: list[Slo]) -> str | None:
    """None when the probe passes, else why it failed (first reason)."""
    if row.get("error"):
        return f"error: {row['error']}"
    if row.get("fatal_error"):
        return f"fatal engine error: {row['fatal_error']}"
    if row.get("num_aborted"):
        return f"{row['num_aborted']} requests aborted"
    for slo in slos:
        value = row.get(slo.column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return f"{slo.metric} undefined (no finished request with it)"
        if value > slo.limit_s:
            return f"{slo.metric} {value:.4g}s > {slo.limit_s:g}s"
    return None


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

    def probe(scale: float) -> bool:
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
    status = "ok"
    if good is None:
        status = _never_passes(probes, slos, min_scale)
    elif bad is None:
        status = f"passes at the maximum scale {max_scale:g} (capacity is at least this)"
    else:
        while (bad - good) / good > tolerance:
            mid = (good + bad) / 2
            if probe(mid):
                good = mid
            else:
                bad = mid
    # Scale 1 rate: every probe's offered rate divided by its scale (the same for all).
    rates = [
        p["offered_rate_req_per_s"] / p["rate_scale"]
        for p in probes
        if p.get("offered_rate_req_per_s")
    ]
    base_rate = rates[0] if rates else math.nan
    return {
        **labels,
        "step_time_factor": step_time_factor,
        "status": status,
        "capacity_scale": good if good is not None else 0.0,
        "bracket_high_scale": bad,
        "base_rate_req_per_s": base_rate,
        "capacity_rate_req_per_s": (good or 0.0) * base_rate,
        "num_probes": len(probes),
        "probes": probes,
    }


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


def confidence_interval(
    values: list[float], level_t: dict[int, float] = _T95
) -> tuple[float, float, float]:
    """(mean, low, high) of a 95 % Student-t interval; one value gives (v, v, v).

    Example: [100, 110, 120] -> mean 110, sd 10, t(2) = 4.303 -> 110 +- 4.303 * 10 / sqrt(3)
    = (110, 85.16, 134.84).
    """
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    df = len(values) - 1
    t = next((level_t[k] for k in sorted(level_t) if k >= df), 1.96)
    half = t * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def capacity_search(
    scenario,
    slos,
    *,
    target_rate: float | None = None,
    seeds: list[int] | tuple[int, ...] = (0,),
    replicates: list[dict[str, Any]] | None = None,
    compare: dict[str, list[Any]] | None = None,
    overrides: dict[str, Any] | None = None,
    tolerance: float = 0.05,
    start_scale: float | None = None,
    min_scale: float = 1 / 64,
    max_scale: float = 64.0,
    workers: int | None = None,
    cluster: Any = None,
    base_dir: str | Path | None = None,
    on_result=None,
    band: StepTimeBand | None = None,
    band_ends: bool = True,
    on_total=None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Capacity table (one row per compared configuration) and every probe run.

    `replicates` (override dicts, e.g. trace windows) replaces `seeds` (each seed s is the
    replicate {"seed": s}; a trace's arrivals do not depend on the seed, so use windows there).
    `band`: the step-time band to search the ends of (default: each configuration's model's own);
    `band_ends=False` searches the central step time only (the band's columns are then NaN).
    `on_total(n)` is called once with the number of searches before they start.
    """
    from sim.overrides import apply_overrides
    from sim.planning import load_base

    if not 0 < tolerance < 1:
        raise SloError(f"--tolerance {tolerance}: must be in (0, 1) (relative)")
    if target_rate is not None and not target_rate > 0:
        raise SloError(f"--target-rate {target_rate}: must be positive")
    slo_list = as_slos(slos)
    base, base_path = load_base(scenario, base_dir)
    base = apply_overrides(base, {**(overrides or {}), "engine.num_replicas": 1})
    start = start_scale if start_scale is not None else base.workload.rate_scale
    compare = {k: list(v) for k, v in (compare or {}).items()}
    validate_axes(base, compare)
    reps = replicates if replicates is not None else [{"seed": int(s)} for s in seeds]
    if not reps:
        raise SloError("give at least one seed or replicate")
    configs = expand_grid(compare)
    tasks = []
    bands = []
    pairs = [(s.metric, s.limit_s) for s in slo_list]
    for c, config in enumerate(configs):
        config_tasks = []
        for r, rep in enumerate(reps):
            try:
                data = resolved_data(base, {**config, **rep}, base_path)
            except ScenarioError as error:
                raise ScenarioError(f"{_label(config) or 'replicate'} {rep}: {error}") from None
            labels = {
                "config": _label(config),
                "config_index": c,
                "replicate": r,
                "replicate_label": _label(rep),
                **config,
            }
            config_tasks.append((data, pairs, tolerance, start, min_scale, max_scale, labels))
        bands.append(band or model_band(config_tasks[0][0], _label(config)))
        for factor in band_factors(bands[-1]) if band_ends else (1.0,):
            tasks += [(*task, factor) for task in config_tasks]
    if on_total is not None:
        on_total(len(tasks))
    results = map_tasks(
        search_capacity, tasks, workers=workers, cluster=cluster, on_result=on_result
    )
    if any(math.isinf(res["base_rate_req_per_s"]) for res in results):
        raise ScenarioError(
            f"{base.name}: every request arrives at the same instant, so the workload has no "
            "arrival rate to scale; capacity needs arrivals spread over time (a trace or a "
            "synthetic arrival process)"
        )
    probes = pd.DataFrame.from_records([p for res in results for p in res["probes"]])
    rows = []
    for c, config in enumerate(configs):
        mine = [r for r in results if r["config_index"] == c and r["step_time_factor"] == 1.0]
        capacities = [res["capacity_rate_req_per_s"] for res in mine]
        mean, low, high = confidence_interval(capacities)
        low = max(low, 0.0)  # a capacity is never negative; few replicates give wide intervals
        row = {"config": _label(config), **config, "num_replicates": len(mine)}
        # The exact vLLM version the probes modelled ("0.5.4", "0.33.0"; `sim.kv.v0_versions`).
        versions = {p.get("vllm_version") for res in mine for p in res["probes"]}
        row["vllm_version"] = ", ".join(sorted(v for v in versions if v)) or None
        row.update(
            capacity_rate_req_per_s=mean,
            capacity_ci_low=low,
            capacity_ci_high=high,
            capacity_min=min(capacities),
            capacity_max=max(capacities),
            capacity_scale_mean=statistics.fmean(r["capacity_scale"] for r in mine),
            tolerance=tolerance,
            slos=", ".join(map(str, slo_list)),
            num_probes=sum(r["num_probes"] for r in mine),
            status="; ".join(sorted({r["status"] for r in mine})),
        )
        row.update(band_columns(results, c, bands[c], band_ends))
        if target_rate is not None:
            row["target_rate_req_per_s"] = target_rate
            row["replicas_needed"] = _replicas(target_rate, min(capacities))
            row["replicas_needed_at_mean"] = _replicas(target_rate, mean)
            slow = row["capacity_slow_step_min"]
            row["replicas_needed_slow_step"] = (
                _replicas(target_rate, slow) if not math.isnan(slow) else math.nan
            )
        rows.append(row)
    return pd.DataFrame.from_records(rows), probes


def _replicas(target: float, per_replica: float) -> float:
    """ceil(target / per-replica capacity); NaN when one replica sustains nothing."""
    return float(math.ceil(target / per_replica - 1e-9)) if per_replica > 0 else math.nan


def _label(config: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in config.items())


def capacity(scenario, slos, **kwargs) -> pd.DataFrame:
    """`capacity_search`'s table; the probes are in `table.attrs["probes"]` (a DataFrame)."""
    table, probes = capacity_search(scenario, slos, **kwargs)
    table.attrs["probes"] = probes
    return table


def write_capacity(table: pd.DataFrame, probes: pd.DataFrame, out_dir: str | Path) -> Path:
    from sim.planning.executor import write_table

    out = Path(out_dir)
    clean = table.copy()
    clean.attrs = {}
    write_table(clean, out, "capacity")
    write_table(_textify(probes), out, "probes")
    return out


def _textify(frame: pd.DataFrame) -> pd.DataFrame:
    """Object columns of mixed types -> text, so Parquet accepts them."""
    frame = frame.copy()
    for name in frame.columns:
        if frame[name].dtype == object and len({type(v) for v in frame[name] if v is not None}) > 1:
            frame[name] = frame[name].map(lambda v: v if v is None else str(v))
    return frame
