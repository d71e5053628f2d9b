"""How many GPUs, co-located or disaggregated, with which router, serve a load under p99 SLOs.

`gpus_needed` runs the scenario's synthetic workload at the target arrival rate on 1, 2, ...
replicas' worth of GPUs: at each count N (replicas x the scenario's TP), the co-located
cluster of N replicas under each router asked for, and every prefill/decode split P + D = N
(under the scenario's router), until each (mode, router) has a shape that meets the SLO (every
request finished, TTFT p99 and TPOT p99 within their limits) or `max_gpus` is reached. The
answer per (mode, router) is the smallest N with a passing shape (and, for disaggregated, the
split with the lowest TPOT p99 among the passing ones at that N).

The shapes of one GPU count run in parallel (`sim.planning.executor.map_tasks`: local
processes, or a Dask cluster); the counts run one after another, because whether N + 1 is
needed depends on N. Rows come back in the order the shapes were listed, so the table is the
same whatever the number of workers.

Example (the crossover benchmark's workload at 24 req/s, TTFT p99 <= 1 s, TPOT p99 <=
15 ms): 4 co-located GPUs miss the TPOT target (17.4 ms), 2P+2D meets it (13.6 ms), so the
disaggregated answer is 4 GPUs and the co-located one needs more (see `kvsim
cluster-capacity`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from sim.cluster.compare import Slo, at_rate, cluster_metrics, meets_slo
from sim.cluster.config import ClusterMode
from sim.errors import InputError
from sim.planning.executor import map_tasks
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario, scenario_from_dict

#: The routers `engine.router` accepts, in the order the CLI lists them.
ROUTERS = (
    "round_robin",
    "least_outstanding",
    "least_kv_usage",
    "prefix_cache_aware",
    "session_affinity",
)


@dataclass(frozen=True, slots=True)
class GpuAnswer:
    """The smallest passing shape of one (mode, router) (None: nothing up to `max_gpus`)."""

    mode: str
    router: str
    num_gpus: int | None
    shape: str | None


def check_routers(routers: list[str]) -> list[str]:
    """`routers` if each is a known router and none repeats; else the `--routers` error naming
    the culprit: ["bogus", "round_robin"] -> "unknown router 'bogus' (known: ...)"."""
    given = f"--routers {','.join(routers)}"
    if any(not r for r in routers):
        raise InputError(f"{given}: an empty name (routers are comma-separated names)")
    unknown = [r for r in routers if r not in ROUTERS]
    if unknown:
        names = ", ".join(repr(r) for r in unknown)
        plural = "s" if len(unknown) > 1 else ""
        raise InputError(f"{given}: unknown router{plural} {names} (known: {', '.join(ROUTERS)})")
    repeated = sorted({r for r in routers if routers.count(r) > 1}, key=routers.index)
    if repeated:
        raise InputError(f"{given}: {', '.join(repeated)} is given twice; give distinct names")
    return list(routers)


def _shapes(scenario: Scenario, num_replicas: int, routers: list[str]) -> list[Scenario]:
    """The co-located cluster of `num_replicas` replicas under each router, then every P + D
    split of them (under the scenario's router)."""
    shapes = [
        apply_overrides(
            scenario,
            {
                "engine.num_replicas": num_replicas,
                "engine.router": router,
                "cluster.mode": "co-located",
            },
        )
        for router in routers
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


def _key(scenario: Scenario) -> tuple[str, str]:
    mode = "disaggregated" if scenario.cluster.mode is ClusterMode.DISAGGREGATED else "co-located"
    return mode, scenario.engine.router


def evaluate_shape(scenario_data: dict[str, Any], base_dir: str) -> dict[str, Any]:
    """One shape's comparison row, with its router (runs in a worker: plain data in and out)."""
    scenario = scenario_from_dict(scenario_data, "cluster capacity shape")
    return {"router": scenario.engine.router, **cluster_metrics(scenario, base_dir)}


def gpus_needed(
    scenario: Scenario,
    rate_per_s: float,
    slo: Slo,
    max_gpus: int,
    base_dir: str = ".",
    *,
    routers: list[str] | None = None,
    workers: int | None = None,
    cluster: Any = None,
) -> tuple[pd.DataFrame, list[GpuAnswer]]:
    """Every shape evaluated (one row each, in order) and the answer per (mode, router).

    routers: the co-located routers to compare (default: the scenario's own). workers / cluster:
    as `sim.sweep` (local processes, 1 = in this process; or a Dask address or client).
    """
    if scenario.workload.kind != "synthetic":
        raise InputError(
            "workload.kind: cluster capacity sets the arrival rate of a synthetic workload "
            f"(got {scenario.workload.kind!r})"
        )
    # Checked here, in the options' own words: `at_rate` would report the scenario key
    # (workload.arrival.rate_per_s) that --rate becomes.
    if not (math.isfinite(rate_per_s) and rate_per_s > 0):
        raise InputError(f"--rate {rate_per_s:g}: must be a positive, finite number (req/s)")
    if max_gpus < 1:
        raise InputError(f"--max-gpus {max_gpus}: must be at least 1")
    routers = check_routers(routers) if routers else [scenario.engine.router]
    scenario = at_rate(scenario, rate_per_s)
    keys = [("co-located", r) for r in routers] + [("disaggregated", scenario.engine.router)]
    tp = scenario.hardware.tensor_parallel_size
    rows: list[dict] = []
    found: dict[tuple[str, str], GpuAnswer] = {}
    for num_replicas in range(1, max_gpus // tp + 1):
        # Only the (mode, router) pairs still without an answer are run at this count.
        shapes = [s for s in _shapes(scenario, num_replicas, routers) if _key(s) not in found]
        tasks = [(s.model_dump(mode="json"), base_dir) for s in shapes]
        passing: dict[tuple[str, str], list[dict]] = {}
        for row in map_tasks(evaluate_shape, tasks, workers=workers, cluster=cluster):
            row["meets_slo"] = meets_slo(row, slo)
            rows.append(row)
            if row["meets_slo"]:
                passing.setdefault((row["mode"], row["router"]), []).append(row)
        for key, candidates in passing.items():
            best = min(candidates, key=lambda r: (r["tpot_p99_s"], r["shape"]))
            found[key] = GpuAnswer(key[0], key[1], best["num_gpus"], best["shape"])
        if len(found) == len(keys):
            break
    answers = [found.get(key, GpuAnswer(key[0], key[1], None, None)) for key in keys]
    return pd.DataFrame(rows), answers


def answers_frame(answers: list[GpuAnswer]) -> pd.DataFrame:
    """The answers as a table: mode, router, num_gpus (None: not reached), shape."""
    return pd.DataFrame.from_records(
        [(a.mode, a.router, a.num_gpus, a.shape) for a in answers],
        columns=["mode", "router", "num_gpus", "shape"],
    )
