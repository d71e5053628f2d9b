"""Co-located vs disaggregated on one workload: the same metrics for either kind of run.

`cluster_metrics(scenario)` runs the scenario (co-located through `sim.engine.run.run`,
disaggregated through `sim.cluster.run`) and returns one flat row: the cluster's shape and GPU
count, TTFT and TPOT percentiles, throughput, and for a disaggregated run the KV transfer cost
(bytes and time per request, and its share of TTFT). `meets_slo` says whether a row meets
p99 latency targets; `max_rate_meeting_slo` is the highest swept rate that does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sim.cluster.config import ClusterMode
from sim.cluster.run import num_gpus, run_disaggregated
from sim.engine.run import run
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario


@dataclass(frozen=True, slots=True)
class Slo:
    """p99 latency targets, e.g. Slo(ttft_p99_s=1.0, tpot_p99_s=0.05)."""

    ttft_p99_s: float
    tpot_p99_s: float


def shape_of(scenario: Scenario) -> str:
    """'4 co-located' or '1P+3D' (replicas; TP shown when above 1: '1P(tp2)+2D')."""
    cluster = scenario.cluster
    tp = scenario.hardware.tensor_parallel_size
    if cluster.mode is ClusterMode.CO_LOCATED:
        suffix = f" (tp{tp})" if tp > 1 else ""
        return f"{scenario.engine.num_replicas} co-located{suffix}"
    parts = []
    for letter, pool in (("P", cluster.prefill), ("D", cluster.decode)):
        pool_tp = pool.tp or tp
        parts.append(f"{pool.replicas}{letter}" + (f"(tp{pool_tp})" if pool_tp > 1 else ""))
    return "+".join(parts)


def cluster_metrics(scenario: Scenario, base_dir: str = ".") -> dict:
    """Run `scenario` and return its comparison row (latencies in seconds)."""
    row: dict = {"shape": shape_of(scenario), "num_gpus": num_gpus(scenario)}
    if scenario.cluster.mode is ClusterMode.DISAGGREGATED:
        summary = run_disaggregated(scenario, base_dir).summary
        row["mode"] = "disaggregated"
    else:
        summary = run(scenario, base_dir=base_dir).summary
        row["mode"] = "co-located"
    for key in (
        "ttft_p50_s",
        "ttft_p99_s",
        "tpot_p50_s",
        "tpot_p99_s",
        "throughput_tok_per_s",
        "throughput_req_per_s",
        "num_violations",
    ):
        row[key] = summary[key]
    row["num_finished"] = summary["states"]["finished"]
    row["num_requests"] = summary["num_requests"]
    for key in (
        "kv_bytes_mean",
        "transfer_s_mean",
        "transfer_s_p99",
        "transfer_share_of_ttft_mean",
    ):
        row[key] = summary.get(key, math.nan)
    return row


def meets_slo(row: dict, slo: Slo) -> bool:
    """Every request finished and both p99 targets met."""
    return (
        row["num_finished"] == row["num_requests"]
        and row["ttft_p99_s"] <= slo.ttft_p99_s
        and row["tpot_p99_s"] <= slo.tpot_p99_s
    )


def at_rate(scenario: Scenario, rate_per_s: float) -> Scenario:
    """The scenario with its synthetic arrival rate set to `rate_per_s`.

    `workload.rate_scale` is reset to 1: it divides every arrival time after the draw, so a
    scenario at rate_scale 2 would otherwise be run at twice the rate asked for.
    """
    return apply_overrides(
        scenario, {"workload.arrival.rate_per_s": rate_per_s, "workload.rate_scale": 1.0}
    )


def max_rate_meeting_slo(rows: list[dict], slo: Slo) -> float | None:
    """The highest `rate_per_s` among `rows` (each with that key) below which every swept
    rate meets `slo`; None if even the lowest does not. Example: rates 2, 4, 6 meeting,
    meeting, missing -> 4."""
    best = None
    for row in sorted(rows, key=lambda r: r["rate_per_s"]):
        if not meets_slo(row, slo):
            break
        best = row["rate_per_s"]
    return best
