"""Replicates that are independent, and workloads whose rate is not ours to scale.

Two mistakes a planning command can make with a workload (issue 20, section 7):

* **Replicates that are not independent.** A seed replicate sets the scenario's top-level
  ``seed``, but a workload that pins ``workload.seed`` ignores it (`sim.scenario.resolve.resolve`
  hands the top-level seed down only when the workload names none), and a trace, an inline
  list or sessions inferred from a Mooncake trace draw nothing at all. Three "replicates" are
  then one run three times: a zero-width interval over "3 runs". `seed_replicates` sends each
  seed to the seed the workload actually draws from (``workload.seed`` when pinned) and
  refuses several seeds where nothing is drawn; `check_independent` refuses any two
  replicates (or sweep points) that would run the same simulation.
* **Scaling a quantity that is not linear in the knob.** `workload.rate_scale` divides every
  arrival time (and think time), so an open-loop workload at scale k offers exactly k times
  its scale-1 rate. A closed-loop one does not: a session's next turn arrives a think time
  after the previous turn FINISHED, so the offered rate is capped by the service itself (40
  sessions of `scenarios/sessions_chat_v1.yaml` never offer more than ~6.9 req/s, at any
  scale). `closed_loop` tells the capacity search to report the rate measured at the passing
  probe instead (`sim.planning.bisection`).

Example: ``seed_replicates(pinned_at_7, [0, 1, 2])`` -> ``[{"workload.seed": 0}, ...]``;
``seed_replicates(inline, [0, 1])`` raises "--seeds 0,1: an inline workload's requests are
written in the scenario, so every seed runs the same workload ...".
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sim.planning.slo import SloError
from sim.scenario.schema import Scenario, ScenarioError, scenario_from_dict
from sim.workload.config import WorkloadConfig

_WINDOWS_HINT = (
    "give one seed, or replicate over trace windows "
    "(sim.capacity(replicates=[{'workload.time_range_s': [START, END]}, ...]))"
)


def seed_free(workload: WorkloadConfig) -> str | None:
    """None when the workload draws from its seed; else why no seed changes it (in words).

    Synthetic requests, synthetic sessions and a length-distribution file (``arrival`` given)
    are drawn from the seed; every other workload is read as it is.
    """
    if workload.kind == "synthetic":
        return None
    if workload.kind == "sessions":
        if workload.sessions is not None and workload.sessions.source == "synthetic":
            return None
        return "sessions inferred from a Mooncake trace keep the trace's arrivals and lengths"
    if workload.kind == "trace":
        if workload.arrival is not None:  # a lengths file: arrivals and samples are drawn
            return None
        return "a trace's arrivals and lengths are the file's"
    return "an inline workload's requests are written in the scenario"


def closed_loop(workload: WorkloadConfig) -> bool:
    """Whether arrivals wait on completions (synthetic sessions: a turn follows a think time
    after the previous turn finished), so the offered rate is not linear in the rate scale."""
    sessions = workload.sessions
    return workload.kind == "sessions" and sessions is not None and sessions.source == "synthetic"


def seed_replicates(scenario: Scenario, seeds: Sequence[int] | None) -> list[dict[str, Any]]:
    """One override dict per seed, naming the seed the workload draws from.

    `seeds` None: the scenario's own seed, as written (one replicate). A pinned
    ``workload.seed`` gets ``{"workload.seed": s}``, otherwise ``{"seed": s}``.
    """
    workload = scenario.workload
    pinned = "seed" in workload.model_fields_set
    key = "workload.seed" if pinned else "seed"
    if seeds is None:
        return [{key: workload.seed if pinned else scenario.seed}]
    seeds = [int(s) for s in seeds]
    text = ",".join(map(str, seeds))
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise SloError(
            f"--seeds {text}: seed {repeated[0]} is repeated (replicates must be independent runs)"
        )
    why = seed_free(workload)
    if len(seeds) > 1 and why is not None:
        raise SloError(
            f"--seeds {text}: {why}, so every seed runs the same workload "
            f"({len(seeds)} identical replicates); {_WINDOWS_HINT}"
        )
    return [{key: s} for s in seeds]


SEED_KEYS = ("seed", "workload.seed")


def capacity_replicates(
    scenario: Scenario, seeds: Sequence[int] | None, compare_keys: Sequence[str]
) -> list[dict[str, Any]]:
    """The seed replicates of a capacity search whose `--compare` axes are `compare_keys`.

    A compared seed (``--compare workload.seed=1,2``) is each configuration's own: no seed
    replicate may override it, and `--seeds` with it would set one seed twice.
    """
    compared = [key for key in compare_keys if key in SEED_KEYS]
    if not compared:
        return seed_replicates(scenario, seeds)
    if seeds is not None:
        raise SloError(f"--seeds and --compare {compared[0]} both set the seed: give one of them")
    return [{}]


def simulation_identity(data: dict[str, Any]) -> str:
    """What a run depends on, as canonical JSON: the validated scenario with every default, its
    name left out, and the seed counted only where the workload draws from it.

    Two override sets with the same identity run the same simulation (the top-level ``seed``
    under a pinned ``workload.seed``, or any seed of a trace, changes nothing).
    """
    scenario = scenario_from_dict(data)
    full = scenario.model_dump(mode="json")
    for name in ("name", "description", "expect", "seed"):
        full.pop(name, None)
    workload = scenario.workload
    pinned = "seed" in workload.model_fields_set
    effective = workload.seed if pinned else scenario.seed
    full["workload"]["seed"] = effective if seed_free(workload) is None else None
    return json.dumps(full, sort_keys=True, separators=(",", ":"), default=str)


def check_independent(
    labels: Sequence[str],
    datas: Sequence[dict[str, Any]],
    what: str,
    keys: Sequence[str] | None = None,
) -> None:
    """Refuse two of `datas` (resolved scenarios, named by `labels`) that run the same
    simulation: they would be counted as independent replicates (or points) of one run.

    `keys` (a sweep's `scenario_key`s): two points with one key are already known to be one
    run (a sweep over `description` shares its rows), so only a seed that changed the key
    without reaching the workload is refused.

    Example: "replicates seed=0 and seed=1 run the same simulation: the scenario pins
    workload.seed (7), so seed does not reach the workload; set workload.seed instead".
    """
    seen: dict[str, int] = {}
    for index, data in enumerate(datas):
        identity = simulation_identity(data)
        if identity in seen and (keys is None or keys[seen[identity]] != keys[index]):
            first = seen[identity]
            reason = _why_same(data)
            raise ScenarioError(
                f"{what} {labels[first]} and {labels[index]} run the same simulation"
                + (f": {reason}" if reason else "")
            )
        seen[identity] = index


def _why_same(data: dict[str, Any]) -> str:
    """Why a seed does not reach this scenario's workload ('' if that is not the reason)."""
    scenario = scenario_from_dict(data)
    workload = scenario.workload
    why = seed_free(workload)
    if why is not None:
        return f"{why}, so no seed changes it"
    if "seed" in workload.model_fields_set:
        return (
            f"the scenario pins workload.seed ({workload.seed}), so seed does not reach the "
            "workload; set workload.seed instead"
        )
    return ""
