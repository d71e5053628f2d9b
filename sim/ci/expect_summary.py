"""`expect.summary`: bounds on the run's summary metrics, checked by `kvsim check`.

A scenario that shows an effect rather than a bug states it as bounds on its own run, e.g. the
CPU-offload example (`scenarios/cpu_offload_sessions_v1.yaml`)::

    expect:
      violations: none
      summary: {ttft_p50_s: {max: 0.2}, prefix_hit_rate: {min: 0.5}}

A metric is a key of `summary.json`'s `summary`, dotted for a nested one
(`states.finished`, `sessions.turn_ttft_p50_s.2`). Example: ``misses({"ttft_p50_s":
SummaryBound(max=0.2)}, {"ttft_p50_s": 0.55})`` -> ``["ttft_p50_s 0.55 is above max 0.2"]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sim.scenario.schema import ScenarioError, SummaryBound


def metric(summary: Mapping[str, Any], name: str, source: str = "<scenario>") -> float:
    """The summary value `name` names (dotted: nested), as a number; a name the summary has
    not, or one that is not a number, is bad input naming the field."""
    node: Any = summary
    for part in name.split("."):
        if not isinstance(node, Mapping) or part not in node:
            known = ", ".join(sorted(k for k, v in summary.items() if _is_number(v)))
            raise ScenarioError(
                f"{source}: expect.summary.{name}: not a metric of this run's summary "
                f"(numbers at the top: {known})"
            )
        node = node[part]
    if not _is_number(node):
        raise ScenarioError(f"{source}: expect.summary.{name}: {node!r} is not a number")
    return float(node)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def misses(
    bounds: Mapping[str, SummaryBound], summary: Mapping[str, Any], source: str = "<scenario>"
) -> list[str]:
    """One line per bound the run's summary does not meet (NaN meets none), in the given order."""
    out = []
    for name, bound in bounds.items():
        value = metric(summary, name, source)
        if bound.min is not None and not value >= bound.min:
            out.append(f"{name} {value:.4g} is below min {bound.min:g}")
        if bound.max is not None and not value <= bound.max:
            out.append(f"{name} {value:.4g} is above max {bound.max:g}")
    return out
