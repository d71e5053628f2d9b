"""One scenario's `kvsim check` outcome and how it reads.

`CheckOutcome` holds what was expected, what happened and how to reproduce it; it renders as
several lines for a failure (`failure_text`), one line for annotations (`one_line`) and a dict
for `--json` (`to_dict`). Paths are shown relative to the working directory where possible
(`display_path`), as a user would type them. `sim.ci.check` builds the outcomes.
"""

from __future__ import annotations

import enum
import shlex
from dataclasses import dataclass, field
from pathlib import Path


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
