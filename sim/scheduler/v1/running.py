"""The V1 engine's running phase: the first loop of `Scheduler.schedule`
(`vllm/v1/core/sched/scheduler.py` at 0.11.0 / 4ac7713, L208-320).

Each running request in list order, while budget remains, gets its new tokens (clamped by
`long_prefill_token_threshold`, the budget and `max_model_len - 1 - computed`, L213-226), then
`allocate_slots`; while that returns None the last running request (PRIORITY: the worst
(priority, arrival)) is preempted by recompute (L254-292), until the request fits or was itself
the victim, which ends the loop. The decode shortcuts (`sim.scheduler.fast.layer`) replace this
phase as a whole and give every request they do not answer themselves upstream's turn,
`_schedule_running_request`.
"""

from __future__ import annotations

import enum
from abc import abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from sim.audit import AuditedV1Manager, AuditError
from sim.kv.types import SequenceStatus
from sim.scheduler.config import Policy, SchedulerConfig
from sim.scheduler.fast.layer import FastPathScheduler
from sim.scheduler.lifecycle import fail
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v1.priority_ties import HeapTieMirror
from sim.scheduler.v1.release import V1ReleasePolicies

if TYPE_CHECKING:
    from sim.scheduler.fast.v1 import V1DecodeShortcuts


class Allocation(enum.Enum):
    """What `allocate_slots` for a running request came to (L254-292)."""

    #: It fits (after preempting victims from the tail, maybe).
    FITS = "fits"
    #: It was itself the victim: the running loop ends (FCFS and 4ac7713 / 0.11.0).
    PREEMPTED_SELF = "preempted_self"
    #: The manager call failed (the auditor recorded why): the request failed, left `running`.
    FAILED = "failed"


class TurnOutcome(enum.Enum):
    """One request's turn in the running loop."""

    SCHEDULED = "scheduled"
    #: No new tokens due (L238-252): the loop moves on (`continue`, not `break`).
    NOTHING_DUE = "nothing_due"
    PREEMPTED_SELF = "preempted_self"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RunningTurn:
    """A turn's outcome and the tokens it scheduled (0 unless SCHEDULED)."""

    outcome: TurnOutcome
    num_new_tokens: int = 0


_NOTHING_DUE = RunningTurn(TurnOutcome.NOTHING_DUE)
_TURN_OF = {
    Allocation.PREEMPTED_SELF: RunningTurn(TurnOutcome.PREEMPTED_SELF),
    Allocation.FAILED: RunningTurn(TurnOutcome.FAILED),
}

#: One request's turn: (request, budget, plan, now_s) -> its outcome.
RequestTurn = Callable[[Request, int, StepPlan, float], RunningTurn]


class RunningPhase(Protocol):
    """The seam: a running phase, upstream's (`V1RunningPhase._schedule_running`) or the
    decode shortcuts' (`V1DecodeShortcuts.schedule_running`); returns the budget left."""

    def __call__(self, plan: StepPlan, budget: int, now_s: float) -> int: ...


class V1RunningPhase(FastPathScheduler):
    """The running phase over the state `V1Scheduler.__init__` sets up."""

    config: SchedulerConfig
    kv_cache_manager: AuditedV1Manager
    release_policies: V1ReleasePolicies
    waiting: deque[Request]
    running: list[Request]
    shortcuts: V1DecodeShortcuts | None
    _ties: HeapTieMirror | None
    _victim_key: Callable[[Request], tuple[int, float] | tuple[int, float, int]]
    _victim_indices: list[int]
    _refunded_tokens: int
    _step_threshold: int

    @abstractmethod
    def _enqueue(self, request: Request, front: bool) -> None:
        """Put `request` in the waiting queue, at its front or by policy (`V1Scheduler`)."""

    def _schedule_running(
        self, plan: StepPlan, budget: int, now_s: float, request_turn: RequestTurn | None = None
    ) -> int:
        """The running loop (L208-320); returns the token budget left. `request_turn` is one
        request's turn, `_schedule_running_request` unless the decode shortcuts give theirs."""
        turn_of = request_turn or self._schedule_running_request
        index = 0
        while index < len(self.running) and budget > 0:
            turn = turn_of(self.running[index], budget, plan, now_s)
            if self._victim_indices:  # PRIORITY victims left `running` (see `_preempt`)
                index, budget = self._after_priority_preemption(index, budget)
            outcome = turn.outcome
            if outcome is TurnOutcome.FAILED:
                continue  # it left `running`
            if outcome is TurnOutcome.PREEMPTED_SELF:
                if self.config.policy is Policy.FCFS or (
                    self.release_policies.priority_victim.self_preemption_ends_loop
                ):
                    break
                continue  # 0.33.0: the next request now sits at `index`
            budget -= turn.num_new_tokens
            index += 1
        return budget

    def _schedule_running_request(
        self, request: Request, budget: int, plan: StepPlan, now_s: float
    ) -> RunningTurn:
        """The loop body (L211-300) for one request: its new tokens, `allocate_slots`
        (preempting from the tail until they fit), the work recorded."""
        seq = request.seq
        computed = seq.num_computed_tokens
        num_new = self._clamp(seq.content.num_tokens - computed, budget)
        num_new = min(num_new, self.config.max_model_len - 1 - computed)
        if num_new <= 0:
            return _NOTHING_DUE
        self._sync(request)
        allocation = self._allocate_running(request, num_new, plan, now_s)
        if allocation is not Allocation.FITS:
            return _TURN_OF[allocation]
        self._refresh_touch(request)
        plan.scheduled.append(
            ScheduledWork(
                request, num_new, seq.num_computed_tokens, self._is_prefill(request, num_new)
            )
        )
        return RunningTurn(TurnOutcome.SCHEDULED, num_new)

    def _clamp(self, num_new: int, budget: int) -> int:
        """`long_prefill_token_threshold`, then the budget (L216-220)."""
        threshold = self._step_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def _allocate_running(
        self, request: Request, num_new: int, plan: StepPlan, now_s: float
    ) -> Allocation:
        """`allocate_slots` for a running request, preempting until it fits (L254-292)."""
        while True:
            try:
                blocks = self.kv_cache_manager.allocate_slots(
                    request.seq, num_new, 0, None, self.config.num_lookahead_slots
                )
            except AuditError as error:
                if self.shortcuts is not None:
                    self.shortcuts.leave_running(request)
                self.running.remove(request)
                self._fail(request, plan, error, now_s)
                return Allocation.FAILED
            if blocks is not None:
                return Allocation.FITS
            if self._preempt(plan) is request:
                return Allocation.PREEMPTED_SELF

    def _preempt(self, plan: StepPlan) -> Request:
        """Preempt the last running request (PRIORITY: the worst) by recompute (L262-282)."""
        if self.config.policy is Policy.PRIORITY:
            victim = max(self.running, key=self._victim_key)
            victim_index = self.running.index(victim)
            del self.running[victim_index]
            self._victim_indices.append(victim_index)
            self._refunded_tokens += self.release_policies.priority_victim.unschedule(plan, victim)
        else:
            victim = self.running.pop()
        if self.shortcuts is not None:
            self.shortcuts.leave_running(victim)
        self._sync(victim)
        self.kv_cache_manager.free(victim.seq)
        victim.state = RequestState.WAITING
        victim.seq.status = SequenceStatus.PREEMPTED
        victim.seq.num_computed_tokens = 0
        victim.num_preemptions += 1
        plan.num_preempted += 1
        self._enqueue(victim, front=True)
        if self._ties is not None:
            self._ties.push(victim)
        return victim

    def _after_priority_preemption(self, index: int, budget: int) -> tuple[int, int]:
        """The running loop's index and budget after PRIORITY victims left `running`."""
        rule = self.release_policies.priority_victim
        for victim_index in self._victim_indices:
            index = rule.index_after_removal(index, victim_index)
        self._victim_indices.clear()
        budget += self._refunded_tokens
        self._refunded_tokens = 0
        return index, budget

    def _fail(self, request: Request, plan: StepPlan, error: AuditError, now_s: float) -> None:
        fail(self.kv_cache_manager, request, plan, error, now_s)

    @staticmethod
    def _is_prefill(request: Request, num_new: int) -> bool:
        seq = request.seq
        return not (
            num_new == 1 and seq.output_len > 0 and seq.num_computed_tokens == seq.num_tokens - 1
        )
