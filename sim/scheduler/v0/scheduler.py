"""The vLLM v0 scheduler, one class beside upstream's one: `Scheduler` of vLLM 0.5.4 (release
commit 4db5176) `vllm/core/scheduler.py`, its methods in upstream's order.

Three queues: `waiting`, `running`, `swapped`. Two step policies:

* **default** (`_schedule_default`, L757-839): if nothing is swapped, schedule prefills; only
  if no prefill was scheduled, schedule the running decodes and then (if nothing was preempted)
  swap-ins. A step is all prefills, or decodes plus swap-ins.
* **chunked prefill** (`_schedule_chunked_prefill`, L841-918): running first, then swapped, then
  new prefills, all in one token budget.

Admission: `can_allocate` LATER breaks the waiting scan (head-of-line blocking), NEVER ends the
request as ignored. Preemption takes the *last* running group (`running.pop()`): recompute for
single-sequence groups, swap otherwise, or the forced mode; a swap-out that finds no CPU space
is the real engine's fatal `RuntimeError`. Every manager call goes through the auditor: a
failed allocation (the v0-V2 sliding-window undercount) fails that request and the run carries
on (the engine ends the run instead under the auditor's stop policy); a failed swap or free
ends the run under every policy (`sim.scheduler.v0.outputs.die`).

Not from 0.5.4: the priority policy (`_schedule_priority_preemption`, vLLM #5958, read at
4ac7713, the v0 scheduler of 0.6.x), which keeps `waiting` sorted by (priority, arrival) and
preempts worse-priority running groups for the head.

Left out versus upstream: LoRA (`curr_loras`, `lora_enabled`, `max_loras`, the long-LoRA prompt
limit of `_get_prompt_limit`) and prompt adapters; `delay_factor` / `_passed_delay`
(L1160-1174: a prefill is never held back); beam search and parallel sampling (every group is
one sequence: `fork_seq`, multi-sequence `_get_num_new_tokens` and swap-by-default for
multi-sequence groups never arise); `abort_seq_group` and `_finished_requests_ids` (the Mamba
cache); the artificial preemption of `VLLM_TEST_ENABLE_ARTIFICIAL_PREEMPT`; the embedding-mode
block manager and the pipeline-parallel split of the pool; the `SequenceGroupMetadata` that
`schedule` builds for the workers (L946-1022: kvsim returns a `StepPlan` of counts); the
preemption warnings; and the block-id lists of `blocks_to_swap_in/out/copy` (counted only).
Encoder-decoder models and multi-step / async output processing are not in 0.5.4's scheduler.

The decode shortcuts (`sim.scheduler.fast.v0`) plug in through `shortcuts`, a
`sim.scheduler.v0.hooks.V0Hooks`: this module calls nothing of the layer but those hooks,
whose defaults (`NoShortcuts`, the fast path off) leave upstream's behaviour as it is.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Sequence

from sim.audit import AuditedV0Manager, AuditError
from sim.kv.types import AllocStatus, SequenceStatus
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.config import Policy, PreemptionMode, SchedulerConfig
from sim.scheduler.fast.v0 import v0_shortcuts
from sim.scheduler.lifecycle import fail, finish, sample_token
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan, priority_key
from sim.scheduler.v0.outputs import (
    SWAP_SPACE_ERROR,
    FatalEngineError,
    RunningOutputs,
    RunningStep,
    RunningWalk,
    die,
)

__all__ = ["SWAP_SPACE_ERROR", "V0Scheduler", "maybe_stop_sequence"]


class V0Scheduler:
    """One replica's v0 scheduler over an audited v0 block manager."""

    engine = "v0"

    def __init__(self, config: SchedulerConfig, block_manager: AuditedV0Manager) -> None:
        """`Scheduler.__init__` (vllm/core/scheduler.py:L264-332): the three queues, the
        preemption count, and the prompt limit of `_get_prompt_limit` (L626-639), which
        depends on the config alone without LoRA."""
        self.config = config
        self.block_manager = block_manager
        self.token_budget = config.token_budget("v0")
        self.waiting: deque[Request] = deque()
        self.running: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.num_cumulative_preemption = 0
        if config.enable_chunked_prefill:
            self.prompt_limit = config.max_model_len
        else:
            self.prompt_limit = min(config.max_model_len, self.token_budget)
        #: Whether the manager caches prefixes: `schedule` then stamps and marks the step's
        #: blocks as upstream's does (`_touch_scheduled`); a no-op call otherwise.
        self.caching = _manager_caches(block_manager)
        #: The speed layer's hooks (`sim.scheduler.v0.hooks.V0Hooks`); no-ops with the fast path
        #: off. Typed as the factory's union of the two concrete classes, not as the protocol:
        #: the compiled core (`sim.native`) then calls the hooks as native methods, where a
        #: protocol-typed attribute costs a generic Python call per hook (~9% of a v0 replay).
        self.shortcuts = v0_shortcuts(config, block_manager, self)

    def use_decode_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a decode cohort (`sim.scheduler.fast.cohort`; kvsim only,
        no upstream counterpart beyond `_schedule_running`, vllm/core/scheduler.py:L408-516,
        whose results it keeps). Needs the decode fast path and the FCFS policy (the priority
        policy re-sorts `running` every step). Call before the first step; `materialize`
        brings every request's tokens up to date. Returns whether it is on."""
        if self.config.policy is not Policy.FCFS:
            return False
        return self.shortcuts.use_cohort(window)

    # ------------------------------------------------------------------ queues
    def add_request(self, request: Request) -> None:
        """`add_seq_group` (vllm/core/scheduler.py:L343-345); the priority policy (not in
        0.5.4) keeps `waiting` sorted by (priority, arrival), equal keys in arrival order."""
        if self.config.policy is Policy.PRIORITY:
            index = len(self.waiting)
            while index > 0 and priority_key(self.waiting[index - 1]) > priority_key(request):
                index -= 1
            self.waiting.insert(index, request)
        else:
            self.waiting.append(request)

    def _append_running(self, requests: Sequence[Request]) -> None:
        """`_add_seq_group_to_running` (L347-350) for each, in order."""
        self.running.extend(requests)
        self.shortcuts.on_join(requests)

    def has_unfinished(self) -> bool:
        """`has_unfinished_seqs` (vllm/core/scheduler.py:L395-397)."""
        return bool(self.waiting or self.running or self.swapped)

    def num_unfinished(self) -> int:
        """`get_num_unfinished_seq_groups` (vllm/core/scheduler.py:L399-400)."""
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def unfinished(self) -> list[Request]:
        """Every queued request, up to date (kvsim's end-of-run abort; upstream's queues are
        those of `has_unfinished_seqs`, vllm/core/scheduler.py:L395-397)."""
        self.materialize()
        return [*self.running, *self.swapped, *self.waiting]

    def materialize(self) -> None:
        """Bring every request's tokens up to date (the decode cohort's members; kvsim only:
        upstream's requests always are, vllm/core/scheduler.py:L408-516)."""
        self.shortcuts.materialize()

    # ------------------------------------------------------------------ running
    def _schedule_running(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> RunningOutputs:
        """`_schedule_running` (L408-516): walk `running` from the head; every request
        visited leaves it (`_requeue` puts the kept ones back). The layer may answer the
        whole phase (`lazy_running`) or a quiet decode's turn (`quiet_turn`) instead."""
        lazy = self.shortcuts.lazy_running(budget, plan, now_s, chunking)
        if lazy is not None:
            return lazy
        outputs = RunningOutputs(RunningWalk.FULL)
        queue = self.running
        while queue:
            request = queue[0]
            if self.shortcuts.quiet_turn(request, budget, plan, chunking, outputs):
                queue.popleft()
                continue
            step = self._schedule_running_request(request, budget, plan, now_s, chunking, outputs)
            if step is RunningStep.NO_TOKENS:
                break
            self.shortcuts.after_turn()
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
        self.shortcuts.before_manager_call(request)
        while not self.block_manager.can_append_slots(
            request.group, self.config.num_lookahead_slots
        ):
            budget.subtract_num_batched_tokens(request.request_id, num_tokens)
            budget.subtract_num_seqs(request.request_id, num_seqs)
            victim = queue.pop() if queue else request
            try:
                mode = self._preempt(victim, plan, now_s)
            except FatalEngineError:
                # The engine dies here: the queues get back what this walk took off them
                # (so the step's row and the final abort see every request).
                if victim is not request:
                    queue.append(victim)
                queue.appendleft(request)
                self._requeue((), outputs, ())
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
            fail(self.block_manager, request, plan, error, now_s)
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

    # ------------------------------------------------------------------ swapped
    def _schedule_swapped(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request]:
        """`_schedule_swapped` (L518-624): swapped groups come back in queue order while
        `can_swap_in` says OK and the budget has room; LATER stops the phase, NEVER ends the
        request as ignored. A swap-in that fails in the manager is fatal (`die`). Returns the
        groups swapped in, in order."""
        swapped_in: list[Request] = []
        while self.swapped:
            request = self.swapped[0]
            status = self.block_manager.can_swap_in(request.group, self.config.num_lookahead_slots)
            if status is AllocStatus.LATER:
                break
            if status is AllocStatus.NEVER:
                self.swapped.popleft()
                self._ignore(
                    request,
                    f"Failing the request {request.request_id} because there's not enough kv "
                    "cache blocks to run the entire sequence.",
                    plan,
                    now_s,
                    free=True,
                )
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
                raise die(plan, error) from None
            self.swapped.popleft()
            plan.num_blocks_swapped_in += len(mapping)
            if self._swap_in_and_record(request, num_tokens, num_seqs, budget, plan, now_s):
                swapped_in.append(request)
        return swapped_in

    def _swap_in_and_record(
        self,
        request: Request,
        num_tokens: int,
        num_seqs: int,
        budget: SchedulingBudget,
        plan: StepPlan,
        now_s: float,
    ) -> bool:
        """The tail of the loop body (L601-612) after `_swap_in` (L1134-1142): the group runs,
        gets its slots and its work; False if `_append_slots` failed it."""
        try:
            request.seq.status = SequenceStatus.RUNNING
            request.state = RequestState.RUNNING
            self._append_slots(request, plan)
        except AuditError as error:
            fail(self.block_manager, request, plan, error, now_s)
            return False
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
        return True

    def _ignore(
        self, request: Request, reason: str, plan: StepPlan, now_s: float, free: bool = False
    ) -> None:
        """A group upstream marks `FINISHED_IGNORED` (L562-571, L691-699, L705-714). A swapped
        one is freed first (0.5.4 frees nothing there; a free the auditor refuses is recorded,
        not raised)."""
        if free:
            with contextlib.suppress(AuditError):
                self.block_manager.free(request.seq)
        request.finish(RequestState.IGNORED, reason, now_s)
        plan.ignored.append(request)

    # ------------------------------------------------------------------ waiting
    def _schedule_prefills(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float, chunking: bool
    ) -> list[Request]:
        """`_schedule_prefills` (L641-755): a prompt over `_get_prompt_limit` or a
        `can_allocate` NEVER ends the request as ignored; `can_allocate` LATER stops the
        phase (head-of-line blocking). Returns the groups scheduled, in order."""
        scheduled: list[Request] = []
        while self.waiting:
            request = self.waiting[0]
            num_new = self._num_new_tokens(request, budget, chunking)
            if num_new > self.prompt_limit:
                self.waiting.popleft()
                self._ignore(
                    request,
                    f"Input prompt ({num_new} tokens) is too long and exceeds limit of "
                    f"{self.prompt_limit}",
                    plan,
                    now_s,
                )
                continue
            if self.shortcuts.known_later(request):
                break
            status = self.block_manager.can_allocate(request.group)
            if status is AllocStatus.LATER:
                self.shortcuts.on_later(request)
                break
            if status is AllocStatus.NEVER:
                self.waiting.popleft()
                self._ignore(
                    request,
                    f"Input prompt ({num_new} tokens) is too long and exceeds the capacity of "
                    "block_manager",
                    plan,
                    now_s,
                )
                continue
            num_new_seqs = request.group.get_max_num_running_seqs()
            if num_new == 0 or not budget.can_schedule(num_new, num_new_seqs):
                break
            self.waiting.popleft()
            try:
                self._allocate_and_set_running(request)
            except AuditError as error:
                fail(self.block_manager, request, plan, error, now_s)
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

    def _schedule_priority_preemption(
        self, budget: SchedulingBudget, plan: StepPlan, now_s: float
    ) -> None:
        """Preempt worse-priority running groups until the waiting head fits (not in 0.5.4:
        `_schedule_priority_preemption`, L970-1036 at 4ac7713, vLLM #5958)."""
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
            except FatalEngineError:
                self.waiting.appendleft(head)
                # `running` (the queue, not the sorted copy) still holds the victims so far.
                moved = set(self.waiting)
                self.running = deque(r for r in self.running if r not in moved)
                raise
            self.waiting.appendleft(victim)
        self.waiting.appendleft(head)
        self.waiting = deque(sorted(self.waiting, key=priority_key))
        self.running = deque(running)

    # ------------------------------------------------------------------ the policies
    def _schedule_default(self, plan: StepPlan, now_s: float) -> None:
        """`_schedule_default` (L757-839)."""
        budget = SchedulingBudget(self.token_budget, self.config.max_num_seqs)
        # Every kvsim request is one sequence (n=1, see `Request`): each running group counts 1.
        budget.count_running_seqs(len(self.running))
        prefills: list[Request] = []
        if not self.swapped:
            prefills = self._schedule_prefills(budget, plan, now_s, chunking=False)
        if not prefills and self.config.policy is Policy.PRIORITY:
            self._schedule_priority_preemption(budget, plan, now_s)
        if prefills:
            self._requeue(prefills, RunningOutputs(RunningWalk.NONE), ())
            return
        running = self._schedule_running(budget, plan, now_s, chunking=False)
        swapped_in: Sequence[Request] = ()
        if self.swapped and not running.preempted and not running.swapped_out:
            try:
                swapped_in = self._schedule_swapped(budget, plan, now_s, chunking=False)
            except FatalEngineError:
                self._requeue(prefills, running, ())
                raise
        self._requeue(prefills, running, swapped_in)

    def _schedule_chunked(self, plan: StepPlan, now_s: float) -> None:
        """`_schedule_chunked_prefill` (L841-918); the plan lists the work in upstream's
        output order (`_output_order`)."""
        budget = SchedulingBudget(self.token_budget, self.config.max_num_seqs)
        running = self._schedule_running(budget, plan, now_s, chunking=True)
        end_running = len(plan.scheduled)
        swapped_in: Sequence[Request] = ()
        if not running.preempted and not running.swapped_out:
            try:
                # Unchunked: 0.5.4 calls `_schedule_swapped(budget, curr_loras)` here (L866-867),
                # so a swapped prefill-stage group needs its whole rest in the budget.
                swapped_in = self._schedule_swapped(budget, plan, now_s, chunking=False)
            except FatalEngineError:
                self._requeue((), running, ())
                raise
        end_swapped = len(plan.scheduled)
        if any(r.is_prefill for r in swapped_in):  # decodes first (L892-895)
            swapped_in = sorted(swapped_in, key=lambda r: r.is_prefill)
        prefills = self._schedule_prefills(budget, plan, now_s, chunking=True)
        if end_swapped and (prefills or running.prefill or swapped_in):
            plan.scheduled = _output_order(plan.scheduled, end_running, end_swapped)
        self._requeue(prefills, running, swapped_in)

    def _requeue(
        self, prefills: Sequence[Request], running: RunningOutputs, swapped_in: Sequence[Request]
    ) -> None:
        """Put the step's requests back in the queues (L807-816, L884-897): the preempted
        ones to the front of `waiting` (`extendleft` reverses: the earliest-preempted ends up
        first, spec 5.3), the swapped-out ones to `swapped`, and to `running` the new
        prefills, the kept ones (decodes, then prefill-stage groups: `RunningOutputs.kept`,
        L886-891) and the swapped-in ones, in that order."""
        if running.preempted:
            self.waiting.extendleft(running.preempted)
        if running.swapped_out:
            self.swapped.extend(running.swapped_out)
        if running.walk is RunningWalk.LAZY:
            if prefills or running.prefill or swapped_in:
                self.shortcuts.requeue_lazy(prefills, running.prefill, swapped_in)
            return
        if running.walk is RunningWalk.NONE:
            self._append_running(prefills)
            self._append_running(swapped_in)
            return
        self.running.extend(prefills)
        self.running.extend(running.kept)
        self.running.extend(swapped_in)
        self.shortcuts.after_requeue()

    def schedule(self, now_s: float) -> StepPlan:
        """`schedule` -> `_schedule` (vllm/core/scheduler.py:L946-1022, L920-925): one of the
        two policies; a fatal engine error ends the step with `plan.fatal_error` set."""
        plan = StepPlan()
        try:
            if self.config.enable_chunked_prefill:
                self._schedule_chunked(plan, now_s)
            else:
                self._schedule_default(plan, now_s)
        except FatalEngineError:
            return plan  # plan.fatal_error says why; the engine ends the run
        if self.caching:
            self._touch_scheduled(plan, now_s)
        return plan

    def _touch_scheduled(self, plan: StepPlan, now_s: float) -> None:
        """The manager calls of `schedule`'s metadata loop (L956-1020) that change the pool:
        every scheduled group's running sequence gets `access_all_blocks_in_seq(seq, now)`
        (v0-V1 stamps its blocks' `last_accessed`, v0-V2 the sequence's access time, read
        when it frees: the LRU evictor's order), then each scheduled group
        `mark_blocks_as_computed` (v0-V1's `computed` flags; a no-op on v0-V2). Left out:
        `get_block_table` and `get_common_computed_block_ids`, queries for the workers'
        metadata. Under caching the fast path is off (`sim.scheduler.fast.v0.v0_shortcuts`),
        so every scheduled group is in `plan.scheduled`. Example: step at t=3.0 schedules
        requests 4 and 7: both sequences' blocks read t=3.0 if freed before their next step."""
        manager = self.block_manager
        for work in plan.scheduled:
            if work.request.state is RequestState.RUNNING:
                manager.access_all_blocks_in_seq(work.request.seq, now_s)
        for work in plan.scheduled:
            manager.mark_blocks_as_computed(work.request.group)

    # ------------------------------------------------------------------ outputs
    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Apply the step's results (`_process_model_outputs` in `llm_engine.py`, then
        `free_finished_seq_groups`, vllm/core/scheduler.py:L1031-1041); returns the requests
        that finished."""
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
            reason = maybe_stop_sequence(request, max_model_len)
            if reason is None:
                continue
            self.shortcuts.before_manager_call(request)
            try:
                self.block_manager.free(seq)
            except AuditError as error:
                # vLLM frees finished groups before it returns their outputs: the engine
                # dies here and the request never finishes (the engine aborts it).
                die(plan, error)
                break
            finish(request, reason, now_s)
            finished.append(request)
        if finished:
            self._free_finished_seq_groups(finished)
        self.shortcuts.after_update(plan, finished, now_s)
        return finished

    def _free_finished_seq_groups(self, finished: list[Request]) -> None:
        """`free_finished_seq_groups` (L1031-1041): the finished groups leave `running`.

        Upstream rebuilds the queue without them; removing each one gives the same queue
        (only `update` ends a running request) in C, without a Python pass over `running`
        on every step that finishes one.
        """
        for request in finished:
            self.running.remove(request)

    # ------------------------------------------------------------------ block manager calls
    def _allocate_and_set_running(self, request: Request) -> None:
        """`_allocate_and_set_running` (L1043-1046)."""
        self.block_manager.allocate(request.group)
        self.shortcuts.after_manager_call(request)
        request.seq.status = SequenceStatus.RUNNING
        request.state = RequestState.RUNNING

    def _append_slots(self, request: Request, plan: StepPlan) -> None:
        """`_append_slots` (L1048-1068): the copy-on-write pairs count as copied blocks."""
        cows = self.block_manager.append_slots(request.seq, self.config.num_lookahead_slots)
        plan.num_blocks_copied += len(cows)
        self.shortcuts.after_manager_call(request)

    def _preempt(
        self, request: Request, plan: StepPlan, now_s: float, mode: PreemptionMode | None = None
    ) -> PreemptionMode:
        """`_preempt` (L1070-1114): recompute or swap; swap without CPU space is fatal.

        A manager call that fails here (v0-V1's double free swapping out a wrapped
        sliding-window ring, v0-V2's swap-out of a table holding the null block) is fatal too:
        vLLM's exception leaves `schedule` and the engine dies, with the table half swapped or
        half freed, a state no later step of the real engine starts from (see `die`).
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
        self.shortcuts.on_leave(request)
        self.shortcuts.before_manager_call(request)
        try:
            if mode is PreemptionMode.RECOMPUTE:
                self._preempt_by_recompute(request)
            else:
                self._preempt_by_swap(request, plan)
        except AuditError as error:
            raise die(plan, error) from None
        return mode

    def _preempt_by_recompute(self, request: Request) -> None:
        """`_preempt_by_recompute` (L1116-1125)."""
        request.seq.status = SequenceStatus.WAITING
        request.state = RequestState.WAITING
        self.block_manager.free(request.seq)
        request.seq.num_computed_tokens = 0
        request.is_prefill = True

    def _preempt_by_swap(self, request: Request, plan: StepPlan) -> None:
        """`_preempt_by_swap` (L1127-1132) -> `_swap_out` (L1144-1158)."""
        if not self.block_manager.can_swap_out(request.group):
            plan.fatal_error = SWAP_SPACE_ERROR
            raise FatalEngineError(SWAP_SPACE_ERROR)
        mapping = self.block_manager.swap_out(request.group)
        plan.num_blocks_swapped_out += len(mapping)
        request.seq.status = SequenceStatus.SWAPPED
        request.state = RequestState.SWAPPED

    def _num_new_tokens(self, request: Request, budget: SchedulingBudget, chunking: bool) -> int:
        """`_get_num_new_tokens`: 1 for a decode, the uncomputed rest for a prefill (L1189-1213)."""
        seq = request.seq
        num_new = seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
        if chunking:
            num_new = min(num_new, budget.remaining_token_budget())
        return num_new


def _manager_caches(manager: AuditedV0Manager) -> bool:
    """Whether the audited v0 manager caches prefixes (kvsim's designs say `enable_caching`;
    a manager that does not say is asked anyway: both calls are no-ops without caching)."""
    return bool(getattr(manager.inner, "enable_caching", True))


def _output_order(
    walk: list[ScheduledWork], end_running: int, end_swapped: int
) -> list[ScheduledWork]:
    """The chunked policy's work, listed in walk order (running, swapped, then new prefills:
    `walk[:end_running]`, `walk[end_running:end_swapped]`, the rest), in the order of
    `SchedulerOutputs.scheduled_seq_groups` (L899-903): new prefills, running prefill-stage
    groups, swapped-in prefill-stage groups, running decodes, swapped-in decodes. `update`
    applies the outputs in this order, as `_process_model_outputs` does (llm_engine.py:L819-831),
    so finished requests free their blocks in upstream's order. Example: walk [r1 decode,
    r2 chunk, s3 decode, w4 prompt] -> [w4, r2, r1, s3]."""
    running, swapped = walk[:end_running], walk[end_running:end_swapped]
    return [
        *walk[end_swapped:],
        *[w for w in running if w.is_prefill],
        *[w for w in swapped if w.is_prefill],
        *[w for w in running if not w.is_prefill],
        *[w for w in swapped if not w.is_prefill],
    ]


def maybe_stop_sequence(request: Request, max_model_len: int) -> str | None:
    """`StopChecker.maybe_stop_sequence` (vllm/engine/output_processor/stop_checker.py of
    0.5.4), its length checks (both end the sequence FINISHED_LENGTH_CAPPED upstream): the
    finish reason, or None while it runs on. Unlike V1's `check_stop`, v0 stops only past
    ``max_model_len``. Example: a 100-token prompt with max_tokens 8 stops at 108 tokens;
    with max_model_len 105, at 106.
    """
    num_tokens = request.seq.content.num_tokens
    if num_tokens - request.seq.prompt_len >= request.max_tokens:
        return "length: generated max_tokens"
    if num_tokens > max_model_len:
        return "length: reached max_model_len"
    return None
