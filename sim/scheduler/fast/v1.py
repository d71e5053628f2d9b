"""The decode shortcuts of the V1-engine scheduler: its running phase with quiet decodes
skipped, and the decode cohort's lazy step (the layer is described in `sim.scheduler.fast.layer`).

`schedule_running` replaces the running loop (`vllm/v1/core/sched/scheduler.py` at 0.11.0 /
4ac7713, L208-320). With a cohort it first tries the lazy step (`_lazy_step`); when it cannot,
or without a cohort, it runs upstream's loop (`V1RunningPhase._schedule_running`) with its own
turn for each request (`_walk_turn`): a quiet decode is scheduled without `allocate_slots`,
every other request takes upstream's turn (`_schedule_running_request`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sim.scheduler.fast.cohort import DecodeCohort
from sim.scheduler.fast.layer import DecodeShortcuts, add_quiet_decode, apply_quiet_decodes
from sim.scheduler.request import Membership, Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v1.running import Allocation, RunningTurn, TurnOutcome

MEMBER = Membership.MEMBER
# Module constants for the enum members tested per touched member and per `event_len` (~250 k
# times each per Azure replay): on Python 3.11 `Enum.MEMBER` through the class costs ~95 ns,
# a module global ~10 ns.
RUNNING = RequestState.RUNNING
ALLOCATION_FAILED = Allocation.FAILED
ALLOCATION_PREEMPTED_SELF = Allocation.PREEMPTED_SELF

if TYPE_CHECKING:
    from sim.scheduler.v1.scheduler import V1Scheduler


_QUIET_TURN = RunningTurn(TurnOutcome.SCHEDULED, 1)


class V1DecodeShortcuts(DecodeShortcuts):
    """The layer for one `V1Scheduler` (created by it when the fast path is on)."""

    def __init__(self, scheduler: V1Scheduler) -> None:
        super().__init__()
        self.scheduler = scheduler
        self.max_model_len = scheduler.config.max_model_len

    # ------------------------------------------------------------------ running, the seam
    def schedule_running(self, plan: StepPlan, budget: int, now_s: float) -> int:
        """The running phase in place of the running loop (same results, fewer calls): the
        cohort's lazy step when there is a cohort and it can, else the walk. Returns the token
        budget left."""
        if self.cohort is None:
            return self._walk(plan, budget, now_s)
        return self._lazy_step(self.cohort, plan, budget, now_s)

    def _walk(self, plan: StepPlan, budget: int, now_s: float) -> int:
        """Upstream's loop over every request, each with `_walk_turn`'s turn."""
        self.materialize()
        return self.scheduler._schedule_running(plan, budget, now_s, self._walk_turn)

    def _walk_turn(
        self, request: Request, budget: int, plan: StepPlan, now_s: float
    ) -> RunningTurn:
        """One request's turn in the loop. A one-token decode (all but the newest token
        computed, outputs exist) that the manager declared quiet would get [] from
        `allocate_slots` and change nothing, so the call is skipped and synced before the next
        real one. Every other request takes upstream's turn."""
        if self.is_quiet(request):
            add_quiet_decode(request, plan, self.max_model_len - 1)
            return _QUIET_TURN
        return self.scheduler._schedule_running_request(request, budget, plan, now_s)

    def is_quiet(self, request: Request) -> bool:
        """The walk's test: a one-token decode the manager declared quiet."""
        seq = request.seq
        num_tokens = seq.content.num_tokens
        touch_len = request.touch_len
        computed = seq.num_computed_tokens
        return (
            touch_len is not None
            and num_tokens < touch_len
            and computed == num_tokens - 1
            and num_tokens > seq.prompt_len
            and computed < self.max_model_len - 1
        )

    # ------------------------------------------------------------------ the cohort's lazy step
    def _lazy_step(self, cohort: DecodeCohort, plan: StepPlan, budget: int, now_s: float) -> int:
        """The running loop visiting only the outsiders and the members whose event is due,
        in queue order; the other members decode in bulk (`plan.bulk`).

        The members take one token each where they stand in the queue. When every request's
        demand fits the budget, nothing is cut off. Otherwise the budget runs out somewhere;
        that is still exact lazily when it runs out after the last member (the usual case: a
        long prefill admitted last takes what remains), so the members' tokens are counted
        just before the first request behind them. Else (nothing has changed yet) the walk
        decides who is cut off (`_walk`). A preemption victim (the last running request) that
        is a member leaves the cohort first. Returns the token budget left.
        """
        sched = self.scheduler
        max_model_len = self.max_model_len
        touched = []
        for request in cohort.pop_due():
            seq = request.seq
            if seq.content.num_tokens >= min(
                seq.prompt_len + request.max_tokens - 1, max_model_len - 1
            ):
                cohort.leave(request)  # finishes after this step: the explicit path frees it
                self.outsiders[request] = None
            else:
                touched.append(request)  # reached touch_len: calls here, stays a member
        members = len(cohort)
        if not touched and not self.outsiders:
            # Half the steps of a replay: nothing but members, one token each.
            if members > budget:
                return self._walk(plan, budget, now_s)  # the walk decides who is cut off
            if members:
                plan.bulk = cohort.bulk()
            return budget - members
        explicit = [*self.outsiders, *touched]
        if len(explicit) > 1:
            explicit.sort(key=_order_key)
        last_computable = max_model_len - 1
        threshold = sched._step_threshold
        quiet_flags = []
        demands = []
        for request in explicit:
            seq = request.seq
            if request.membership is MEMBER:
                quiet_flags.append(False)
                demands.append(0)  # counted with the members
                continue
            quiet = self.is_quiet(request)
            quiet_flags.append(quiet)
            if quiet:
                demands.append(1)
            else:
                num_new = seq.content.num_tokens - seq.num_computed_tokens
                if 0 < threshold < num_new:
                    num_new = threshold
                demands.append(max(0, min(num_new, last_computable - seq.num_computed_tokens)))
        # Members' tokens are counted before the first request with a larger key.
        members_key = -1
        if members and members + sum(demands) > budget:
            members_key = cohort.max_order_key()
            ahead = sum(
                d for r, d in zip(explicit, demands, strict=True) if r.order_key < members_key
            )
            if ahead + members > budget:
                return self._walk(plan, budget, now_s)
        elif members:
            members_key = explicit[-1].order_key + 1 if explicit else 0  # count them at the end
        members_counted = not members
        running = RUNNING
        for request, quiet in zip(explicit, quiet_flags, strict=True):
            if not members_counted and request.order_key > members_key:
                budget -= len(cohort)
                members_counted = True
            if budget <= 0:
                break
            if request.state is not running:
                continue  # preempted earlier in this walk
            computed = request.seq.num_computed_tokens
            if request.membership is MEMBER:
                # A due member whose decode needs the manager: upstream's turn, written out.
                sched._sync(request)
                allocation = sched._allocate_running(request, 1, plan, now_s)
                if allocation is ALLOCATION_FAILED:
                    continue
                if allocation is ALLOCATION_PREEMPTED_SELF:
                    break
                sched._refresh_touch(request)
                event_len = self.event_len(request)
                if event_len is not None:
                    cohort.refile(request, event_len)
                else:  # every call from now on: this decode runs as an outsider's
                    cohort.leave(request)
                    self.outsiders[request] = None
                    plan.scheduled.append(ScheduledWork(request, 1, computed, False))
                    budget -= 1
                continue
            if quiet:
                add_quiet_decode(request, plan, max_model_len - 1)
                budget -= 1
                continue
            turn = sched._schedule_running_request(request, budget, plan, now_s)
            if turn.outcome is TurnOutcome.FAILED:
                continue  # it left `running`
            if turn.outcome is TurnOutcome.PREEMPTED_SELF:
                break
            budget -= turn.num_new_tokens
        if not members_counted:
            budget -= len(cohort)
        if len(cohort):
            plan.bulk = cohort.bulk()
        return budget

    # ------------------------------------------------------------------ the queues' events
    def use_cohort(self, window: int | None) -> None:
        self.cohort = DecodeCohort(window)
        self.join_running(self.scheduler.running)

    def event_len(self, request: Request) -> int | None:
        """The first length at which a running one-token decode fails the walk's quiet test or
        is finished by the step; None: not a decode the fast path may skip."""
        touch_len = request.touch_len
        if touch_len is None or request.state is not RUNNING:
            return None
        seq = request.seq
        num_tokens = seq.content.num_tokens
        if seq.num_computed_tokens != num_tokens - 1 or num_tokens <= seq.prompt_len:
            return None
        return min(touch_len, seq.prompt_len + request.max_tokens - 1, self.max_model_len - 1)

    def leave_running(self, request: Request) -> None:
        """`request` leaves `running` (preempted or failed): a member leaves the cohort, and
        its touch length ends with its table."""
        if self.cohort is not None:
            if request.membership is MEMBER:
                self.cohort.leave(request)
            self.outsiders.pop(request, None)
        request.touch_len = None

    def after_update(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
        """After `update_from_output`: the quiet decodes get their tokens, the members theirs
        (`tick`), the finished requests leave, and the decodes with a quiet stretch join."""
        if plan.quiet:
            apply_quiet_decodes(plan.quiet, now_s, advance_computed=False)
        cohort = self.cohort
        if cohort is None:
            return
        if plan.bulk is not None:
            cohort.tick(now_s)
        for request in finished:
            del self.outsiders[request]
        if self.outsiders:
            cohort.join_outsiders(self.outsiders, self.event_len)


def _order_key(request: Request) -> int:
    return request.order_key
