"""Scenario settings that would do nothing where they are set: refused, not accepted.

A setting the run cannot honour looks, in the outputs, exactly like one that was honoured and
changed nothing: a `kv_events` table that is empty because the v0 engine emits no events, a
prefix-cache router choosing among replicas that cache nothing. Each is bad input, named by
its field, before anything runs:

* `engine.kv_events` on a v0 design: vLLM 0.5.4's v0 engine has no KV cache events (they come
  with the V1 engine's `KVEventBatch`; `sim.kv_events`), so the table would be empty;
* `engine.router: prefix_cache_aware` on a v0 design (it routes on those events) or with
  `cache.enable_prefix_caching: false` (nothing is cached to route by: every score is 0);
* `engine.router_load_weight` / `engine.router_staleness_s` set with another router (only the
  prefix-cache-aware router reads them, `sim.routing.make_policy`, `sim.engine.engine`);
* `scheduler.long_prefill_token_threshold` on a v0 design (a V1-engine setting; vLLM 0.5.4's
  `SchedulerConfig` has no such field, and kvsim's v0 scheduler never reads it);
* `scheduler.preemption_mode: swap`, `cache.num_cpu_blocks > 0` or `cache.swap_space_gib` on
  v1-engine: the V1 engine preempts by recompute only and keeps no swap space (its CPU tier
  is the offloading connector, `cache.cpu_offload_gib`).

Only values other than the default are refused: a default is what the run does, not a request.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from sim.kv.config import Design
from sim.scenario.schema import Scenario, ScenarioError

#: The settings only the prefix-cache-aware router reads (`sim.routing.make_policy`).
PREFIX_ROUTER_KNOBS = ("router_load_weight", "router_staleness_s")


def _default(section: BaseModel, name: str) -> Any:
    """The schema default of `section.name`. A value is compared with it, not looked up in
    `model_fields_set`: a scenario dumped whole and read back (cluster capacity, fuzz cases)
    "sets" every field."""
    return type(section).model_fields[name].default


def _v0_only(scenario: Scenario) -> None:
    """What a v0 design cannot honour."""
    design = scenario.scheduler.design.value
    if scenario.engine.kv_events:
        raise ScenarioError(
            f"engine.kv_events: the v0 engine ({design}) emits no KV cache events, so the "
            "kv_events table would be empty; set it to false, or use scheduler.design: v1-engine"
        )
    if scenario.engine.router == "prefix_cache_aware":
        raise ScenarioError(
            f"engine.router: prefix_cache_aware routes on KV cache events, which the v0 engine "
            f"({design}) does not emit; choose another router, or use scheduler.design: v1-engine"
        )
    if scenario.scheduler.long_prefill_token_threshold:
        raise ScenarioError(
            f"scheduler.long_prefill_token_threshold: a V1-engine setting; the v0 engine "
            f"({design}) has none, so it would do nothing (remove it)"
        )


def _v1_only(scenario: Scenario) -> None:
    """What the V1 engine cannot honour: swapping to CPU."""
    cache, sched = scenario.cache, scenario.scheduler
    if sched.preemption_mode.value == "swap":
        raise ScenarioError(
            "scheduler.preemption_mode: the V1 engine preempts by recompute only; swap would "
            "do nothing (use recompute or auto)"
        )
    if cache.num_cpu_blocks:
        raise ScenarioError(
            f"cache.num_cpu_blocks: {cache.num_cpu_blocks}: the V1 engine keeps no swap space, "
            "so they would do nothing (set 0; a CPU tier is cache.cpu_offload_gib)"
        )
    if cache.swap_space_gib != _default(cache, "swap_space_gib"):
        raise ScenarioError(
            "cache.swap_space_gib: the V1 engine keeps no swap space, so it would do nothing "
            "(remove it; a CPU tier is cache.cpu_offload_gib)"
        )


def check_no_effect(scenario: Scenario) -> None:
    """Refuse (ScenarioError) the first setting of `scenario` that would do nothing."""
    if scenario.scheduler.design is Design.V1_ENGINE:
        _v1_only(scenario)
    else:
        _v0_only(scenario)
    engine = scenario.engine
    if engine.router == "prefix_cache_aware":
        if not scenario.cache.enable_prefix_caching:
            raise ScenarioError(
                "engine.router: prefix_cache_aware routes by cached prefixes, but "
                "cache.enable_prefix_caching is false (nothing is cached; every score is 0)"
            )
        return
    for name in PREFIX_ROUTER_KNOBS:
        if getattr(engine, name) != _default(engine, name):
            raise ScenarioError(
                f"engine.{name}: only the prefix_cache_aware router reads it; with "
                f"engine.router: {engine.router} it would do nothing"
            )
