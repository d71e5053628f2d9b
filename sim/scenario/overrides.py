"""Dotted-key overrides of a scenario (`--set scheduler.max_num_seqs=128`), validated again.

Example::

    apply_overrides(scenario, {"cache.num_gpu_blocks": 4096, "workload.rate_scale": 2})

Values given as strings are parsed as YAML scalars ("128" -> 128, "true" -> True, "null" -> None).
A key that the schema does not know is an error naming the key.
"""

from __future__ import annotations

import json
from typing import Any

import yaml

from sim.scenario.schema import Scenario, ScenarioError, load_yaml, scenario_from_dict


def parse_value(text: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError:
        return text


def parse_assignment(text: str, option: str = "--set") -> tuple[str, list[Any]]:
    """'a.b=1,2,4' -> ('a.b', [1, 2, 4]); used by `--set` on run (one value) and sweep (several),
    and by capacity's `--compare` (`option`, named in the error)."""
    key, sep, values = text.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ScenarioError(f"{option} {text!r}: expected KEY=VALUE[,VALUE...]")
    return key, [parse_value(v.strip()) for v in values.split(",")]


def parse_sets(items: list[str] | None, option: str = "--set") -> dict[str, list[Any]]:
    """['a.b=1,2', 'c=x'] -> {'a.b': [1, 2], 'c': ['x']}; a key given twice is an error (on
    every command that takes --set: which of two values wins is not for kvsim to guess).

    `option` is the option the items came from (`--set`, or capacity's `--compare`), named in
    the errors."""
    axes: dict[str, list[Any]] = {}
    for item in items or []:
        key, values = parse_assignment(item, option)
        if key in axes:
            raise ScenarioError(f"{option} {key}: given twice; list its values once (KEY=V1,V2)")
        axes[key] = values
    return axes


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """`--set` of run / capacity / compare-versions: {'a.b': 1}, a list for 'a.b=1,2'."""
    return {k: v[0] if len(v) == 1 else v for k, v in parse_sets(items).items()}


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


def _shown(value: Any) -> str:
    """A value as the user would have typed it: 'x' -> x, True -> true, None -> null."""
    return value if isinstance(value, str) else json.dumps(value)


def assignment_at_fault(overrides: dict[str, Any], field: str, source: str = "--set") -> str:
    """The `--set KEY=VALUE` that set `field` (or a section above or below it), as the user
    typed it; else `source`. Example: ({"bogus.key": 1}, "bogus") -> "--set bogus.key=1"."""
    for key, value in overrides.items():
        if key == field or key.startswith(field + ".") or field.startswith(key + "."):
            return f"{source} {key}={_shown(value)}"
    return source


def apply_overrides(
    scenario: Scenario, overrides: dict[str, Any], source: str = "--set"
) -> Scenario:
    """`scenario` with the dotted `overrides` set, validated again. An error names `source`:
    for the default, `--set`, the assignment at fault ("--set bogus.key=1: unknown key ...")."""
    data = scenario.model_dump(mode="json", exclude_unset=True)
    for key, value in overrides.items():
        _set(data, key, parse_value(value) if isinstance(value, str) else value)
    if source != "--set":  # a caller's own source (one assignment, or an option) says it all
        return scenario_from_dict(data, source)
    return scenario_from_dict(
        data, source, source_of=lambda field: assignment_at_fault(overrides, field, source)
    )
