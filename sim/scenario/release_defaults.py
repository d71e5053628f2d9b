"""A scenario's unset engine settings, filled in as its pinned vLLM release derives them.

A scenario says what the user passes to `vllm serve`; every engine setting it leaves unset
(None in `sim.scenario.schema`) takes the value the pinned release computes for that model,
GPU (memory and name), tensor parallelism and entry point (`engine.entry_point`, the API
server unless said): `sim.scenario.vllm_defaults`, verified against each release's own
`EngineArgs.create_engine_config()` by `kvsim verify --defaults`. `apply_release_defaults`
returns the scenario with every such field concrete, and a record of each value's origin,
which `summary.json` keeps under `inputs.settings`.

Worked example: Llama-3.1-8B on an H100, `design: v1-engine`, nothing else set ->

    vLLM 0.33.0: max_num_seqs 1024, max_num_batched_tokens 8192, chunked prefill on,
                 prefix caching on, gpu_memory_utilization 0.92, async scheduling on
    vLLM 0.11.0: the same batch limits, utilization 0.9, async scheduling off
    (v0-v2) 0.5.4: 256 sequences; max_model_len 131072 > 32K turns chunked prefill on with a
                 512-token budget; prefix caching off

Where the release overrides the user (0.11.0 chunks every generative model, whatever
`enable_chunked_prefill` says), the run follows the release, as the real server does, and
`overridden` names the field. Not mapped: `cache.sliding_window: null` is kvsim's "simulate
without a window", not vLLM's `--disable-sliding-window` (which also caps max_model_len).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from sim.catalog import ModelSpec, get_gpu, get_model
from sim.errors import InputError
from sim.kv.pins import VllmPin
from sim.scenario.schema import Scenario, ScenarioError
from sim.scenario.vllm_defaults import (
    ABSENT_FLAGS,
    RELEASES,
    DefaultsError,
    Refusal,
    ResolvedDefaults,
    UserFlags,
    resolve_defaults,
)
from sim.scenario.vllm_defaults.common import replace_flags

#: ResolvedDefaults field -> (scenario section, field) it fills.
SCENARIO_FIELDS: dict[str, tuple[str, str]] = {
    "max_num_seqs": ("scheduler", "max_num_seqs"),
    "max_num_batched_tokens": ("scheduler", "max_num_batched_tokens"),
    "enable_chunked_prefill": ("scheduler", "enable_chunked_prefill"),
    "max_model_len": ("scheduler", "max_model_len"),
    "long_prefill_token_threshold": ("scheduler", "long_prefill_token_threshold"),
    "async_scheduling": ("scheduler", "async_scheduling"),
    "enable_prefix_caching": ("cache", "enable_prefix_caching"),
    "gpu_memory_utilization": ("cache", "gpu_memory_utilization"),
    "block_size": ("cache", "block_size"),
}

T = TypeVar("T")


def applied(value: T | None, field: str) -> T:
    """A setting `apply_release_defaults` has filled in. None here is a kvsim bug (a section
    read before its release's defaults were applied), not bad input."""
    if value is None:
        raise AssertionError(f"{field} read before the release's defaults were applied")
    return value


#: Where a release's startup refusal points in the scenario.
_REFUSAL_FIELD: dict[Refusal, str] = {
    Refusal.MAX_MODEL_LEN: "scheduler.max_model_len",
    Refusal.BATCH_BELOW_SEQS: "scheduler.max_num_batched_tokens",
    Refusal.BATCH_BELOW_MODEL_LEN: "scheduler.max_num_batched_tokens",
    Refusal.HEADS_NOT_DIVISIBLE: "hardware.tensor_parallel_size",
    Refusal.ASYNC_WITH_PP: "scheduler.async_scheduling",
    Refusal.PP_UNSUPPORTED_ARCH: "hardware",
    Refusal.LONG_PREFILL_ABOVE_MODEL_LEN: "scheduler.long_prefill_token_threshold",
}

#: The releases with their own defaults table, oldest first ("what changed since the last").
_TABLE_ORDER = (VllmPin.V0_5_4, VllmPin.V0_11_0, VllmPin.V0_33_0)


@dataclass(frozen=True, slots=True)
class ReleaseSettings:
    """The scenario as the release runs it, the release's resolution, and what it overrode."""

    scenario: Scenario
    defaults: ResolvedDefaults
    #: Scenario fields the user set that the release replaces (0.11.0's chunked prefill).
    overridden: tuple[str, ...] = ()
    #: Release defaults kvsim cannot simulate here, replaced by what it can, each said.
    not_modelled: dict[str, str] = field(default_factory=dict)

    def record(self) -> dict[str, dict[str, Any]]:
        """{setting: {value, origin, rule}}, for summary.json (`inputs.settings`)."""
        out: dict[str, dict[str, Any]] = {}
        for f in fields(self.defaults):
            if f.name == "release":
                continue
            setting = getattr(self.defaults, f.name)
            out[f.name] = {
                "value": setting.value,
                "origin": setting.origin.value,
                "rule": setting.rule,
            }
        for name, why in self.not_modelled.items():
            section, scenario_field = SCENARIO_FIELDS[name]
            ran = getattr(getattr(self.scenario, section), scenario_field)
            out[name] = {"value": ran, "origin": "kvsim (not modelled)", "rule": why}
        return out


def user_flags(scenario: Scenario) -> UserFlags:
    """What the scenario sets of the flags a release defaults (None: unset)."""
    sched, cache = scenario.scheduler, scenario.cache
    return UserFlags(
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        enable_prefix_caching=cache.enable_prefix_caching,
        enable_chunked_prefill=sched.enable_chunked_prefill,
        gpu_memory_utilization=cache.gpu_memory_utilization,
        block_size=cache.block_size,
        max_model_len=sched.max_model_len,
        async_scheduling=sched.async_scheduling,
        # 0 is "off" in every V1 release, as unset is: the v0 release has no such flag.
        long_prefill_token_threshold=sched.long_prefill_token_threshold or None,
    )


def model_of(scenario: Scenario) -> ModelSpec | None:
    """The scenario's model from the catalog (or its dict); None for a model-free scenario.
    A bad name is the scenario's `model` field."""
    if scenario.model is None:
        return None
    try:
        return get_model(scenario.model)
    except InputError as error:
        raise ScenarioError(f"model: {error}".splitlines()[0]) from None


def resolve_release(scenario: Scenario, release: str | None = None) -> ResolvedDefaults:
    """What `release` (default: the scenario's pin) resolves for the scenario's deployment.

    Raises ScenarioError naming the field where the release would refuse to start."""
    release = release or scenario.scheduler.resolved_vllm_version
    flags = user_flags(scenario)
    for name in ABSENT_FLAGS.get(RELEASES[release], ()):
        if name not in SCENARIO_FIELDS:  # not a scenario setting (performance_mode)
            continue
        if getattr(flags, name):  # false / 0 is what a release without the flag does
            section, field = SCENARIO_FIELDS[name]
            raise ScenarioError(
                f"{section}.{field}: vLLM {release} has no --{name.replace('_', '-')}"
            )
        flags = replace_flags(flags, **{name: None})
    if scenario.model is None and flags.max_model_len is None:
        raise ScenarioError("scheduler.max_model_len: needed when the scenario has no model")
    try:
        return resolve_defaults(
            release,
            model_of(scenario),
            get_gpu(scenario.hardware.gpu),
            tp=scenario.hardware.tensor_parallel_size,
            usage=scenario.engine.entry_point,
            flags=flags,
        )
    except DefaultsError as error:
        where = _REFUSAL_FIELD[error.refusal]
        raise ScenarioError(f"{where}: vLLM {release} refuses to start: {error}") from None


def apply_release_defaults(scenario: Scenario) -> ReleaseSettings:
    """The scenario with every unset engine setting filled in by its pinned release.

    Idempotent: the result has every field of `SCENARIO_FIELDS` set, so applying it again
    changes nothing."""
    resolved = resolve_release(scenario)
    updates: dict[str, dict[str, Any]] = {"scheduler": {}, "cache": {}}
    overridden = []
    for name, (section, key) in SCENARIO_FIELDS.items():
        value = getattr(resolved, name).value
        given = getattr(getattr(scenario, section), key)
        if given is not None and given != value and name != "long_prefill_token_threshold":
            overridden.append(f"{section}.{key}")
        updates[section][key] = value
    not_modelled = _not_modelled(scenario, resolved, updates)
    filled = scenario.model_copy(
        update={
            "scheduler": scenario.scheduler.model_copy(update=updates["scheduler"]),
            "cache": scenario.cache.model_copy(update=updates["cache"]),
        }
    )
    return ReleaseSettings(filled, resolved, tuple(overridden), not_modelled)


def _not_modelled(
    scenario: Scenario, resolved: ResolvedDefaults, updates: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """Release defaults kvsim replaces because it cannot simulate them with this scenario
    (changing `updates`): async scheduling by default with the CPU offloading connector, which
    kvsim models only synchronously (a user who asks for both is refused instead)."""
    wants_async = resolved.async_scheduling.value and scenario.scheduler.async_scheduling is None
    if wants_async and scenario.cache.cpu_offload_gib > 0:
        updates["scheduler"]["async_scheduling"] = False
        return {
            "async_scheduling": f"vLLM {resolved.release} would schedule asynchronously "
            "(config/vllm.py L1685-1719); kvsim models the CPU offloading connector only "
            "with synchronous scheduling, so this run is synchronous"
        }
    return {}


def previous_table(release: str) -> VllmPin | None:
    """The release with the defaults table before `release`'s: 0.33.0 -> 0.11.0, 0.11.0 (and
    4ac7713, which follows its rules) -> 0.5.4, 0.5.4 -> None."""
    index = _TABLE_ORDER.index(RELEASES[release])
    return _TABLE_ORDER[index - 1] if index else None


def changes_since_previous(scenario: Scenario, settings: ReleaseSettings) -> dict[str, Any]:
    """The release defaults this run uses that the previous table's release would not, for
    the scenario as the user wrote it: ``{"previous": "0.11.0", "changes":
    ["async_scheduling: True (0.11.0: False)", ...]}``; no changes when there is no previous
    table, or it would refuse the deployment (`refused` says why)."""
    previous = previous_table(settings.defaults.release)
    if previous is None:
        return {"previous": None, "changes": []}
    try:
        before = resolve_release(scenario, previous.value)
    except ScenarioError as error:
        return {"previous": previous.value, "changes": [], "refused": str(error)}
    lines = []
    for f in fields(settings.defaults):
        if f.name == "release":
            continue
        now, then = getattr(settings.defaults, f.name), getattr(before, f.name)
        if now.origin.value != "user" and now.value != then.value:
            lines.append(f"{f.name} {now.value} (was {then.value})")
    return {"previous": previous.value, "changes": lines}
