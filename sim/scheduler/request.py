"""The runtime record of one request, shared by both schedulers, and the step plan they return."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sim.kv.types import Sequence, SequenceGroup, SequenceStatus, TokenContent

if TYPE_CHECKING:
    from sim.latency.batch import DecodeBulk


class RequestState(enum.Enum):
    """Where a request is. The last four are terminal: every request ends in exactly one."""

    WAITING = "waiting"
    RUNNING = "running"
    SWAPPED = "swapped"
    #: V1 with a KV connector: blocks allocated, waiting in `waiting` for an async KV load
    #: (vLLM's `RequestStatus.WAITING_FOR_REMOTE_KVS`; `sim.kv_connector`).
    WAITING_FOR_REMOTE_KVS = "waiting_for_remote_kvs"
    #: Generated all its output tokens (or hit max_model_len).
    FINISHED = "finished"
    #: Rejected by the scheduler (prompt too long, admission NEVER), as vLLM's FINISHED_IGNORED.
    IGNORED = "ignored"
    #: Its allocation failed under the auditor's record policy (the real engine would crash).
    FAILED = "failed"
    #: Still unfinished when the run ended (stop policy, a fatal engine error, or a time limit).
    ABORTED = "aborted"

    @property
    def is_terminal(self) -> bool:
        # Identity tests, not a set of members: an Enum hashes in Python code (`Enum.__hash__`),
        # and `update` asks this of every running request whenever one finishes.
        return (
            self is RequestState.FINISHED
            or self is RequestState.IGNORED
            or self is RequestState.FAILED
            or self is RequestState.ABORTED
        )


class Membership(enum.Enum):
    """Whether a running decode is a member of its scheduler's decode cohort
    (`sim.scheduler.fast.cohort`): its tokens then advance without it being visited."""

    OUTSIDE = "outside"
    MEMBER = "member"


@dataclass(slots=True, eq=False)
class Request:
    """A request as the engine sees it: the sequence, its group, timestamps and counters.

    A single-sequence request (n=1, no beam search), which is what serving traces contain.
    """

    request_id: int
    arrival_s: float
    max_tokens: int
    seq: Sequence
    group: SequenceGroup
    priority: int = 0
    state: RequestState = RequestState.WAITING
    finish_reason: str = ""
    first_scheduled_s: float | None = None
    first_token_s: float | None = None
    finish_s: float | None = None
    num_preemptions: int = 0
    num_prefix_hit_tokens: int = 0
    replica: int = 0
    #: Time the last output token was produced (for TPOT).
    last_token_s: float | None = None
    #: In the prefill stage (v0 `SequenceStage.PREFILL`): set again by recompute preemption.
    is_prefill: bool = True
    #: Decode fast path: the length at which the next decode must call the manager (None: always).
    touch_len: int | None = None
    #: Decode steps were skipped since the manager last saw this request (sync before a call).
    needs_sync: bool = False
    #: Position in its scheduler's running queue (smaller runs first); see `sim.scheduler.fast.cohort`.
    order_key: int = 0
    #: Decode cohort membership; while a member: the clock its token count was taken at, the
    #: count then, and the clock of its next event (None: not filed, a stale entry).
    membership: Membership = Membership.OUTSIDE
    cohort_clock: int = 0
    cohort_tokens: int = 0
    cohort_event: int | None = None
    #: The session and turn (1, 2, ...) of a multi-turn workload (`sim.workload.sessions`);
    #: None otherwise. A session-affinity router reads `session_id`.
    session_id: int | None = None
    turn: int | None = None
    #: Every output token's sample time, when the engine records them (`sim.engine.client`).
    token_times_s: list[float] | None = None
    #: V1 async scheduling (`sim.scheduler.v1.async_scheduler`): tokens a scheduled step will
    #: sample that have not come back yet (vLLM's `num_output_placeholders`), and at 0.33.0 the
    #: in-flight tokens scheduled before a preemption whose output is stale
    #: (`num_stale_output_tokens`). Both stay 0 in a synchronous engine.
    num_output_placeholders: int = 0
    num_stale_output_tokens: int = 0
    #: Mamba prefix caching on 0.26.0: the shared-prefix junction a prefill chunk stops at
    #: (`request.shared_prefix_boundary`, `sim.scheduler.v1.mamba_align`); 0: none.
    mamba_junction_tokens: int = 0

    @classmethod
    def new(
        cls,
        request_id: int,
        arrival_s: float,
        prompt: TokenContent,
        max_tokens: int,
        priority: int = 0,
    ) -> Request:
        seq = Sequence(request_id, prompt, prompt.num_tokens)
        group = SequenceGroup(request_id, [seq], arrival_s=arrival_s, priority=priority)
        return cls(request_id, arrival_s, max_tokens, seq, group, priority)

    @property
    def prompt_tokens(self) -> int:
        return self.seq.prompt_len

    def finish(self, state: RequestState, reason: str, now_s: float) -> None:
        assert not self.state.is_terminal, f"request {self.request_id} already {self.state.value}"
        self.state = state
        self.finish_reason = reason
        self.finish_s = now_s
        self.seq.status = {
            RequestState.FINISHED: SequenceStatus.FINISHED_LENGTH_CAPPED,
            RequestState.IGNORED: SequenceStatus.FINISHED_IGNORED,
        }.get(state, SequenceStatus.FINISHED_ABORTED)


def priority_key(request: Request) -> tuple[int, float, int]:
    """Order of the priority policy: lower `priority` first, then earlier arrival, then id."""
    return (request.priority, request.arrival_s, request.request_id)


@dataclass(slots=True)
class ScheduledWork:
    """One request's share of a step: `num_tokens` computed after `num_context_tokens` of KV."""

    request: Request
    num_tokens: int
    num_context_tokens: int
    is_prefill: bool
    #: Async scheduling: the step samples a token for it (it got an output placeholder at
    #: schedule time, so the worker samples); unused by the synchronous scheduler.
    samples: bool = False


@dataclass(slots=True, init=False)
class StepPlan:
    """What a scheduler decided for one step.

    `scheduled` holds every piece of work that needs individual handling after the step, in
    schedule order. Fast-path decodes (one token, no manager call, not finishing this step) go to
    `quiet` instead, with their context lengths in `quiet_contexts`: the hot path of a replay
    handles them in bulk. `all_scheduled()` gives everything as `ScheduledWork`.
    """

    scheduled: list[ScheduledWork] = field(default_factory=list)
    quiet: list[Request] = field(default_factory=list)
    quiet_contexts: list[int] = field(default_factory=list)
    #: The decode cohort's members, when the step ran them (each decodes one token).
    bulk: DecodeBulk | None = None
    num_preempted: int = 0
    ignored: list[Request] = field(default_factory=list)
    failed: list[Request] = field(default_factory=list)
    num_blocks_swapped_in: int = 0
    num_blocks_swapped_out: int = 0
    num_blocks_copied: int = 0
    #: A fatal engine error (e.g. "Aborted due to the lack of CPU swap space"); the run ends.
    fatal_error: str | None = None

    def __init__(self) -> None:
        # Written out (dataclass(init=False)): one plan per engine step, and the generated
        # __init__ with seven defaults and five factories costs twice as much.
        self.scheduled = []
        self.quiet = []
        self.quiet_contexts = []
        self.bulk = None
        self.num_preempted = 0
        self.ignored = []
        self.failed = []
        self.num_blocks_swapped_in = 0
        self.num_blocks_swapped_out = 0
        self.num_blocks_copied = 0
        self.fatal_error = None

    @property
    def num_bulk_decodes(self) -> int:
        return self.bulk.num_seqs if self.bulk is not None else 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.quiet and not self.num_bulk_decodes

    @property
    def num_tokens(self) -> int:
        return sum(w.num_tokens for w in self.scheduled) + len(self.quiet) + self.num_bulk_decodes

    def all_scheduled(self) -> list[ScheduledWork]:
        """Everything listed this step: `scheduled`, then the quiet decodes (not the bulk)."""
        quiet = [
            ScheduledWork(r, 1, ctx, False)
            for r, ctx in zip(self.quiet, self.quiet_contexts, strict=True)
        ]
        return [*self.scheduled, *quiet]
