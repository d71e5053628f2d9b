"""What `kvsim fuzz` reports about kvsim itself, never as a vLLM finding.

Two things can be wrong with kvsim rather than with the design it models:

* an **internal error**: an exception escapes `sim.engine.run.run`. The real code's failures that
  kvsim models (NoFreeBlocksError, vLLM 0.5.4's IndexError, ...) never escape: the auditor
  records them as violations and the engine stops the run with a `fatal_error`. Anything that
  does escape is a bug in kvsim, reported with its traceback and the case seed to replay.
* an **internal inconsistency**: the decode fast path and the decode cohort are speed-ups
  that must change no result (tests/scheduler/test_decode_cohort.py proves it on drawn cases). A fuzz
  run re-runs every case whose seed is a multiple of `CROSS_CHECK_EVERY` with both turned off
  and compares the tables (`tables_of`); a difference is a bug in kvsim.

What "no result" means, exactly: the `requests` and `steps` tables are byte-identical, and so
is the `violations` table once repeated reports are dropped. The audit checks the pool after
every manager call; a corruption that persists (a refcount-0 block still in a table) is
reported again after each call, and the fast path makes fewer calls (that is its point), so it
repeats such a report less often. The first report of each distinct (kind, call, request,
message) is the same, row for row. Found by `kvsim fuzz --design v0-v2 --case-seed 23012616`:
8 `refcount` rows without the shortcuts, 6 with them, everything else identical.

Example: case seed 1_000_000 (a multiple of 8) is run twice, as generated and with
`scheduler.decode_fast_path: false, decode_cohort: false`, and `tables_of` of both must match.
"""

from __future__ import annotations

import json
import traceback
from dataclasses import dataclass

from sim.output.results import RunResult
from sim.scenario.schema import Scenario

#: One case in this many (by case seed) is also run with the shortcuts off and compared.
CROSS_CHECK_EVERY = 8
#: The tables compared, in the order a difference is reported.
TABLES = ("requests", "steps", "violations", "summary")
#: What makes two violation rows the same report (a repeat differs only in time and step).
REPORT_KEY = ["kind", "call", "request_id", "message"]


def is_cross_checked(case_seed: int) -> bool:
    """Whether the case with this seed is cross-checked (decided by the seed alone, so a
    `--case-seed` replay repeats it). Example: 16 -> True, 17 -> False."""
    return case_seed % CROSS_CHECK_EVERY == 0


def without_shortcuts(scenario: Scenario) -> Scenario:
    """The same case with the decode fast path and the decode cohort turned off."""
    scheduler = scenario.scheduler.model_copy(
        update={"decode_fast_path": False, "decode_cohort": False}
    )
    return scenario.model_copy(update={"scheduler": scheduler})


def tables_of(result: RunResult) -> dict[str, str]:
    """The run's tables as CSV text and its summary as JSON, as the shortcuts must keep them:
    violations without repeated reports, the summary without their count (see above)."""
    violations = result.violations.drop_duplicates(subset=REPORT_KEY, keep="first")
    summary = {k: v for k, v in result.summary.items() if k != "num_violations"}
    tables = {
        "requests": result.requests.to_csv(index=False),
        "steps": result.steps.to_csv(index=False),
        "violations": violations.to_csv(index=False),
        # NaN (an empty percentile) writes as NaN on both sides: equal text, equal values.
        "summary": json.dumps(summary, sort_keys=True),
    }
    if result.kv_events is not None:  # recorded by the case (`engine.kv_events`)
        tables["kv_events"] = result.kv_events.to_csv(index=False)
    return tables


def first_difference(expected: dict[str, str], actual: dict[str, str]) -> str | None:
    """None when equal; else the first table that differs and its first differing line.

    Example: requests line 3 `2,finished,...` vs `2,failed,...` ->
    "requests line 3: '2,finished,...' with the shortcuts, '2,failed,...' without".
    """
    for name in TABLES:
        if expected[name] == actual[name]:
            continue
        with_lines, without_lines = expected[name].splitlines(), actual[name].splitlines()
        for number, (a, b) in enumerate(zip(with_lines, without_lines, strict=False), start=1):
            if a != b:
                return f"{name} line {number}: {a!r} with the shortcuts, {b!r} without"
        return f"{name}: {len(with_lines)} lines with the shortcuts, {len(without_lines)} without"
    return None


@dataclass(slots=True)
class InternalError:
    """An exception that escaped kvsim's simulator on one fuzz case (a kvsim bug)."""

    case_index: int
    case_seed: int
    error: str
    traceback: str

    @classmethod
    def from_exception(cls, case_index: int, case_seed: int, exc: BaseException) -> InternalError:
        text = traceback.format_exception(type(exc), exc, exc.__traceback__)
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        return cls(case_index, case_seed, f"{type(exc).__name__}: {first_line}", "".join(text))

    def to_dict(self) -> dict[str, object]:
        return {
            "case_index": self.case_index,
            "case_seed": self.case_seed,
            "error": self.error,
            "traceback": self.traceback,
        }


@dataclass(slots=True)
class Inconsistency:
    """A case whose tables change when the fast path and cohort are off (a kvsim bug)."""

    case_index: int
    case_seed: int
    difference: str

    def to_dict(self) -> dict[str, object]:
        return {
            "case_index": self.case_index,
            "case_seed": self.case_seed,
            "difference": self.difference,
        }
