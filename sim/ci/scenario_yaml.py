"""Scenario YAML that keeps its meaning: `explicit_yaml` writes the defaults that may change.

Used for the scenarios kvsim generates and that are checked in as regression tests (fuzz
findings, shrunk reproducers).
"""

from __future__ import annotations

import yaml

from sim.scenario.schema import Scenario, scenario_to_yaml


def explicit_yaml(scenario: Scenario) -> str:
    """`scenario_to_yaml`, but the design, its vLLM version, block size and window are always
    written.

    Generated scenarios (fuzz findings, shrunk reproducers) are checked in as regression
    tests; they must not change meaning if a schema default changes later (as v0's did: the
    unpinned v0 designs model the 0.5.4 release, `sim.kv.pins`).
    """
    text = scenario_to_yaml(scenario)
    data = yaml.safe_load(text)
    data["scheduler"] = {
        "design": scenario.scheduler.design.value,
        **data.get("scheduler", {}),
        "vllm_version": scenario.scheduler.resolved_vllm_version,
    }
    data["cache"] = {
        "block_size": scenario.cache.block_size,
        **data.get("cache", {}),
        "sliding_window": scenario.cache.sliding_window,
    }
    ordered = {key: data[key] for key in _KEY_ORDER if key in data}
    ordered.update({k: v for k, v in data.items() if k not in ordered})
    return yaml.safe_dump(ordered, sort_keys=False)


_KEY_ORDER = (
    "name", "description", "seed", "model", "hardware", "cache", "scheduler", "engine",
    "workload", "step_time", "expect",
)  # fmt: skip
