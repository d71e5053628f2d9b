"""Violation records: what the auditor found, in a form a person and a CI job can read."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass


class ViolationKind(enum.Enum):
    """Kinds of invariant breach. Values are the names used in scenarios' `expect:` lists."""

    #: The admission query said OK, then the allocation failed or took more blocks than counted.
    ADMISSION_UNDERCOUNT = "admission_undercount"
    #: The admission query said OK for N blocks and the allocation took more, but succeeded
    #: because the pool happened to have room (the latent form of an undercount).
    ADMISSION_OVERTAKE = "admission_overtake"
    #: A failed allocation kept blocks that no table owns.
    LEAKED_BLOCKS = "leaked_blocks"
    #: free + held != total.
    CONSERVATION = "conservation"
    #: A block was freed with refcount 0, or a refcount went negative.
    DOUBLE_FREE = "double_free"
    #: A table references a block with refcount 0, or the held count disagrees with refcounts.
    REFCOUNT = "refcount"
    #: A sequence holds more blocks than its design's sliding-window bound.
    SLIDING_WINDOW_FOOTPRINT = "sliding_window_footprint"
    #: Admission left fewer than the watermark blocks free.
    WATERMARK = "watermark"
    #: `can_append_slots` said yes, then `append_slots` ran dry.
    APPEND_UNDERCOUNT = "append_undercount"
    #: A swap admission (`can_swap_in/out`) said yes, then the swap ran dry or took more.
    SWAP_UNDERCOUNT = "swap_undercount"
    #: The manager raised a failure of vLLM's code (a `sim.kv.types.ManagerError`, e.g. "null
    #: block should not be modified"), or ran dry on a call no admission query had promised.
    MANAGER_ERROR = "manager_error"
    #: Async scheduling: a block left a running request's sliding-window table while a step
    #: in flight still reads it (silent: the free succeeds; `sim.audit.in_flight`).
    FREED_WHILE_IN_FLIGHT = "freed_while_in_flight"
    #: The queue can never move (nothing runs and nothing can be admitted, or steps keep
    #: preempting without running anything): the real engine would hang. The engine aborts
    #: what is left; the message diagnoses it (`sim.audit.liveness`).
    NO_PROGRESS = "no_progress"
    #: Found before the run: vLLM's startup check accepts `max_model_len`, but the full-sequence
    #: admission gate charges a request of that many tokens more blocks than the pool has, so
    #: such a request would wait forever (the #7470 class between two checks, not two calls:
    #: `sim.scenario.startup.startup_gate_mismatch`).
    STARTUP_GATE_MISMATCH = "startup_gate_mismatch"


@dataclass(frozen=True, slots=True)
class Violation:
    """One finding. `counted`/`needed`/`free` are block counts (None where not applicable)."""

    kind: ViolationKind
    call: str
    request_id: int | None
    message: str
    counted_blocks: int | None = None
    needed_blocks: int | None = None
    free_blocks: int | None = None
    time_s: float | None = None
    step: int | None = None
    recovered_blocks: int = 0

    def to_row(self) -> dict[str, object]:
        row = asdict(self)
        row["kind"] = self.kind.value
        return row


class AuditError(Exception):
    """Raised to the caller when an audited call failed; carries the violation."""

    def __init__(self, violation: Violation) -> None:
        # The violation itself is the argument, so copies made from `args` (SimPy rebuilds an
        # exception escaping a process that way, as does pickling) stay whole.
        super().__init__(violation)
        self.violation = violation

    def __str__(self) -> str:
        return self.violation.message


class ViolationPolicy(enum.Enum):
    """What happens after a violation.

    ``record``: keep it, roll back what the failed call took (and say so), carry on. A failed
    swap or free, which nothing can roll back, still ends the run (`sim.scheduler.v0.outputs.die`).
    ``stop``: end the run where the real engine would raise: at the first violation whose
    manager call failed (an allocation that ran dry, a double free, a `ManagerError`). A
    silent one (an `admission_overtake` whose allocation succeeded, a watermark breach) is
    recorded and the run goes on, as the real engine does.
    ``stop_any``: end the run at the first violation of any kind.
    Both stop policies leave the blocks a failed call leaked lost, as the real code does.
    """

    RECORD = "record"
    STOP = "stop"
    STOP_ANY = "stop_any"
