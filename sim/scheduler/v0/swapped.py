"""The v0 swapped phase, `_schedule_swapped` (`vllm/core/scheduler.py @fc93e56` L518-624).

Swapped groups come back in queue order while `can_swap_in` says OK and the budget has room;
LATER stops the phase, NEVER ends the request as ignored. A swap-in that fails in the manager
is fatal (see `_die`).
"""

from __future__ import annotations

import contextlib

from sim.audit import AuditError
from sim.kv.types import AllocStatus, SequenceStatus
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v0.base import _die
from sim.scheduler.v0.prefills import V0PrefillsPhase


class V0SwappedPhase(V0PrefillsPhase):
    def _schedule_swapped(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request]:
        """`_schedule_swapped` (L518-624); returns the groups swapped in, in order."""
        swapped_in: list[Request] = []
        while self.swapped:
            request = self.swapped[0]
            status = self.block_manager.can_swap_in(request.group, self.config.num_lookahead_slots)
            if status is AllocStatus.LATER:
                break
            if status is AllocStatus.NEVER:
                self.swapped.popleft()
                with contextlib.suppress(AuditError):
                    self.block_manager.free(request.seq)
                request.finish(
                    RequestState.IGNORED,
                    f"Failing the request {request.request_id} because there's not enough kv cache blocks "
                    "to run the entire sequence.",
                    now_s,
                )
                plan.ignored.append(request)
                continue
            num_seqs = request.group.get_max_num_running_seqs()
            num_tokens = self._num_new_tokens(request, budget, chunking)
            if num_tokens == 0 or not budget.can_schedule(num_tokens, num_seqs):
                break
            try:
                mapping = self.block_manager.swap_in(request.group)
            except AuditError as error:
                # Fatal, as in `_preempt`: a swap-in that ran dry leaves blocks without an id.
                # The requests swapped in so far go to `running` (the caller requeues the rest).
                self._append_running(swapped_in)
                raise _die(plan, error) from None
            self.swapped.popleft()
            try:
                plan.num_blocks_swapped_in += len(mapping)
                request.seq.status = SequenceStatus.RUNNING
                request.state = RequestState.RUNNING
                self._append_slots(request, plan)
            except AuditError as error:
                self._fail(request, plan, error, now_s)
                continue
            is_prefill = request.is_prefill
            plan.scheduled.append(
                ScheduledWork(
                    request,
                    num_tokens if is_prefill else 1,
                    request.seq.num_computed_tokens,
                    is_prefill,
                )
            )
            budget.add_num_batched_tokens(request.request_id, num_tokens)
            budget.add_num_seqs(request.request_id, num_seqs)
            swapped_in.append(request)
        return swapped_in
