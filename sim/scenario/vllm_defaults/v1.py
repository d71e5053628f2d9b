"""vLLM 0.11.0's and 0.33.0's V1-engine defaults (engine/arg_utils.py and config/*.py)."""

from __future__ import annotations

from sim.kv.pins import VllmPin
from sim.scenario.vllm_defaults.common import (
    GIB,
    DefaultsError,
    Deployment,
    Origin,
    Refusal,
    ResolvedDefaults,
    Setting,
    UsageContext,
    UserFlags,
    cache_sliding_window,
    check_batch,
    check_heads,
    executor_setting,
    max_model_len_setting,
    pick,
)


# -- the V1 batch tables ----------------------------------------------------------------------
def _v1_batch_table(dep: Deployment, release: str) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, rule) for the GPU tier and usage context.

    0.33.0 `EngineArgs.get_batch_defaults` (engine/arg_utils.py L2940-3039): >= 160 GiB ->
    16384 / 1024 for both contexts (L2973-2982); >= 70 GiB and no "a100" in the name -> API
    server 8192 / 1024, LLM class 16384 / 1024 (L2983-2996); else 2048 / 256 and 8192 / 256
    (L2997-3006). 0.11.0 `_set_default_args` (L1605-1624) has no >= 160 GiB tier."""
    api = dep.usage is UsageContext.API_SERVER
    memory, name = dep.device_memory_bytes, dep.device_name.lower()
    v033 = VllmPin(release) is not VllmPin.V0_11_0  # 0.33.0's code (`RELEASES`), or 0.11.0's
    # The >= 160 GiB tier is 0.33.0's alone: 0.19.1 to 0.26.0 have 0.11.0's two tiers
    # (0.26.0 `engine/arg_utils.py` L2460-2479), checked by the defaults lockstep.
    if VllmPin(release) is VllmPin.V0_33_0 and memory >= 160 * GIB:
        return 16384, 1024, "0.33.0 engine/arg_utils.py L2973-2982 (>= 160 GiB)"
    if memory >= 70 * GIB and "a100" not in name:
        where = (
            "0.33.0 engine/arg_utils.py L2983-2996" if v033 else "0.11.0 arg_utils.py L1605-1614"
        )
        return (8192 if api else 16384), 1024, where + " (>= 70 GiB, not A100)"
    where = "0.33.0 engine/arg_utils.py L2997-3006" if v033 else "0.11.0 arg_utils.py L1615-1624"
    return (2048 if api else 8192), 256, where + " (other GPUs)"


def _batch_v033(
    dep: Deployment, flags: UserFlags, max_model_len: int, chunked: bool, release: str
) -> tuple[int, int, str]:
    """(max_num_seqs, max_num_batched_tokens, rule): `_set_default_max_num_seqs_and_batched_
    tokens_args` (engine/arg_utils.py L3151-3240) on the table's values.

    Example: Llama-2 (4096 tokens) on an L4, API server, chunked prefill off: the table's 2048
    tokens rise to one whole sequence, max(4096, 2048) = 4096; min(256 x 4096, 4096) = 4096."""
    table_mnbt, table_mns, table_rule = _v1_batch_table(dep, release)
    factor = 2 if flags.performance_mode == "throughput" else 1  # L3184-3188
    mns = table_mns * factor if flags.max_num_seqs is None else flags.max_num_seqs
    if flags.max_num_batched_tokens is None:
        mnbt = table_mnbt * factor
        if not chunked:  # L3194-3199: at least one whole max_model_len
            mnbt = max(max_model_len, mnbt)
        mnbt = min(mns * max_model_len, mnbt)  # L3221-3224
    else:
        mnbt = flags.max_num_batched_tokens
    if flags.max_num_seqs is None:
        mns = min(mns, mnbt)  # L3232-3234
    return mns, mnbt, table_rule


def resolve_v033(dep: Deployment, flags: UserFlags, release: str = "0.33.0") -> ResolvedDefaults:
    """vLLM 0.33.0's V1 engine (`EngineArgs.create_engine_config`, engine/arg_utils.py L2245),
    or a 2026 pin that follows it (`release`: the batch table, the memory utilization and the
    long-prefill bound differ)."""
    mml = max_model_len_setting(dep, flags, "0.33.0 config/model.py L2545-2684")
    chunked = pick(
        flags.enable_chunked_prefill,
        True,
        "0.33.0 arg_utils.py L3041-3048: generative models support chunked prefill "
        "(config/model.py L2229-2236)",
    )
    prefix = pick(
        flags.enable_prefix_caching,
        True,
        "0.33.0 arg_utils.py L3075-3076: decoder models support prefix caching "
        "(config/model.py L2289-2291)",
    )
    mns, mnbt, table_rule = _batch_v033(dep, flags, mml.value, chunked.value, release)
    batch_rule = f"{table_rule}; arg_utils.py L3151-3240"
    check_batch(mnbt, mns, mml.value, chunked.value, "0.33.0 config/scheduler.py L317-336")
    threshold = flags.long_prefill_token_threshold or 0
    # config/scheduler.py L355-360; 0.11.0 to 0.26.0 check it only with
    # max_num_partial_prefills > 1 (0.26.0 L301-313), which kvsim's V1 engine does not have.
    if threshold > mml.value and VllmPin(release).bounds_long_prefill_threshold:
        raise DefaultsError(
            f"long_prefill_token_threshold {threshold} > max_model_len {mml.value} "
            "(0.33.0 config/scheduler.py L355-360)",
            Refusal.LONG_PREFILL_ABOVE_MODEL_LEN,
        )
    # VllmConfig.__post_init__ (config/vllm.py L1549) checks the layout after the batch.
    check_heads(dep, "0.33.0 config/model.py L1559")
    return ResolvedDefaults(
        release=release,
        max_num_seqs=pick(flags.max_num_seqs, mns, batch_rule),
        max_num_batched_tokens=pick(flags.max_num_batched_tokens, mnbt, batch_rule),
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=_gpu_memory_utilization(flags, release),
        block_size=pick(
            flags.block_size,
            16,
            "0.33.0 config/cache.py L185, L462-463 (as create_engine_config leaves it; the "
            "executor may still raise it for the attention backend after the model loads: "
            "platforms/interface.py L750-781, v1/executor/uniproc_executor.py L75)",
        ),
        max_model_len=mml,
        async_scheduling=_async_v033(flags),
        long_prefill_token_threshold=pick(
            flags.long_prefill_token_threshold, 0, "0.33.0 config/scheduler.py L79"
        ),
        sliding_window=cache_sliding_window(
            dep.model, flags, "0.33.0 engine/arg_utils.py L2288-2294"
        ),
        executor=executor_setting(dep, flags, "0.33.0 config/parallel.py L1054-1099"),
    )


def _gpu_memory_utilization(flags: UserFlags, release: str) -> Setting:
    """0.92 from 0.20.0 (0.33.0 config/cache.py L215, 0.20.0 L66); 0.19.1 still has 0.9
    (L41), as 0.11.0."""
    if VllmPin(release) is VllmPin.V0_19_1:
        return pick(flags.gpu_memory_utilization, 0.9, "0.19.1 config/cache.py L41")
    return pick(flags.gpu_memory_utilization, 0.92, "0.33.0 config/cache.py L215")


def _async_v033(flags: UserFlags) -> Setting:
    """On unless incompatible (config/vllm.py L1685-1719). On a GPU install (Triton present)
    the V2 model runner is the default (L731-767), and only the V1 runner refuses pipeline
    parallelism with async (L1650-1666), so no catalog model, TP or PP turns it off."""
    return pick(flags.async_scheduling, True, "0.33.0 config/vllm.py L1685-1719")


def resolve_v011(dep: Deployment, flags: UserFlags, release: str) -> ResolvedDefaults:
    """vLLM 0.11.0's V1 engine (`EngineArgs._set_default_args`, engine/arg_utils.py L1540)."""
    mml = max_model_len_setting(dep, flags, "0.11.0 config/model.py L1763-1912")
    # L1547-1548: non-pooling models always chunk, whatever the user passed.
    chunked = Setting(True, Origin.RELEASE, "0.11.0 arg_utils.py L1547-1548 (overrides the user)")
    prefix = pick(flags.enable_prefix_caching, True, "0.11.0 arg_utils.py L1561-1562")
    if dep.model is not None and dep.model.mamba_state is not None:
        # MambaModelConfig.verify_and_update_config: no prefix caching for Mamba hybrids yet.
        prefix = Setting(
            False,
            Origin.RELEASE,
            "0.11.0 model_executor/models/config.py L290-297 (Mamba layers; overrides the user)",
        )
    table_mnbt, table_mns, table_rule = _v1_batch_table(dep, "0.11.0")
    mnbt = table_mnbt if flags.max_num_batched_tokens is None else flags.max_num_batched_tokens
    mns = min(table_mns, mnbt) if flags.max_num_seqs is None else flags.max_num_seqs  # L1678
    batch_rule = f"{table_rule}; arg_utils.py L1654-1683"
    if flags.async_scheduling and dep.pp > 1:  # arg_utils.py L1295-1297
        raise DefaultsError(
            "async scheduling with pipeline-parallel-size > 1 (0.11.0 arg_utils.py L1295-1297)",
            Refusal.ASYNC_WITH_PP,
        )
    check_batch(mnbt, mns, mml.value, True, "0.11.0 config/scheduler.py L234-249")
    # VllmConfig.__post_init__ (config/__init__.py L309) checks the layout after the batch.
    check_heads(dep, "0.11.0 config/model.py L1048")
    executor = executor_setting(dep, flags, "0.11.0 config/parallel.py L447-483")
    if flags.async_scheduling:  # L1289-1294: async needs the mp executor, even on one GPU
        executor = Setting("mp", Origin.RELEASE, "0.11.0 arg_utils.py L1289-1294")
    return ResolvedDefaults(
        release=release,
        max_num_seqs=pick(flags.max_num_seqs, mns, batch_rule),
        max_num_batched_tokens=pick(flags.max_num_batched_tokens, mnbt, batch_rule),
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=pick(
            flags.gpu_memory_utilization, 0.9, "0.11.0 config/cache.py L43"
        ),
        block_size=pick(flags.block_size, 16, "0.11.0 platforms/cuda.py L126-127"),
        max_model_len=mml,
        async_scheduling=pick(flags.async_scheduling, False, "0.11.0 config/scheduler.py L138"),
        long_prefill_token_threshold=pick(
            flags.long_prefill_token_threshold, 0, "0.11.0 config/scheduler.py L59"
        ),
        sliding_window=cache_sliding_window(dep.model, flags, "0.11.0 arg_utils.py L1172-1177"),
        executor=executor,
    )
