"""The v0 scheduler's decode shortcuts (`sim.scheduler.fast.layer`): its `V0Hooks` with quiet
decodes and repeated LATER answers skipped, and the decode cohort's lazy step.

The scheduler walks `running` with upstream's loop (`_schedule_running`, vllm/core/scheduler.py
L408-516 of 0.5.4). With a cohort, `lazy_running` first tries the lazy step, which visits only
the outsiders and the members whose event is due; when it cannot (`_lazy_step`), or without a
cohort, the walk runs and `quiet_turn` schedules each quiet decode without a manager call. The
layer reads nothing of the scheduler but the hooks' arguments and `running` (`V0Queues`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from operator import attrgetter

from sim.audit import AuditedV0Manager, AuditError
from sim.kv.types import Sequence as KVSequence
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.config import SchedulerConfig
from sim.scheduler.fast.cohort import DecodeCohort
from sim.scheduler.fast.layer import (
    DecodeShortcuts,
    add_quiet_decode,
    apply_quiet_decodes,
    fast_path_enabled,
)
from sim.scheduler.lifecycle import fail
from sim.scheduler.request import Membership, Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v0.hooks import NoShortcuts, V0Queues
from sim.scheduler.v0.outputs import RunningOutputs, RunningWalk

MEMBER = Membership.MEMBER
# Read per `event_len` (~250 k times per Azure replay): ~10 ns as a global, ~95 via the enum.
RUNNING = RequestState.RUNNING


def v0_shortcuts(
    config: SchedulerConfig, manager: AuditedV0Manager, queues: V0Queues
) -> V0DecodeShortcuts | NoShortcuts:
    """The hooks for one v0 scheduler: the layer when the fast path is on, else no-ops; off
    under prefix caching, where every scheduled sequence's blocks get their access time each
    step (`V0Scheduler._touch_scheduled`), which quiet and bulk decodes would skip."""
    if fast_path_enabled(config, manager) and not getattr(manager.inner, "enable_caching", False):
        return V0DecodeShortcuts(config, manager, queues)
    return NoShortcuts()


class V0DecodeShortcuts(DecodeShortcuts):
    """The layer for one `V0Scheduler` (created by it when the fast path is on)."""

    #: Skip a `can_allocate` whose LATER answer is known (see `known_later`); tests turn it
    #: off to show that the skip changes no result.
    skip_repeated_later = True

    def __init__(
        self, config: SchedulerConfig, manager: AuditedV0Manager, queues: V0Queues
    ) -> None:
        super().__init__()
        self.queues = queues
        self.manager = manager
        self.chunked_prefill = config.enable_chunked_prefill
        self.max_model_len = config.max_model_len
        self.lookahead = config.num_lookahead_slots
        # Bound once: they run on every touched decode, and the auditor's properties would
        # look the inner method up on each read (3.41 s instead of 3.15 s per Azure replay).
        self._touch_len_of: Callable[[KVSequence], int | None] = manager.decode_touch_len
        self._sync_decode: Callable[[KVSequence], None] = manager.sync_decode
        #: Free blocks as of the walk's last real call (`quiet_turn`'s test).
        self._walk_free = 0
        # The next order key in front of `running` (chunked prefill's prefill-stage requests).
        self._front_key = -1
        #: (request id, its tokens) and free blocks of the last LATER answer (`known_later`).
        self._later_key: tuple[int, int] | None = None
        self._later_free = 0

    # ------------------------------------------------------------------ manager calls
    def before_manager_call(self, request: Request) -> None:
        """Before a real call: let the manager catch up on the decodes it did not see."""
        if request.needs_sync:  # only ever set by the layer
            request.needs_sync = False
            self._sync_decode(request.seq)

    def after_manager_call(self, request: Request) -> None:
        """After a real call: ask the manager when the next decode must call it again."""
        request.touch_len = self._touch_len_of(request.seq)

    def known_later(self, request: Request) -> bool:
        """Speed-up of `can_allocate`: whether its answer for the head is known to be LATER.
        It is a pure query of (request, free blocks), monotone in the free blocks in every v0
        design (OK iff free - required >= watermark; NEVER does not depend on them): a head
        that got LATER stays LATER while it is unchanged and no block was freed. Example:
        LATER for request 7 with 300 tokens at 12 free blocks; next step request 7 still has
        300 tokens and 10 blocks are free: LATER without a call."""
        return (
            self.skip_repeated_later
            and self._later_key == (request.request_id, request.seq.content.num_tokens)
            and self.manager.get_num_free_gpu_blocks() <= self._later_free
        )

    def on_later(self, request: Request) -> None:
        """Remember the LATER answer for `known_later`."""
        self._later_key = (request.request_id, request.seq.content.num_tokens)
        self._later_free = self.manager.get_num_free_gpu_blocks()

    # ------------------------------------------------------------------ running, the walk
    def lazy_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs | None:
        """The cohort's lazy step in place of the walk, if it can; else None (walk)."""
        if self.cohort is not None:
            outputs = self._lazy_step(self.cohort, budget, plan, now_s, chunking)
            if outputs is not None:
                return outputs
        self.materialize()
        self._walk_free = self.manager.get_num_free_gpu_blocks()
        return None

    def quiet_turn(
        self,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        chunking: bool,
        outputs: RunningOutputs,
    ) -> bool:
        """One request's turn in the walk, if it is quiet: a decode whose `can_append_slots`
        is then `free >= 1`, with room in the budget. False: upstream's turn."""
        if self._walk_free < 1 or (chunking and budget.num_batched_tokens >= budget.token_budget):
            return False
        if not self._schedule_quiet(request, budget, plan, chunking):
            return False
        outputs.decode.append(request)
        return True

    def _schedule_quiet(
        self, request: Request, budget: SchedulingBudget, plan: StepPlan, chunking: bool
    ) -> bool:
        """Schedule a decode whose manager calls would change nothing (the manager said so with
        `decode_touch_len`) without them; the skipped tokens are synced before the next real
        call. Counted without the budget's per-request id sets: those only make a later
        subtract idempotent, and a request already scheduled is never preempted in this step
        (victims come from the tail)."""
        touch_len = request.touch_len
        if request.is_prefill or touch_len is None or request.seq.content.num_tokens >= touch_len:
            return False
        add_quiet_decode(request, plan, self.max_model_len)
        budget.num_batched_tokens += 1
        if chunking:
            budget.num_curr_seqs += 1
        return True

    def after_turn(self) -> None:
        """Upstream's turn made real calls: the pool may have changed."""
        self._walk_free = self.manager.get_num_free_gpu_blocks()

    # ------------------------------------------------------------------ the cohort's lazy step
    def _lazy_step(
        self,
        cohort: DecodeCohort,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
    ) -> RunningOutputs | None:
        """The running phase visiting only the outsiders and the members whose event is due,
        in queue order; the other members decode in bulk (`plan.bulk`). None (the scheduler
        walks; nothing has changed before) when the pool is so low that a call may fail or
        leave no free block for a quiet decode (the walk's `free >= 1` test), or when the
        token budget would not cover every request.

        A due member that finishes in this step leaves the cohort; one whose decode needs the
        manager (it reached `touch_len`) gets its calls here and stays, filed under its next
        event, so it costs no leave, no join and no explicit update.
        """
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
            return self._bulk_only(cohort, budget, plan, chunking)
        explicit = [*self.outsiders, *touched]
        if len(explicit) > 1:
            explicit.sort(key=attrgetter("order_key"))
        # One decode call takes at most 2 blocks (a new block, plus v0-V2's lazily created null
        # block or v0-V1's copy-on-write); with this margin every call's `can_append_slots`
        # holds and at least one block stays free for the quiet decodes after it.
        if self.manager.get_num_free_gpu_blocks() < 2 * len(explicit) + 2:
            return None
        if chunking:
            demand = len(cohort)  # the touched members included
            for request in self.outsiders:
                seq = request.seq
                demand += seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
            if demand > budget.remaining_token_budget():
                return None
        outputs = RunningOutputs(RunningWalk.LAZY)
        for request in explicit:
            if request.membership is MEMBER:
                self._touch_member(cohort, request, budget, plan, now_s)
            else:
                self._outsider_turn(request, budget, plan, now_s, chunking, outputs)
        self._count_members(cohort, budget, plan, chunking)
        return outputs

    def _outsider_turn(
        self,
        request: Request,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
        chunking: bool,
        outputs: RunningOutputs,
    ) -> None:
        """Upstream's turn (L446-506) for an outsider of the lazy step: quiet, or its calls;
        a scheduled prefill-stage request leaves `running` (into `outputs.prefill`)."""
        if self._schedule_quiet(request, budget, plan, chunking):
            return  # quiet, as in the walk; an outsider because it finishes after this step
        seq = request.seq
        # `_get_num_new_tokens` (L1189-1213); the budget covers every request here.
        num_new = seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
        if chunking:
            num_new = min(num_new, budget.remaining_token_budget())
        error = self._append_slots(request, plan)
        if error is not None:
            self.remove_running(request)
            fail(self.manager, request, plan, error, now_s)
            return
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

    def _bulk_only(
        self, cohort: DecodeCohort, budget: SchedulingBudget, plan: StepPlan, chunking: bool
    ) -> RunningOutputs | None:
        """The lazy step of a step with nothing but members (about half of a replay's steps):
        each quiet, if one block is free and the budget covers them."""
        if self.manager.get_num_free_gpu_blocks() < 2:
            return None
        if chunking and len(cohort) > budget.remaining_token_budget():
            return None
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

        `_append_slots` and `event_len`'s rule: a replay runs this for every decode that
        crosses a block boundary (~250 k times for the Azure trace).
        """
        context = request.seq.num_computed_tokens
        error = self._append_slots(request, plan)
        if error is not None:
            cohort.leave(request)
            self.remove_running(request)
            fail(self.manager, request, plan, error, now_s)
            return
        seq = request.seq
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

    def _append_slots(self, request: Request, plan: StepPlan) -> AuditError | None:
        """The scheduler's `_append_slots` (L1048-1068) for a request of the lazy step, whose
        `can_append_slots` holds by the step's margin; the error if the call failed."""
        self.before_manager_call(request)
        manager = self.manager
        if not manager.can_append_slots(request.group, self.lookahead):
            raise AssertionError(f"kvsim: lazy step without room for request {request.request_id}")
        try:
            cows = manager.append_slots(request.seq, self.lookahead)
        except AuditError as error:
            return error
        plan.num_blocks_copied += len(cows)
        self.after_manager_call(request)
        return None

    # ------------------------------------------------------------------ the queues' events
    def use_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a `DecodeCohort` from now on."""
        self.cohort = DecodeCohort(window)
        self.after_requeue()
        return True

    def event_len(self, request: Request) -> int | None:
        """The first length at which a running decode is not quiet: the manager must see it
        (`touch_len`), or the step finishes it (`add_quiet_decode`). None: not a decode the
        fast path may skip."""
        touch_len = request.touch_len
        if touch_len is None or request.is_prefill or request.state is not RUNNING:
            return None
        seq = request.seq
        return min(touch_len, seq.prompt_len + request.max_tokens - 1, self.max_model_len)

    def after_requeue(self) -> None:
        """`running` was refilled after a walk (the cohort is empty): under a cohort, number it
        afresh, all outsiders."""
        if self.cohort is not None:
            running = self.queues.running
            for key, request in enumerate(running):
                request.order_key = key
            self._back_key = len(running)
            self._front_key = -1
            self.outsiders = dict.fromkeys(running)

    def on_join(self, requests: Sequence[Request]) -> None:
        """`requests` were appended to `running` (as outsiders, under a cohort)."""
        self.join_running(requests)

    def on_leave(self, request: Request) -> None:
        """`request` is being preempted (a walked request, so not a member): its touch
        length ends with its table."""
        self.outsiders.pop(request, None)
        request.touch_len = None

    def remove_running(self, request: Request) -> None:
        """Take a request the lazy step ended or scheduled as a prefill out of `running`."""
        self.queues.running.remove(request)
        self.outsiders.pop(request, None)

    def requeue_lazy(
        self,
        prefills: Sequence[Request],
        kept_prefill: Sequence[Request],
        swapped_in: Sequence[Request],
    ) -> None:
        """`_requeue` after a lazy step: `running` still holds the kept decodes in order. New
        prefills go first when chunking (as after a full walk), else last; then the kept
        prefill-stage ones (scheduler.py:L886-891 of 0.5.4), then the swapped-in ones."""
        running = self.queues.running
        if self.chunked_prefill and prefills:
            for request in reversed(prefills):
                running.appendleft(request)
                request.order_key = self._front_key
                self._front_key -= 1
                self.outsiders[request] = None
        elif prefills:
            kept_prefill = [*prefills, *kept_prefill]
        for joining in (kept_prefill, swapped_in):
            running.extend(joining)
            self.on_join(joining)

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
