"""Types and rules shared by every release's defaults (see `sim.scenario.vllm_defaults`)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace
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
    PP_UNSUPPORTED_ARCH = "pipeline parallelism not supported for the architecture"
    LONG_PREFILL_ABOVE_MODEL_LEN = "long_prefill_token_threshold above max_model_len"


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
    slides); `executor` is the distributed executor backend (V1: "uni" for one GPU, else "mp";
    0.5.4: None for one GPU)."""

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
    """The inputs every rule reads. `model` None: an abstract model (kvsim scenarios with a
    linear step time and a given pool), of which only the user's max_model_len is known; the
    rules that read the model's config (heads, windows, architecture) then have nothing to
    check, the GPU and usage-context rules still apply."""

    model: ModelSpec | None
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


#: Catalog name prefix -> (HF architecture, model_type); anything else is Llama-shaped.
FAMILIES: tuple[tuple[str, str, str], ...] = (
    ("mistral", "MistralForCausalLM", "mistral"),
    ("mixtral", "MixtralForCausalLM", "mixtral"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"),
    ("gemma-2", "Gemma2ForCausalLM", "gemma2"),
)


def hf_architecture(model: ModelSpec | None) -> tuple[str, str]:
    """(architecture, model_type) of the model's config.json: "gemma-2-9b" ->
    ("Gemma2ForCausalLM", "gemma2"); a release's per-architecture rules key on the first.
    An abstract model (None) is Llama-shaped."""
    if model is None:
        return "LlamaForCausalLM", "llama"
    for prefix, arch, model_type in FAMILIES:
        if model.name.lower().startswith(prefix):
            return arch, model_type
    return "LlamaForCausalLM", "llama"


def pick(user: Any, default: Any, rule: str) -> Setting:
    if user is not None:
        return Setting(user, Origin.USER, "set by the user")
    return Setting(default, Origin.RELEASE, rule)


# -- max_model_len ----------------------------------------------------------------------------
def max_model_len_setting(dep: Deployment, flags: UserFlags, rule: str) -> Setting:
    """max_position_embeddings, capped at the window where sliding is disabled; a user value
    above it is refused (`_get_and_verify_max_len`, cited in `rule`).

    Example: Mistral-7B (32768, window 4096) with --disable-sliding-window -> 4096. An
    abstract model has no config: the user's value is the length."""
    if dep.model is None:
        if flags.max_model_len is None:
            raise InputError("max_model_len: needed when there is no model")
        return Setting(flags.max_model_len, Origin.USER, "set by the user")
    derived = dep.model.max_position_embeddings
    window = dep.model.sliding_window  # the window config.json carries
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


def check_heads(dep: Deployment, where: str) -> None:
    """ModelConfig.verify_with_parallel_config: the heads split evenly over TP (checked after
    max_model_len, as vLLM builds ModelConfig first)."""
    if dep.model is None:
        return
    if dep.model.num_attention_heads % dep.tp:
        raise DefaultsError(
            f"{dep.model.num_attention_heads} attention heads are not divisible by TP "
            f"{dep.tp} ({where})",
            Refusal.HEADS_NOT_DIVISIBLE,
        )


def cache_sliding_window(model: ModelSpec | None, flags: UserFlags, rule: str) -> Setting:
    """CacheConfig.sliding_window: the window only when every layer slides (an interleaved
    model such as Gemma-2 keeps it per layer) and sliding is not disabled."""
    slides = model is not None and model.layer_pattern == "sliding"
    window = model.sliding_window if model is not None and slides else None
    if flags.disable_sliding_window:
        window = None
    return Setting(window, Origin.RELEASE, rule)


def executor_setting(dep: Deployment, flags: UserFlags, rule: str) -> Setting:
    """V1: "uni" for one GPU, "mp" for more on one node (kvsim simulates one node and no Ray
    placement group, where ParallelConfig.__post_init__ picks multiprocessing)."""
    return Setting("uni" if dep.tp * dep.pp == 1 else "mp", Origin.RELEASE, rule)


def check_batch(mnbt: int, mns: int, max_model_len: int, chunked: bool, rule: str) -> None:
    """SchedulerConfig's refusals: a batch below one sequence, or (without chunked prefill)
    below max_model_len."""
    if mnbt < max_model_len and not chunked:  # checked first, in every release
        raise DefaultsError(
            f"max_num_batched_tokens {mnbt} is smaller than max_model_len {max_model_len} "
            f"without chunked prefill ({rule}); turn chunked prefill on, or give a budget of "
            f"at least {max_model_len}",
            Refusal.BATCH_BELOW_MODEL_LEN,
        )
    if mnbt < mns:
        raise DefaultsError(
            f"max_num_batched_tokens {mnbt} is smaller than max_num_seqs {mns} ({rule}); give "
            f"a budget of at least {mns}, or fewer sequences",
            Refusal.BATCH_BELOW_SEQS,
        )


def replace_flags(flags: UserFlags, **changes: Any) -> UserFlags:
    return replace(flags, **changes)
