"""The vLLM v0 scheduler (`vllm/core/scheduler.py @fc93e56`, 0.5.4), pure Python.

Three queues: `waiting`, `running`, `swapped`. Two step policies:

* **default** (`_schedule_default`, L757-839): if nothing is swapped, schedule prefills; only
  if no prefill was scheduled, schedule the running decodes and then (if nothing was preempted)
  swap-ins. A step is all prefills, or decodes plus swap-ins.
* **chunked prefill** (`_schedule_chunked_prefill`, L841-918): running first, then swapped, then
  new prefills, all in one token budget.

Admission: `can_allocate` LATER breaks the waiting scan (head-of-line blocking), NEVER ends the
request as ignored. Preemption takes the *last* running group (`running.pop()`): recompute for
single-sequence groups, swap otherwise, or the forced mode; a swap-out that finds no CPU space
is the real engine's fatal `RuntimeError`. The priority policy (#5958, read at 4ac7713) sorts
waiting by (priority, arrival) and preempts worse-priority running groups for the head.

Every manager call goes through the auditor. A failed allocation (the v0-V2 sliding-window
undercount) fails that request and the run carries on; the engine ends the run instead under the
auditor's stop policy. A failed swap or free ends the run under every policy (see `_die`).
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence

from sim.audit import AuditedV0Manager, AuditError
from sim.kv.types import AllocStatus, SequenceStatus
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.cohort import DecodeCohort
from sim.scheduler.config import Policy, PreemptionMode, SchedulerConfig
from sim.scheduler.fast_path import FastPathScheduler, add_quiet_decode, apply_quiet_decodes
from sim.scheduler.lifecycle import fail, finish, sample_token
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan, priority_key

SWAP_SPACE_ERROR = (
    "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."
)


class V0Scheduler(FastPathScheduler):
    """One replica's v0 scheduler over an audited v0 block manager."""

    engine = "v0"
    #: Skip a `can_allocate` whose LATER answer is known (see `_schedule_prefills`); tests
    #: turn it off to show that the skip changes no result.
    skip_repeated_later = True

    def __init__(self, config: SchedulerConfig, block_manager: AuditedV0Manager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.token_budget = config.token_budget("v0")
        self.waiting: deque[Request] = deque()
        self.running: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.num_cumulative_preemption = 0
        #: (request id, its tokens) and free blocks of the last LATER answer (_schedule_prefills).
        self._later_key: tuple[int, int] | None = None
        self._later_free = 0
        self._init_fast_path(config, block_manager)
        # Bound once: the auditor passes this pure query through `__getattr__`, which would
        # cost a failed lookup on each of the several calls per step.
        self._num_free_gpu_blocks = block_manager.get_num_free_gpu_blocks
        self._back_key = 0
        self._front_key = -1
        # The prompt limit of `_get_prompt_limit` (L626-639).
        if config.enable_chunked_prefill:
            self.prompt_limit = config.max_model_len
        else:
            self.prompt_limit = min(config.max_model_len, self.token_budget)

    # ------------------------------------------------------------------ queues
    def add_request(self, request: Request) -> None:
        if self.config.policy is Policy.PRIORITY:
            # Keep waiting sorted by (priority, arrival); equal keys keep arrival order.
            index = len(self.waiting)
            while index > 0 and priority_key(self.waiting[index - 1]) > priority_key(request):
                index -= 1
            self.waiting.insert(index, request)
        else:
            self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def unfinished(self) -> list[Request]:
        self.materialize()
        return [*self.running, *self.swapped, *self.waiting]

    # ------------------------------------------------------------------ decode cohort
    def use_decode_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a `DecodeCohort` (see `sim.scheduler.cohort`): a decode step
        then costs what changes in it, not the batch size. Needs the decode fast path and the
        FCFS policy (the priority policy re-sorts `running` every step). Call before the first
        step; `materialize` brings every request's tokens up to date. Returns whether it is on.
        """
        if not self._fast_path or self.config.policy is not Policy.FCFS:
            return False
        self._cohort = DecodeCohort(window)
        self._renumber_running()
        return True

    def _renumber_running(self) -> None:
        for key, request in enumerate(self.running):
            request.order_key = key
        self._back_key = len(self.running)
        self._front_key = -1
        self._outsiders = dict.fromkeys(self.running)

    def _append_running(self, requests: Sequence[Request]) -> None:
        self.running.extend(requests)
        if self._cohort is not None:
            for request in requests:
                request.order_key = self._back_key
                self._back_key += 1
                self._outsiders[request] = None

    def _remove_running(self, request: Request) -> None:
        self.running.remove(request)
        self._outsiders.pop(request, None)

    def _event_len(self, request: Request) -> int | None:
        """The first length at which a running decode is not quiet: the manager must see it
        (`touch_len`), or the step finishes it (`add_quiet_decode`). None: not a decode the
        fast path may skip."""
        touch_len = request.touch_len
        if touch_len is None or request.is_prefill or request.state is not RequestState.RUNNING:
            return None
        seq = request.seq
        return min(touch_len, seq.prompt_len + request.max_tokens - 1, self.config.max_model_len)

    def _num_new_tokens(self, request: Request, budget: SchedulingBudget, chunking: bool) -> int:
        """`_get_num_new_tokens`: 1 for a decode, the uncomputed rest for a prefill (L1189-1213)."""
        seq = request.seq
        num_new = seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
        if chunking:
            num_new = min(num_new, budget.remaining_token_budget())
        return num_new

    def _preempt(
        self, request: Request, plan: StepPlan, now_s: float, mode: PreemptionMode | None = None
    ) -> PreemptionMode:
        """`_preempt` (L1070-1114): recompute or swap; swap without CPU space is fatal.

        A manager call that fails here (v0-V1's double free swapping out a wrapped
        sliding-window ring, v0-V2's swap-out of a table holding the null block) is fatal too:
        vLLM's exception leaves `schedule` and the engine dies, with the table half swapped or
        half freed, a state no later step of the real engine starts from (see `_die`).
        """
        if mode is None:
            mode = self.config.preemption_mode
            if mode is PreemptionMode.AUTO:
                mode = (
                    PreemptionMode.RECOMPUTE
                    if request.group.get_max_num_running_seqs() == 1
                    else PreemptionMode.SWAP
                )
        self.num_cumulative_preemption += 1
        request.num_preemptions += 1
        plan.num_preempted += 1
        self._outsiders.pop(request, None)
        self._sync(request)
        request.touch_len = None
        try:
            return self._preempt_as(mode, request, plan)
        except AuditError as error:
            raise _die(plan, error) from None

    def _preempt_as(self, mode: PreemptionMode, request: Request, plan: StepPlan) -> PreemptionMode:
        if mode is PreemptionMode.RECOMPUTE:
            request.seq.status = SequenceStatus.WAITING
            request.state = RequestState.WAITING
            self.block_manager.free(request.seq)
            request.seq.num_computed_tokens = 0
            request.is_prefill = True
            return mode
        if not self.block_manager.can_swap_out(request.group):
            plan.fatal_error = SWAP_SPACE_ERROR
            raise _FatalError(SWAP_SPACE_ERROR)
        mapping = self.block_manager.swap_out(request.group)
        plan.num_blocks_swapped_out += len(mapping)
        request.seq.status = SequenceStatus.SWAPPED
        request.state = RequestState.SWAPPED
        return mode

    def _fail(self, request: Request, plan: StepPlan, error: AuditError, now_s: float) -> None:
        fail(self.block_manager, request, plan, error, now_s)

    def _append_slots(self, request: Request, plan: StepPlan) -> None:
        cows = self.block_manager.append_slots(request.seq, self.config.num_lookahead_slots)
        plan.num_blocks_copied += len(cows)
        self._refresh_touch(request)

    # ------------------------------------------------------------------ phases
    def _schedule_prefills(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request]:
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
            # `can_allocate` is a pure query of (request, free blocks), and every v0 design's
            # answer is monotone in the free blocks (OK iff free - required >= watermark; NEVER
            # does not depend on them). So a head that got LATER stays LATER while it is
            # unchanged and no block was freed: the repeat query of an overloaded replay,
            # made on nearly every step, is skipped.
            free = self._num_free_gpu_blocks()
            later_key = (request.request_id, request.seq.content.num_tokens)
            if (
                later_key == self._later_key
                and free <= self._later_free
                and self.skip_repeated_later
            ):
                break
            status = self.block_manager.can_allocate(request.group)
            if status is AllocStatus.LATER:
                self._later_key = later_key
                self._later_free = free
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
                self.block_manager.allocate(request.group)
            except AuditError as error:
                self._fail(request, plan, error, now_s)
                continue
            self._refresh_touch(request)
            request.seq.status = SequenceStatus.RUNNING
            request.state = RequestState.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
            plan.scheduled.append(
                ScheduledWork(request, num_new, request.seq.num_computed_tokens, True)
            )
            budget.add_num_batched_tokens(request.request_id, num_new)
            budget.add_num_seqs(request.request_id, num_new_seqs)
            scheduled.append(request)
        return scheduled

    def _schedule_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> tuple[list[Request], list[Request], list[Request]]:
        """Returns (still running in order: prefills+decodes, recompute-preempted, swapped out).

        Fast path: a decode whose manager call would change nothing (the manager said so with
        `decode_touch_len`) and whose `can_append_slots` is then `free >= 1` skips the manager;
        the skipped tokens are synced before the next real call. Same results, fewer calls.
        """
        kept_prefill: list[Request] = []
        kept_decode: list[Request] = []
        preempted: list[Request] = []
        swapped_out: list[Request] = []
        queue = self.running
        manager = self.block_manager
        fast = self._fast_path
        free = self._num_free_gpu_blocks() if fast else 0
        scheduled = plan.scheduled
        while queue:
            request = queue[0]
            if (
                fast
                and free >= 1
                and not request.is_prefill
                and (not chunking or budget.num_batched_tokens < budget.token_budget)
            ):
                touch_len = request.touch_len
                seq = request.seq
                num_tokens = seq.content.num_tokens
                if touch_len is not None and num_tokens < touch_len:
                    queue.popleft()
                    add_quiet_decode(request, plan, self.config.max_model_len)
                    kept_decode.append(request)
                    # Counted without the per-request id sets: those only make a later
                    # subtract idempotent, and a request already walked is never preempted
                    # in this step (victims come from the tail).
                    budget.num_batched_tokens += 1
                    if chunking:
                        budget.num_curr_seqs += 1
                    continue
            num_tokens = self._num_new_tokens(request, budget, chunking)
            if num_tokens == 0:
                break
            queue.popleft()
            num_seqs = request.group.get_max_num_running_seqs()
            self._sync(request)
            while not manager.can_append_slots(request.group, self.config.num_lookahead_slots):
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
                    self._requeue((), [*kept_prefill, *kept_decode], preempted, swapped_out, ())
                    raise
                if mode is PreemptionMode.RECOMPUTE:
                    preempted.append(victim)
                else:
                    swapped_out.append(victim)
                if victim is request:
                    break
            else:
                try:
                    self._append_slots(request, plan)
                except AuditError as error:
                    self._fail(request, plan, error, now_s)
                    continue
                is_prefill = request.is_prefill
                scheduled.append(
                    ScheduledWork(
                        request,
                        num_tokens if is_prefill else 1,
                        request.seq.num_computed_tokens,
                        is_prefill,
                    )
                )
                (kept_prefill if is_prefill else kept_decode).append(request)
                budget.add_num_batched_tokens(request.request_id, num_tokens)
                if chunking:
                    budget.add_num_seqs(request.request_id, num_seqs)
            if fast:
                free = self._num_free_gpu_blocks()
        return kept_prefill + kept_decode, preempted, swapped_out

    def _schedule_running_lazy(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request] | None:
        """`_schedule_running` with a cohort: visit only the outsiders and the members whose
        event is due, in queue order; the other members decode in bulk (`plan.bulk`).

        Returns the scheduled prefill-stage requests (taken out of `running`, to go in front),
        or None when this step must visit every request: when the pool is so low that a call
        may fail or leave no free block for a quiet decode (the walk's `free >= 1` test), or
        when the token budget would not cover every request. Nothing has changed then.

        A due member that finishes in this step leaves the cohort; one whose decode needs the
        manager (it reached `touch_len`) gets its calls here and stays, filed under its next
        event, so it costs no leave, no join and no explicit update.
        """
        cohort = self._cohort
        touched = []
        max_model_len = self.config.max_model_len
        for request in cohort.pop_due():
            seq = request.seq
            if seq.content.num_tokens >= min(
                seq.prompt_len + request.max_tokens - 1, max_model_len
            ):
                cohort.leave(request)  # finishes after this step: the explicit path frees it
                self._outsiders[request] = None
            else:
                touched.append(request)
        if not touched and not self._outsiders:
            return self._bulk_only(budget, plan, chunking)
        explicit = [*self._outsiders, *touched]
        if len(explicit) > 1:
            explicit.sort(key=_order_key)
        manager = self.block_manager
        # One decode call takes at most 2 blocks (a new block, plus v0-V2's lazily created null
        # block or v0-V1's copy-on-write); with this margin every call's `can_append_slots`
        # holds and at least one block stays free for the quiet decodes after it.
        if self._num_free_gpu_blocks() < 2 * len(explicit) + 2:
            return None
        if chunking:
            demand = len(cohort)  # the touched members included
            for request in self._outsiders:
                seq = request.seq
                demand += seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
            if demand > budget.remaining_token_budget():
                return None
        scheduled = plan.scheduled
        kept_prefill: list[Request] = []
        for request in explicit:
            if request.cohort_clock >= 0:
                self._touch_member(request, budget, plan, now_s)
                continue
            seq = request.seq
            num_tokens = seq.content.num_tokens
            touch_len = request.touch_len
            if not request.is_prefill and touch_len is not None and num_tokens < touch_len:
                # Quiet, as in the walk; here because it finishes after this step.
                add_quiet_decode(request, plan, self.config.max_model_len)
                budget.num_batched_tokens += 1
                if chunking:
                    budget.num_curr_seqs += 1
                continue
            num_new = self._num_new_tokens(request, budget, chunking)
            self._sync(request)
            if not manager.can_append_slots(request.group, self.config.num_lookahead_slots):
                raise AssertionError(
                    f"kvsim: lazy step without room for request {request.request_id}"
                )
            try:
                self._append_slots(request, plan)
            except AuditError as error:
                self._remove_running(request)
                self._fail(request, plan, error, now_s)
                continue
            is_prefill = request.is_prefill
            scheduled.append(
                ScheduledWork(
                    request, num_new if is_prefill else 1, seq.num_computed_tokens, is_prefill
                )
            )
            if is_prefill:
                self._remove_running(request)
                kept_prefill.append(request)
            budget.add_num_batched_tokens(request.request_id, num_new)
            if chunking:
                budget.add_num_seqs(request.request_id, request.group.get_max_num_running_seqs())
        members = len(cohort)
        if members:
            plan.bulk = cohort.bulk()
            budget.num_batched_tokens += members
            if chunking:
                budget.num_curr_seqs += members
        return kept_prefill

    def _bulk_only(
        self, budget: SchedulingBudget, plan: StepPlan, chunking: bool
    ) -> list[Request] | None:
        """The lazy walk of a step with nothing but members (about half of a replay's steps):
        each quiet, if one block is free and the budget covers them."""
        cohort = self._cohort
        members = len(cohort)
        if self._num_free_gpu_blocks() < 2:
            return None
        if chunking and members > budget.remaining_token_budget():
            return None
        if members:
            plan.bulk = cohort.bulk()
            budget.num_batched_tokens += members
            if chunking:
                budget.num_curr_seqs += members
        return []

    def _touch_member(
        self, request: Request, budget: SchedulingBudget, plan: StepPlan, now_s: float
    ) -> None:
        """The walk's real-call branch for a due cohort member (a one-token decode).

        `_sync`, `_append_slots` and `_event_len` written out: a replay runs this for every
        decode that crosses a block boundary (~250 k times for the Azure trace).
        """
        seq = request.seq
        context = seq.num_computed_tokens
        if request.needs_sync:
            request.needs_sync = False
            self._sync_decode(seq)
        manager = self.block_manager
        lookahead = self.config.num_lookahead_slots
        if not manager.can_append_slots(request.group, lookahead):
            raise AssertionError(f"kvsim: lazy step without room for request {request.request_id}")
        try:
            cows = manager.append_slots(seq, lookahead)
        except AuditError as error:
            self._cohort.leave(request)
            self._remove_running(request)
            self._fail(request, plan, error, now_s)
            return
        plan.num_blocks_copied += len(cows)
        touch_len = request.touch_len = self._touch_len_of(seq)
        if touch_len is not None:  # a running decode: `_event_len`'s rule
            limit = min(seq.prompt_len + request.max_tokens - 1, self.config.max_model_len)
            self._cohort.refile(request, touch_len if touch_len < limit else limit)
            return
        # The manager wants every call from now on: this decode runs as an outsider's.
        self._cohort.leave(request)
        self._outsiders[request] = None
        plan.scheduled.append(ScheduledWork(request, 1, context, False))
        budget.add_num_batched_tokens(request.request_id, 1)

    def _schedule_swapped(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request]:
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

    # ------------------------------------------------------------------ step
    def schedule(self, now_s: float) -> StepPlan:
        plan = StepPlan()
        try:
            if self.config.enable_chunked_prefill:
                self._schedule_chunked(plan, now_s)
            else:
                self._schedule_default(plan, now_s)
        except _FatalError:
            pass  # plan.fatal_error says why; the engine ends the run
        return plan

    def _new_budget(self) -> SchedulingBudget:
        return SchedulingBudget(self.token_budget, self.config.max_num_seqs)

    def _walk_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> tuple[Sequence[Request], Sequence[Request], Sequence[Request], Sequence[Request] | None]:
        """The running phase, lazily when a cohort allows it. Returns (kept, preempted,
        swapped out, kept prefills of a lazy walk or None after a full walk)."""
        if self._cohort is not None:
            kept_prefill = self._schedule_running_lazy(budget, plan, now_s, chunking)
            if kept_prefill is not None:
                return _NONE, _NONE, _NONE, kept_prefill
            self.materialize()
        kept, preempted, swapped_out = self._schedule_running(budget, plan, now_s, chunking)
        return kept, preempted, swapped_out, None

    def _schedule_default(self, plan: StepPlan, now_s: float) -> None:
        budget = self._new_budget()
        # Every kvsim request is one sequence (n=1, see `Request`): each running group counts 1.
        budget.count_running_seqs(len(self.running))
        prefills: list[Request] = []
        if not self.swapped:
            prefills = self._schedule_prefills(budget, plan, now_s, chunking=False)
        if not prefills and self.config.policy is Policy.PRIORITY:
            self._schedule_priority_preemption(budget, plan, now_s)
        kept, preempted, swapped_out, swapped_in = _NONE, _NONE, _NONE, _NONE
        kept_prefill: Sequence[Request] | None = _NONE  # empty: `running` was not walked
        if not prefills:
            kept, preempted, swapped_out, kept_prefill = self._walk_running(
                budget, plan, now_s, chunking=False
            )
            if self.swapped and not preempted and not swapped_out:
                try:
                    swapped_in = self._schedule_swapped(budget, plan, now_s, chunking=False)
                except _FatalError:
                    self._requeue(prefills, kept, preempted, swapped_out, (), kept_prefill)
                    raise
        self._requeue(prefills, kept, preempted, swapped_out, swapped_in, kept_prefill)

    def _schedule_chunked(self, plan: StepPlan, now_s: float) -> None:
        budget = self._new_budget()
        kept, preempted, swapped_out, kept_prefill = self._walk_running(
            budget, plan, now_s, chunking=True
        )
        swapped_in = []
        if not preempted and not swapped_out:
            try:
                swapped_in = self._schedule_swapped(budget, plan, now_s, chunking=True)
            except _FatalError:
                self._requeue((), kept, preempted, swapped_out, (), kept_prefill)
                raise
        prefills = self._schedule_prefills(budget, plan, now_s, chunking=True)
        self._requeue(prefills, kept, preempted, swapped_out, swapped_in, kept_prefill)

    def _requeue(
        self,
        prefills: Sequence[Request],
        kept: Sequence[Request],
        preempted: Sequence[Request],
        swapped_out: Sequence[Request],
        swapped_in: Sequence[Request],
        kept_prefill: Sequence[Request] | None = None,
    ) -> None:
        """Put the step's requests back in the queues.

        After a full walk (`kept_prefill` None) `running` holds what the walk left and is
        extended by the new prefills, the kept ones and the swapped-in ones. After a lazy walk
        (or none) it still holds every request in order; the new prefills and the kept
        prefill-stage ones go first when chunking (where a full walk would have put them), or
        last otherwise (the default policy schedules prefills only when it walks nothing).
        """
        if not (prefills or kept or preempted or swapped_out or swapped_in or kept_prefill):
            if kept_prefill is None and self._cohort is not None:
                self._renumber_running()
            return  # a lazy decode step: the queues are as they were
        # `extendleft` reverses: the earliest-preempted ends up at the front (spec 5.3).
        self.waiting.extendleft(preempted)
        self.swapped.extend(swapped_out)
        if kept_prefill is None or self._cohort is None:
            self.running.extend(prefills)
            self.running.extend(kept)
            self.running.extend(swapped_in)
            if self._cohort is not None:
                self._renumber_running()
            return
        front = [*prefills, *kept_prefill]
        if self.config.enable_chunked_prefill and front:
            for request in reversed(front):
                self.running.appendleft(request)
                request.order_key = self._front_key
                self._front_key -= 1
                self._outsiders[request] = None
        else:
            self._append_running(front)
        self._append_running(swapped_in)

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Apply the step's results (`_process_model_outputs`); returns the requests that finished."""
        finished: list[Request] = []
        running = RequestState.RUNNING
        max_model_len = self.config.max_model_len
        for work in plan.scheduled:
            request = work.request
            if request.state is not running:
                continue
            seq = request.seq
            seq.num_computed_tokens += work.num_tokens
            if request.is_prefill and seq.num_computed_tokens < seq.content.num_tokens:
                continue  # a chunk that does not finish the prompt samples nothing
            request.is_prefill = False
            sample_token(request, now_s)
            # The StopChecker's length checks (stop_checker.py @fc93e56), inlined: once per token.
            num_tokens = seq.content.num_tokens
            if num_tokens - seq.prompt_len >= request.max_tokens:
                reason = "length: generated max_tokens"
            elif num_tokens > max_model_len:
                reason = "length: reached max_model_len"
            else:
                continue
            self._sync(request)
            try:
                self.block_manager.free(seq)
            except AuditError as error:
                # vLLM frees finished groups before it returns their outputs: the engine
                # dies here and the request never finishes (the engine aborts it).
                _die(plan, error)
                break
            finish(request, reason, now_s)
            finished.append(request)
        apply_quiet_decodes(plan.quiet, now_s, advance_computed=True)
        cohort = self._cohort
        if cohort is None:
            if finished:
                self.running = deque(r for r in self.running if not r.state.is_terminal)
            return finished
        if plan.bulk is not None:
            cohort.tick(now_s)
        for request in finished:
            self._remove_running(request)
        self._join_cohort()
        return finished


#: No requests: an immutable empty sequence shared by every step (read, never appended to).
_NONE: Sequence[Request] = ()


def _order_key(request: Request) -> int:
    return request.order_key


class _FatalError(Exception):
    """Internal: unwinds `schedule` after a fatal engine error recorded in the plan."""


def _die(plan: StepPlan, error: AuditError) -> _FatalError:
    """Record a manager failure the run cannot go on from as the plan's fatal engine error.

    The record policy carries on after a failed `allocate` or `append_slots`: the request
    fails, its table is released whole (and the auditor returns what a failed allocate
    leaked), so the pool stays consistent. A failed swap or free leaves a table half moved or
    half released (ids back in the pool while the table still names them, or blocks with no
    id at all), which no later call can undo; vLLM raises out of the engine at that call, so
    the run ends there under every policy. The auditor has recorded the violation. Returns
    the exception that unwinds `schedule`.
    """
    plan.fatal_error = error.violation.message
    return _FatalError(plan.fatal_error)
