"""Run a scenario: the public `sim.run(...)` entry point.

`sim.scenario.resolve.resolve` turns the scenario into concrete numbers (reported in
`RunResult.inputs`); `run` builds the engine from them, runs it and returns its tables.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sim.engine.engine import Engine
from sim.files.tables import FileSink
from sim.kv.config import Design, KVCacheConfig
from sim.latency import band_of, scaled
from sim.output.records import REQUEST_COLUMNS, STEP_COLUMNS, TableSinks
from sim.output.results import RunResult, build_result
from sim.output.sessions import is_session_workload, session_tables
from sim.scenario.resolve import (
    ResolvedRun,
    absolute_step_time_paths,
    resolve,
    step_time_model,
)
from sim.scenario.schema import Scenario, ScenarioError, load_scenario

DEFAULT_SCENARIO = "default.yaml"


def builtin_scenario_path(name: str = DEFAULT_SCENARIO) -> Path:
    """A scenario shipped inside the package (`sim/data/scenarios/`)."""
    return Path(str(resources.files("sim.data").joinpath("scenarios", name)))


def self_contained(scenario: Scenario, base_dir: str | Path) -> Scenario:
    """The scenario with its relative file paths (trace, profile) made absolute from base_dir."""
    base_dir = Path(base_dir).resolve()
    workload = scenario.workload
    if workload.path is not None and not Path(workload.path).is_absolute():
        workload = workload.model_copy(update={"path": str(base_dir / workload.path)})
    sessions = workload.sessions
    if sessions is not None and sessions.path is not None and not Path(sessions.path).is_absolute():
        sessions = sessions.model_copy(update={"path": str(base_dir / sessions.path)})
        workload = workload.model_copy(update={"sessions": sessions})
    step_time = scenario.step_time
    if step_time is not None:
        step_time = absolute_step_time_paths(step_time, base_dir)
    return scenario.model_copy(update={"workload": workload, "step_time": step_time})


def run(
    scenario: Scenario | str | Path | None = None,
    *,
    base_dir: str | Path | None = None,
    progress: Callable[[int, int], None] | None = None,
    overrides: dict[str, Any] | None = None,
    vllm_root: str | Path | None = None,
    step_time_factor: float = 1.0,
    tables_dir: str | Path | None = None,
) -> RunResult:
    """Run a scenario (an object, a path, or None for the built-in default) and return its tables.

    `overrides` are dotted keys applied before validation, e.g. {"cache.num_gpu_blocks": 4096}.
    `step_time_factor` multiplies every step time (capacity runs it at the ends of the model's
    band, `summary["step_time_band"]`); it is recorded in `inputs` when it is not 1.
    `vllm_root` runs vLLM's REAL block manager (an install made by scripts/setup_vllm.sh)
    under the same scheduler and auditor instead of kvsim's model of it.
    `tables_dir`: an existing folder (e.g. the staging folder of `sim.files.outdir`) that the
    `requests` and `steps` tables stream into as Parquet and CSV while the run goes, so they
    are never whole in memory; the result reads them back from there when asked for them.
    `sim.output.results.write_tables(result, tables_dir)` then adds the rest.
    """
    if scenario is None:
        scenario = builtin_scenario_path()
    if isinstance(scenario, (str, Path)):
        path = Path(scenario)
        scenario = load_scenario(path)
        base_dir = base_dir or path.parent
    if overrides:
        from sim.scenario.overrides import apply_overrides

        scenario = apply_overrides(scenario, overrides)
    resolved = resolve(scenario, base_dir or ".")
    if vllm_root is not None:
        resolved = _with_real_manager(resolved, vllm_root)
    inputs = resolved.inputs
    if step_time_factor != 1.0:
        inputs = {**inputs, "step_time_factor": step_time_factor}
    step_time = scaled(resolved.step_time, step_time_factor)
    sinks = None if tables_dir is None else file_sinks(Path(tables_dir))
    engine = Engine(
        resolved.engine, resolved.workload.requests, step_time, progress=progress, sinks=sinks
    )
    records = engine.run()
    inputs = _with_group_peaks(inputs, engine)
    result = build_result(
        records,
        inputs,
        step_time_band=band_of(resolved.step_time).as_dict(),
        tables_dir=None if tables_dir is None else Path(tables_dir),
    )
    if is_session_workload(resolved.workload):
        result.sessions, result.summary["sessions"] = session_tables(
            resolved.workload, result.requests
        )
    return result


def file_sinks(folder: Path) -> TableSinks:
    """The run's tables streamed into `folder` as they are recorded."""
    return TableSinks(
        FileSink(folder, "requests", REQUEST_COLUMNS),
        FileSink(folder, "steps", STEP_COLUMNS),
        spill_to_file=True,
    )


@runtime_checkable
class CountsGroupPeaks(Protocol):
    """A block manager that counts each KV-cache group's peak held blocks (kvsim's V1
    managers, `sim.kv.v1_engine`)."""

    def group_peak_held_blocks(self) -> list[int]: ...


def _with_group_peaks(inputs: dict[str, Any], engine: Engine) -> dict[str, Any]:
    """`inputs` with each KV-cache group's peak held blocks (the most over replicas)."""
    groups = inputs.get("kv_cache_groups")
    if not groups:
        return inputs
    peaks = [0] * len(groups)
    for replica in engine.replicas:
        manager = replica.manager.inner
        if not isinstance(manager, CountsGroupPeaks):  # vLLM's real one (--vllm-root) does not
            return inputs
        peaks = [max(a, b) for a, b in zip(peaks, manager.group_peak_held_blocks(), strict=True)]
    groups = [{**group, "peak_blocks": peak} for group, peak in zip(groups, peaks, strict=True)]
    return {**inputs, "kv_cache_groups": groups}


def _with_real_manager(resolved: ResolvedRun, vllm_root: str | Path) -> ResolvedRun:
    """`resolved` with vLLM's real block manager from `vllm_root` in place of kvsim's model.

    The install and the design are checked here, by building one real manager, so a bad path,
    a vLLM without the design's manager (v0 managers live in 0.5.x-0.6.x, the V1-engine one
    from 0.10) or v0-fixed (kvsim's own design, with no vLLM code) is bad input (ScenarioError).
    """
    from dataclasses import replace

    from sim.vllm_real.loader import VllmNotAvailableError, load_vllm
    from sim.vllm_real.lockstep import make_real

    design = resolved.engine.design
    if design is Design.V0_FIXED:
        raise ScenarioError(
            "scheduler.design: v0-fixed is kvsim's own design; vLLM has no code for it to run "
            "(--vllm-root runs v0-v1, v0-v2 or v1-engine)"
        )
    try:
        install = load_vllm(vllm_root)
        make_real(design.value, resolved.engine.kv, install)
    except (VllmNotAvailableError, ValueError) as error:
        raise ScenarioError(f"vllm_root: {error}".splitlines()[0]) from None

    def factory(design: Design, kv_config: KVCacheConfig) -> object:
        return make_real(design.value, kv_config, install)

    inputs = {
        **resolved.inputs,
        # What ran is vLLM's own code at the install's version, whatever the scenario pinned.
        "vllm_version": install.version,
        "block_manager": {
            "kind": "real",
            "vllm_version": install.version,
            "vllm_root": str(install.root),
        },
    }
    return replace(
        resolved, engine=replace(resolved.engine, manager_factory=factory), inputs=inputs
    )


#: Names that moved to `sim.scenario.resolve`, still imported from here by callers.
__all__ = [
    "DEFAULT_SCENARIO",
    "ResolvedRun",
    "builtin_scenario_path",
    "file_sinks",
    "resolve",
    "run",
    "self_contained",
    "step_time_model",
]
