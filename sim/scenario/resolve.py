"""Resolve a scenario into concrete numbers: every default made explicit (`resolve`).

What a run will use, each reported in `ResolvedRun.inputs`: where the block count came from
(given, or derived by `sim.memory` with every term), the sliding window, the token budget,
the step-time model, and the workload source. `sim.engine.run.run` runs the result.

The KV pool is sized and cut into groups in `sim.scenario.kv_pool`; the startup checks vLLM
makes (and kvsim's startup findings) are `sim.scenario.startup`'s. Here: the order they run in
(release defaults, scheduler, pool, startup checks, KV offloading, replicas in memory), the
workload and the step-time model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sim.audit import AuditLevel
from sim.audit.violations import Violation, ViolationKind
from sim.catalog import ModelSpec
from sim.cluster.config import ClusterMode
from sim.engine.engine import EngineConfig
from sim.errors import InputError
from sim.kv.config import Design, KVCacheConfig
from sim.kv.pins import VllmPin, resolve_pin
from sim.kv_connector.from_scenario import offloading_config
from sim.latency import LinearStepTime, StepTimeConfig, StepTimeModel, make_step_time
from sim.memory.host import check_pool_fits
from sim.memory.logged import logged_kv_cache
from sim.routing import Router
from sim.scenario.configs import kv_dtype_of, scheduler_config_of
from sim.scenario.full_variants import sink_startup_mismatch
from sim.scenario.kv_pool import kv_config
from sim.scenario.no_effect import check_no_effect
from sim.scenario.release_defaults import (
    apply_release_defaults,
    changes_since_previous,
    model_of,
)
from sim.scenario.schema import Scenario, ScenarioError
from sim.scenario.startup import (
    check_cache_fits,
    check_tensor_parallel,
    check_token_budget,
    check_v0_window,
    full_sequence_reserve,
    startup_gate_mismatch,
)
from sim.scheduler import SchedulerConfig
from sim.workload import Workload, load_workload


@dataclass(frozen=True)
class ResolvedRun:
    scenario: Scenario
    engine: EngineConfig
    workload: Workload
    step_time: StepTimeModel
    inputs: dict


def _startup(
    scenario: Scenario, inputs: dict, replicas_field: str = "engine.num_replicas"
) -> tuple:
    """The scenario as its release runs it (every unset engine setting filled in by
    `apply_release_defaults`), and the scheduler and KV pool a run starts with, after every
    startup check (vLLM's and kvsim's); fills `inputs` with what they resolved to (each
    setting's value and origin in `inputs["settings"]`). Loads no workload.

    `replicas_field` is where the user set `engine.num_replicas` (a disaggregated pool's
    `cluster.prefill.replicas`, say), for the message when the replicas do not fit in memory.
    """
    scenario = _as_released(scenario, inputs)
    model = model_of(scenario)
    scheduler_config, token_budget = _scheduler(scenario, model, inputs)
    design, pin = scenario.scheduler.design, scenario.scheduler.resolved_vllm_version
    max_model_len = scheduler_config.max_model_len
    kv = kv_config(scenario, model, token_budget, max_model_len, inputs)
    inputs["vllm_version"] = pin
    check_v0_window(design, kv, scheduler_config.enable_chunked_prefill)
    if design is Design.V1_ENGINE:
        release = resolve_pin(design, pin)
        _check_v1_startup(release, pin, kv, scheduler_config, token_budget, inputs)
    else:
        check_cache_fits(design, kv, max_model_len, token_budget)
    offload = offloading_config(scenario, model, kv, inputs)
    if offload is not None:  # its stores need every decode: `KVConnector.needs_every_step`
        scheduler_config = replace(scheduler_config, decode_fast_path=False, decode_cohort=False)
    num_replicas = scenario.engine.num_replicas
    too_big = check_pool_fits(design, kv.num_gpu_blocks, kv.num_cpu_blocks, num_replicas)
    if too_big is not None:  # refuse now: building the pools would eat all memory
        field = replicas_field if num_replicas > 1 else "cache.num_gpu_blocks"
        raise ScenarioError(f"{field}: {too_big}")
    return scenario, model, scheduler_config, kv, offload


def _as_released(scenario: Scenario, inputs: dict) -> Scenario:
    """The scenario with its pinned release's launch defaults filled in, each setting's value
    and origin recorded in `inputs`, refused where it would run as something else (a
    disaggregated cluster) or where a setting would have no effect (`check_no_effect`)."""
    if scenario.cluster.mode is ClusterMode.DISAGGREGATED:
        # Two pools and a link: `sim.cluster.run` resolves each pool through here.
        raise ScenarioError(
            "cluster.mode: a disaggregated scenario runs with `kvsim disagg` "
            "(sim.cluster.run.run_disaggregated), not as one co-located engine"
        )
    settings = apply_release_defaults(scenario)
    inputs["settings"] = settings.record()
    inputs["settings_overridden"] = list(settings.overridden)
    inputs["settings_not_modelled"] = dict(settings.not_modelled)
    inputs["settings_since_previous"] = changes_since_previous(scenario, settings)
    check_no_effect(settings.scenario)
    return settings.scenario


def _scheduler(
    scenario: Scenario, model: ModelSpec | None, inputs: dict
) -> tuple[SchedulerConfig, int]:
    """The scheduler config and its token budget, after vLLM's own checks of both (the budget
    against max_model_len and max_num_seqs, the model's heads against the TP size), recorded
    in `inputs`. The KV pool is sized from the budget, so this comes first."""
    sched = scenario.scheduler
    max_model_len = sched.max_model_len
    assert max_model_len is not None  # the release resolved it
    scheduler_config = scheduler_config_of(sched, max_model_len)
    token_budget = scheduler_config.token_budget(sched.design.api)
    # Unpinned: v1-engine gets the latest release, a v0 design the 0.5.4 release (what
    # `--vllm-root .vllm/0.5.4` runs), so the model and the real code agree by default.
    pin = sched.resolved_vllm_version
    check_token_budget(sched.design, pin, scheduler_config, token_budget)
    check_tensor_parallel(model, scenario.hardware.tensor_parallel_size, pin)
    inputs["design"] = sched.design.value
    # kvsim's model of the design; `run(vllm_root=...)` replaces it with vLLM's real code.
    inputs["block_manager"] = {"kind": "model", "vllm_version": None, "vllm_root": None}
    inputs["max_model_len"] = max_model_len
    inputs["max_num_batched_tokens"] = token_budget
    return scheduler_config, token_budget


def _check_v1_startup(
    release: VllmPin,
    pin: str,
    kv: KVCacheConfig,
    scheduler_config: SchedulerConfig,
    token_budget: int,
    inputs: dict,
) -> None:
    """The V1 engine's startup: one max_model_len request must fit the pool (the window's
    charge bounded by the tokens in flight), the KV-cache lines vLLM would log, and a
    `startup_gate_mismatch` where the admission gate would charge that request more than the
    startup check did (`inputs["startup_violations"]`, recorded first in the run)."""
    max_model_len = scheduler_config.max_model_len
    bound_tokens = release.window_bound_tokens(
        token_budget, scheduler_config.max_concurrent_batches
    )
    startup_blocks = check_cache_fits(Design.V1_ENGINE, kv, max_model_len, bound_tokens)
    logged = logged_kv_cache(
        kv.num_gpu_blocks,
        len(kv.group_specs),
        # The smallest group block size: a Mamba group's is max_model_len.
        min(kv.block_size, max_model_len) if kv.has_mamba_group else kv.block_size,
        max_model_len,
        startup_blocks,
        from_concurrency=release.logs_capacity_from_concurrency,
    )
    inputs["vllm_kv_cache_log"] = logged.lines()
    inputs["startup_blocks_per_request"] = startup_blocks
    reserve = full_sequence_reserve(release, kv, max_model_len, bound_tokens)
    mismatch = sink_startup_mismatch(release, kv, startup_blocks, pin)
    if reserve is not None:
        inputs["admission_reserve"] = reserve.as_dict()
        mismatch = startup_gate_mismatch(reserve, startup_blocks, pin) or mismatch
    if mismatch is not None:
        inputs["startup_violations"] = [mismatch.to_row()]


def preflight(scenario: Scenario, base_dir: str | Path = ".") -> None:
    """Every check `resolve` makes before a run, without loading the workload: what a sweep
    or compare-versions asks of each point before running any (a bad point is bad input).
    The workload's files are checked to exist and be regular files, but not read."""
    from sim.workload.load import check_input_files

    scenario, model, *_ = _startup(scenario, {})
    _step_time(scenario, model, Path(base_dir), {})
    check_input_files(scenario.workload, base_dir)


def resolve(
    scenario: Scenario, base_dir: str | Path = ".", replicas_field: str = "engine.num_replicas"
) -> ResolvedRun:
    """Every number the run will use, from a validated scenario (`replicas_field`: see
    `_startup`)."""
    base_dir = Path(base_dir)
    inputs: dict = {"scenario": scenario.name, "seed": scenario.seed}
    scenario, model, scheduler_config, kv, offload = _startup(scenario, inputs, replicas_field)
    workload_config = scenario.workload
    if "seed" not in workload_config.model_fields_set:
        workload_config = workload_config.model_copy(update={"seed": scenario.seed})
    workload = load_workload(workload_config, base_dir)
    inputs["workload"] = {
        "name": getattr(workload, "name", ""),
        "num_requests": len(workload.requests),
    }
    if "sessions" in workload.metadata:  # how a trace's requests were grouped into sessions
        inputs["workload"]["sessions"] = workload.metadata["sessions"]
    step_time = _step_time(scenario, model, base_dir, inputs)
    engine = EngineConfig(
        design=scenario.scheduler.design,
        kv=kv,
        scheduler=scheduler_config,
        num_replicas=scenario.engine.num_replicas,
        router=Router(scenario.engine.router),
        router_load_weight=scenario.engine.router_load_weight,
        router_staleness_s=scenario.engine.router_staleness_s,
        kv_events=scenario.engine.kv_events,
        violation_policy=scenario.engine.violation_policy,
        audit_level=AuditLevel(scenario.engine.audit_level),
        max_sim_time_s=scenario.engine.max_sim_time_s,
        kv_connector=offload,
        api_server_count=scenario.engine.api_server_count,
        stream_interval=scenario.engine.stream_interval,
        startup_violations=tuple(
            Violation(**{**row, "kind": ViolationKind(row["kind"])})
            for row in inputs.get("startup_violations", ())
        ),
    )
    return ResolvedRun(scenario, engine, workload, step_time, inputs)


def absolute_step_time_paths(config: StepTimeConfig, base_dir: Path) -> StepTimeConfig:
    """The calibrated profile / measured coefficients path made absolute from base_dir."""
    for kind, field in (("calibrated", "profile"), ("measured", "coefficients")):
        section = getattr(config, kind)
        path = getattr(section, field, None) if section is not None else None
        if path is not None and not Path(path).is_absolute():
            section = section.model_copy(update={field: str(base_dir / path)})
            config = config.model_copy(update={kind: section})
    return config


def _step_time(scenario: Scenario, model: ModelSpec | None, base_dir: Path, inputs: dict):
    config = absolute_step_time_paths(
        scenario.step_time or StepTimeConfig.model_validate({"measured": {}}), base_dir
    )
    inputs["step_time"] = config.model_dump(mode="json", exclude_none=True)
    if model is None:
        assert config.linear is not None
        return LinearStepTime(**config.linear.model_dump())
    try:
        return make_step_time(
            config,
            model,
            scenario.hardware.gpu,
            tp=scenario.hardware.tensor_parallel_size,
            kv_dtype=kv_dtype_of(scenario.cache),
            engine="v1" if scenario.scheduler.design is Design.V1_ENGINE else "v0",
            p2p=scenario.hardware.p2p,
            release=scenario.scheduler.resolved_vllm_version,
            weight_dtype=scenario.model_dtype,
        )
    except InputError as error:
        raise ScenarioError(f"step_time: {error}".splitlines()[0]) from None


def step_time_model(scenario: Scenario, base_dir: str | Path = "."):
    """The scenario's step-time model alone (no workload, no KV pool): e.g. for its band."""
    return _step_time(scenario, model_of(scenario), Path(base_dir), {})
