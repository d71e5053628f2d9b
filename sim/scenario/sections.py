"""The sections of a scenario file (`schema.Scenario` nests them): hardware, cache (and its
KV-cache groups), scheduler, engine and expect (and its summary bounds), each a closed
pydantic model (an unknown key is an error); their fields are documented in
docs/scenarios.md."""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from sim.audit import AuditLevel, ViolationKind, ViolationPolicy
from sim.catalog import get_gpu
from sim.cluster.config import RouterName
from sim.errors import InputError
from sim.kv.config import Design, KVCacheGroupSpec
from sim.kv.pins import resolve_pin
from sim.scenario.fields import Bool, Float, Int, Seconds
from sim.scenario.vllm_defaults.common import UsageContext
from sim.scheduler.config import Policy, PreemptionMode


class ClosedModel(BaseModel):
    """A section that refuses unknown keys and cannot be changed once read."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class KVCacheGroupSection(ClosedModel):
    """One V1-engine KV-cache group: full attention (no field), a sliding window,
    chunked-local attention (Llama-4's RoPE layers), or a Mamba / linear-attention state
    (`mamba: true`; Jamba, Nemotron-H, Qwen3.5-style hybrids: one block per request with
    prefix caching off; with it on, the "align" or "all" mode, `cache.mamba_cache_mode`,
    0.19.1-0.26.0, "align" with prefill checkpoint blocks on 0.33.0), or a variant of full
    attention (`sink_len`, `rswa_window`, `circular_buffer`: scenarios/full_variants_hybrid_v1.yaml;
    prefix caching over them except a sink or R-SWA group beside a third attention type,
    sim/kv/v1_engine/variant_caching.py). Example: scenarios/mamba_hybrid_v1.yaml, three Mamba groups then a
    full one, `kv_cache_groups: [{mamba: true}, {mamba: true}, {mamba: true}, {}]`."""

    sliding_window: Int | None = Field(default=None, ge=1)
    attention_chunk_size: Int | None = Field(default=None, ge=1)
    #: A Mamba state group (vLLM 0.11.0 on; prefix caching over it, the "align" or "all"
    #: mode, on 0.19.1-0.33.0 only: `cache.enable_prefix_caching: false` on 0.11.0).
    mamba: Bool = False
    #: Full attention with this many static sink tokens, a multiple of cache.block_size
    #: (vLLM 0.19.1 and 0.20.0; `SinkFullAttentionSpec`, sim/kv/v1_engine/full_variants.py).
    sink_len: Int | None = Field(default=None, ge=1)
    #: Reference sliding-window attention: the prompt and the last rswa_window generated
    #: tokens (vLLM 0.25.1 on; `RSWASpec`).
    rswa_window: Int | None = Field(default=None, ge=1)
    #: A circular buffer of one block per request (vLLM 0.33.0; `CircularBufferSpec`).
    circular_buffer: Bool = False

    @model_validator(mode="after")
    def _one_type(self) -> KVCacheGroupSection:
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError("a group is sliding-window or chunked-local, not both")
        if self.mamba and (self.sliding_window is not None or self.attention_chunk_size):
            raise ValueError("a Mamba group has no sliding_window or attention_chunk_size")
        self.group_spec()  # the rest of the manager's own checks (one kind per group)
        return self

    def group_spec(self) -> KVCacheGroupSpec:
        """The manager's group spec (`sim.kv.config.KVCacheGroupSpec`)."""
        return KVCacheGroupSpec(
            self.sliding_window,
            self.attention_chunk_size,
            self.mamba,
            sink_len=self.sink_len,
            rswa_window=self.rswa_window,
            circular_buffer=self.circular_buffer,
        )


class CacheSection(ClosedModel):
    # Fields that default to None are what a user passes to `vllm serve`: unset, they take the
    # value the pinned release derives for the model, GPU and entry point
    # (`sim.scenario.release_defaults`; summary.json records each value and its origin).
    #: Strict: YAML `true` is not a block size (lax validation turned it into 1, and the error
    #: that followed blamed scheduler.max_model_len). None: the release's (16).
    block_size: Int | None = Field(default=None, ge=1)
    #: A number, or "derive" to compute it from the model, GPU and memory settings.
    num_gpu_blocks: Annotated[Int, Field(ge=1)] | Literal["derive"] = "derive"
    num_cpu_blocks: Int | None = Field(default=None, ge=0)
    #: CPU swap space per replica, used when num_cpu_blocks is not given (vLLM default 4 GiB).
    swap_space_gib: Float = Field(default=4.0, ge=0)
    #: Tokens; "model" takes the model's window where all its layers are sliding (Mistral).
    sliding_window: Annotated[Int, Field(ge=1)] | Literal["model"] | None = "model"
    #: None: the release's (off in 0.5.4's v0 engine, on in the V1 releases).
    enable_prefix_caching: Bool | None = None
    #: With Mamba groups and prefix caching (`vllm serve --mamba-cache-mode`): "align" or
    #: "all" (0.19.1-0.26.0, Mamba2-family models). None: the release's for the model
    #: (`sim.scenario.vllm_defaults.mamba`; "align" where kvsim does not know the model).
    mamba_cache_mode: Literal["align", "all"] | None = None
    watermark: Float = Field(default=0.01, ge=0, lt=1)
    #: None: the release's (0.9; 0.92 from 0.33.0).
    gpu_memory_utilization: Float | None = Field(default=None, gt=0, le=1)
    kv_cache_dtype: Literal["auto", "fp16", "bf16", "fp8"] = "auto"
    #: V1 engine: host memory (GiB per GPU) for vLLM's CPU KV offloading connector; 0: off.
    cpu_offload_gib: Float = Field(default=0.0, ge=0)
    #: Tokens per offloaded block (a multiple of block_size); None: block_size.
    cpu_offload_block_size: Int | None = Field(default=None, ge=1)
    #: v1-engine: the KV-cache groups in group-id order, overriding the model's (a catalog
    #: model with per-layer types gets its release's groups without them,
    #: `sim.memory.hybrid_pool`); needs a given num_gpu_blocks (the shared pool). Empty: the
    #: model's layout.
    kv_cache_groups: tuple[KVCacheGroupSection, ...] = ()


class SchedulerSection(ClosedModel):
    design: Design = Design.V0_V2
    max_model_len: Int | None = Field(default=None, ge=1)
    #: None (these four): the release's, by GPU memory and name and entry point in V1 (an H100
    #: behind the API server: 1024 sequences, 8192 tokens; 0.5.4: 256 sequences).
    max_num_seqs: Int | None = Field(default=None, ge=1)
    max_num_batched_tokens: Int | None = Field(default=None, ge=1)
    enable_chunked_prefill: Bool | None = None
    policy: Policy = Policy.FCFS
    preemption_mode: PreemptionMode = PreemptionMode.AUTO
    long_prefill_token_threshold: Int | None = Field(default=None, ge=0)
    #: A speed-up that changes no result (tests prove it); false calls the manager every step.
    decode_fast_path: Bool = True
    #: Also keep steady decodes in a cohort so a step costs what changes in it (same results).
    decode_cohort: Bool = True
    #: The vLLM version the design models (`sim.kv.pins`). v1-engine: "4ac7713", "0.11.0" or
    #: "0.33.0", unset = the latest (0.33.0). v0 designs: "0.5.4" (the release; the default)
    #: or, for v0-v2 only, "0.5.4+7380".
    vllm_version: str | None = None
    #: v1-engine: vLLM's async scheduling (`AsyncScheduler`, the engine core's batch queue of
    #: 2): true, false, or unset = the pinned release's default (on in 0.33.0, off in 0.11.0).
    #: The v0 engine has none.
    async_scheduling: Bool | None = None

    @model_validator(mode="after")
    def _async_needs_v1(self) -> SchedulerSection:
        if self.async_scheduling and self.design.api != "v1":
            raise ValueError(
                f"async_scheduling: the {self.design.value} design (vLLM's v0 engine) has no "
                "async scheduler; use design: v1-engine or leave it unset"
            )
        return self

    @model_validator(mode="after")
    def _version_of_design(self) -> SchedulerSection:
        if self.vllm_version is None:
            return self
        try:
            resolve_pin(self.design, self.vllm_version)
        except ValueError as error:
            raise ValueError(f"vllm_version: {error}") from None
        return self

    @property
    def resolved_vllm_version(self) -> str:
        """The exact vLLM version a run models: `vllm_version`, or the design's default
        ("0.33.0" for v1-engine, the "0.5.4" release for the v0 designs)."""
        return resolve_pin(self.design, self.vllm_version).value


class EngineSection(ClosedModel):
    num_replicas: Int = Field(default=1, ge=1)
    router: RouterName = "round_robin"
    #: prefix_cache_aware only: score = leading prompt blocks held - weight * outstanding.
    router_load_weight: Float = Field(default=1.0, ge=0)
    #: prefix_cache_aware only: seconds from a replica's KV event to the router seeing it.
    router_staleness_s: Seconds = 0.0
    #: Write the replicas' KV cache events as the `kv_events` table (V1 engine only).
    kv_events: Bool = False
    #: record (carry on), stop (end where the real engine raises: an allocation that ran dry,
    #: a double free, ...) or stop_any (end at the first violation of any kind).
    violation_policy: ViolationPolicy = ViolationPolicy.RECORD
    audit_level: AuditLevel = AuditLevel.CHEAP
    max_sim_time_s: Seconds | None = Field(default=None, gt=0)
    #: How vLLM is launched, which picks the V1 batch defaults: `vllm serve` (api_server) or
    #: the `vllm.LLM` class (llm_class).
    entry_point: UsageContext = UsageContext.API_SERVER
    #: `vllm serve --api-server-count`: API server processes, each its own event loop taking a
    #: share of the requests (`sim.engine.frontend`; read where a run has an API server, as
    #: `kvsim bench serve` does).
    api_server_count: Int = Field(default=1, ge=1)
    #: `vllm serve --stream-interval` (0.19.1 onward): tokens a stream holds before it sends
    #: (first and last go at once); read with the API server, as `api_server_count`.
    stream_interval: Int = Field(default=1, ge=1)


class HardwareSection(ClosedModel):
    #: A catalog name, or a geometry dict for a GPU outside the catalog (the `GpuSpec` fields:
    #: memory_gb, memory_visible_gib, hbm_bandwidth_GBps, bf16_tflops, fp16_tflops,
    #: interconnect_GBps, ...), as `model:` accepts a dict.
    gpu: str | dict[str, Any] = "h100-sxm"
    tensor_parallel_size: Int = Field(default=1, ge=1)
    #: False: the GPUs cannot reach each other's memory (vLLM logs "Custom allreduce is
    #: disabled because your platform lacks GPU P2P capability"); all-reduce goes through host
    #: memory (sim.latency.interconnect). Measured step time only.
    p2p: bool = True

    @field_validator("gpu")
    @classmethod
    def _catalog_gpu(cls, gpu: str | dict[str, Any]) -> str | dict[str, Any]:
        """A catalog name is looked up here, so an unknown one is reported as hardware.gpu,
        not under whichever section first uses the GPU (step_time, cache.num_gpu_blocks)."""
        if isinstance(gpu, str):
            try:
                get_gpu(gpu)
            except InputError as error:
                raise ValueError(str(error)) from None
        return gpu

    @model_validator(mode="after")
    def _gpu_geometry(self) -> HardwareSection:
        if isinstance(self.gpu, dict):
            try:
                get_gpu(self.gpu)
            except ValidationError as error:
                first = error.errors()[0]
                where = ".".join(str(p) for p in first["loc"])
                raise ValueError(f"gpu.{where}: {first['msg']}") from None
        return self


class SummaryBound(ClosedModel):
    """Bounds on one summary metric of the run: `{min: 0.5}`, `{max: 0.2}` or both."""

    min: float | None = Field(default=None, allow_inf_nan=False)
    max: float | None = Field(default=None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _a_bound(self) -> SummaryBound:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} is above max {self.max}")
        return self


class ExpectSection(ClosedModel):
    """What `kvsim check` compares with: `violations: none` or a list of kinds that must occur;
    and `summary:`, bounds on metrics of the run's summary (`sim.ci.expect_summary`), so a
    scenario can state what it shows: `summary: {ttft_p50_s: {max: 0.2}}`."""

    violations: Literal["none", "any"] | list[ViolationKind] = "none"
    summary: dict[str, SummaryBound] = Field(default_factory=dict)

    @field_validator("violations", mode="before")
    @classmethod
    def _known_kinds(cls, value: Any) -> Any:
        """An unknown kind is named with the known ones (the union's own error named neither:
        "expect.violations.literal['none','any']: Input should be 'none' or 'any')."""
        known = ", ".join(kind.value for kind in ViolationKind)
        items = [value] if isinstance(value, str) and value not in ("none", "any") else value
        if not isinstance(items, list):
            if isinstance(value, str):
                return value
            raise ValueError(f"expected none, any or a list of violation kinds ({known})")
        for item in items:
            if not isinstance(item, str) or item not in {k.value for k in ViolationKind}:
                raise ValueError(_unknown_kind(item, known))
        return value


def _unknown_kind(item: object, known: str) -> str:
    """A misspelt kind gets its nearest name; anything else the list. Kept short: the list of
    13 kinds nearly fills the one-line error (`sim.errors.MAX_ERROR_CHARS`).

    >>> _unknown_kind("no_progres", "no_progress")
    "unknown violation kind 'no_progres'; did you mean 'no_progress'?"
    """
    close = difflib.get_close_matches(str(item), [k.value for k in ViolationKind], n=1)
    if close:
        return f"unknown violation kind {item!r}; did you mean {close[0]!r}?"
    return f"unknown violation kind {item!r}; none, any or of: {known}"
