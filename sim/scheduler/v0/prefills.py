"""The v0 waiting phase: `_schedule_prefills` (`vllm/core/scheduler.py @fc93e56` L641-755) and
the priority policy's preemption for the waiting head (`_schedule_priority_preemption`, L970-1036
at 4ac7713, the v0 scheduler of 0.6.x with #5958).

Admission: a prompt over `_get_prompt_limit` or a `can_allocate` NEVER ends the request as
ignored; `can_allocate` LATER stops the phase (head-of-line blocking).
"""

from __future__ import annotations

from collections import deque

from sim.audit import AuditError
from sim.kv.types import AllocStatus, SequenceStatus
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.config import PreemptionMode
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan, priority_key
from sim.scheduler.v0.base import V0SchedulerBase, _FatalError


class V0PrefillsPhase(V0SchedulerBase):
    #: Skip a `can_allocate` whose LATER answer is known (see `_known_later`); tests turn it
    #: off to show that the skip changes no result.
    skip_repeated_later = True
    #: (request id, its tokens) and free blocks of the last LATER answer (`_known_later`).
    _later_key: tuple[int, int] | None = None
    _later_free = 0

    def _schedule_prefills(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request]:
        """`_schedule_prefills` (L641-755); returns the groups scheduled, in order."""
        scheduled: list[Request] = []
        while self.waiting:
            request = self.waiting[0]
            num_new = self._num_new_tokens(request, budget, chunking)
            if num_new > self.prompt_limit:
                self.waiting.popleft()
                request.finish(
                    RequestState.IGNORED,
                    f"Input prompt ({num_new} tokens) is too long and exceeds limit of {self.prompt_limit}",
                    now_s,
                )
                plan.ignored.append(request)
                continue
            if self._known_later(request):
                break
            status = self.block_manager.can_allocate(request.group)
            if status is AllocStatus.LATER:
                self._remember_later(request)
                break
            if status is AllocStatus.NEVER:
                self.waiting.popleft()
                request.finish(
                    RequestState.IGNORED,
                    f"Input prompt ({num_new} tokens) is too long and exceeds the capacity of block_manager",
                    now_s,
                )
                plan.ignored.append(request)
                continue
            num_new_seqs = request.group.get_max_num_running_seqs()
            if num_new == 0 or not budget.can_schedule(num_new, num_new_seqs):
                break
            self.waiting.popleft()
            try:
                self._allocate_and_set_running(request)
            except AuditError as error:
                self._fail(request, plan, error, now_s)
                continue
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
            plan.scheduled.append(
                ScheduledWork(request, num_new, request.seq.num_computed_tokens, True)
            )
            budget.add_num_batched_tokens(request.request_id, num_new)
            budget.add_num_seqs(request.request_id, num_new_seqs)
            scheduled.append(request)
        return scheduled

    def _known_later(self, request: Request) -> bool:
        """Speed-up of `can_allocate`: whether its answer for the head is known to be LATER.

        `can_allocate` is a pure query of (request, free blocks), and every v0 design's answer
        is monotone in the free blocks (OK iff free - required >= watermark; NEVER does not
        depend on them). So a head that got LATER stays LATER while it is unchanged and no
        block was freed: the repeat query of an overloaded replay, made on nearly every step,
        is skipped. Example: LATER for request 7 with 300 tokens at 12 free blocks; next step
        request 7 still has 300 tokens and 10 blocks are free: LATER without a call.
        """
        return (
            self.skip_repeated_later
            and self._later_key == (request.request_id, request.seq.content.num_tokens)
            and self.block_manager.get_num_free_gpu_blocks() <= self._later_free
        )

    def _remember_later(self, request: Request) -> None:
        self._later_key = (request.request_id, request.seq.content.num_tokens)
        self._later_free = self.block_manager.get_num_free_gpu_blocks()

    def _allocate_and_set_running(self, request: Request) -> None:
        """`_allocate_and_set_running` (L1043-1046)."""
        self.block_manager.allocate(request.group)
        self._refresh_touch(request)
        request.seq.status = SequenceStatus.RUNNING
        request.state = RequestState.RUNNING

    def _schedule_priority_preemption(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float
    ) -> None:
        """Preempt worse-priority running groups until the waiting head fits (L970-1036 @4ac7713)."""
        if not self.waiting:
            return
        running = sorted(self.running, key=priority_key)
        head = self.waiting.popleft()
        num_new = self._num_new_tokens(head, budget, False)
        num_new_seqs = head.group.get_max_num_running_seqs()
        while running and priority_key(running[-1]) > priority_key(head):
            status = self.block_manager.can_allocate(head.group)
            if (
                num_new > 0
                and status is AllocStatus.OK
                and budget.can_schedule(num_new, num_new_seqs)
            ):
                break
            victim = running.pop()
            budget.subtract_num_batched_tokens(
                victim.request_id, self._num_new_tokens(victim, budget, False)
            )
            budget.subtract_num_seqs(victim.request_id, victim.group.get_max_num_running_seqs())
            try:
                self._preempt(victim, plan, now_s, PreemptionMode.RECOMPUTE)
            except _FatalError:
                self.waiting.appendleft(head)
                # `running` (the queue, not the sorted copy) still holds the victims so far.
                moved = set(self.waiting)
                self.running = deque(r for r in self.running if r not in moved)
                raise
            self.waiting.appendleft(victim)
        self.waiting.appendleft(head)
        self.waiting = deque(sorted(self.waiting, key=priority_key))
        self.running = deque(running)
