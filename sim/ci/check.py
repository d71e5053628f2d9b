"""`kvsim check`: run scenarios and compare what happened with each scenario's `expect:`.

A scenario states what its run must show::

    expect: {violations: none}                                   # a clean design
    expect: {violations: any}                                    # something, whatever it is
    expect: {violations: [admission_undercount, leaked_blocks]}  # a known, documented bug

A list is an exact set: every listed kind must occur (else "missing") and no other kind may
(else "unexpected"). `none` also fails on a fatal engine error. Example: the 4-vs-3 case on
v0-v2 shows {admission_undercount, leaked_blocks}; with `expect: {violations: none}` it fails
with "unexpected admission_undercount, leaked_blocks"; with the list above it passes.

Bad input (a missing file, invalid YAML, an unknown key, a trace that cannot be read) is not a
failed expectation: that file becomes an outcome with `Status.BAD_INPUT` (a JUnit `<error>`,
one `error:` line on stderr) and the other scenarios still run, so the reports are complete.
Exit status (`exit_code`): 2 when any input was bad (fix the input first: a finding among the
rest is still in the reports), else 1 when any expectation failed, else 0.
"""

from __future__ import annotations

import enum
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from sim.cluster.config import ClusterMode
from sim.errors import InputError, one_line
from sim.results import RunResult
from sim.scenario import Scenario, ScenarioError, load_scenario, scenario_to_yaml

SCENARIO_SUFFIXES = (".yaml", ".yml")


class Status(enum.Enum):
    PASSED = "passed"
    FAILED = "failed"
    #: The scenario file (or a file it names) is invalid; nothing of it ran.
    BAD_INPUT = "bad_input"


@dataclass(frozen=True, slots=True)
class FirstViolation:
    """The first violation of one kind in a run (what a failure message shows)."""

    kind: str
    message: str
    time_s: float | None
    request_id: int | None
    count: int


@dataclass(slots=True)
class CheckOutcome:
    """One scenario's result: what was expected, what happened, and how to reproduce it."""

    path: Path
    name: str
    seed: int
    design: str
    expected: str | list[str]
    observed_kinds: list[str]
    status: Status
    reason: str
    duration_s: float
    unexpected_kinds: list[str] = field(default_factory=list)
    missing_kinds: list[str] = field(default_factory=list)
    first_violations: list[FirstViolation] = field(default_factory=list)
    fatal_error: str | None = None
    num_requests: int = 0
    #: The simulator itself raised (a bug in kvsim, not a violation of the model).
    crashed: bool = False
    #: The exact vLLM version the design modelled ("0.5.4", "0.5.4+7380", "0.33.0", ...).
    vllm_version: str | None = None

    @property
    def design_text(self) -> str:
        """'v0-v2 @ vLLM 0.5.4' (just the design when the scenario could not be read)."""
        if self.vllm_version is None:
            return self.design
        return f"{self.design} @ vLLM {self.vllm_version}"

    @property
    def passed(self) -> bool:
        return self.status is Status.PASSED

    @property
    def bad_input(self) -> bool:
        return self.status is Status.BAD_INPUT

    @property
    def reproduce_command(self) -> str:
        return f"kvsim run {shlex.quote(display_path(self.path))} --no-plots"

    @property
    def check_command(self) -> str:
        return f"kvsim check {shlex.quote(display_path(self.path))}"

    def failure_text(self) -> str:
        """Several lines: the reason, the first violation of each kind, how to reproduce."""
        lines = [f"{self.name}: {self.reason}"]
        for first in self.first_violations:
            at = f" at t={first.time_s:.6g} s" if first.time_s is not None else ""
            lines.append(f"  {first.kind} (x{first.count}){at}: {first.message}")
        if self.fatal_error:
            lines.append(f"  fatal engine error: {self.fatal_error}")
        lines.append(
            f"reproduce locally: {self.reproduce_command}   "
            f"(scenario {display_path(self.path)}, design {self.design_text}, seed {self.seed}; "
            f"re-check with: {self.check_command})"
        )
        return "\n".join(lines)

    def one_line(self) -> str:
        """A single line for annotations and table cells."""
        return (
            f"{self.name}: {self.reason} (design {self.design_text}, seed {self.seed}); "
            f"reproduce: {self.reproduce_command}"
        )

    def to_dict(self) -> dict:
        return {
            "path": display_path(self.path),
            "name": self.name,
            "seed": self.seed,
            "design": self.design,
            "vllm_version": self.vllm_version,
            "expected": self.expected,
            "observed_kinds": self.observed_kinds,
            "status": self.status.value,
            "reason": self.reason,
            "unexpected_kinds": self.unexpected_kinds,
            "missing_kinds": self.missing_kinds,
            "first_violations": [
                {
                    "kind": f.kind,
                    "message": f.message,
                    "time_s": f.time_s,
                    "request_id": f.request_id,
                    "count": f.count,
                }
                for f in self.first_violations
            ],
            "fatal_error": self.fatal_error,
            "crashed": self.crashed,
            "num_requests": self.num_requests,
            "duration_s": round(self.duration_s, 6),
            "reproduce": self.reproduce_command,
        }


def display_path(path: Path) -> str:
    """`path` relative to the working directory where possible (what a user types)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def collect_scenario_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Scenario files named directly, plus every *.yaml / *.yml under named folders (sorted).

    Raises `ScenarioError` for a path that does not exist or a folder without scenarios.
    """
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ScenarioError(f"{path}: no such file or directory")
        if path.is_dir():
            files = sorted(
                p for p in path.rglob("*") if p.is_file() and p.suffix in SCENARIO_SUFFIXES
            )
            if not files:
                raise ScenarioError(f"{path}: no scenario files (*.yaml, *.yml) in this folder")
            found.extend(files)
        else:
            found.append(path)
    unique: list[Path] = []
    seen: set[Path] = set()
    for path in found:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def explicit_yaml(scenario: Scenario) -> str:
    """`scenario_to_yaml`, but the design, its vLLM version, block size and window are always
    written.

    Generated scenarios (fuzz findings, shrunk reproducers) are checked in as regression
    tests; they must not change meaning if a schema default changes later (as v0's did: the
    unpinned v0 designs model the 0.5.4 release, `sim.kv.v0_versions`).
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


def expected_of(scenario: Scenario) -> str | list[str]:
    wanted = scenario.expect.violations
    if isinstance(wanted, str):
        return wanted
    return sorted({kind.value for kind in wanted})


def first_violations(result: RunResult) -> list[FirstViolation]:
    frame = result.violations
    out = []
    for kind in sorted(set(frame["kind"])) if len(frame) else []:
        rows = frame[frame["kind"] == kind]
        row = rows.iloc[0]
        time_s = row["time_s"]
        request_id = row["request_id"]
        out.append(
            FirstViolation(
                kind=kind,
                message=str(row["message"]),
                time_s=None if time_s is None or time_s != time_s else float(time_s),
                request_id=None
                if request_id is None or request_id != request_id
                else int(request_id),
                count=len(rows),
            )
        )
    return out


def compare(
    expected: str | list[str], observed: list[str], fatal_error: str | None
) -> tuple[Status, str, list[str], list[str]]:
    """(status, reason, unexpected kinds, missing kinds) for one run.

    >>> compare(["leaked_blocks"], ["admission_undercount", "leaked_blocks"], None)[1]
    'unexpected violation: admission_undercount'
    """
    observed_set = set(observed)
    if expected == "none":
        if observed:
            return (
                Status.FAILED,
                f"unexpected violation: {', '.join(observed)}",
                sorted(observed),
                [],
            )
        if fatal_error:
            return Status.FAILED, f"fatal engine error: {fatal_error}", [], []
        return Status.PASSED, "no violations, as expected", [], []
    if expected == "any":
        if observed:
            return Status.PASSED, f"violations found, as expected: {', '.join(observed)}", [], []
        return Status.FAILED, "expected a violation (any kind), found none", [], []
    wanted = set(expected)
    missing = sorted(wanted - observed_set)
    unexpected = sorted(observed_set - wanted)
    parts = []
    if unexpected:
        parts.append(f"unexpected violation: {', '.join(unexpected)}")
    if missing:
        parts.append(f"expected violation missing: {', '.join(missing)}")
    if parts:
        return Status.FAILED, "; ".join(parts), unexpected, missing
    return Status.PASSED, f"expected violations found: {', '.join(sorted(wanted))}", [], []


def check_scenario(path: Path, scenario: Scenario | None = None) -> CheckOutcome:
    """Run one scenario file and compare it with its expectations (bad input raises)."""
    from sim.runner import run

    scenario = scenario if scenario is not None else load_scenario(path)
    start = time.perf_counter()
    try:
        if scenario.cluster.mode is ClusterMode.DISAGGREGATED:
            from sim.cluster.run import combined_result, run_disaggregated

            result = combined_result(run_disaggregated(scenario, path.parent))
        else:
            result = run(scenario, base_dir=path.parent)
    except (InputError, OSError):
        raise
    except Exception as error:  # noqa: BLE001 - a simulator crash fails this scenario only
        return _crashed(path, scenario, error, time.perf_counter() - start)
    duration_s = time.perf_counter() - start
    observed = sorted(result.violation_kinds)
    expected = expected_of(scenario)
    fatal_error = result.summary.get("fatal_error")
    status, reason, unexpected, missing = compare(expected, observed, fatal_error)
    return CheckOutcome(
        path=path,
        name=scenario.name,
        seed=scenario.seed,
        design=scenario.scheduler.design.value,
        expected=expected,
        observed_kinds=observed,
        status=status,
        reason=reason,
        duration_s=duration_s,
        unexpected_kinds=unexpected,
        missing_kinds=missing,
        first_violations=first_violations(result),
        fatal_error=fatal_error,
        num_requests=int(result.summary.get("num_requests", 0)),
        vllm_version=result.inputs.get("vllm_version"),
    )


def _crashed(path: Path, scenario: Scenario, error: Exception, duration_s: float) -> CheckOutcome:
    first_line = str(error).splitlines()[0] if str(error) else ""
    return CheckOutcome(
        path=path,
        name=scenario.name,
        seed=scenario.seed,
        design=scenario.scheduler.design.value,
        expected=expected_of(scenario),
        observed_kinds=[],
        status=Status.FAILED,
        reason=f"the simulator raised {type(error).__name__}: {first_line}",
        duration_s=duration_s,
        crashed=True,
        vllm_version=scenario.scheduler.resolved_vllm_version,
    )


def _bad_input(path: Path, error: InputError, scenario: Scenario | None = None) -> CheckOutcome:
    return CheckOutcome(
        path=path,
        name=scenario.name if scenario is not None else path.stem,
        seed=scenario.seed if scenario is not None else 0,
        design=scenario.scheduler.design.value if scenario is not None else "-",
        expected=expected_of(scenario) if scenario is not None else "-",
        observed_kinds=[],
        status=Status.BAD_INPUT,
        reason=f"bad input: {one_line(str(error))}",
        duration_s=0.0,
        vllm_version=scenario.scheduler.resolved_vllm_version if scenario is not None else None,
    )


def check_paths(
    paths: Iterable[str | Path],
    on_outcome: Callable[[CheckOutcome], None] | None = None,
) -> list[CheckOutcome]:
    """Every scenario's outcome, in path order; a bad file or path is a `BAD_INPUT` outcome.

    Every file is read and validated before any runs, so bad input is reported at once.
    """
    outcomes: list[CheckOutcome] = []
    entries: list[tuple[Path, Scenario | CheckOutcome]] = []
    for raw in paths:
        try:
            files = collect_scenario_paths([raw])
        except InputError as error:
            entries.append((Path(raw), _bad_input(Path(raw), error)))
            continue
        for path in files:
            if any(path.resolve() == seen.resolve() for seen, _ in entries):
                continue
            try:
                entries.append((path, load_scenario(path)))
            except InputError as error:
                entries.append((path, _bad_input(path, error)))
    for path, entry in entries:
        if isinstance(entry, CheckOutcome):
            outcome = entry
        else:
            try:
                outcome = check_scenario(path, entry)
            except InputError as error:  # e.g. the trace it names cannot be read
                outcome = _bad_input(path, error, entry)
        outcomes.append(outcome)
        if on_outcome is not None:
            on_outcome(outcome)
    return outcomes


def exit_code(outcomes: list[CheckOutcome]) -> int:
    """2 when any input was bad, else 1 when any expectation failed, else 0."""
    if any(o.bad_input for o in outcomes):
        return 2
    return 0 if all(o.passed for o in outcomes) else 1


def outcomes_json(outcomes: list[CheckOutcome]) -> dict:
    return {
        "num_scenarios": len(outcomes),
        "num_passed": sum(o.passed for o in outcomes),
        "num_failed": sum(not o.passed and not o.bad_input for o in outcomes),
        "num_bad_input": sum(o.bad_input for o in outcomes),
        "exit_code": exit_code(outcomes),
        "scenarios": [o.to_dict() for o in outcomes],
    }
