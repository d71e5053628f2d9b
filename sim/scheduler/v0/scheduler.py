"""The vLLM v0 scheduler (`vllm/core/scheduler.py @fc93e56`, 0.5.4), pure Python.

Three queues: `waiting`, `running`, `swapped`. Two step policies, in this module:

* **default** (`_schedule_default`, L757-839): if nothing is swapped, schedule prefills; only
  if no prefill was scheduled, schedule the running decodes and then (if nothing was preempted)
  swap-ins. A step is all prefills, or decodes plus swap-ins.
* **chunked prefill** (`_schedule_chunked_prefill`, L841-918): running first, then swapped, then
  new prefills, all in one token budget.

The phases they order live in one module each (see `sim.scheduler.v0.base`): running
(`v0_running`), swapped (`v0_swapped`), prefills and the priority preemption (`v0_prefills`).

Admission: `can_allocate` LATER breaks the waiting scan (head-of-line blocking), NEVER ends the
request as ignored. Preemption takes the *last* running group (`running.pop()`): recompute for
single-sequence groups, swap otherwise, or the forced mode; a swap-out that finds no CPU space
is the real engine's fatal `RuntimeError`. The priority policy (#5958, read at 4ac7713) sorts
waiting by (priority, arrival) and preempts worse-priority running groups for the head.

Every manager call goes through the auditor. A failed allocation (the v0-V2 sliding-window
undercount) fails that request and the run carries on; the engine ends the run instead under the
auditor's stop policy. A failed swap or free ends the run under every policy (see `_die`).

The decode shortcuts (`sim.scheduler.fast.layer`, `sim.scheduler.fast.v0`) replace only
the running phase: `running_phase` is one or the other.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.audit import AuditedV0Manager, AuditError
from sim.scheduler.config import Policy, SchedulerConfig
from sim.scheduler.fast.layer import fast_path_enabled
from sim.scheduler.fast.v0 import V0DecodeShortcuts
from sim.scheduler.lifecycle import finish, sample_token
from sim.scheduler.request import Request, RequestState, StepPlan
from sim.scheduler.v0.base import SWAP_SPACE_ERROR, RunningOutputs, RunningWalk, _die, _FatalError
from sim.scheduler.v0.running import RunningPhase, V0RunningPhase

__all__ = ["SWAP_SPACE_ERROR", "V0Scheduler"]


class V0Scheduler(V0RunningPhase):
    """One replica's v0 scheduler over an audited v0 block manager."""

    def __init__(self, config: SchedulerConfig, block_manager: AuditedV0Manager) -> None:
        super().__init__(config, block_manager)
        #: The running phase (the seam): upstream's `_schedule_running`, or the decode
        #: shortcuts' in its place (`sim.scheduler.fast.layer`).
        self.running_phase: RunningPhase = self._schedule_running
        if fast_path_enabled(config, block_manager):
            self.shortcuts = V0DecodeShortcuts(self)
            self.running_phase = self.shortcuts.schedule_running

    def use_decode_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a `DecodeCohort` (see `sim.scheduler.fast.cohort`): a decode step
        then costs what changes in it, not the batch size. Needs the decode fast path and the
        FCFS policy (the priority policy re-sorts `running` every step). Call before the first
        step; `materialize` brings every request's tokens up to date. Returns whether it is on.
        """
        if self.shortcuts is None or self.config.policy is not Policy.FCFS:
            return False
        self.shortcuts.use_cohort(window)
        return True

    # ------------------------------------------------------------------ step
    def schedule(self, now_s: float) -> StepPlan:
        """`schedule` -> `_schedule` (L920-925): one of the two policies."""
        plan = StepPlan()
        try:
            if self.config.enable_chunked_prefill:
                self._schedule_chunked(plan, now_s)
            else:
                self._schedule_default(plan, now_s)
        except _FatalError:
            pass  # plan.fatal_error says why; the engine ends the run
        return plan

    def _schedule_default(self, plan: StepPlan, now_s: float) -> None:
        """`_schedule_default` (L757-839)."""
        budget = self._new_budget()
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
        running = self.running_phase(budget, plan, now_s, chunking=False)
        swapped_in: Sequence[Request] = ()
        if self.swapped and not running.preempted and not running.swapped_out:
            try:
                swapped_in = self._schedule_swapped(budget, plan, now_s, chunking=False)
            except _FatalError:
                self._requeue(prefills, running, ())
                raise
        self._requeue(prefills, running, swapped_in)

    def _schedule_chunked(self, plan: StepPlan, now_s: float) -> None:
        """`_schedule_chunked_prefill` (L841-918)."""
        budget = self._new_budget()
        running = self.running_phase(budget, plan, now_s, chunking=True)
        swapped_in: Sequence[Request] = ()
        if not running.preempted and not running.swapped_out:
            try:
                swapped_in = self._schedule_swapped(budget, plan, now_s, chunking=True)
            except _FatalError:
                self._requeue((), running, ())
                raise
        prefills = self._schedule_prefills(budget, plan, now_s, chunking=True)
        self._requeue(prefills, running, swapped_in)

    def _requeue(
        self, prefills: Sequence[Request], running: RunningOutputs, swapped_in: Sequence[Request]
    ) -> None:
        """Put the step's requests back in the queues (L824-839, L895-918): the preempted
        ones to the front of `waiting` (`extendleft` reverses: the earliest-preempted ends up
        first, spec 5.3), the swapped-out ones to `swapped`, and to `running` the new
        prefills, the kept ones and the swapped-in ones, in that order."""
        if running.preempted:
            self.waiting.extendleft(running.preempted)
        if running.swapped_out:
            self.swapped.extend(running.swapped_out)
        if running.walk is RunningWalk.LAZY:
            assert self.shortcuts is not None  # only the shortcuts' lazy step is LAZY
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
        if self.shortcuts is not None:
            self.shortcuts.after_walk()

    def _requeue_on_fatal(self, outputs: RunningOutputs) -> None:
        self._requeue((), outputs, ())

    # ------------------------------------------------------------------ outputs
    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Apply the step's results (`_process_model_outputs` in `llm_engine.py`, then
        `free_finished_seq_groups`, L1031-1041); returns the requests that finished."""
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
        if finished:
            self._free_finished_seq_groups(finished)
        if self.shortcuts is not None:
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


def maybe_stop_sequence(request: Request, max_model_len: int) -> str | None:
    """`StopChecker.maybe_stop_sequence` (stop_checker.py @fc93e56), its length checks (both
    end the sequence FINISHED_LENGTH_CAPPED upstream): the finish reason, or None while it runs
    on. Unlike V1's `check_stop`, v0 stops only past ``max_model_len``. Example: a 100-token
    prompt with max_tokens 8 stops at 108 tokens; with max_model_len 105, at 106.
    """
    num_tokens = request.seq.content.num_tokens
    if num_tokens - request.seq.prompt_len >= request.max_tokens:
        return "length: generated max_tokens"
    if num_tokens > max_model_len:
        return "length: reached max_model_len"
    return None
