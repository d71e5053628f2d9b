"""`kvsim check`: run scenarios and compare what happened with each scenario's `expect:`.

A scenario states what its run must show::

    expect: {violations: none}                                   # a clean design
    expect: {violations: any}                                    # something, whatever it is
    expect: {violations: [admission_undercount, leaked_blocks]}  # a known, documented bug

A list is an exact set: every listed kind must occur (else "missing") and no other kind may
(else "unexpected"). `none` also fails on a fatal engine error. Example: the 4-vs-3 case on
v0-v2 shows {admission_undercount, leaked_blocks}; with `expect: {violations: none}` it fails
with "unexpected admission_undercount, leaked_blocks"; with the list above it passes.
A scenario that shows an effect rather than a bug states it as bounds on its run's summary
(`expect: {summary: {ttft_p50_s: {max: 0.2}}}`, `sim.ci.expect_summary`); a bound missed fails.

Bad input (a missing file, invalid YAML, an unknown key, a trace that cannot be read) is not a
failed expectation: that file becomes an outcome with `Status.BAD_INPUT` (a JUnit `<error>`,
one `error:` line on stderr) and the other scenarios still run, so the reports are complete.
Exit status (`exit_code`): 2 when any input was bad (fix the input first: a finding among the
rest is still in the reports), else 1 when any expectation failed, else 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from sim.ci.expect_summary import misses
from sim.ci.outcome import CheckOutcome, FirstViolation, Status, display_path
from sim.ci.scenario_yaml import explicit_yaml
from sim.cluster.config import ClusterMode
from sim.errors import InputError, one_line
from sim.files.inputs import refuse_non_regular
from sim.output.results import RunResult
from sim.scenario.schema import Scenario, ScenarioError, load_scenario, naming

SCENARIO_SUFFIXES = (".yaml", ".yml")


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
            named = sorted(p for p in path.rglob("*") if p.suffix in SCENARIO_SUFFIXES)
            for candidate in named:  # a FIFO named x.yaml would block `kvsim check` forever
                if not candidate.is_dir():
                    refuse_non_regular(candidate)
            files = [p for p in named if p.is_file()]
            if not files:
                raise ScenarioError(f"{path}: no scenario files (*.yaml, *.yml) in this folder")
            found.extend(files)
        else:
            refuse_non_regular(path)
            found.append(path)
    unique: list[Path] = []
    seen: set[Path] = set()
    for path in found:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


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
    from sim.engine.run import run

    scenario = scenario if scenario is not None else load_scenario(path)
    start = time.perf_counter()
    try:
        with naming(path):  # a resolution error names the file too
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
    # expect.summary: what the scenario shows, as bounds on its own run's metrics.
    unmet = misses(scenario.expect.summary, result.summary, str(path))
    if unmet:
        reason = "; ".join(unmet) if status is Status.PASSED else "; ".join([reason, *unmet])
        status = Status.FAILED
    elif scenario.expect.summary and status is Status.PASSED:
        reason += f"; summary within bounds ({', '.join(scenario.expect.summary)})"
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


__all__ = [
    "SCENARIO_SUFFIXES",
    "CheckOutcome",
    "FirstViolation",
    "Status",
    "check_paths",
    "check_scenario",
    "collect_scenario_paths",
    "compare",
    "display_path",
    "exit_code",
    "expected_of",
    "explicit_yaml",
    "first_violations",
    "outcomes_json",
]
