"""`kvsim fuzz`: random but valid workloads and cache configurations, looking for violations.

Every case is a complete scenario drawn from one integer, its case seed
(`sim.ci.fuzz_cases`); the case seeds come from the master seed, so a fuzz run is a
deterministic sequence of cases and only the number of cases a time budget reaches depends on
the machine. With `max_cases` instead of a budget the whole run is deterministic.

Example: `fuzz("v0-v2", master_seed=0, max_cases=50)` reports `admission_undercount` (the
sliding-window undercount of vLLM #7470) with the seed of the first case that showed it.

On the V1 engine about one case in `DISAGG_ONE_IN` is prefill/decode disaggregated
(`generate_disagg_case`: 1-2 prefill and 1-2 decode replicas, vLLM 0.11.0's NIXL flow). What
such a case shows is reported under its own key, `disagg:<kind>`, so that a P/D finding never
hides behind (or is hidden by) the same kind on co-located serving. Its `disagg:no_progress` is
what vLLM 0.11.0 does too, not a kvsim artefact: a preempted decode request at the head of the
waiting queue needs more blocks than the requests parked behind it (their KV read, their
blocks allocated) leave free, and the scheduler's waiting loop stops at the head
(tests/vllm_real/test_vllm_pd_deadlock.py drives vLLM's own scheduler and NIXL connector into it).

What is wrong with kvsim itself is never a finding (`sim.ci.selfcheck`): an exception that
escapes the simulator stops the run as an internal error (traceback, case seed), and one case
in `CROSS_CHECK_EVERY` also runs with the decode fast path and cohort off, any difference in
its tables being an internal inconsistency.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sim.audit import ViolationKind
from sim.ci.check import explicit_yaml
from sim.ci.fuzz_cases import DISAGG_ONE_IN as DISAGG_ONE_IN

# The case generator, re-exported: `sim.ci.fuzz` is where callers look for all of it.
from sim.ci.fuzz_cases import FUZZ_STEP_TIME as FUZZ_STEP_TIME
from sim.ci.fuzz_cases import case_seed, draw_case
from sim.ci.fuzz_cases import generate_case as generate_case
from sim.ci.fuzz_cases import sim_time_limit_s as sim_time_limit_s
from sim.ci.fuzz_variant import BASE_CASES, CaseVariant
from sim.ci.selfcheck import (
    Inconsistency,
    InternalError,
    first_difference,
    is_cross_checked,
    tables_of,
    without_shortcuts,
)
from sim.cluster.config import ClusterMode
from sim.errors import InputError
from sim.files.outdir import write_text_atomic
from sim.kv.config import Design
from sim.output.results import RunResult
from sim.scenario.schema import Scenario, ScenarioError
from sim.workload.errors import WorkloadError

DEFAULT_BUDGET_S = 60.0
#: The key prefix of a finding in a disaggregated case (`finding_key`).
DISAGG_PREFIX = "disagg:"


def is_disaggregated(scenario: Scenario) -> bool:
    return scenario.cluster.mode is ClusterMode.DISAGGREGATED


def finding_key(scenario: Scenario, kind: str) -> str:
    """The report's key for violation `kind` in `scenario`: `disagg:no_progress` in a
    disaggregated case, the kind itself otherwise."""
    return DISAGG_PREFIX + kind if is_disaggregated(scenario) else kind


@dataclass(slots=True)
class Finding:
    """The first case that showed one violation kind."""

    kind: str
    case_index: int
    case_seed: int
    message: str
    time_s: float | None
    scenario: Scenario
    observed_kinds: list[str]
    count: int = 1
    #: Seconds from the start of the fuzz run until this case finished.
    found_after_s: float = 0.0

    def reproduce_command(
        self,
        design: str,
        saved_path: Path | None = None,
        allow_swap: bool = True,
        flags: str = "",
    ) -> str:
        if saved_path is not None:
            if is_disaggregated(self.scenario):
                return f"kvsim check {saved_path}"  # (`kvsim run` is co-located only)
            return f"kvsim run {saved_path} --no-plots"
        no_swap = "" if allow_swap else " --no-swap"
        return f"kvsim fuzz --design {design}{no_swap}{flags} --case-seed {self.case_seed}"


@dataclass(slots=True)
class FuzzReport:
    design: str
    master_seed: int
    allow_swap: bool = True
    #: What the run varies beyond the base cases (`sim.ci.fuzz_variant`).
    variant: CaseVariant = BASE_CASES
    #: A real vLLM install whose block manager ran under kvsim's scheduler and auditor.
    vllm_root: str | None = None
    num_cases: int = 0
    #: Of `num_cases`, the prefill/decode disaggregated ones (V1 engine only).
    num_disagg_cases: int = 0
    elapsed_s: float = 0.0
    stopped_by: str = ""
    findings: dict[str, Finding] = field(default_factory=dict)
    num_fatal_errors: int = 0
    num_violating_cases: int = 0
    #: Cases that reached their simulated-time cap (a preemption livelock; not a violation).
    num_time_limited: int = 0
    #: Cases the scenario validation refused (a generator out of step with `sim.engine.run`).
    num_invalid_cases: int = 0
    first_invalid: str | None = None
    saved: dict[str, Path] = field(default_factory=dict)
    #: Cases also run with the decode fast path and cohort off (`sim.ci.selfcheck`).
    num_cross_checked: int = 0
    #: The first case whose tables changed with the shortcuts off, and how many did.
    inconsistency: Inconsistency | None = None
    num_inconsistent_cases: int = 0
    #: An exception that escaped the simulator (a kvsim bug); the run stops there.
    internal_error: InternalError | None = None

    @property
    def kinds(self) -> list[str]:
        return sorted(self.findings)

    @property
    def replay_flags(self) -> str:
        """The options beyond --design and --no-swap that replay a case of this run."""
        root = f" --vllm-root {self.vllm_root}" if self.vllm_root is not None else ""
        return self.variant.flags() + root

    @property
    def kvsim_is_wrong(self) -> bool:
        """An internal error or inconsistency: a bug in kvsim, not a finding about vLLM."""
        return self.internal_error is not None or self.inconsistency is not None

    def to_dict(self) -> dict:
        return {
            "design": self.design,
            "master_seed": self.master_seed,
            "allow_swap": self.allow_swap,
            "vllm_version": self.variant.vllm_version,
            "hybrid": self.variant.hybrid,
            "async_mix": self.variant.async_mix,
            "group_types": self.variant.group_types,
            "vllm_root": self.vllm_root,
            "num_cases": self.num_cases,
            "num_disagg_cases": self.num_disagg_cases,
            "elapsed_s": round(self.elapsed_s, 3),
            "stopped_by": self.stopped_by,
            "num_violating_cases": self.num_violating_cases,
            "num_fatal_errors": self.num_fatal_errors,
            "num_time_limited": self.num_time_limited,
            "num_invalid_cases": self.num_invalid_cases,
            "first_invalid": self.first_invalid,
            "num_cross_checked": self.num_cross_checked,
            "num_inconsistent_cases": self.num_inconsistent_cases,
            "inconsistency": self.inconsistency.to_dict() if self.inconsistency else None,
            "internal_error": self.internal_error.to_dict() if self.internal_error else None,
            "findings": [
                {
                    "kind": f.kind,
                    "case_index": f.case_index,
                    "case_seed": f.case_seed,
                    "num_cases": f.count,
                    "found_after_s": round(f.found_after_s, 3),
                    "message": f.message,
                    "time_s": f.time_s,
                    "observed_kinds": f.observed_kinds,
                    "reproduce": f.reproduce_command(
                        self.design, self.saved.get(f.kind), self.allow_swap, self.replay_flags
                    ),
                    "saved": str(self.saved[f.kind]) if f.kind in self.saved else None,
                }
                for f in (self.findings[k] for k in self.kinds)
            ],
        }


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What one case showed: (kind, first message, first time) per kind, and how it ended."""

    kinds: list[tuple[str, str, float | None]]
    fatal_error: str | None = None
    stopped_early: str | None = None
    #: With a cross-check: None when the shortcuts changed nothing, else the first difference.
    difference: str | None = None

    @property
    def kind_names(self) -> list[str]:
        return [kind for kind, _, _ in self.kinds]


def run_case(
    scenario: Scenario, cross_check: bool = False, vllm_root: str | None = None
) -> CaseResult:
    """Run one case (and with `cross_check`, again with the fast path and cohort off).

    An exception propagates: a modelled failure of the real code never escapes a run (the
    auditor records it and the engine stops with a `fatal_error`), so one that does is a bug
    in kvsim, which the caller reports as an internal error, not as a finding.
    """
    result = _run(scenario, vllm_root)
    difference = None
    if cross_check:
        slow = _run(without_shortcuts(scenario), vllm_root)
        difference = first_difference(tables_of(result), tables_of(slow))
    frame = result.violations
    kinds = []
    for kind in sorted(set(frame["kind"])) if len(frame) else []:
        row = frame[frame["kind"] == kind].iloc[0]
        time_s = row["time_s"]
        kinds.append((kind, str(row["message"]), None if time_s != time_s else float(time_s)))
    return CaseResult(
        kinds, result.summary.get("fatal_error"), result.summary.get("stopped_early"), difference
    )


def _run(scenario: Scenario, vllm_root: str | None = None) -> RunResult:
    """One run, co-located or disaggregated (both pools' violations in one table); with
    `vllm_root`, vLLM's real block manager runs under kvsim's scheduler and auditor."""
    if is_disaggregated(scenario):
        from sim.cluster.run import combined_result, run_disaggregated

        return combined_result(run_disaggregated(scenario))
    from sim.engine.run import run

    return run(scenario, vllm_root=vllm_root)


def record_case(
    report: FuzzReport,
    index: int,
    seed: int,
    scenario: Scenario,
    started_s: float,
    cross_check: bool | None = None,
) -> None:
    """Run case `index` (seed `seed`) and add what it showed to `report`.

    `cross_check=None` cross-checks the cases `is_cross_checked(seed)` picks.
    """
    if cross_check is None:
        cross_check = is_cross_checked(seed)
    report.num_cases += 1
    report.num_disagg_cases += is_disaggregated(scenario)
    try:
        case = run_case(scenario, cross_check, report.vllm_root)
    except (ScenarioError, WorkloadError) as error:
        report.num_invalid_cases += 1
        report.first_invalid = report.first_invalid or f"case seed {seed}: {error}"
        return
    except Exception as error:  # noqa: BLE001 - any escape is a kvsim bug: reported as such
        report.internal_error = InternalError.from_exception(index, seed, error)
        return
    report.num_cross_checked += cross_check
    if case.difference is not None:
        report.num_inconsistent_cases += 1
        if report.inconsistency is None:
            report.inconsistency = Inconsistency(index, seed, case.difference)
    report.num_fatal_errors += case.fatal_error is not None
    report.num_time_limited += bool(case.stopped_early) and case.fatal_error is None
    report.num_violating_cases += bool(case.kinds)
    observed = case.kind_names
    for kind, message, time_s in case.kinds:
        key = finding_key(scenario, kind)
        if key in report.findings:
            report.findings[key].count += 1
        else:
            found_after_s = time.perf_counter() - started_s
            report.findings[key] = Finding(
                key, index, seed, message, time_s, scenario, observed, 1, found_after_s
            )


def fuzz(
    design: str | Design,
    master_seed: int = 0,
    budget_s: float | None = DEFAULT_BUDGET_S,
    max_cases: int | None = None,
    on_case: Callable[[int, FuzzReport], None] | None = None,
    allow_swap: bool = True,
    variant: CaseVariant = BASE_CASES,
    vllm_root: str | None = None,
) -> FuzzReport:
    """Run cases `case_seed(master_seed, 0), (…, 1), …` until the budget or the case count ends.

    At least one case always runs. Returns the first finding of every distinct kind. An
    internal error (`sim.ci.selfcheck`) stops the run at its case.
    """
    design = Design(design)
    if budget_s is None and max_cases is None:
        raise InputError("fuzz needs a time budget or a maximum number of cases")
    if max_cases is not None and max_cases < 1:
        raise InputError(f"max_cases must be >= 1, got {max_cases}")
    if budget_s is not None and budget_s <= 0:
        raise InputError(f"budget must be positive, got {budget_s} s")
    report = FuzzReport(design.value, master_seed, allow_swap, variant, vllm_root)
    start = time.perf_counter()
    index = 0
    while True:
        seed = case_seed(master_seed, index)
        record_case(report, index, seed, draw_case(design, seed, allow_swap, variant), start)
        if on_case is not None:
            on_case(index, report)
        index += 1
        report.elapsed_s = time.perf_counter() - start
        if report.internal_error is not None:
            report.stopped_by = f"an internal error in case {index - 1}"
            break
        if max_cases is not None and index >= max_cases:
            report.stopped_by = f"{max_cases} cases"
            break
        if budget_s is not None and report.elapsed_s >= budget_s:
            report.stopped_by = f"budget of {budget_s:g} s"
            break
    return report


def fuzz_one_case(
    design: str | Design,
    seed: int,
    allow_swap: bool = True,
    variant: CaseVariant = BASE_CASES,
    vllm_root: str | None = None,
) -> FuzzReport:
    """Replay one case seed (`kvsim fuzz --case-seed`), always cross-checked."""
    design = Design(design)
    report = FuzzReport(design.value, -1, allow_swap, variant, vllm_root)
    start = time.perf_counter()
    case = draw_case(design, seed, allow_swap, variant)
    record_case(report, 0, seed, case, start, cross_check=True)
    report.elapsed_s = time.perf_counter() - start
    report.stopped_by = f"case seed {seed}"
    return report


def finding_yaml(finding: Finding, design: str) -> str:
    """A self-contained scenario for a finding, expecting exactly the kinds its case showed."""
    kinds = list(finding.observed_kinds)
    scenario = finding.scenario.model_copy(
        update={
            "name": f"fuzz-{design}-{finding.kind.replace(':', '-')}-{finding.case_seed}",
            "expect": finding.scenario.expect.model_copy(
                update={"violations": [ViolationKind(k) for k in kinds] or "none"}
            ),
        }
    )
    run_it = (
        "kvsim check <this file>"
        if is_disaggregated(finding.scenario)
        else "kvsim run <this file> --no-plots"
    )
    header = (
        f"# Found by: kvsim fuzz --design {design} (case {finding.case_index}, "
        f"case seed {finding.case_seed}).\n"
        f"# First {finding.kind}: {finding.message}\n"
        f"# Reproduce: {run_it}   (or: kvsim fuzz --design {design} "
        f"--case-seed {finding.case_seed})\n"
    )
    return header + explicit_yaml(scenario)


def save_findings(report: FuzzReport, out_dir: str | Path) -> dict[str, Path]:
    """Write one scenario YAML per finding into `out_dir`; returns kind -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for kind in report.kinds:
        finding = report.findings[kind]
        name = f"{report.design}-{kind.replace(':', '-')}-seed{finding.case_seed}.yaml"
        path = out / name
        write_text_atomic(path, finding_yaml(finding, report.design))
        report.saved[kind] = path
    return dict(report.saved)


def parse_budget(text: str) -> float:
    """'60s' -> 60.0, '2m' -> 120.0, '90' -> 90.0, '1.5h' -> 5400.0 (seconds)."""
    raw = text.strip().lower()
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    for suffix in sorted(units, key=len, reverse=True):
        if raw.endswith(suffix):
            number, scale = raw[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = raw, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise InputError(f"--budget {text!r}: expected a duration such as 60s, 2m or 90") from None
    if not value > 0:
        raise InputError(f"--budget {text!r}: must be positive")
    return value
