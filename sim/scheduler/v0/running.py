"""The v0 running phase, `_schedule_running` (`vllm/core/scheduler.py @fc93e56` L408-516).

Each running group in queue order gets its new tokens (1 for a decode) if `can_append_slots`
holds; while it does not, the *last* running group is preempted (recompute for a single
sequence, else swap) until it does, or the group is itself the victim. The decode shortcuts
(`sim.scheduler.fast.layer`) replace this phase as a whole and call `_schedule_running_request`
for every request they do not answer themselves.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Protocol

from sim.audit import AuditError
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.config import PreemptionMode
from sim.scheduler.request import Request, ScheduledWork, StepPlan
from sim.scheduler.v0.base import (
    RunningOutputs,
    RunningStep,
    RunningWalk,
    _FatalError,
)
from sim.scheduler.v0.swapped import V0SwappedPhase

#: One request's turn: (request, budget, plan, now_s, chunking, outputs) -> its outcome.
RequestStep = Callable[
    [Request, SchedulingBudget, StepPlan, float, bool, RunningOutputs], RunningStep
]


class RunningPhase(Protocol):
    """The seam: a running phase, upstream's (`V0RunningPhase._schedule_running`) or the
    decode shortcuts' (`V0DecodeShortcuts.schedule_running`)."""

    def __call__(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs: ...


class V0RunningPhase(V0SwappedPhase):
    def _schedule_running(
        self,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
        request_step: RequestStep | None = None,
    ) -> RunningOutputs:
        """`_schedule_running` (L408-516): walk `running` from the head; every request
        visited leaves it (`_requeue` puts the kept ones back). `request_step` is the turn of
        one request, `_schedule_running_request` unless the decode shortcuts give theirs."""
        step = request_step or self._schedule_running_request
        outputs = RunningOutputs(RunningWalk.FULL)
        queue = self.running
        while queue:
            if step(queue[0], budget, plan, now_s, chunking, outputs) is RunningStep.NO_TOKENS:
                break
        return outputs

    def _schedule_running_request(
        self,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
        outputs: RunningOutputs,
    ) -> RunningStep:
        """The loop body (L446-506) for the head of `running`: preempt from the tail until
        `can_append_slots` holds (L454-483), then `_append_slots` and record the work
        (L484-506)."""
        num_tokens = self._num_new_tokens(request, budget, chunking)
        if num_tokens == 0:
            return RunningStep.NO_TOKENS
        queue = self.running
        queue.popleft()
        num_seqs = request.group.get_max_num_running_seqs()
        self._sync(request)
        while not self.block_manager.can_append_slots(
            request.group, self.config.num_lookahead_slots
        ):
            budget.subtract_num_batched_tokens(request.request_id, num_tokens)
            budget.subtract_num_seqs(request.request_id, num_seqs)
            victim = queue.pop() if queue else request
            try:
                mode = self._preempt(victim, plan, now_s)
            except _FatalError:
                # The engine dies here: the queues get back what this walk took off them
                # (so the step's row and the final abort see every request).
                if victim is not request:
                    queue.append(victim)
                queue.appendleft(request)
                self._requeue_on_fatal(outputs)
                raise
            if mode is PreemptionMode.RECOMPUTE:
                outputs.preempted.append(victim)
            else:
                outputs.swapped_out.append(victim)
            if victim is request:
                return RunningStep.DONE
        try:
            self._append_slots(request, plan)
        except AuditError as error:
            self._fail(request, plan, error, now_s)
            return RunningStep.DONE
        is_prefill = request.is_prefill
        plan.scheduled.append(
            ScheduledWork(
                request,
                num_tokens if is_prefill else 1,
                request.seq.num_computed_tokens,
                is_prefill,
            )
        )
        (outputs.prefill if is_prefill else outputs.decode).append(request)
        budget.add_num_batched_tokens(request.request_id, num_tokens)
        if chunking:
            budget.add_num_seqs(request.request_id, num_seqs)
        return RunningStep.DONE

    @abstractmethod
    def _requeue_on_fatal(self, outputs: RunningOutputs) -> None:
        """Put back what a walk took off `running` before the engine died (`V0Scheduler`)."""
