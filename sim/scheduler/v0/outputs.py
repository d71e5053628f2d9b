"""The v0 scheduler's data: what the running phase returns, and the fatal engine error that ends
`schedule` (vLLM 0.5.4, release commit 4db5176, `vllm/core/scheduler.py`).

Upstream keeps `SchedulerRunningOutputs` (L172-205) in the scheduler's file; here it is data
the decode shortcuts (`sim.scheduler.fast.v0`) build too, so it lives apart from the class
(`sim.scheduler.v0.scheduler`), and neither module needs the other's class.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from sim.audit import AuditError
from sim.scheduler.request import Request, StepPlan

#: The real engine's `RuntimeError` of `_preempt_by_swap` / `_swap_out` (L1144-1158).
SWAP_SPACE_ERROR = (
    "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."
)


class RunningWalk(enum.Enum):
    """How the running phase treated `running`, which decides how `_requeue` refills it."""

    #: The phase did not run (the default policy scheduled prefills): `running` is untouched.
    NONE = "none"
    #: Upstream's walk: every request visited was taken off `running`; `_requeue` refills it.
    FULL = "full"
    #: The decode cohort's lazy step: `running` still holds every request, except the
    #: scheduled prefill-stage ones in `prefill` (they go back in front when chunking).
    LAZY = "lazy"


@dataclass(slots=True, init=False)
class RunningOutputs:
    """What the running phase returns (`SchedulerRunningOutputs`, L172-205): the requests kept
    running (prefill stage and decodes, in queue order each), those preempted by recompute and
    those swapped out (in preemption order)."""

    walk: RunningWalk
    prefill: list[Request]
    decode: list[Request]
    preempted: list[Request]
    swapped_out: list[Request]

    def __init__(self, walk: RunningWalk) -> None:
        # Written out (dataclass(init=False)): one per engine step, and the generated
        # __init__ with four factories costs twice as much.
        self.walk = walk
        self.prefill = []
        self.decode = []
        self.preempted = []
        self.swapped_out = []

    @property
    def kept(self) -> list[Request]:
        """Upstream's requeue order: the decodes, then the prefill-stage groups
        (`_schedule_chunked_prefill`, vllm/core/scheduler.py:L886-891 of 0.5.4; the default
        policy keeps no prefill-stage group)."""
        return self.decode + self.prefill


class RunningStep(enum.Enum):
    """One request's turn in the running phase."""

    #: Scheduled, preempted (itself or victims from the tail) or failed: the walk goes on.
    DONE = "done"
    #: No new tokens (the chunked budget ran out): the walk ends, the request stays queued.
    NO_TOKENS = "no_tokens"


class FatalEngineError(Exception):
    """Unwinds `schedule` after a fatal engine error recorded in the plan."""


def die(plan: StepPlan, error: AuditError) -> FatalEngineError:
    """Record a manager failure the run cannot go on from as the plan's fatal engine error.

    The record policy carries on after a failed `allocate` or `append_slots`: the request
    fails, its table is released whole (and the auditor returns what a failed allocate
    leaked), so the pool stays consistent. A failed swap or free leaves a table half moved or
    half released (ids back in the pool while the table still names them, or blocks with no
    id at all), which no later call can undo; vLLM raises out of the engine at that call, so
    the run ends there under every policy. The auditor has recorded the violation. Returns
    the exception that unwinds `schedule`.
    """
    plan.fatal_error = error.violation.message
    return FatalEngineError(plan.fatal_error)
