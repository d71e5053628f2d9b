"""The decode shortcuts of the v0 scheduler: its running phase with quiet decodes skipped, and
the decode cohort's lazy step (the layer is described in `sim.scheduler.fast.layer`).

`schedule_running` replaces `_schedule_running` (`vllm/core/scheduler.py @fc93e56` L408-516).
With a cohort it first tries the lazy step, which visits only the outsiders and the members
whose event is due; when it cannot (see `_lazy_step`), or without a cohort, it walks `running`
with upstream's loop (`V0RunningPhase._schedule_running`) and its own turn for each request
(`_walk_request`): a quiet decode is scheduled without a manager call, every other request
takes upstream's turn (`_schedule_running_request`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sim.audit import AuditError
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.fast.cohort import DecodeCohort
from sim.scheduler.fast.layer import DecodeShortcuts, add_quiet_decode, apply_quiet_decodes
from sim.scheduler.request import Membership, Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v0.base import RunningOutputs, RunningStep, RunningWalk

MEMBER = Membership.MEMBER
# Tested per `event_len` (~250 k times per Azure replay): on Python 3.11 an enum member read
# through its class costs ~95 ns, a module global ~10 ns.
RUNNING = RequestState.RUNNING

if TYPE_CHECKING:
    from sim.scheduler.v0.scheduler import V0Scheduler


class V0DecodeShortcuts(DecodeShortcuts):
    """The layer for one `V0Scheduler` (created by it when the fast path is on)."""

    def __init__(self, scheduler: V0Scheduler) -> None:
        super().__init__()
        self.scheduler = scheduler
        self.max_model_len = scheduler.config.max_model_len
        #: Free blocks as of the walk's last real call (`_walk_request`'s quiet test).
        self._walk_free = 0
        # The next order key in front of `running` under a cohort (chunked prefill puts
        # prefill-stage requests there); the base class keeps the one at the back.
        self._front_key = -1

    # ------------------------------------------------------------------ running, the seam
    def schedule_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs:
        """The running phase in place of `_schedule_running` (same results, fewer calls):
        the cohort's lazy step when there is a cohort and it can, else the walk."""
        if self.cohort is None:
            return self._walk(budget, plan, now_s, chunking)
        return self._lazy_step(self.cohort, budget, plan, now_s, chunking)

    def _walk(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs:
        """Upstream's loop over every request, each with `_walk_request`'s turn."""
        self.materialize()
        self._walk_free = self.scheduler.block_manager.get_num_free_gpu_blocks()
        return self.scheduler._schedule_running(budget, plan, now_s, chunking, self._walk_request)

    def _walk_request(
        self,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
        outputs: RunningOutputs,
    ) -> RunningStep:
        """One request's turn in the walk. A decode whose manager calls would change nothing
        (the manager said so with `decode_touch_len`) and whose `can_append_slots` is then
        `free >= 1` is scheduled without them; the skipped tokens are synced before the next
        real call. Every other request takes upstream's turn."""
        if (
            self._walk_free >= 1
            and not request.is_prefill
            and (not chunking or budget.num_batched_tokens < budget.token_budget)
        ):
            touch_len = request.touch_len
            if touch_len is not None and request.seq.content.num_tokens < touch_len:
                self.scheduler.running.popleft()
                add_quiet_decode(request, plan, self.max_model_len)
                outputs.decode.append(request)
                # Counted without the per-request id sets: those only make a later subtract
                # idempotent, and a request already walked is never preempted in this step
                # (victims come from the tail).
                budget.num_batched_tokens += 1
                if chunking:
                    budget.num_curr_seqs += 1
                return RunningStep.DONE
        step = self.scheduler._schedule_running_request(
            request, budget, plan, now_s, chunking, outputs
        )
        self._walk_free = self.scheduler.block_manager.get_num_free_gpu_blocks()
        return step

    # ------------------------------------------------------------------ the cohort's lazy step
    def _lazy_step(
        self,
        cohort: DecodeCohort,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
    ) -> RunningOutputs:
        """The running phase visiting only the outsiders and the members whose event is due,
        in queue order; the other members decode in bulk (`plan.bulk`). The scheduled
        prefill-stage requests leave `running` (into `outputs.prefill`, to go in front).

        It walks instead (`_walk`; nothing has changed before) when the pool is so low that
        a call may fail or leave no free block for a quiet decode (the walk's `free >= 1`
        test), or when the token budget would not cover every request.

        A due member that finishes in this step leaves the cohort; one whose decode needs the
        manager (it reached `touch_len`) gets its calls here and stays, filed under its next
        event, so it costs no leave, no join and no explicit update.
        """
        sched = self.scheduler
        touched = []
        for request in cohort.pop_due():
            seq = request.seq
            if seq.content.num_tokens >= min(
                seq.prompt_len + request.max_tokens - 1, self.max_model_len
            ):
                cohort.leave(request)  # finishes after this step: the explicit path frees it
                self.outsiders[request] = None
            else:
                touched.append(request)
        if not touched and not self.outsiders:
            return self._bulk_only(cohort, budget, plan, now_s, chunking)
        explicit = [*self.outsiders, *touched]
        if len(explicit) > 1:
            explicit.sort(key=_order_key)
        # One decode call takes at most 2 blocks (a new block, plus v0-V2's lazily created null
        # block or v0-V1's copy-on-write); with this margin every call's `can_append_slots`
        # holds and at least one block stays free for the quiet decodes after it.
        if self.scheduler.block_manager.get_num_free_gpu_blocks() < 2 * len(explicit) + 2:
            return self._walk(budget, plan, now_s, chunking)
        if chunking:
            demand = len(cohort)  # the touched members included
            for request in self.outsiders:
                seq = request.seq
                demand += seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
            if demand > budget.remaining_token_budget():
                return self._walk(budget, plan, now_s, chunking)
        outputs = RunningOutputs(RunningWalk.LAZY)
        manager = sched.block_manager
        for request in explicit:
            if request.membership is MEMBER:
                self._touch_member(cohort, request, budget, plan, now_s)
                continue
            seq = request.seq
            touch_len = request.touch_len
            if (
                not request.is_prefill
                and touch_len is not None
                and seq.content.num_tokens < touch_len
            ):
                # Quiet, as in the walk; here because it finishes after this step.
                add_quiet_decode(request, plan, self.max_model_len)
                budget.num_batched_tokens += 1
                if chunking:
                    budget.num_curr_seqs += 1
                continue
            num_new = sched._num_new_tokens(request, budget, chunking)
            sched._sync(request)
            if not manager.can_append_slots(request.group, sched.config.num_lookahead_slots):
                raise AssertionError(
                    f"kvsim: lazy step without room for request {request.request_id}"
                )
            try:
                sched._append_slots(request, plan)
            except AuditError as error:
                self.remove_running(request)
                sched._fail(request, plan, error, now_s)
                continue
            is_prefill = request.is_prefill
            plan.scheduled.append(
                ScheduledWork(
                    request, num_new if is_prefill else 1, seq.num_computed_tokens, is_prefill
                )
            )
            if is_prefill:
                self.remove_running(request)
                outputs.prefill.append(request)
            budget.add_num_batched_tokens(request.request_id, num_new)
            if chunking:
                budget.add_num_seqs(request.request_id, request.group.get_max_num_running_seqs())
        self._count_members(cohort, budget, plan, chunking)
        return outputs

    def _bulk_only(
        self,
        cohort: DecodeCohort,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
    ) -> RunningOutputs:
        """The lazy step of a step with nothing but members (about half of a replay's steps):
        each quiet, if one block is free and the budget covers them."""
        if self.scheduler.block_manager.get_num_free_gpu_blocks() < 2:
            return self._walk(budget, plan, now_s, chunking)
        if chunking and len(cohort) > budget.remaining_token_budget():
            return self._walk(budget, plan, now_s, chunking)
        self._count_members(cohort, budget, plan, chunking)
        return _LAZY_NOTHING

    @staticmethod
    def _count_members(
        cohort: DecodeCohort, budget: SchedulingBudget, plan: StepPlan, chunking: bool
    ) -> None:
        """The members decode one token each, in bulk."""
        members = len(cohort)
        if members:
            plan.bulk = cohort.bulk()
            budget.num_batched_tokens += members
            if chunking:
                budget.num_curr_seqs += members

    def _touch_member(
        self,
        cohort: DecodeCohort,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
    ) -> None:
        """Upstream's turn for a due member (a one-token decode that reached `touch_len`).

        The scheduler's `_sync`, then `_append_slots` and `event_len` written out: a replay runs
        this for every decode that crosses a block boundary (~250 k times for the Azure trace).
        """
        sched = self.scheduler
        seq = request.seq
        context = seq.num_computed_tokens
        sched._sync(request)
        manager = sched.block_manager
        lookahead = sched.config.num_lookahead_slots
        if not manager.can_append_slots(request.group, lookahead):
            raise AssertionError(f"kvsim: lazy step without room for request {request.request_id}")
        try:
            cows = manager.append_slots(seq, lookahead)
        except AuditError as error:
            cohort.leave(request)
            self.remove_running(request)
            sched._fail(request, plan, error, now_s)
            return
        plan.num_blocks_copied += len(cows)
        sched._refresh_touch(request)
        touch_len = request.touch_len
        if touch_len is not None:  # a running decode: `event_len`'s rule
            limit = min(seq.prompt_len + request.max_tokens - 1, self.max_model_len)
            cohort.refile(request, touch_len if touch_len < limit else limit)
            return
        # The manager wants every call from now on: this decode runs as an outsider's.
        cohort.leave(request)
        self.outsiders[request] = None
        plan.scheduled.append(ScheduledWork(request, 1, context, False))
        budget.add_num_batched_tokens(request.request_id, 1)

    # ------------------------------------------------------------------ the queues' events
    def use_cohort(self, window: int | None) -> None:
        self.cohort = DecodeCohort(window)
        self._renumber()

    def event_len(self, request: Request) -> int | None:
        """The first length at which a running decode is not quiet: the manager must see it
        (`touch_len`), or the step finishes it (`add_quiet_decode`). None: not a decode the
        fast path may skip."""
        touch_len = request.touch_len
        if touch_len is None or request.is_prefill or request.state is not RUNNING:
            return None
        seq = request.seq
        return min(touch_len, seq.prompt_len + request.max_tokens - 1, self.max_model_len)

    def _renumber(self) -> None:
        """After a walk (the cohort is empty): number `running` afresh, all outsiders."""
        running = self.scheduler.running
        for key, request in enumerate(running):
            request.order_key = key
        self._back_key = len(running)
        self._front_key = -1
        self.outsiders = dict.fromkeys(running)

    def after_walk(self) -> None:
        """`running` was refilled by upstream's requeue."""
        if self.cohort is not None:
            self._renumber()

    def leave_running(self, request: Request) -> None:
        """`request` is being preempted (a walked request, so not a member): its touch
        length ends with its table."""
        self.outsiders.pop(request, None)
        request.touch_len = None

    def remove_running(self, request: Request) -> None:
        """Take a request the lazy step ended or scheduled as a prefill out of `running`."""
        self.scheduler.running.remove(request)
        self.outsiders.pop(request, None)

    def requeue_lazy(
        self,
        prefills: Sequence[Request],
        kept_prefill: Sequence[Request],
        swapped_in: Sequence[Request],
    ) -> None:
        """`_requeue` after a lazy step: `running` still holds every other request in order.
        The new prefills and the kept prefill-stage ones go first when chunking (where a
        full walk would have put them), or last otherwise; the swapped-in ones last."""
        sched = self.scheduler
        front = [*prefills, *kept_prefill]
        if sched.config.enable_chunked_prefill and front:
            for request in reversed(front):
                sched.running.appendleft(request)
                request.order_key = self._front_key
                self._front_key -= 1
                self.outsiders[request] = None
        elif front:
            sched._append_running(front)
        if swapped_in:
            sched._append_running(swapped_in)

    def after_update(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
        """After `update`: the quiet decodes get their tokens, the members theirs (`tick`),
        the finished requests leave, and the running decodes with a quiet stretch join."""
        if plan.quiet:
            apply_quiet_decodes(plan.quiet, now_s, advance_computed=True)
        cohort = self.cohort
        if cohort is None:
            return
        if plan.bulk is not None:
            cohort.tick(now_s)
        for request in finished:
            self.outsiders.pop(request, None)
        if self.outsiders:  # every running decode with a quiet stretch ahead joins
            cohort.join_outsiders(self.outsiders, self.event_len)


#: The outputs of a lazy step that scheduled no request on its own: read, never written.
_LAZY_NOTHING = RunningOutputs(RunningWalk.LAZY)


def _order_key(request: Request) -> int:
    return request.order_key
