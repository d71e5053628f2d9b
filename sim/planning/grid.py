"""Sweep grids: `--set KEY=V1,V2` axes, their cartesian product, and the key of each point.

Example: ``--set scheduler.max_num_seqs=128,256 --set workload.rate_scale=1,2`` gives 4 points,
the LAST axis varying fastest (the order of `itertools.product`), so the same grid always gives
the same table rows in the same order::

    0: {max_num_seqs: 128, rate_scale: 1}   1: {128, 2}   2: {256, 1}   3: {256, 2}

A point's key is the SHA-256 of the resolved scenario (overrides applied, relative trace and
profile paths made absolute) as canonical JSON: two points that run the same simulation share a
key, so a re-run sweep skips them, and editing the base scenario invalidates them.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.errors import InputError
from sim.scenario.overrides import apply_overrides, parse_sets
from sim.scenario.schema import Scenario, ScenarioError, scenario_from_dict


@dataclass(frozen=True, slots=True)
class SweepPoint:
    """One grid point: its position, its settings, and the scenario it runs (as plain data)."""

    index: int
    overrides: dict[str, Any]
    key: str
    scenario_data: dict[str, Any]


def expand_grid(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The cartesian product of the axes in the order given (last axis fastest); {} -> [{}]."""
    for key, values in axes.items():
        if not values:
            raise ScenarioError(f"--set {key}: no values")
        if len(set(map(_canonical, values))) != len(values):
            raise ScenarioError(f"--set {key}: a value is repeated: {values}")
    keys = list(axes)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*axes.values())]


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def validate_axes(scenario: Scenario, axes: dict[str, list[Any]], option: str = "--set") -> None:
    """Apply every value of every axis alone, so a bad key or value names that key (and the
    option it was given with, `option`)."""
    for key, values in axes.items():
        for value in values:
            try:
                apply_overrides(scenario, {key: value}, source=f"{option} {key}={value}")
            except ScenarioError as error:
                message = str(error)
                if key not in message:
                    message = f"{option} {key}: {message}"
                raise ScenarioError(message) from None


def _absolute_paths(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """Trace and profile paths made absolute, so workers elsewhere (Dask) find the same files."""
    workload = data.get("workload") or {}
    if workload.get("path") and not Path(workload["path"]).is_absolute():
        workload["path"] = str((base_dir / workload["path"]).resolve())
    for side in ("prompt", "output"):
        dist = ((workload.get("lengths") or {}).get(side)) or {}
        if dist.get("path") and not Path(dist["path"]).is_absolute():
            dist["path"] = str((base_dir / dist["path"]).resolve())
    calibrated = (data.get("step_time") or {}).get("calibrated")
    if isinstance(calibrated, dict) and not Path(calibrated["profile"]).is_absolute():
        calibrated["profile"] = str((base_dir / calibrated["profile"]).resolve())
    return data


def resolved_data(
    scenario: Scenario, overrides: dict[str, Any], base_dir: str | Path
) -> dict[str, Any]:
    """The scenario with `overrides` applied, validated, as JSON-ready data with absolute paths."""
    if overrides:
        scenario = apply_overrides(scenario, overrides)
    data = scenario.model_dump(mode="json", exclude_unset=True)
    return _absolute_paths(data, Path(base_dir))


def scenario_key(data: dict[str, Any]) -> str:
    """SHA-256 (first 16 hex digits) of the validated scenario with every default filled in.

    Hashing the full dump (defaults included) means `{max_num_seqs: 256}` and an omitted
    max_num_seqs (default 256) share a key; the description and name do not change results,
    so they are left out.
    """
    full = scenario_from_dict(data).model_dump(mode="json")
    full.pop("name", None)
    full.pop("description", None)
    full.pop("expect", None)
    return hashlib.sha256(_canonical(full).encode()).hexdigest()[:16]


def build_points(
    scenario: Scenario, axes: dict[str, list[Any]], base_dir: str | Path = "."
) -> list[SweepPoint]:
    """Every grid point of `axes` over `scenario`, validated up front: a bad key, or a point
    that cannot start (`preflight`: what vLLM or kvsim refuses at startup), fails here, before
    any point runs, naming the point's settings.

    Two points that would run the same simulation are refused: `--set seed=0,1` on a workload
    that pins `workload.seed`, or that draws nothing (a trace), is one run under two names.
    """
    from sim.planning.replicates import check_independent

    validate_axes(scenario, axes)
    points = []
    for index, overrides in enumerate(expand_grid(axes)):
        data = resolved_data(scenario, overrides, base_dir)
        check_point(data, overrides, base_dir)
        points.append(SweepPoint(index, overrides, scenario_key(data), data))
    labels = [
        f"{p.index} ({', '.join(f'{k}={v}' for k, v in p.overrides.items())})" for p in points
    ]
    datas = [p.scenario_data for p in points]
    check_independent(labels, datas, "sweep points", [p.key for p in points])
    return points


def check_point(data: dict[str, Any], overrides: dict[str, Any], base_dir: str | Path) -> None:
    """Refuse (ScenarioError) a point that would only become an error row: its startup checks
    (`sim.scenario.resolve.preflight`, no workload loaded) say it cannot run.

    Regression: `kvsim sweep --set scheduler.max_model_len=256,100000` ran point 0, wrote an
    error row for point 1 and exited 0."""
    from sim.scenario.resolve import preflight

    settings = ", ".join(f"{key}={value}" for key, value in overrides.items())
    try:
        preflight(scenario_from_dict(data, "sweep point"), base_dir)
    except InputError as error:
        where = f"sweep point ({settings})" if settings else "sweep"
        raise ScenarioError(f"{where}: {error}".splitlines()[0]) from None


#: parse_sets lives in sim.scenario.overrides (every command's --set); sweep imports it from here too.
__all__ = ["build_points", "expand_grid", "parse_sets", "scenario_key", "validate_axes"]
