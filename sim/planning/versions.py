"""`kvsim compare-versions`: one workload through every design kvsim models, side by side.

The question it answers: "what changes for my workload if I upgrade vLLM?" Each row is one
variant of the same scenario (same workload, cache, scheduler limits and step time), differing
only in `scheduler.design` and, for the V1 engine, `scheduler.vllm_version`:

==================  ===============================================================
variant             models
==================  ===============================================================
v0-v1               vLLM 0.5.4 v0, BlockSpaceManagerV1
v0-v2               vLLM 0.5.4 v0, BlockSpaceManagerV2
v0-fixed            kvsim's corrected design (v0-V2 with exact admission counts)
v1-engine@4ac7713   vLLM ~0.10 V1 engine @ 4ac7713
v1-engine@0.11.0    vLLM 0.11.0 V1 engine
v1-engine@0.33.0    vLLM 0.33.0 V1 engine (the latest release kvsim pins)
==================  ===============================================================

The variants run through the sweep machinery (`sim.planning.executor.map_tasks`: local
processes, one per variant). A variant the scenario's checks refuse (a pool too small for
max_model_len under that engine's rule, say) is a row whose `status` is "refused" and whose
`reason` is the one-line error; any other exception is a kvsim bug and propagates.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from sim.errors import InputError
from sim.kv.config import Design
from sim.kv.pins import PINS_BY_DESIGN
from sim.planning.executor import METRIC_COLUMNS, map_tasks, summary_row
from sim.planning.grid import resolved_data, scenario_key
from sim.scenario.schema import Scenario, ScenarioError
from sim.workload.load import check_input_files

#: The table's columns, in order: which variant, whether it ran, then the metrics.
HEAD_COLUMNS = ("variant", "design", "vllm_version", "models", "status", "reason")
EXTRA_COLUMNS = ("violation_counts", "peak_used_blocks")
TAIL_COLUMNS = ("scenario", "key", "wall_s")

CORRECTED = "kvsim's corrected design (v0-V2 with exact admission counts)"


@dataclass(frozen=True, slots=True)
class Variant:
    """One design (and, for the V1 engine, one pinned release) to run the workload through."""

    design: Design
    vllm_version: str | None = None

    @property
    def label(self) -> str:
        """'v0-v2', or 'v1-engine@0.33.0' for a pinned V1 engine."""
        if self.vllm_version is None:
            return self.design.value
        return f"{self.design.value}@{self.vllm_version}"

    @property
    def models(self) -> str:
        """What the variant models, in words (`Design.upstream_at`; v0-fixed is kvsim's own)."""
        if self.design is Design.V0_FIXED:
            return CORRECTED
        return self.design.upstream_at(self.vllm_version)

    @property
    def overrides(self) -> dict[str, Any]:
        """The settings that make the base scenario this variant (a v0 design has no pin)."""
        return {"scheduler.design": self.design.value, "scheduler.vllm_version": self.vllm_version}


def variants() -> list[Variant]:
    """Every pinned design: the three v0 designs at their default (the 0.5.4 release), v0-v2
    also at 0.5.4 + #7380 (`sim.kv.pins`), then the V1 engine at each pinned release."""
    v0 = [Variant(Design.V0_V1), Variant(Design.V0_V2)]
    v0 += [Variant(Design.V0_V2, pin.value) for pin in PINS_BY_DESIGN[Design.V0_V2][1:]]
    v0.append(Variant(Design.V0_FIXED))
    return v0 + [Variant(Design.V1_ENGINE, pin.value) for pin in PINS_BY_DESIGN[Design.V1_ENGINE]]


def violation_counts(kinds: pd.Series) -> str:
    """'admission_undercount×3, leaked_blocks×3' from a violations table's `kind` column.

    Kinds in name order; '' when there is none.
    """
    counts = Counter(kinds)
    return ", ".join(f"{kind}×{counts[kind]}" for kind in sorted(counts))


def run_variant(scenario_data: dict[str, Any], label: str, key: str, index: int) -> dict[str, Any]:
    """Run one variant; a refusal of the scenario (`InputError`) becomes the row's reason."""
    from sim.engine.run import run
    from sim.scenario.schema import scenario_from_dict

    start = time.perf_counter()
    row: dict[str, Any] = {"variant": label, "key": key, "point": index}
    try:
        result = run(scenario_from_dict(scenario_data, f"variant {label}"), base_dir=".")
    except InputError as error:
        row.update(status="refused", reason=str(error).splitlines()[0])
    else:
        row.update(summary_row(result), status="ran", reason=None)
        row["violation_counts"] = violation_counts(result.violations["kind"])
        steps = result.steps
        row["peak_used_blocks"] = int(steps["num_used_blocks"].max()) if len(steps) else 0
    row["wall_s"] = time.perf_counter() - start
    return row


def compare_versions(
    scenario: Scenario | str | Path | dict | None,
    overrides: dict[str, Any] | None = None,
    *,
    workers: int | None = None,
    base_dir: str | Path | None = None,
    before_run: Callable[[], None] | None = None,
) -> pd.DataFrame:
    """One row per variant (`variants()`) of `scenario` with `overrides` applied to all.

    Example::

        table = sim.compare_versions("scenarios/mistral_azure_conv_swa.yaml",
                                     overrides={"scheduler.enable_chunked_prefill": True})
        table[["variant", "num_preemptions", "violation_counts"]]

    `workers`: local processes (default: CPU count, at most 8; 1 runs here, in order).
    `before_run` is called once every variant is checked and before any runs (the CLI checks
    its output folder there). A scenario that every variant refuses at startup is bad input
    (ScenarioError), raised before `before_run`.
    """
    from sim.planning import load_base
    from sim.scenario.overrides import apply_overrides

    base, base_path = load_base(scenario, base_dir)
    if overrides:
        base = apply_overrides(base, overrides)
    # A missing or unreadable trace is the scenario's fault, not any design's: exit 2 up front
    # (regression: a FIFO trace gave a refused row per design and exit 0).
    check_input_files(base.workload, base_path)
    rows, tasks, slots = _plan(base, base_path)
    if not tasks:  # nothing would run: the scenario, not a design, is at fault
        first = next(row for row in rows if row is not None)
        raise ScenarioError(
            f"compare-versions: every design refuses scenario {base.name!r} "
            f"({first['variant']}: {first['reason']})"
        )

    if before_run is not None:
        before_run()

    def done(i: int, row: dict[str, Any]) -> None:
        rows[slots[i]] = row

    map_tasks(run_variant, tasks, workers=workers, on_result=done)
    return _frame(base.name, [r for r in rows if r is not None])


def _plan(
    base: Scenario, base_path: Path
) -> tuple[list[dict[str, Any] | None], list[tuple], list[int]]:
    """Each variant in order, checked before anything runs: a refused row (the scenario's
    validation or the design's startup checks say why), or a run to make (`tasks`) whose row
    is None until it comes back into its slot (`slots[i]`: where task i's row goes)."""
    rows: list[dict[str, Any] | None] = []
    tasks: list[tuple] = []
    slots: list[int] = []
    for index, variant in enumerate(variants()):
        try:
            data = resolved_data(base, variant.overrides, base_path)
            key = scenario_key(data)
        except InputError as error:  # the scenario validation refuses this design
            rows.append(
                {
                    "variant": variant.label,
                    "status": "refused",
                    "reason": str(error).splitlines()[0],
                }
            )
            continue
        reason = _refusal(data, base_path)
        if reason is not None:  # refused at startup: a row that says why, and no run
            rows.append(
                {"variant": variant.label, "key": key, "point": index, "status": "refused"}
                | {"reason": reason}
            )
            continue
        rows.append(None)
        slots.append(index)
        tasks.append((data, variant.label, key, index))
    return rows, tasks, slots


def _refusal(data: dict[str, Any], base_dir: Path) -> str | None:
    """The one-line reason a variant cannot start (`sim.scenario.resolve.preflight`), or None."""
    from sim.scenario.resolve import preflight
    from sim.scenario.schema import scenario_from_dict

    try:
        preflight(scenario_from_dict(data, "variant"), base_dir)
    except InputError as error:
        return str(error).splitlines()[0]
    return None


def _frame(scenario_name: str, rows: list[dict[str, Any]]) -> pd.DataFrame:
    by_label = {v.label: v for v in variants()}
    for row in rows:
        variant = by_label[row["variant"]]
        row.update(
            design=variant.design.value,
            # What the run resolved (a v0 variant names no pin and gets its default).
            vllm_version=row.get("vllm_version") or variant.vllm_version,
            models=variant.models,
            scenario=scenario_name,
        )
    columns = [*HEAD_COLUMNS, *METRIC_COLUMNS, *EXTRA_COLUMNS, *TAIL_COLUMNS]
    frame = pd.DataFrame.from_records(rows, columns=columns)
    for name in (*METRIC_COLUMNS, "peak_used_blocks"):
        if name not in ("violation_kinds", "fatal_error", "stopped_early"):
            frame[name] = pd.to_numeric(frame[name], errors="coerce")
    return frame
