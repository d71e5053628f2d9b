"""Dotted-key overrides of a scenario (`--set scheduler.max_num_seqs=128`), validated again.

Example::

    apply_overrides(scenario, {"cache.num_gpu_blocks": 4096, "workload.rate_scale": 2})

Values given as strings are parsed as YAML scalars ("128" -> 128, "true" -> True, "null" -> None).
A key that the schema does not know is an error naming the key.
"""

from __future__ import annotations

from typing import Any

import yaml

from sim.scenario import Scenario, ScenarioError, load_yaml, scenario_from_dict


def parse_value(text: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text


def parse_assignment(text: str) -> tuple[str, list[Any]]:
    """'a.b=1,2,4' -> ('a.b', [1, 2, 4]); used by `--set` on run (one value) and sweep (several)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"--set {text!r}: expected KEY=VALUE[,VALUE...]")
    return key, [parse_value(v.strip()) for v in values.split(",")]


def _set(data: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
            node[part] = child
        if not isinstance(child, dict):
            raise ScenarioError(f"--set {dotted}: '{'.'.join(parts[: i + 1])}' is not a section")
        node = child
    node[parts[-1]] = value


def apply_overrides(
    scenario: Scenario, overrides: dict[str, Any], source: str = "--set"
) -> Scenario:
    data = scenario.model_dump(mode="json", exclude_unset=True)
    for key, value in overrides.items():
        _set(data, key, parse_value(value) if isinstance(value, str) else value)
    return scenario_from_dict(data, source)
