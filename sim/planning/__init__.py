"""Capacity planning: parameter sweeps (`sweep`) and SLO capacity search (`sim.planning.capacity`).

`sim.sweep(...)` is `sweep` below; nothing heavy is imported until it runs.

Example::

    table = sim.sweep("scenarios/azure.yaml",
                      {"scheduler.max_num_seqs": [128, 256], "workload.rate_scale": [1, 2]},
                      out_dir="runs/sweep")      # 4 rows, one per point, in grid order
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

    from sim.scenario.schema import Scenario


def load_base(
    scenario: Scenario | str | Path | dict | None, base_dir: str | Path | None = None
) -> tuple[Scenario, Path]:
    """A scenario object (from an object, a dict, a path, or None for the built-in default)."""
    from sim.engine.run import builtin_scenario_path
    from sim.scenario.schema import Scenario, load_scenario, scenario_from_dict

    if scenario is None:
        scenario = builtin_scenario_path()
    if isinstance(scenario, dict):
        return scenario_from_dict(scenario), Path(base_dir or ".")
    if isinstance(scenario, Scenario):
        return scenario, Path(base_dir or ".")
    path = Path(scenario)
    return load_scenario(path), Path(base_dir or path.parent)


def sweep(
    scenario: Scenario | str | Path | dict | None,
    grid: dict[str, list[Any]] | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    out_dir: str | Path | None = None,
    workers: int | None = None,
    cluster: Any = None,
    resume: bool = True,
    base_dir: str | Path | None = None,
    on_row=None,
) -> pd.DataFrame:
    """Run every point of `grid` (dotted key -> values) and return one summary row per point.

    `overrides` apply to every point first. `out_dir`: write sweep.parquet / sweep.csv there
    and resume from it. `cluster`: a Dask address or Client (default: local processes, which
    `sim.planning.executor.start_method` starts so that a script needs no `__main__` guard on
    Linux; `workers=1` runs in this process).
    """
    from sim.planning.executor import run_points, write_table
    from sim.planning.grid import build_points
    from sim.scenario.overrides import apply_overrides

    base, base_path = load_base(scenario, base_dir)
    if overrides:
        base = apply_overrides(base, overrides)
    points = build_points(base, {k: list(v) for k, v in (grid or {}).items()}, base_path)
    table = run_points(
        points, out_dir=out_dir, workers=workers, cluster=cluster, resume=resume, on_row=on_row
    )
    if out_dir is not None:
        write_table(table, out_dir, "sweep")
    return table


__all__ = ["load_base", "sweep"]
