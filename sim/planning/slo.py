"""Service-level objectives of a capacity search: parsing (`--slo ttft_p99=2s`, seeds) and the
pass/fail check of one probe (`sim.planning.capacity`).

Example: `parse_slo("ttft_p99=250ms")` is `Slo("ttft_p99", 0.25)`; a probe row with
`ttft_p99_s` 0.3 fails it: `check_slos(row, [slo])` -> "ttft_p99 0.3s > 0.25s".
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from sim.errors import InputError

#: SLO metrics: summary columns (seconds).
SLO_METRICS = tuple(f"{m}_{q}" for m in ("ttft", "tpot", "e2e") for q in ("p50", "p99"))
_UNITS_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True, slots=True)
class Slo:
    """`metric` (e.g. ttft_p99) at most `limit_s` seconds."""

    metric: str
    limit_s: float

    @property
    def column(self) -> str:
        return f"{self.metric}_s"

    def __str__(self) -> str:
        return f"{self.metric}<={self.limit_s:g}s"


class SloError(InputError):
    """A bad `--slo`, seed list, tolerance or target rate (one line, exit 2 at the CLI)."""


def parse_duration_s(text: str) -> float:
    """'2s' -> 2.0, '100ms' -> 0.1, '250us' -> 0.00025 (seconds); the unit is required.

    A bare number is refused: `tpot_p99=100` could mean 100 ms as easily as 100 s.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e-?[0-9]+)?)\s*(s|ms|us)?\s*", text)
    if match is None:
        raise SloError(f"{text!r}: expected a duration like 2s, 100ms or 250us")
    if match.group(2) is None:
        raise SloError(
            f"{text!r}: a duration needs a unit (s, ms or us), e.g. {match.group(1)}ms "
            f"or {match.group(1)}s"
        )
    return float(match.group(1)) * _UNITS_S[match.group(2)]


def parse_slo(text: str) -> Slo:
    """'ttft_p99=2s' -> Slo('ttft_p99', 2.0)."""
    metric, sep, value = text.partition("=")
    metric = metric.strip().removesuffix("_s")
    if not sep:
        raise SloError(f"--slo {text!r}: expected METRIC=DURATION, e.g. ttft_p99=2s")
    if metric not in SLO_METRICS:
        raise SloError(
            f"--slo {text!r}: unknown metric '{metric}' (one of {', '.join(SLO_METRICS)})"
        )
    try:
        limit_s = parse_duration_s(value)
    except SloError as error:
        raise SloError(f"--slo {error}") from None
    if limit_s <= 0:
        raise SloError(f"--slo {text!r}: the limit must be positive")
    return Slo(metric, limit_s)


def as_slos(slos: Any) -> list[Slo]:
    """Slo objects from ['ttft_p99=2s'], {'ttft_p99': '2s'} / {'ttft_p99_s': 2.0}, or Slo objects.

    A number (no unit) is accepted only under a key that names its unit (`ttft_p99_s`).
    """
    if isinstance(slos, dict):
        slos = [_slo_item(k, v) for k, v in slos.items()]
    result = [s if isinstance(s, Slo) else parse_slo(s) for s in slos]
    for slo in result:
        if slo.metric not in SLO_METRICS:
            raise SloError(f"unknown SLO metric '{slo.metric}' (one of {', '.join(SLO_METRICS)})")
    if not result:
        raise SloError("give at least one SLO, e.g. --slo ttft_p99=2s")
    return result


def _slo_item(key: str, value: Any) -> str | Slo:
    if isinstance(value, str):
        return f"{key}={value}"
    if not key.endswith("_s"):
        raise SloError(
            f"SLO {key}: {value!r} has no unit; give a string ('{value}ms' or '{value}s') "
            f"or name the unit in the key ({key}_s)"
        )
    return Slo(key.removesuffix("_s"), float(value))


def parse_seeds(text: str) -> list[int]:
    """'0,1,2' -> [0, 1, 2] (the `--seeds` option)."""
    seeds = []
    for item in text.split(","):
        if not item.strip():
            continue
        try:
            seed = int(item)
        except ValueError:
            raise SloError(f"--seeds {text!r}: {item.strip()!r} is not an integer") from None
        if seed < 0:
            raise SloError(f"--seeds {text!r}: seeds must be >= 0, got {seed}")
        seeds.append(seed)
    if not seeds:
        raise SloError(f"--seeds {text!r}: give at least one seed, e.g. --seeds 0,1,2")
    return seeds


def check_slos(row: dict[str, Any], slos: list[Slo]) -> str | None:
    """None when the probe passes, else why it failed (first reason)."""
    if row.get("error"):
        return f"error: {row['error']}"
    if row.get("fatal_error"):
        return f"fatal engine error: {row['fatal_error']}"
    if row.get("num_aborted"):
        return f"{row['num_aborted']} requests aborted"
    for slo in slos:
        value = row.get(slo.column)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return f"{slo.metric} undefined (no finished request with it)"
        if value > slo.limit_s:
            return f"{slo.metric} {value:.4g}s > {slo.limit_s:g}s"
    return None
