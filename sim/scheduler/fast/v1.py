"""The decode shortcuts of the V1-engine scheduler: its running phase with quiet decodes
skipped, the decode cohort's lazy step, and the waiting loop's known refusals (the layer is
described in `sim.scheduler.fast.layer`).

`with_decode_shortcuts` installs the layer on a `V1Scheduler` when `fast_path_enabled`; the
layer then implements the scheduler's speed hooks (`sim.scheduler.v1.scheduler.SpeedHooks`),
the only names the faithful scheduler knows of it. `schedule_running` replaces the running
loop (`vllm/v1/core/sched/scheduler.py` at 0.11.0 / 4ac7713, L208-320). With a cohort it first
tries the lazy step (`_lazy_step`); when it cannot, or without a cohort, it runs upstream's loop
(`V1Scheduler.running_loop`) with its own turn for each request (`_walk_turn`): a quiet decode
is scheduled without `allocate_slots`, every other request takes upstream's turn
(`V1Scheduler.running_turn`).
"""

from __future__ import annotations

from collections.abc import Callable

from sim.kv.types import Sequence
from sim.scheduler.config import Policy
from sim.scheduler.fast.cohort import DecodeCohort
from sim.scheduler.fast.layer import (
    DecodeShortcuts,
    add_quiet_decode,
    apply_quiet_decodes,
    fast_path_enabled,
)
from sim.scheduler.request import Membership, Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v1.scheduler import Allocation, RunningTurn, TurnOutcome, V1Scheduler

MEMBER = Membership.MEMBER
# Module constants for the enum members tested per touched member and per `event_len` (~250 k
# times each per Azure replay): on Python 3.11 `Enum.MEMBER` through the class costs ~95 ns,
# a module global ~10 ns.
RUNNING = RequestState.RUNNING
ALLOCATION_FAILED = Allocation.FAILED
ALLOCATION_PREEMPTED_SELF = Allocation.PREEMPTED_SELF


_QUIET_TURN = RunningTurn(TurnOutcome.SCHEDULED, 1)


def with_decode_shortcuts(scheduler: V1Scheduler) -> V1Scheduler:
    """Install the decode shortcuts on `scheduler` when its config asks for them and its
    manager supports them (`fast_path_enabled`); returns `scheduler`. Call before the first
    request."""
    if fast_path_enabled(scheduler.config, scheduler.kv_cache_manager):
        shortcuts = V1DecodeShortcuts(scheduler)
        scheduler.install_speed_layer(shortcuts, shortcuts.schedule_running)
    return scheduler


class V1DecodeShortcuts(DecodeShortcuts):
    """The layer for one `V1Scheduler` (installed by `with_decode_shortcuts`)."""

    #: Skip an `allocate_slots` whose None answer is known (`refusal_known`); tests turn it
    #: off to show that the skip changes no result.
    skip_repeated_later = True

    def __init__(self, scheduler: V1Scheduler) -> None:
        super().__init__()
        self.scheduler = scheduler
        self.max_model_len = scheduler.config.max_model_len
        manager = scheduler.kv_cache_manager
        # Bound once: they run on every touched decode, and the auditor's properties would
        # look the inner method up again on each read (measured on the compiled core: 3.41 s
        # instead of 3.15 s for the v1-engine Azure replay).
        self._touch_len_of: Callable[[Sequence], int | None] = manager.decode_touch_len
        self._sync_decode: Callable[[Sequence], None] = manager.sync_decode
        self._num_free_blocks: Callable[[], int] = lambda: manager.num_free_blocks
        # The known-refusal skip is exact only without prefix hits and without a connector.
        self._refusals_repeat = not (
            scheduler.prefix_hits_possible or scheduler.connector_hooks.enabled
        )
        self._later_key: tuple[int, int, int] | None = None
        self._later_num_new = 0
        self._later_free = 0
        self._free_now = 0

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
        return self.scheduler.running_loop(plan, budget, now_s, self._walk_turn)

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
        return self.scheduler.running_turn(request, budget, plan, now_s)

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
        touched = self._take_due(cohort)
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
        quiet_flags, demands = self._demands(explicit)
        members_key = self._members_key(cohort, explicit, demands, budget)
        if members_key is None:
            return self._walk(plan, budget, now_s)
        budget = self._visit(cohort, explicit, quiet_flags, members_key, plan, budget, now_s)
        if len(cohort):
            plan.bulk = cohort.bulk()
        return budget

    def _take_due(self, cohort: DecodeCohort) -> list[Request]:
        """The due members whose decode calls the manager in this step (they reached
        `touch_len` and stay members); a due member that finishes after this step leaves the
        cohort, an outsider (the explicit path frees it)."""
        max_model_len = self.max_model_len
        touched = []
        for request in cohort.pop_due():
            seq = request.seq
            if seq.content.num_tokens >= min(
                seq.prompt_len + request.max_tokens - 1, max_model_len - 1
            ):
                cohort.leave(request)
                self.outsiders[request] = None
            else:
                touched.append(request)
        return touched

    def _demands(self, explicit: list[Request]) -> tuple[list[bool], list[int]]:
        """Per explicit request (queue order): whether it is a quiet decode, and the tokens
        it asks for (a due member's is counted with the members: 0)."""
        last_computable = self.max_model_len - 1
        threshold = self.scheduler.step_threshold
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
        return quiet_flags, demands

    @staticmethod
    def _members_key(
        cohort: DecodeCohort, explicit: list[Request], demands: list[int], budget: int
    ) -> int | None:
        """The order key before which the members' tokens are counted (-1: no members), or
        None when the budget could run out before the last member (the walk decides).
        Example: members up to key 9, demands 5 (key 3) and 40 (key 12), 20 members, budget
        50: 5 + 20 fit ahead of key 12, so the members are counted there (key 9)."""
        members = len(cohort)
        if not members:
            return -1
        if members + sum(demands) > budget:
            members_key = cohort.max_order_key()
            ahead = sum(
                d for r, d in zip(explicit, demands, strict=True) if r.order_key < members_key
            )
            return None if ahead + members > budget else members_key
        return explicit[-1].order_key + 1 if explicit else 0  # count them at the end

    def _visit(
        self,
        cohort: DecodeCohort,
        explicit: list[Request],
        quiet_flags: list[bool],
        members_key: int,
        plan: StepPlan,
        budget: int,
        now_s: float,
    ) -> int:
        """The running loop over the explicit requests, the members' tokens counted before
        the first one behind `members_key`; returns the budget left."""
        members_counted = not len(cohort)
        running = RUNNING
        for request, quiet in zip(explicit, quiet_flags, strict=True):
            if not members_counted and request.order_key > members_key:
                budget -= len(cohort)
                members_counted = True
            if budget <= 0:
                break
            if request.state is not running:
                continue  # preempted earlier in this walk
            if request.membership is MEMBER:
                outcome = self._member_turn(cohort, request, plan, now_s)
                if outcome is TurnOutcome.PREEMPTED_SELF:
                    break
                if outcome is TurnOutcome.SCHEDULED:
                    budget -= 1
                continue
            if quiet:
                add_quiet_decode(request, plan, self.max_model_len - 1)
                budget -= 1
                continue
            turn = self.scheduler.running_turn(request, budget, plan, now_s)
            if turn.outcome is TurnOutcome.FAILED:
                continue  # it left `running`
            if turn.outcome is TurnOutcome.PREEMPTED_SELF:
                break
            budget -= turn.num_new_tokens
        if not members_counted:
            budget -= len(cohort)
        return budget

    def _member_turn(
        self, cohort: DecodeCohort, request: Request, plan: StepPlan, now_s: float
    ) -> TurnOutcome:
        """A due member whose decode needs the manager: upstream's turn, written out. It is
        refiled under its next event (its token counted with the members: NOTHING_DUE), or,
        when every call from now on is real, leaves and runs as an outsider (SCHEDULED)."""
        computed = request.seq.num_computed_tokens
        self.before_call(request)
        allocation = self.scheduler.allocate_running(request, 1, plan, now_s)
        if allocation is ALLOCATION_FAILED:
            return TurnOutcome.FAILED
        if allocation is ALLOCATION_PREEMPTED_SELF:
            return TurnOutcome.PREEMPTED_SELF
        self.after_call(request)
        event_len = self.event_len(request)
        if event_len is not None:
            cohort.refile(request, event_len)
            return TurnOutcome.NOTHING_DUE
        cohort.leave(request)
        self.outsiders[request] = None
        plan.scheduled.append(ScheduledWork(request, 1, computed, False))
        return TurnOutcome.SCHEDULED

    # ------------------------------------------------------------------ the speed hooks
    def use_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a `DecodeCohort`: only under FCFS (a PRIORITY victim may sit
        anywhere in `running`). `materialize` brings every request up to date."""
        if self.scheduler.config.policy is not Policy.FCFS:
            return False
        self.cohort = DecodeCohort(window)
        self.join_running(self.scheduler.running)
        return True

    def joined(self, request: Request) -> None:
        """A waiting request was admitted to `running`."""
        self.join_running((request,))

    def left(self, request: Request) -> None:
        """`request` leaves `running` (preempted or failed): a member leaves the cohort, and
        its touch length ends with its table."""
        if self.cohort is not None:
            if request.membership is MEMBER:
                self.cohort.leave(request)
            self.outsiders.pop(request, None)
        request.touch_len = None

    def before_call(self, request: Request) -> None:
        """Before a real call: let the manager catch up on the decodes it did not see."""
        if request.needs_sync:  # only ever set by the layer
            request.needs_sync = False
            self._sync_decode(request.seq)

    def after_call(self, request: Request) -> None:
        """After a real call: ask the manager when the next decode must call it again."""
        request.touch_len = self._touch_len_of(request.seq)

    def refusal_known(self, request: Request, num_new_tokens: int) -> bool:
        """Without prefix hits (and without a connector), `allocate_slots` for a waiting
        request is None exactly when the blocks for its `num_new` tokens exceed the free ones:
        monotone in both. So a head that got None stays refused while it is unchanged, asks no
        fewer tokens and no block was freed; the repeat call, made on most steps of an
        overloaded replay, is skipped. Example: head 7 refused for 64 tokens with 3 free
        blocks; next step, still 64 tokens and 3 free: skipped; 4 free: called again."""
        if not self._refusals_repeat:
            return False
        self._free_now = free = self._num_free_blocks()
        seq = request.seq
        return (
            self.skip_repeated_later
            and (request.request_id, seq.num_tokens, seq.num_computed_tokens) == self._later_key
            and num_new_tokens >= self._later_num_new
            and free <= self._later_free
        )

    def refused(self, request: Request, num_new_tokens: int) -> None:
        """Remember the refused head, its tokens and the free blocks it saw."""
        if self._refusals_repeat:
            seq = request.seq
            self._later_key = (request.request_id, seq.num_tokens, seq.num_computed_tokens)
            self._later_num_new = num_new_tokens
            self._later_free = self._free_now

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

    def step_done(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
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
