"""Resolve a scenario into concrete numbers: every default made explicit (`resolve`).

What a run will use, each reported in `ResolvedRun.inputs`: where the block count came from
(given, or derived by `sim.memory` with every term), the sliding window, the token budget,
the step-time model, and the workload source. `sim.engine.run.run` runs the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from sim.audit import AuditLevel
from sim.audit.violations import Violation, ViolationKind
from sim.catalog import ModelSpec, get_gpu
from sim.cluster.config import ClusterMode
from sim.engine.engine import EngineConfig
from sim.errors import InputError
from sim.kv.config import Design, KVCacheConfig
from sim.kv.pins import V1_BASELINE, AdmissionCap, VllmPin, resolve_pin
from sim.kv.v1_engine.hybrid_layout import HybridLayout
from sim.kv_connector.from_scenario import offloading_config
from sim.latency import LinearStepTime, StepTimeConfig, StepTimeModel, make_step_time
from sim.memory.derive import given_num_gpu_blocks, hybrid_layout_of
from sim.memory.host import check_pool_fits
from sim.memory.hybrid_pool import HybridPool
from sim.memory.logged import logged_kv_cache
from sim.memory.terms import VllmEngine
from sim.planning.admission_reserve import AdmissionReserve, admission_reserve
from sim.routing import Router
from sim.scenario.catalog_layout import (
    catalog_pool,
    group_rows,
    pool_num_blocks,
    uses_catalog_layout,
)
from sim.scenario.configs import (
    derive_budget,
    explicit_kv_cache_groups,
    kv_cache_config_of,
    kv_dtype_of,
    kv_layout_of,
    num_cpu_blocks_of,
    scheduler_config_of,
    sliding_window_of,
)
from sim.scenario.full_variants import (
    check_full_variant_groups,
    num_sink_blocks,
    sink_startup_mismatch,
)
from sim.scenario.no_effect import check_no_effect
from sim.scenario.release_defaults import (
    applied,
    apply_release_defaults,
    changes_since_previous,
    model_of,
)
from sim.scenario.retention import with_serve_retention
from sim.scenario.schema import CacheSection, Scenario, ScenarioError
from sim.scenario.startup import check_tensor_parallel, check_token_budget
from sim.scenario.vllm_defaults.mamba import (
    mamba_prefill_checkpoint_blocks,
    resolve_mamba_cache_mode,
)
from sim.workload import Workload, load_workload


@dataclass(frozen=True)
class ResolvedRun:
    scenario: Scenario
    engine: EngineConfig
    workload: Workload
    step_time: StepTimeModel
    inputs: dict


def _kv_config(
    scenario: Scenario,
    model: ModelSpec | None,
    token_budget: int,
    max_model_len: int,
    inputs: dict,
) -> KVCacheConfig:
    """The KV pool: given, or derived by `sim.memory` as the scenario's engine would size it.

    The V1 engine gives a model with both sliding-window and full layers (Gemma-2) the hybrid
    layout: `num_gpu_blocks` blocks of `group_size` layers, shared by the KV-cache groups, each
    request holding one table per group (`sim.kv.v1_engine.hybrid_coordinator`). The manager gets
    vLLM's own block count and the groups (`inputs["kv_cache_groups"]`). Example: Gemma-2-9B,
    42 layers -> 2 groups of 21 layers; 20,000 blocks, which vLLM reports as
    20,000 // 2 * 16 = 160,000 tokens. A scenario that sets `cache.sliding_window` itself
    overrides the model's layers: one group, and `num_gpu_blocks // num_kv_groups` blocks (the
    token capacity vLLM reports) for a derived pool.
    """
    cache = scenario.cache
    engine = VllmEngine(scenario.scheduler.design.api)
    kv_layout = kv_layout_of(model, engine)
    # The hybrid allocator's groups, unless the scenario overrides the model's windows.
    layout, pool = None, None
    groups = explicit_kv_cache_groups(
        cache, scenario.scheduler.design, scenario.scheduler.resolved_vllm_version
    )
    if groups:
        kv_layout = "hybrid"
    elif model is not None and uses_catalog_layout(scenario, model):
        pool = catalog_pool(scenario, model, max_model_len)
        groups = pool.groups
        if len(groups) == 1 and groups[0].is_full_attention:  # one full group: uniform
            groups = ()
        kv_layout = "hybrid" if groups else "uniform"
    elif model is not None and kv_layout == "hybrid" and cache.sliding_window == "model":
        layout = hybrid_layout_of(model)
        groups = layout.groups
    num_gpu_blocks = _num_gpu_blocks(scenario, model, token_budget, layout, inputs, pool)
    inputs["kv_layout"] = kv_layout
    num_cpu_blocks = num_cpu_blocks_of(cache, engine, model, scenario.hardware.tensor_parallel_size)
    window = sliding_window_of(cache, model)
    config = kv_cache_config_of(
        cache,
        num_gpu_blocks=num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        sliding_window=window,
        max_model_len=max_model_len,
        vllm_pin=scenario.scheduler.resolved_vllm_version,
        kv_cache_groups=groups,
        max_num_batched_tokens=token_budget,
    )
    if pool is not None:  # the release's unified block size (a Mamba hybrid's is raised)
        config = replace(config, block_size=pool.block_size)
        inputs["kv_cache_groups"] = group_rows(pool)
        inputs["hybrid_pool"] = pool.as_dict()
    elif groups and layout is None:
        inputs["kv_cache_groups"] = [
            {
                "group_id": group_id,
                "sliding_window": group.sliding_window,
                "attention_chunk_size": group.attention_chunk_size,
                "mamba": group.mamba,
                "sink_len": group.sink_len,
                "rswa_window": group.rswa_window,
                "circular_buffer": group.circular_buffer,
            }
            for group_id, group in enumerate(groups)
        ]
    if layout is not None:
        inputs["kv_cache_groups"] = [
            {
                "group_id": group_id,
                "sliding_window": group.sliding_window,
                "num_layers": len(layers),
            }
            for group_id, (group, layers) in enumerate(
                zip(layout.groups, layout.group_layers, strict=True)
            )
        ]
    if config.has_mamba_group:
        config = _with_mamba_cache_mode(config, cache, inputs, model)
    config = with_serve_retention(config, inputs)  # 0.33.0's sliding windows
    check_mamba_groups(config)
    check_full_variant_groups(config)  # `sim.scenario.full_variants`
    inputs["num_gpu_blocks"] = num_gpu_blocks
    inputs["num_cpu_blocks"] = num_cpu_blocks
    inputs["sliding_window"] = window
    return config


def _with_mamba_cache_mode(
    config: KVCacheConfig, cache: CacheSection, inputs: dict, model: ModelSpec | None
) -> KVCacheConfig:
    """`config` with the Mamba cache mode its release runs (`vllm_defaults.mamba`), recorded
    in `inputs`. A catalog model's state kind says whether its vLLM class declares
    `SupportsMambaPrefixCaching`: the Mamba2-kernel family does (Nemotron-H, 0.25.1
    `nemotron_h.py:L776-787`), the gated-delta-net hybrids do not (`qwen3_next.py`); an
    abstract model (groups given by hand) runs "align" unless the scenario says "all"."""
    pin = VllmPin(config.vllm_pin) if config.vllm_pin is not None else V1_BASELINE
    state = model.mamba_state if model is not None else None
    supports_all = None if state is None else state.kind == "mamba2"
    try:
        mode = resolve_mamba_cache_mode(
            pin, config.enable_prefix_caching, cache.mamba_cache_mode, supports_all
        )
    except InputError as exc:
        raise ScenarioError(f"cache.{exc}") from None
    inputs["mamba_cache_mode"] = mode.value
    if mode.value == "none":
        return config
    checkpoint = mamba_prefill_checkpoint_blocks(
        pin, mode.value, None if state is None else state.kind
    )
    inputs["mamba_prefill_checkpoint_blocks"] = checkpoint.value
    # `vllm serve`'s sparse retention on 0.33.0 (`config/cache.py:L275`: 0), which kvsim
    # models for full + Mamba layouts (`mamba_checkpoint`); no such setting before.
    retention = 0 if pin.mamba_align_has_checkpoints and mode.value == "align" else None
    inputs["prefix_cache_retention_interval"] = retention
    return replace(
        config,
        mamba_cache_mode=mode.value,
        mamba_prefill_checkpoint_blocks=checkpoint.value,
        prefix_cache_retention_interval=retention,
    )


def check_mamba_groups(config: KVCacheConfig) -> None:
    """A Mamba group (`cache.kv_cache_groups`) with prefix caching runs vLLM's Mamba cache
    mode "align" or "all" (`MambaModelConfig.verify_and_update_config`,
    `model_executor/models/config.py:L423-481 @0.19.1`; `vllm serve` turns caching on by
    default for generative hybrid models, `sim.scenario.vllm_defaults.mamba`), which kvsim
    models on 0.19.1 to 0.33.0 for full + Mamba layouts (`sim.kv.v1_engine.mamba`, 0.33.0's
    checkpoint blocks `sim.kv.v1_engine.mamba_checkpoint`). 0.11.0 turns caching off for
    Mamba models (`L290-297 @0.11.0`), which a catalog hybrid gets from its release defaults
    (`vllm_defaults.v1.resolve_v011`). Refused, one line each: caching with hand-given Mamba
    groups on a release without "align" (no model class to say what vLLM would do), and
    caching with a sliding-window or chunked-local group beside the Mamba ones."""
    if not (config.has_mamba_group and config.enable_prefix_caching):
        return
    pin = VllmPin(config.vllm_pin) if config.vllm_pin is not None else V1_BASELINE
    if not pin.models_mamba_align:
        raise ScenarioError(
            "cache.enable_prefix_caching: a Mamba group with prefix caching runs vLLM's "
            f"'align' Mamba mode, which kvsim models on 0.19.1 to 0.33.0, not {pin.value}; "
            "set cache.enable_prefix_caching: false"
        )
    if any(not (g.is_full_attention or g.mamba) for g in config.kv_cache_groups):
        raise ScenarioError(
            "cache.enable_prefix_caching: Mamba prefix caching is modelled for full-attention "
            "plus Mamba groups only; drop the sliding or chunked group or turn caching off"
        )


def _num_gpu_blocks(
    scenario: Scenario,
    model: ModelSpec | None,
    token_budget: int,
    layout: HybridLayout | None,
    inputs: dict,
    pool: HybridPool | None = None,
) -> int:
    """The pool's block count, given or derived (`configs.derive_budget`; a catalog model's
    release pool re-cuts the memory left, `catalog_layout.pool_num_blocks`); what it amounts
    to in memory goes to `inputs["memory"]` (every term) when there is a model."""
    cache, hw = scenario.cache, scenario.hardware
    kv_dtype = kv_dtype_of(cache)
    engine = VllmEngine(scenario.scheduler.design.api)
    if cache.num_gpu_blocks == "derive":
        assert model is not None
        try:
            budget = derive_budget(
                model,
                get_gpu(hw.gpu),
                engine,
                tp=hw.tensor_parallel_size,
                block_size=applied(cache.block_size, "cache.block_size"),
                gpu_memory_utilization=applied(
                    cache.gpu_memory_utilization, "cache.gpu_memory_utilization"
                ),
                kv_dtype=kv_dtype,
                weight_dtype=scenario.model_dtype,
                max_num_batched_tokens=token_budget,
                max_num_seqs=applied(scenario.scheduler.max_num_seqs, "scheduler.max_num_seqs"),
                # the release's profiling run decides which sampler's peak is subtracted
                vllm_release=resolve_pin(
                    scenario.scheduler.design, scenario.scheduler.resolved_vllm_version
                ).value,
            )
        except InputError as error:
            raise ScenarioError(f"cache.num_gpu_blocks: {error}") from None
        if pool is not None:
            budget = pool_num_blocks(pool, model, budget)
        num_gpu_blocks = budget.num_gpu_blocks
        if layout is None and pool is None:
            num_gpu_blocks //= budget.num_kv_groups
        inputs["memory"] = budget.as_dict()
        inputs["num_gpu_blocks_source"] = "derived"
        return num_gpu_blocks
    inputs["num_gpu_blocks_source"] = "given"
    if model is not None and pool is None:  # what the given blocks amount to, for the record
        budget = given_num_gpu_blocks(
            cache.num_gpu_blocks,
            model,
            tp=hw.tensor_parallel_size,
            block_size=applied(cache.block_size, "cache.block_size"),
            kv_dtype=kv_dtype,
            kv_layout="hybrid" if layout is not None else "uniform",
        )
        inputs["memory"] = budget.as_dict()
    return cache.num_gpu_blocks


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
    scenario = settings.scenario
    check_no_effect(scenario)
    model = model_of(scenario)
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
    kv = _kv_config(scenario, model, token_budget, max_model_len, inputs)
    inputs["vllm_version"] = pin
    _check_v0_startup(sched.design, kv, scheduler_config.enable_chunked_prefill)
    if sched.design is Design.V1_ENGINE:
        release = resolve_pin(sched.design, pin)
        bound_tokens = release.window_bound_tokens(
            token_budget, scheduler_config.max_concurrent_batches
        )
        startup_blocks = _check_cache_fits(sched.design, kv, max_model_len, bound_tokens)
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
        reserve = _admission_reserve(release, kv, max_model_len, bound_tokens)
        mismatch = sink_startup_mismatch(release, kv, startup_blocks, pin)
        if reserve is not None:
            inputs["admission_reserve"] = reserve.as_dict()
            mismatch = _startup_gate_mismatch(reserve, startup_blocks, pin) or mismatch
        if mismatch is not None:
            inputs["startup_violations"] = [mismatch.to_row()]
    else:
        _check_cache_fits(sched.design, kv, max_model_len, token_budget)
    offload = offloading_config(scenario, model, kv, inputs)
    if offload is not None:  # its stores need every decode: `KVConnector.needs_every_step`
        scheduler_config = replace(scheduler_config, decode_fast_path=False, decode_cohort=False)
    num_replicas = scenario.engine.num_replicas
    too_big = check_pool_fits(sched.design, kv.num_gpu_blocks, kv.num_cpu_blocks, num_replicas)
    if too_big is not None:  # refuse now: building the pools would eat all memory
        field = replicas_field if num_replicas > 1 else "cache.num_gpu_blocks"
        raise ScenarioError(f"{field}: {too_big}")
    return scenario, model, scheduler_config, kv, offload


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


def _check_v0_startup(design: Design, kv: KVCacheConfig, chunked_prefill: bool) -> None:
    """Pairs vLLM 0.5.4's v0 engine refuses at startup with a sliding window: bad input, said
    before the block manager is built (which would raise as upstream does).

    * prefix caching, any v0 block manager (`CacheConfig._verify_prefix_caching`,
      config.py:L492-499 @v0.5.4);
    * chunked prefill with BlockSpaceManagerV1 (`EngineArgs.create_engine_config`,
      arg_utils.py:L855-860 @v0.5.4; the V2 manager is allowed).

    Regression: `--set cache.enable_prefix_caching=true` on the bundled Mistral (4,096-token
    window) scenario reached the v0 manager's ValueError and was reported as a kvsim bug; and
    v0-v1 ran chunked prefill with a window, which vLLM never does.
    """
    if design.api != "v0" or kv.sliding_window is None:
        return
    window = f"a sliding window (here {kv.sliding_window} tokens)"
    if kv.enable_prefix_caching:
        raise ScenarioError(
            f"cache.enable_prefix_caching: vLLM's v0 engine refuses prefix caching with "
            f"{window}; set it to false, or use scheduler.design: v1-engine"
        )
    if chunked_prefill and design is Design.V0_V1:
        raise ScenarioError(
            f"scheduler.enable_chunked_prefill: vLLM's v0 BlockSpaceManagerV1 refuses chunked "
            f"prefill with {window}; set it to false, or use scheduler.design: v0-v2"
        )


def _admission_reserve(
    release: VllmPin, kv: KVCacheConfig, max_model_len: int, bound_tokens: int
) -> AdmissionReserve | None:
    """The full-sequence gate's charge for a max_model_len request against what it holds
    once processed (`sim.planning.admission_reserve`, vllm #54703), where the release has
    the gate and a group has a window; None where nothing is reserved."""
    specs = kv.group_specs
    if not release.has_full_sequence_gate or all(g.is_full_attention for g in specs):
        return None
    in_flight = None if release.admission_cap is AdmissionCap.NONE else bound_tokens
    reserve = admission_reserve(
        tuple(g.sliding_window for g in specs),
        # A Mamba group's block is max_model_len tokens: charged one, holding one; so is a
        # circular buffer's one block (sink and R-SWA groups are charged as full attention).
        tuple(max_model_len if g.mamba or g.circular_buffer else kv.block_size for g in specs),
        kv.num_gpu_blocks - 1 - num_sink_blocks(release, kv),
        in_flight,
        max_model_len,
        chunk_sizes=tuple(g.attention_chunk_size for g in specs),
    )
    return reserve if reserve.reserved_blocks > 0 else None


def _startup_gate_mismatch(
    reserve: AdmissionReserve, startup_blocks: int, pin: str
) -> Violation | None:
    """A `startup_gate_mismatch` where startup accepted max_model_len (`startup_blocks` fit the
    pool) but the gate charges such a request more than the pool has: it would never be
    admitted, and the engine would wait on it forever.

    Example (vLLM 0.19.1, whose gate is uncapped: full attention + a 4,096-token window,
    bs 16, T 8,192, max_model_len 32,768, 3,000 blocks): startup charges 2,048 + cdiv(4,095 +
    8,192, 16) + 1 = 2,817 <= 2,999 usable; the gate charges 2,048 + 2,048 = 4,096 > 2,999.
    From 0.20.0 the window's charge is capped like the startup check's: no mismatch.
    """
    if reserve.charged_blocks <= reserve.usable_blocks:
        return None
    return Violation(
        ViolationKind.STARTUP_GATE_MISMATCH,
        "startup",
        None,
        f"vLLM {pin}'s startup check accepts max_model_len {reserve.request_tokens} "
        f"({startup_blocks} blocks of {reserve.usable_blocks} usable), but its admission gate "
        f"charges such a request {reserve.charged_blocks} blocks: a request of "
        f"{reserve.request_tokens} tokens would never be admitted and wait forever",
        counted_blocks=startup_blocks,
        needed_blocks=reserve.charged_blocks,
        free_blocks=reserve.usable_blocks,
        time_s=0.0,
    )


def _check_cache_fits(design, kv: KVCacheConfig, max_model_len: int, token_budget: int) -> int:
    """vLLM refuses to start when one max-length request cannot fit in the pool.

    v0 (`raise_if_cache_size_invalid`, worker.py @fc93e56): max_model_len <= block_size * G.
    V1 engine (`check_enough_kv_cache_memory`, kv_cache_utils.py:L651-696 @4ac7713): the
    request's blocks fit in G - 1 (block 0 is the null block); a sliding window needs only
    cdiv(min(W - 1 + T, max_model_len), bs) + 1 blocks, chunked-local attention in chunks of A
    cdiv(min(A + T, max_model_len), bs) (`kv_cache_interface.py:L376-400 @0.20.0`, the same
    arithmetic at 0.11.0 `L174-191`); a hybrid model needs the sum over its
    KV-cache groups (`max_memory_usage_bytes`, L624-631 @0.11.0), a Mamba group one block
    (`MambaSpec.max_memory_usage_bytes`, `kv_cache_interface.py:L1135-1141 @0.33.0`, L235-238
    @0.11.0: one page per request with caching off), a circular buffer one block, a sink or
    R-SWA group as full attention (`FullAttentionSpec`'s). T (`token_budget` here) is
    `max_num_batched_tokens`, from 0.26.0 `max_in_flight_tokens`, twice the budget under async
    scheduling (`VllmPin.window_bound_tokens`, `max_memory_usage_bytes` L946-958 @0.33.0).
    Example: bs=16, G=10, v0: max_model_len 160 is the most that starts.
    Returns the blocks the check charged one max_model_len request.
    """
    bs, num_blocks = kv.block_size, kv.num_gpu_blocks
    if design.api == "v0":
        if max_model_len > bs * num_blocks:
            raise ScenarioError(
                f"scheduler.max_model_len: {max_model_len} tokens is larger than the KV cache "
                f"holds ({num_blocks} blocks x {bs} tokens = {num_blocks * bs}); vLLM would refuse to start"
            )
        return -(-max_model_len // bs)
    # Hybrid: the sum over groups (vLLM sums the bytes of every layer, `group_size` per group).
    needed = 0
    for group in kv.group_specs:
        if group.circular_buffer:  # `CircularBufferSpec.max_memory_usage_bytes`: one page
            needed += 1  # (`L983-985 @0.33.0`)
        elif group.mamba:  # `MambaSpec.max_memory_usage_bytes` (L293-300 @0.19.1): one page,
            # two in "align" (three with 0.33.0's prefill checkpoint block, `L1135-1139
            # @0.33.0`), one per block of max_model_len in "all"
            if not kv.enable_prefix_caching:
                needed += 1
            elif kv.mamba_cache_mode == "all":
                needed += -(-max_model_len // bs)
            else:
                needed += 2 + kv.mamba_prefill_checkpoint_blocks
        elif group.attention_chunk_size is not None:  # `ChunkedLocalAttentionSpec`, no "+1"
            needed += -(-min(group.attention_chunk_size + token_budget, max_model_len) // bs)
        elif group.sliding_window is None:
            needed += -(-max_model_len // bs)
        else:
            window = group.sliding_window
            needed += -(-min(window - 1 + token_budget, max_model_len) // bs) + 1
    if needed > num_blocks - 1:
        raise ScenarioError(
            f"scheduler.max_model_len: one {max_model_len}-token request needs {needed} blocks but "
            f"only {num_blocks - 1} are usable (block 0 is the null block); vLLM would refuse to start"
        )
    return needed


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
