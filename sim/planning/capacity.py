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

Worked example (the D/D/1 scenario of tests/planning/test_capacity.py): 200 requests every 20 ms
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

Modules: `sim.planning.slo` (SLOs: parsing and the pass check), `sim.planning.bisection` (one
search), `sim.planning.interval` (the replicates' t-interval), `sim.planning.band` (the band's
ends); this one runs the searches and builds the table.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from sim.cluster.config import ClusterMode
from sim.latency.band import StepTimeBand
from sim.planning.band import band_columns, band_factors, model_band
from sim.planning.bisection import search_capacity
from sim.planning.executor import map_tasks
from sim.planning.grid import expand_grid, resolved_data, scenario_key, validate_axes
from sim.planning.interval import confidence_interval
from sim.planning.replicates import capacity_replicates, check_independent
from sim.planning.slo import (
    SLO_METRICS,
    Slo,
    SloError,
    as_slos,
    check_slos,
    parse_duration_s,
    parse_seeds,
    parse_slo,
)
from sim.scenario.schema import ScenarioError, scenario_from_dict
from sim.workload.load import check_input_files


def capacity_search(
    scenario,
    slos,
    *,
    target_rate: float | None = None,
    seeds: list[int] | tuple[int, ...] | None = None,
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
    replicate {"seed": s}, or {"workload.seed": s} when the workload pins its seed; None: the
    scenario's own seed). Several seeds on a workload that draws nothing (a trace, inline
    requests) are refused, as are two replicates that run the same simulation
    (`sim.planning.replicates`): use trace windows there.
    `band`: the step-time band to search the ends of (default: each configuration's model's own);
    `band_ends=False` searches the central step time only (the band's columns are then NaN).
    `on_total(n)` is called once with the number of searches, after every input is checked and
    before any search starts (the CLI checks and makes its output folder there).
    """
    _check_search_options(tolerance, target_rate)
    slo_list = as_slos(slos)
    base, base_path = _one_replica_base(scenario, overrides, base_dir)
    start = start_scale if start_scale is not None else base.workload.rate_scale
    compare = {k: list(v) for k, v in (compare or {}).items()}
    validate_axes(base, compare, option="--compare")
    if replicates is None:
        replicates = capacity_replicates(base, seeds, list(compare))
    if not replicates:
        raise SloError("give at least one seed or replicate")
    configs = expand_grid(compare)
    pairs = [(s.metric, s.limit_s) for s in slo_list]
    search = (pairs, tolerance, start, min_scale, max_scale)
    tasks, bands = _all_tasks(base, base_path, configs, replicates, search, band, band_ends)
    if on_total is not None:
        on_total(len(tasks))
    results = map_tasks(
        search_capacity, tasks, workers=workers, cluster=cluster, on_result=on_result
    )
    _check_arrival_rate(base.name, results)
    probes = pd.DataFrame.from_records([p for res in results for p in res["probes"]])
    rows = [
        _config_row(results, c, config, tolerance, slo_list, bands[c], band_ends, target_rate)
        for c, config in enumerate(configs)
    ]
    return pd.DataFrame.from_records(rows), probes


def _check_search_options(tolerance: float, target_rate: float | None) -> None:
    """Refuse a tolerance outside (0, 1) or a target rate that is not a positive, finite
    number, before anything is read."""
    if not 0 < tolerance < 1:
        raise SloError(f"--tolerance {tolerance}: must be in (0, 1) (relative)")
    if target_rate is not None and not (math.isfinite(target_rate) and target_rate > 0):
        raise SloError(f"--target-rate {target_rate:g}: must be a positive, finite number")


def _config_row(
    results: list[dict],
    c: int,
    config: dict[str, Any],
    tolerance: float,
    slo_list: list[Slo],
    band: StepTimeBand,
    band_ends: bool,
    target_rate: float | None,
) -> dict[str, Any]:
    """The capacity table's row of configuration `c`: its capacity over the replicates, the
    band's columns and, given a target rate, the replicas it needs."""
    row = _capacity_row(results, c, config, tolerance, slo_list)
    row.update(band_columns(results, c, band, band_ends))
    if target_rate is not None:
        row.update(_replicas_columns(target_rate, row))
    return row


def _one_replica_base(scenario, overrides: dict[str, Any] | None, base_dir: str | Path | None):
    """The scenario every probe starts from, and the folder its paths are relative to: the
    overrides applied and one replica forced (capacity is per replica). A disaggregated
    scenario is refused here, since every probe of it would be an error row."""
    from sim.planning import load_base
    from sim.scenario.overrides import apply_overrides

    base, base_path = load_base(scenario, base_dir)
    base = apply_overrides(base, {**(overrides or {}), "engine.num_replicas": 1})
    if base.cluster.mode is ClusterMode.DISAGGREGATED:  # every probe would be an error row
        raise ScenarioError(
            f"{base.name}: cluster.mode: disaggregated; capacity searches one co-located "
            "replica: use kvsim cluster-capacity for prefill/decode pools"
        )
    return base, base_path


def _all_tasks(
    base,
    base_path,
    configs: list[dict[str, Any]],
    reps: list[dict[str, Any]],
    search: tuple,
    band: StepTimeBand | None,
    band_ends: bool,
) -> tuple[list[tuple], list[StepTimeBand]]:
    """Every search to run, configuration by configuration, each replicate at the central
    step time and (`band_ends`) at the step-time band's ends, with each configuration's band
    (`band`, or its model's own); refused before any runs where two compared configurations
    would run one simulation."""
    tasks: list[tuple] = []
    bands = []
    for c, config in enumerate(configs):
        config_tasks = _config_tasks(base, base_path, c, config, reps, search)
        bands.append(band or model_band(config_tasks[0][0], _label(config)))
        for factor in band_factors(bands[-1]) if band_ends else (1.0,):
            tasks += [(*task, factor) for task in config_tasks]
    _check_configs_independent(configs, tasks)
    return tasks, bands


def _check_arrival_rate(name: str, results: list[dict]) -> None:
    """A workload whose requests all arrive at once has no rate to scale (its base rate is
    infinite): bad input, said after the searches found it."""
    if any(math.isinf(res["base_rate_req_per_s"]) for res in results):
        raise ScenarioError(
            f"{name}: every request arrives at the same instant, so the workload has no "
            "arrival rate to scale; capacity needs arrivals spread over time (a trace or a "
            "synthetic arrival process)"
        )


def _config_tasks(
    base, base_path, c: int, config: dict[str, Any], reps: list[dict[str, Any]], search: tuple
) -> list[tuple]:
    """One search per replicate of configuration `c` (`search_capacity`'s arguments but the
    step-time factor; `search`: the SLO pairs, tolerance and scale bounds). Each point is
    resolved and its input files checked before any probe runs (regression: a FIFO trace
    searched to an answer, exit 0), and two replicates that run one simulation are refused."""
    config_tasks = []
    for r, rep in enumerate(reps):
        try:
            data = resolved_data(base, {**config, **rep}, base_path)
        except ScenarioError as error:
            raise ScenarioError(f"{_label(config) or 'replicate'} {rep}: {error}") from None
        check_input_files(scenario_from_dict(data, "capacity").workload, base_path)
        labels = {
            "config": _label(config),
            "config_index": c,
            "replicate": r,
            "replicate_label": _label(rep),
            **config,
        }
        config_tasks.append((data, *search, labels))
    rep_labels = [_label(rep) or f"#{r}" for r, rep in enumerate(reps)]
    check_independent(rep_labels, [task[0] for task in config_tasks], "replicates")
    return config_tasks


def _check_configs_independent(configs: list[dict[str, Any]], tasks: list[tuple]) -> None:
    """Two compared configurations that run one simulation (`--compare seed=0,1` on a pinned
    workload.seed) would be two rows of one answer: refused, comparing each configuration's
    first replicate at the central step time."""
    firsts = [t[0] for t in tasks if t[6]["replicate"] == 0 and t[-1] == 1.0]
    keys = [scenario_key(data) for data in firsts]
    check_independent([_label(c) for c in configs], firsts, "--compare configurations", keys)


def _capacity_row(
    results: list[dict], c: int, config: dict[str, Any], tolerance: float, slo_list: list[Slo]
) -> dict[str, Any]:
    """Configuration `c`'s row at the central step time: the replicates' mean capacity and
    its 95 % interval (never below zero: few replicates give wide intervals), their spread,
    the probes run and the vLLM version they modelled."""
    mine = [r for r in results if r["config_index"] == c and r["step_time_factor"] == 1.0]
    capacities = [res["capacity_rate_req_per_s"] for res in mine]
    mean, low, high = confidence_interval(capacities)
    low = max(low, 0.0)  # a capacity is never negative; few replicates give wide intervals
    row = {"config": _label(config), **config, "num_replicates": len(mine)}
    # The exact vLLM version the probes modelled ("0.5.4", "0.33.0"; `sim.kv.pins`).
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
    return row


def _replicas_columns(target_rate: float, row: dict[str, Any]) -> dict[str, Any]:
    """The replicas a target rate needs at the worst replicate's capacity (conservative), at
    the mean, and at the slow step time's worst (NaN where the band was not searched)."""
    slow = row["capacity_slow_step_min"]
    return {
        "target_rate_req_per_s": target_rate,
        "replicas_needed": _replicas(target_rate, row["capacity_min"]),
        "replicas_needed_at_mean": _replicas(target_rate, row["capacity_rate_req_per_s"]),
        "replicas_needed_slow_step": (
            _replicas(target_rate, slow) if not math.isnan(slow) else math.nan
        ),
    }


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


__all__ = [
    "SLO_METRICS",
    "Slo",
    "SloError",
    "as_slos",
    "capacity",
    "capacity_search",
    "check_slos",
    "confidence_interval",
    "parse_duration_s",
    "parse_seeds",
    "parse_slo",
    "search_capacity",
    "write_capacity",
]
