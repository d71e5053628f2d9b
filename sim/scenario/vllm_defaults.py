"""The engine settings each pinned vLLM release resolves for a model, GPU, parallelism and entry
point, with each value's origin: set by the user, or this release's default.

A `vllm serve` user passes a few flags; the release derives the rest from the model's config,
the GPU (memory and name), TP x PP and the usage context (the OpenAI API server or the `LLM`
class). This module restates those rules per pin, so a scenario can start from what the real
server would run. `sim/vllm_real/defaults_lockstep.py` builds the real `EngineArgs(...)
.create_engine_config()` of each V1 release over a grid and compares every field with this
(`kvsim verify --defaults --vllm-version V`).

Worked examples (Llama-3.1-8B, max_position_embeddings 131072, TP 1, API server):

    0.33.0  H100 (79.19 GiB, >= 70, not "a100")  -> 1024 seqs, 8192 tokens, async on, util 0.92
    0.33.0  A100 80GB ("a100" in the name)       ->  256 seqs, 2048 tokens
    0.33.0  B200 (~178 GiB >= 160)               -> 1024 seqs, 16384 tokens (both contexts)
    0.11.0  H100                                 -> 1024 seqs, 8192 tokens, async off, util 0.9
    0.5.4   any CUDA GPU (v0, no usage context)  ->  256 seqs, chunked prefill on because
            max_model_len 131072 > 32K, so max_num_batched_tokens 512; prefix caching off

The GPU's memory is what the driver reports (`sim.memory.terms.visible_memory`: measured where
the catalog has it, else memory_gb x 79.19/80), since vLLM asks the device. Pin 4ac7713 (~0.10)
has no install here: `RELEASES` maps it to 0.11.0's rules, as kvsim's scheduler pins do
(`sim/scheduler/v1/release.py`), unverified against its own arg_utils.py.

Left out (the defaults of configurations kvsim does not simulate): pooling and
encoder-decoder models, multimodal models, MLA and Mamba block sizes, speculative decoding,
LoRA, KV transfer / events, data parallelism, TPU / CPU / ROCm platform tables, GB10's
capability check (not in the catalog), rope-scaling factors (the catalog has none) and
`VLLM_ALLOW_LONG_MAX_MODEL_LEN`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields
from typing import Any

from sim.catalog import GpuSpec, ModelSpec
from sim.errors import InputError
from sim.memory.terms import visible_memory

GIB = 2**30


class UsageContext(enum.Enum):
    """vLLM's `UsageContext` for the two entry points (`vllm/usage/usage_lib.py`)."""

    API_SERVER = "api_server"  # `vllm serve` (UsageContext.OPENAI_API_SERVER)
    LLM_CLASS = "llm_class"  # `vllm.LLM(...)` (UsageContext.LLM_CLASS)


class Origin(enum.Enum):
    USER = "user"
    RELEASE = "release default"


class Refusal(enum.Enum):
    """Why a release refuses a configuration at startup."""

    MAX_MODEL_LEN = "max_model_len above the model's"
    BATCH_BELOW_SEQS = "max_num_batched_tokens below max_num_seqs"
    BATCH_BELOW_MODEL_LEN = "max_num_batched_tokens below max_model_len, no chunked prefill"
    HEADS_NOT_DIVISIBLE = "attention heads not divisible by TP"
    ASYNC_WITH_PP = "async scheduling with pipeline parallelism"


class DefaultsError(InputError):
    """The release would refuse this configuration at startup (its own ValueError)."""

    def __init__(self, message: str, refusal: Refusal) -> None:
        super().__init__(message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class UserFlags:
    """What the user passed (`None`: not given, so the release decides)."""

    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    enable_chunked_prefill: bool | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None
    max_model_len: int | None = None
    async_scheduling: bool | None = None
    long_prefill_token_threshold: int | None = None
    disable_sliding_window: bool = False
    #: 0.33.0 `--performance-mode` ("balanced" default; "throughput" doubles the batch limits).
    performance_mode: str | None = None


@dataclass(frozen=True, slots=True)
class Setting:
    """One resolved value, where it came from, and the rule (release file and lines)."""

    value: Any
    origin: Origin
    rule: str


@dataclass(frozen=True, slots=True)
class ResolvedDefaults:
    """What one release runs with. `sliding_window` is CacheConfig's (set only when every layer
    slides); `executor` is the distributed executor backend ("uni" for one GPU, else "mp")."""

    release: str
    max_num_seqs: Setting
    max_num_batched_tokens: Setting
    enable_prefix_caching: Setting
    enable_chunked_prefill: Setting
    gpu_memory_utilization: Setting
    block_size: Setting
    max_model_len: Setting
    async_scheduling: Setting
    long_prefill_token_threshold: Setting
    sliding_window: Setting
    executor: Setting

    def values(self) -> dict[str, Any]:
        """{field: value}, the form the lockstep compares."""
        return {f.name: getattr(self, f.name).value for f in fields(self) if f.name != "release"}


@dataclass(frozen=True, slots=True)
class Deployment:
    """The inputs every rule reads."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    pp: int = 1
    usage: UsageContext = UsageContext.API_SERVER

    @property
    def device_memory_bytes(self) -> int:
        return device_total_memory_bytes(self.gpu)

    @property
    def device_name(self) -> str:
        return gpu_device_name(self.gpu)


def device_total_memory_bytes(gpu: GpuSpec) -> int:
    """What `current_platform.get_device_total_memory()` returns for this GPU (driver-visible)."""
    return visible_memory(gpu)[0]


def gpu_device_name(gpu: GpuSpec) -> str:
    """The device name vLLM reads (only "a100" in it matters): the catalog's display name."""
    return gpu.display_name or gpu.name


def _pick(user: Any, default: Any, rule: str) -> Setting:
    if user is not None:
        return Setting(user, Origin.USER, "set by the user")
    return Setting(default, Origin.RELEASE, rule)


# -- max_model_len ----------------------------------------------------------------------------
def _max_model_len(dep: Deployment, flags: UserFlags, rule: str) -> Setting:
    """max_position_embeddings, capped at the window where sliding is disabled; a user value
    above it is refused (`_get_and_verify_max_len`, cited in `rule`).

    Example: Mistral-7B (32768, window 4096) with --disable-sliding-window -> 4096."""
    derived = dep.model.max_position_embeddings
    window = _config_sliding_window(dep.model)
    if flags.disable_sliding_window and window is not None and window < derived:
        derived = window
    if flags.max_model_len is None:
        return Setting(derived, Origin.RELEASE, rule)
    if flags.max_model_len > derived:
        raise DefaultsError(
            f"max_model_len {flags.max_model_len} exceeds the model's derived maximum {derived} "
            f"({rule}; VLLM_ALLOW_LONG_MAX_MODEL_LEN is not modelled)",
            Refusal.MAX_MODEL_LEN,
        )
    return Setting(flags.max_model_len, Origin.USER, "set by the user")


def _check_heads(dep: Deployment, where: str) -> None:
    """ModelConfig.verify_with_parallel_config: the heads split evenly over TP (checked after
    max_model_len, as vLLM builds ModelConfig first)."""
    if dep.model.num_attention_heads % dep.tp:
        raise DefaultsError(
            f"{dep.model.num_attention_heads} attention heads are not divisible by TP "
            f"{dep.tp} ({where})",
            Refusal.HEADS_NOT_DIVISIBLE,
        )


def _config_sliding_window(model: ModelSpec) -> int | None:
    """The window the model's config.json carries (None for full attention)."""
    return model.sliding_window


def _cache_sliding_window(model: ModelSpec, flags: UserFlags, rule: str) -> Setting:
    """CacheConfig.sliding_window: the window only when every layer slides (an interleaved
    model such as Gemma-2 keeps it per layer) and sliding is not disabled."""
    window = model.sliding_window if model.layer_pattern == "sliding" else None
    if flags.disable_sliding_window:
        window = None
    return Setting(window, Origin.RELEASE, rule)


def _executor(dep: Deployment, flags: UserFlags, rule: str) -> Setting:
    """ "uni" for one GPU, "mp" for more (Ray is not installed; ParallelConfig.__post_init__)."""
    return Setting("uni" if dep.tp * dep.pp == 1 else "mp", Origin.RELEASE, rule)


def _check_batch(mnbt: int, mns: int, max_model_len: int, chunked: bool, rule: str) -> None:
    """SchedulerConfig's refusals: a batch below one sequence, or (without chunked prefill)
    below max_model_len."""
    if mnbt < mns:
        raise DefaultsError(
            f"max_num_batched_tokens {mnbt} < max_num_seqs {mns} ({rule})",
            Refusal.BATCH_BELOW_SEQS,
        )
    if mnbt < max_model_len and not chunked:
        raise DefaultsError(
            f"max_num_batched_tokens {mnbt} < max_model_len {max_model_len} without chunked "
            f"prefill ({rule})",
            Refusal.BATCH_BELOW_MODEL_LEN,
        )


# -- the V1 batch tables ----------------------------------------------------------------------
def _v1_batch_table(dep: Deployment, release: str) -> tuple[int, int, str]:
    """(max_num_batched_tokens, max_num_seqs, rule) for the GPU tier and usage context.

    0.33.0 `EngineArgs.get_batch_defaults` (engine/arg_utils.py L2940-3039): >= 160 GiB ->
    16384 / 1024 for both contexts (L2970-2978); >= 70 GiB and no "a100" in the name -> API
    server 8192 / 1024, LLM class 16384 / 1024 (L2979-2991); else 2048 / 256 and 8192 / 256
    (L2992-3001). 0.11.0 `_set_default_args` (L1588-1609) has no >= 160 GiB tier."""
    api = dep.usage is UsageContext.API_SERVER
    memory, name = dep.device_memory_bytes, dep.device_name.lower()
    v033 = release == "0.33.0"
    if v033 and memory >= 160 * GIB:
        return 16384, 1024, "0.33.0 engine/arg_utils.py L2970-2978 (>= 160 GiB)"
    if memory >= 70 * GIB and "a100" not in name:
        where = (
            "0.33.0 engine/arg_utils.py L2979-2991" if v033 else "0.11.0 arg_utils.py L1588-1597"
        )
        return (8192 if api else 16384), 1024, where + " (>= 70 GiB, not A100)"
    where = "0.33.0 engine/arg_utils.py L2992-3001" if v033 else "0.11.0 arg_utils.py L1598-1607"
    return (2048 if api else 8192), 256, where + " (other GPUs)"


def _resolve_v033(dep: Deployment, flags: UserFlags) -> ResolvedDefaults:
    """vLLM 0.33.0's V1 engine (`EngineArgs.create_engine_config`, engine/arg_utils.py L2245)."""
    mml = _max_model_len(dep, flags, "0.33.0 config/model.py L2545-2660")
    _check_heads(dep, "0.33.0 config/model.py L1559")
    chunked = _pick(
        flags.enable_chunked_prefill,
        True,
        "0.33.0 arg_utils.py L3041-3048: generative models support chunked prefill "
        "(config/model.py L2229-2236)",
    )
    prefix = _pick(
        flags.enable_prefix_caching,
        True,
        "0.33.0 arg_utils.py L3075-3076: decoder models support prefix caching "
        "(config/model.py L2288-2290)",
    )
    table_mnbt, table_mns, table_rule = _v1_batch_table(dep, "0.33.0")
    factor = 2 if flags.performance_mode == "throughput" else 1  # arg_utils.py L3184-3188
    mns = table_mns * factor if flags.max_num_seqs is None else flags.max_num_seqs
    if flags.max_num_batched_tokens is None:
        mnbt = table_mnbt * factor
        if not chunked.value:  # L3194-3199: at least one whole max_model_len
            mnbt = max(mml.value, mnbt)
        mnbt = min(mns * mml.value, mnbt)  # L3222-3225
    else:
        mnbt = flags.max_num_batched_tokens
    if flags.max_num_seqs is None:
        mns = min(mns, mnbt)  # L3234
    batch_rule = f"{table_rule}; arg_utils.py L3151-3245"
    _check_batch(mnbt, mns, mml.value, chunked.value, "0.33.0 config/scheduler.py L317-336")
    return ResolvedDefaults(
        release="0.33.0",
        max_num_seqs=_pick(flags.max_num_seqs, mns, batch_rule),
        max_num_batched_tokens=_pick(flags.max_num_batched_tokens, mnbt, batch_rule),
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=_pick(
            flags.gpu_memory_utilization, 0.92, "0.33.0 config/cache.py L215"
        ),
        block_size=_pick(
            flags.block_size,
            16,
            "0.33.0 config/cache.py L185, L462-463; the CUDA attention backends keep 16 "
            "(platforms/interface.py L771-781)",
        ),
        max_model_len=mml,
        async_scheduling=_async_v033(flags),
        long_prefill_token_threshold=_pick(
            flags.long_prefill_token_threshold, 0, "0.33.0 config/scheduler.py L79"
        ),
        sliding_window=_cache_sliding_window(dep.model, flags, "0.33.0 arg_utils.py L2288-2294"),
        executor=_executor(dep, flags, "0.33.0 config/parallel.py"),
    )


def _async_v033(flags: UserFlags) -> Setting:
    """On unless incompatible (config/vllm.py L1685-1719). On a GPU install (Triton present)
    the V2 model runner is the default (L731-767), and only the V1 runner refuses pipeline
    parallelism with async (L1652-1666), so no catalog model, TP or PP turns it off."""
    return _pick(flags.async_scheduling, True, "0.33.0 config/vllm.py L1685-1719")


def _resolve_v011(dep: Deployment, flags: UserFlags, release: str) -> ResolvedDefaults:
    """vLLM 0.11.0's V1 engine (`EngineArgs._set_default_args`, engine/arg_utils.py L1540)."""
    mml = _max_model_len(dep, flags, "0.11.0 config/model.py L1763-1880")
    _check_heads(dep, "0.11.0 config/model.py L1048")
    # L1547-1549: non-pooling models always chunk, whatever the user passed.
    chunked = Setting(True, Origin.RELEASE, "0.11.0 arg_utils.py L1547-1549 (overrides the user)")
    prefix = _pick(flags.enable_prefix_caching, True, "0.11.0 arg_utils.py L1561-1562")
    table_mnbt, table_mns, table_rule = _v1_batch_table(dep, "0.11.0")
    mnbt = table_mnbt if flags.max_num_batched_tokens is None else flags.max_num_batched_tokens
    mns = min(table_mns, mnbt) if flags.max_num_seqs is None else flags.max_num_seqs  # L1675
    batch_rule = f"{table_rule}; arg_utils.py L1652-1678"
    _check_batch(mnbt, mns, mml.value, True, "0.11.0 config/scheduler.py L233-249")
    if flags.async_scheduling and dep.pp > 1:  # arg_utils.py L1295-1297
        raise DefaultsError(
            "async scheduling with pipeline-parallel-size > 1 (0.11.0 arg_utils.py L1295-1297)",
            Refusal.ASYNC_WITH_PP,
        )
    executor = _executor(dep, flags, "0.11.0 config/parallel.py L440-483")
    if flags.async_scheduling:  # L1289-1294: async needs the mp executor, even on one GPU
        executor = Setting("mp", Origin.RELEASE, "0.11.0 arg_utils.py L1289-1294")
    return ResolvedDefaults(
        release=release,
        max_num_seqs=_pick(flags.max_num_seqs, mns, batch_rule),
        max_num_batched_tokens=_pick(flags.max_num_batched_tokens, mnbt, batch_rule),
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=_pick(
            flags.gpu_memory_utilization, 0.9, "0.11.0 config/cache.py L43"
        ),
        block_size=_pick(flags.block_size, 16, "0.11.0 platforms/cuda.py L126-127"),
        max_model_len=mml,
        async_scheduling=_pick(flags.async_scheduling, False, "0.11.0 config/scheduler.py L138"),
        long_prefill_token_threshold=_pick(
            flags.long_prefill_token_threshold, 0, "0.11.0 config/scheduler.py L59"
        ),
        sliding_window=_cache_sliding_window(dep.model, flags, "0.11.0 arg_utils.py L1170-1176"),
        executor=executor,
    )


def _resolve_v054(dep: Deployment, flags: UserFlags) -> ResolvedDefaults:
    """vLLM 0.5.4's v0 engine: fixed EngineArgs defaults, no GPU or usage-context tables.

    Gemma-2's interleaved window is unsupported there: sliding is disabled and max_model_len
    capped at the window (config.py L163-171), 8192 -> 4096."""
    model = dep.model
    if model.layer_pattern == "alternating":
        flags = _replace_flags(flags, disable_sliding_window=True)
    mml = _max_model_len(dep, flags, "0.5.4 config.py L1459-1540")
    _check_heads(dep, "0.5.4 config.py L272")
    window = None if flags.disable_sliding_window else model.sliding_window
    prefix = _pick(flags.enable_prefix_caching, False, "0.5.4 engine/arg_utils.py L56")
    # arg_utils.py L746-773: on by default above 32K tokens on CUDA, without a sliding window
    # or prefix caching (spec decode, LoRA, prompt adapters, Mamba layers: not modelled).
    auto_chunk = mml.value > 32768 and window is None and not prefix.value
    chunked = _pick(flags.enable_chunked_prefill, auto_chunk, "0.5.4 engine/arg_utils.py L746-773")
    # config.py L795-806: 512 with chunked prefill, else max(max_model_len, 2048).
    mnbt = 512 if chunked.value else max(mml.value, 2048)
    if flags.max_num_batched_tokens is not None:
        mnbt = flags.max_num_batched_tokens
    mns = 256 if flags.max_num_seqs is None else flags.max_num_seqs
    _check_batch(mnbt, mns, mml.value, chunked.value, "0.5.4 config.py L824-838")
    return ResolvedDefaults(
        release="0.5.4",
        max_num_seqs=_pick(flags.max_num_seqs, 256, "0.5.4 engine/arg_utils.py L63"),
        max_num_batched_tokens=_pick(flags.max_num_batched_tokens, mnbt, "0.5.4 config.py L795"),
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=_pick(
            flags.gpu_memory_utilization, 0.9, "0.5.4 engine/arg_utils.py L61"
        ),
        block_size=_pick(flags.block_size, 16, "0.5.4 engine/arg_utils.py L55"),
        max_model_len=mml,
        async_scheduling=Setting(False, Origin.RELEASE, "v0 has no async scheduling"),
        long_prefill_token_threshold=Setting(0, Origin.RELEASE, "v0 has no such setting"),
        sliding_window=Setting(window, Origin.RELEASE, "0.5.4 config.py L307-314"),
        executor=_executor(dep, flags, "0.5.4 config.py (ParallelConfig)"),
    )


def _replace_flags(flags: UserFlags, **changes: Any) -> UserFlags:
    from dataclasses import replace

    return replace(flags, **changes)


#: Pin -> the release whose rules it follows.
RELEASES: dict[str, str] = {
    "0.5.4": "0.5.4",
    "4ac7713": "0.11.0",
    "0.11.0": "0.11.0",
    "0.33.0": "0.33.0",
}


def resolve_defaults(
    release: str,
    model: ModelSpec,
    gpu: GpuSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    usage: UsageContext = UsageContext.API_SERVER,
    flags: UserFlags | None = None,
) -> ResolvedDefaults:
    """The settings `release` resolves; raises DefaultsError where it would refuse to start."""
    if release not in RELEASES:
        raise InputError(f"no defaults table for vLLM {release!r}; known: {sorted(RELEASES)}")
    if tp < 1 or pp < 1:
        raise InputError(f"tensor/pipeline parallel sizes must be >= 1, got {tp}/{pp}")
    dep = Deployment(model, gpu, tp, pp, usage)
    flags = flags or UserFlags()
    if flags.performance_mode not in (None, "balanced", "interactivity", "throughput"):
        raise InputError(f"unknown performance_mode {flags.performance_mode!r}")
    rules = RELEASES[release]
    if rules == "0.33.0":
        return _resolve_v033(dep, flags)
    if rules == "0.11.0":
        return _resolve_v011(dep, flags, release)
    return _resolve_v054(dep, flags)
