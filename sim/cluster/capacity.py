"""How many GPUs, co-located or disaggregated, serve a target load under p99 SLOs.

`gpus_needed` runs the scenario's synthetic workload at the target arrival rate on 1, 2, ...
replicas' worth of GPUs: at each count N (replicas x the scenario's TP), the co-located
cluster of N replicas and every prefill/decode split P + D = N, until each mode has a shape
that meets the SLO (every request finished, TTFT p99 and TPOT p99 within their limits) or
`max_gpus` is reached. The answer per mode is the smallest N with a passing shape (and, for
disaggregated, the split with the lowest TPOT p99 among the passing ones at that N).

Example (the crossover benchmark's workload at 24 req/s, TTFT p99 <= 1 s, TPOT p99 <=
15 ms): 4 co-located GPUs miss the TPOT target (17.4 ms), 2P+2D meets it (13.6 ms), so the
disaggregated answer is 4 GPUs and the co-located one needs more (see `kvsim
cluster-capacity`).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from sim.cluster.compare import Slo, at_rate, cluster_metrics, meets_slo
from sim.errors import InputError
from sim.overrides import apply_overrides
from sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class GpuAnswer:
    """The smallest passing shape of one mode (None: nothing up to `max_gpus` passes)."""

    mode: str
    num_gpus: int | None
    shape: str | None


def _shapes(scenario: Scenario, num_replicas: int) -> list[Scenario]:
    """The co-located cluster of `num_replicas` replicas and every P + D split of them."""
    shapes = [
        apply_overrides(
            scenario, {"engine.num_replicas": num_replicas, "cluster.mode": "co-located"}
        )
    ]
    for num_prefill in range(1, num_replicas):
        shapes.append(
            apply_overrides(
                scenario,
                {
                    "cluster.mode": "disaggregated",
                    "cluster.prefill.replicas": num_prefill,
                    "cluster.decode.replicas": num_replicas - num_prefill,
                },
            )
        )
    return shapes


def gpus_needed(
    scenario: Scenario, rate_per_s: float, slo: Slo, max_gpus: int, base_dir: str = "."
) -> tuple[pd.DataFrame, list[GpuAnswer]]:
    """Every shape evaluated (one row each, in order) and the answer per mode."""
    if scenario.workload.kind != "synthetic":
        raise InputError(
            "workload.kind: cluster capacity sets the arrival rate of a synthetic workload "
            f"(got {scenario.workload.kind!r})"
        )
    if rate_per_s <= 0 or max_gpus < 1:
        raise InputError("--rate and --max-gpus must be positive")
    scenario = at_rate(scenario, rate_per_s)
    tp = scenario.hardware.tensor_parallel_size
    rows: list[dict] = []
    found: dict[str, GpuAnswer] = {}
    for num_replicas in range(1, max_gpus // tp + 1):
        passing: dict[str, list[dict]] = {}
        for shape in _shapes(scenario, num_replicas):
            row = cluster_metrics(shape, base_dir)
            if row["mode"] in found:
                continue
            row["meets_slo"] = meets_slo(row, slo)
            rows.append(row)
            if row["meets_slo"]:
                passing.setdefault(row["mode"], []).append(row)
        for mode, candidates in passing.items():
            if mode not in found:
                best = min(candidates, key=lambda r: (r["tpot_p99_s"], r["shape"]))
                found[mode] = GpuAnswer(mode, best["num_gpus"], best["shape"])
        if len(found) == 2:
            break
    answers = [
        found.get(mode, GpuAnswer(mode, None, None)) for mode in ("co-located", "disaggregated")
    ]
    return pd.DataFrame(rows), answers
