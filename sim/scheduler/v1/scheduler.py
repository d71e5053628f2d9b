"""The vLLM V1-engine scheduler (`vllm/v1/core/sched/scheduler.py` at 0.11.0 / 4ac7713), pure Python.

There are no prefill/decode phases: each request has `num_computed_tokens` and is given
`num_tokens - num_computed_tokens` new tokens (1 for a decode), clamped by
`long_prefill_token_threshold`, the token budget and `max_model_len - 1 - C`.

1. RUNNING first, in list order, while budget remains. `allocate_slots` returning None preempts
   the last running request (or the worst priority) by recompute, until the current one fits or
   is itself the victim, which ends the running loop.
2. WAITING only if nothing was preempted in this step: stop at `max_num_seqs`; prefix hits are
   looked up for a request with no computed tokens; without chunked prefill a prompt larger than
   the budget is skipped; `allocate_slots` None breaks (head-of-line blocking, no preemption).
3. Every scheduled request's `num_computed_tokens` advances at schedule time
   (`_update_after_schedule`); a token is sampled only once all its tokens are computed.

Where later releases decide differently (the admission gate, a prompt over the budget without
chunked prefill, a PRIORITY victim), the rule is the pinned release's (`v1_release.py`).

There is no NEVER path: vLLM's frontend rejects a prompt longer than `max_model_len` before it
is queued, which kvsim reports as ignored at arrival.

Modules, as upstream's `schedule` orders its work: the running loop (L208-320) in
`sim.scheduler.v1.running`; here the waiting loop (`_schedule_waiting`, L334-541),
`_update_after_schedule` (L629-658) and `update_from_output` (`update`, L861-1022). The decode
shortcuts (`sim.scheduler.fast.layer`, `sim.scheduler.fast.v1`) replace only the running loop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sim.audit import AuditedV1Manager, AuditError
from sim.kv.types import SequenceStatus
from sim.kv_connector.base import KVConnector, MatchStatus, NoConnector
from sim.kv_connector.hooks import ConnectorHooks
from sim.scheduler.config import Policy, SchedulerConfig
from sim.scheduler.fast.layer import fast_path_enabled
from sim.scheduler.fast.v1 import V1DecodeShortcuts
from sim.scheduler.lifecycle import finish, sample_token
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan, priority_key
from sim.scheduler.v1.priority_ties import HeapTieMirror
from sim.scheduler.v1.release import policies_for
from sim.scheduler.v1.running import RunningPhase, V1RunningPhase


class V1Scheduler(V1RunningPhase):
    """One replica's V1-engine scheduler over an audited `KVCacheManager`."""

    engine = "v1"
    #: Skip an `allocate_slots` whose None answer is known (see `_schedule_waiting`); tests
    #: turn it off to show that the skip changes no result.
    skip_repeated_later = True

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: AuditedV1Manager,
        kv_connector: KVConnector | None = None,
    ) -> None:
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        # What `SchedulerConfig.token_budget` resolves, never raised here: an explicit budget
        # below max_model_len without chunked prefill is refused at startup, as vLLM's
        # SchedulerConfig refuses it (`sim.scenario.startup.check_token_budget`); kvsim used to raise
        # it silently to max_model_len while summary.json recorded the budget asked for.
        self.token_budget = config.token_budget("v1")
        #: The pinned release's waiting-side rules (`sim.scheduler.v1.release`).
        self.release_policies = policies_for(kv_cache_manager, self.token_budget)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: 4ac7713 / 0.11.0 under PRIORITY: where the real waiting heap would raise on a tie
        #: (only with `use_exact_arrival_times`).
        self._ties: HeapTieMirror | None = None
        #: The PRIORITY victim's key: kvsim's total order, or vLLM's own (see there).
        self._victim_key: Callable[[Request], tuple[int, float] | tuple[int, float, int]] = (
            priority_key
        )
        self._init_fast_path(config, kv_cache_manager)
        #: The decode shortcuts (`sim.scheduler.fast.layer`); None: every call is made.
        self.shortcuts: V1DecodeShortcuts | None = None
        #: The running phase (the seam): upstream's loop, or the decode shortcuts' in its
        #: place (`sim.scheduler.fast.layer`).
        self.running_phase: RunningPhase = self._schedule_running
        if fast_path_enabled(config, kv_cache_manager):
            self.shortcuts = V1DecodeShortcuts(self)
            self.running_phase = self.shortcuts.schedule_running
        # Prefix-cache hits can only happen with caching on (a manager that does not say is
        # taken to have it). Without them the waiting phase can skip known refusals.
        self._prefix_hits_possible = getattr(kv_cache_manager, "enable_caching", True) is not False
        if not self._prefix_hits_possible:
            self._num_free_blocks: Callable[[], int] = lambda: kv_cache_manager.num_free_blocks
        # PRIORITY preemptions during one running turn: the running-loop indices
        # of the victims and the tokens refunded to the budget (0.33.0's rule).
        self._victim_indices: list[int] = []
        self._refunded_tokens = 0
        self._later_key: tuple[int, int, int] | None = None
        self._later_num_new = 0
        self._later_free = 0
        #: `long_prefill_token_threshold` as it applies in the current step (`schedule`).
        self._step_threshold = config.long_prefill_token_threshold
        #: The KV connector's scheduler side (`sim.kv_connector`); no-ops without one.
        self.connector_hooks = ConnectorHooks(kv_connector or NoConnector(), kv_cache_manager)

    # ------------------------------------------------------------------ queues
    def use_exact_arrival_times(self) -> bool:
        """Take `arrival_s` as vLLM's own `arrival_time` (the scheduler lockstep does): then
        equal ones are real ties, and 4ac7713 / 0.11.0's PRIORITY heap dies on comparing two
        (`sim.scheduler.v1.priority_ties`; the step's `fatal_error`). Off by default: a simulated
        arrival comes from a trace or a generator, whose ties (a burst at one millisecond) a
        real frontend's receipt timestamps break, as kvsim's request-id order does. Call before
        the first request; True when the pinned release and policy can die this way.

        It also makes the PRIORITY victim vLLM's exactly: the worst (priority, arrival), the
        first in `running` among equals (`max` over that pair, every pinned release), where
        kvsim's default breaks the tie by the higher request id."""
        self._victim_key = _priority_and_arrival
        if self.config.policy is Policy.PRIORITY and (
            self.release_policies.unordered_priority_ties
        ):
            self._ties = HeapTieMirror()
        return self._ties is not None

    def add_request(self, request: Request) -> None:
        self._enqueue(request, front=False)
        if self._ties is not None:
            self._ties.push(request)

    def _enqueue(self, request: Request, front: bool) -> None:
        """FCFS: append (or prepend after preemption). PRIORITY: insert in (priority, arrival) order."""
        if self.config.policy is Policy.PRIORITY:
            index = len(self.waiting)
            while index > 0 and priority_key(self.waiting[index - 1]) > priority_key(request):
                index -= 1
            self.waiting.insert(index, request)
        elif front:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def unfinished(self) -> list[Request]:
        self.materialize()
        return [*self.running, *self.waiting]

    # ------------------------------------------------------------------ decode cohort
    def materialize(self) -> None:
        """Bring every request's tokens up to date (the decode cohort's members)."""
        if self.shortcuts is not None:
            self.shortcuts.materialize()

    def use_decode_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a `DecodeCohort` (see `sim.scheduler.fast.cohort`). Needs the
        decode fast path and FCFS (a priority victim may sit anywhere in `running`). Call
        before the first step; `materialize` brings every request up to date."""
        if self.shortcuts is None or self.config.policy is not Policy.FCFS:
            return False
        self.shortcuts.use_cohort(window)
        return True

    def _schedule_waiting(self, plan: StepPlan, budget: int, now_s: float) -> None:
        skipped: list[Request] = []
        while self.waiting and budget > 0:
            if len(self.running) == self.config.max_num_seqs:
                break
            request = self.waiting[0]
            seq = request.seq
            hooks = self.connector_hooks
            # KV connector: a request whose load runs stays parked (0.11.0 L342-353).
            if request.state is RequestState.WAITING_FOR_REMOTE_KVS:
                if not hooks.update_waiting_for_remote_kv(request):
                    skipped.append(self.waiting.popleft())
                    if self._ties is not None:
                        self._ties.skip(request)
                    continue
                request.state = RequestState.WAITING
            if seq.num_computed_tokens == 0 and self._prefix_hits_possible:
                hit_block_ids, num_computed = self.kv_cache_manager.get_computed_blocks(seq)
            else:  # (without prefix caching the lookup is a pure ([], 0))
                hit_block_ids, num_computed = [], seq.num_computed_tokens
            num_external = 0
            load_async = False
            if hooks.enabled and seq.num_computed_tokens == 0:
                # Tokens the connector holds beyond the local hit (0.11.0 L386-402).
                match = hooks.get_num_new_matched_tokens(request, num_computed)
                if match.status is MatchStatus.RETRY_LATER:
                    skipped.append(self.waiting.popleft())
                    if self._ties is not None:
                        self._ties.skip(request)
                    continue
                num_external, load_async = match.num_external_tokens, match.load_async
            if load_async:
                num_new = 0  # loading: no new work until the load completes (L414-417)
            else:
                num_new = seq.num_tokens - num_computed - num_external
                threshold = self._step_threshold
                if 0 < threshold < num_new:
                    num_new = threshold
                if not self.config.enable_chunked_prefill and num_new > budget:
                    if not self.release_policies.oversized_prompt.skips_to_next:
                        break
                    skipped.append(self.waiting.popleft())
                    if self._ties is not None:
                        self._ties.skip(request)
                    continue
                num_new = min(num_new, budget)
            num_new_hit = num_computed if seq.num_computed_tokens == 0 else 0
            # Without prefix hits, `allocate_slots` for a waiting request is None exactly when
            # the blocks for its `num_new` tokens exceed the free ones: monotone in both. So
            # a head that got None stays refused while it is unchanged, asks no fewer tokens
            # and no block was freed; the repeat call, made on most steps of an overloaded
            # replay, is skipped.
            later_key = (request.request_id, seq.num_tokens, seq.num_computed_tokens)
            free = self._num_free_blocks() if not self._prefix_hits_possible else 0
            if (
                not self._prefix_hits_possible
                and self.skip_repeated_later
                and not hooks.enabled
                and later_key == self._later_key
                and num_new >= self._later_num_new
                and free <= self._later_free
            ):
                break
            try:
                if self.release_policies.admission.admits(
                    self.kv_cache_manager, seq, hit_block_ids if num_new_hit else []
                ):
                    blocks = self.kv_cache_manager.allocate_slots(
                        seq,
                        num_new + num_external,
                        num_new_hit,
                        hit_block_ids,
                        self.config.num_lookahead_slots,
                    )
                else:
                    blocks = None  # 0.33.0's full-sequence gate: refused like allocate_slots
            except AuditError as error:
                self.waiting.popleft()
                if self._ties is not None:
                    self._ties.pop()
                self._fail(request, plan, error, now_s)
                continue
            if blocks is None:
                self._later_key, self._later_num_new, self._later_free = later_key, num_new, free
                break
            if hooks.enabled:  # (0.11.0 L489-504)
                hooks.update_state_after_alloc(request, num_new_hit, num_external, now_s)
                if load_async:
                    skipped.append(self.waiting.popleft())
                    if self._ties is not None:
                        self._ties.skip(request)
                    request.state = RequestState.WAITING_FOR_REMOTE_KVS
                    continue
                num_computed += num_external
            self.waiting.popleft()
            if self._ties is not None:
                self._ties.pop()
            self.running.append(request)
            if self.shortcuts is not None:
                self.shortcuts.join_running((request,))
            self._refresh_touch(request)
            request.state = RequestState.RUNNING
            seq.status = SequenceStatus.RUNNING
            if request.first_scheduled_s is None:
                request.first_scheduled_s = now_s
                request.num_prefix_hit_tokens = num_computed
            seq.num_computed_tokens = num_computed
            plan.scheduled.append(ScheduledWork(request, num_new, num_computed, True))
            budget -= num_new
        # 4ac7713 / 0.11.0 collect the skipped requests by `prepend_request` into a side queue
        # that is then prepended whole (0.11.0 `sched/scheduler.py:L434`, `L541`): they return
        # to the head in *reverse* skip order ([A, B] skipped -> waiting [B, A, ...]).
        for request in skipped:
            self._enqueue(request, front=True)
        if skipped and self._ties is not None:
            self._ties.return_skipped()

    def schedule(self, now_s: float) -> StepPlan:
        plan = StepPlan()
        self.connector_hooks.poll(now_s)  # the transfers the last step's worker reported
        self._step_threshold = self.config.long_prefill_token_threshold
        if self.release_policies.lone_request_ignores_threshold and self.num_unfinished() <= 1:
            self._step_threshold = 0  # 0.33.0: nobody to starve (`v1_release`)
        budget = self.running_phase(plan, self.token_budget, now_s)
        if plan.num_preempted == 0:
            self._schedule_waiting(plan, budget, now_s)
        self._update_after_schedule(plan)
        self.connector_hooks.build_connector_meta(plan, now_s)  # (0.11.0 L604-607)
        if self._ties is not None and self._ties.error is not None:
            plan.fatal_error = self._ties.error  # the real engine died in this call or before
        return plan

    @staticmethod
    def _update_after_schedule(plan: StepPlan) -> None:
        """`_update_after_schedule` (L629-658): computed tokens advance now, for every
        scheduled request (at 4ac7713 this includes a priority victim scheduled earlier in the
        same step), the quiet decodes included."""
        for work in plan.scheduled:
            work.request.seq.num_computed_tokens += work.num_tokens
        for request in plan.quiet:
            request.seq.num_computed_tokens += 1

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """`update_from_output` (L861-1022): sample for requests whose tokens are all computed; finish them."""
        finished: list[Request] = []
        running = RequestState.RUNNING
        max_model_len = self.config.max_model_len
        self.connector_hooks.wait_for_save(now_s)  # the step's stores start as it ends
        for work in plan.scheduled:
            request = work.request
            if request.state is not running:
                continue
            seq = request.seq
            content = seq.content
            if seq.num_computed_tokens < content.num_tokens:
                continue  # partial prefill: the sampled token is discarded
            request.is_prefill = False
            sample_token(request, now_s)
            reason = check_stop(request, max_model_len)
            if reason is None:
                continue
            self._sync(request)
            self.connector_hooks.free_finished(request)  # `_free_request` (0.11.0 L1145-1158)
            finish(request, reason, now_s)
            finished.append(request)
        if finished:
            self.running = [r for r in self.running if not r.state.is_terminal]
        if self.shortcuts is not None:
            self.shortcuts.after_update(plan, finished, now_s)
        return finished


def check_stop(request: Request, max_model_len: int) -> str | None:
    """`check_stop` (sched/utils.py @4ac7713), its length rules: the finish reason, or None
    while the request runs on. Example: a 100-token prompt with max_tokens 8 stops at 108
    tokens ("length: generated max_tokens"); with max_model_len 105 it stops at 105 already.
    """
    num_tokens = request.seq.content.num_tokens
    if num_tokens - request.seq.prompt_len >= request.max_tokens:
        return "length: generated max_tokens"
    if num_tokens >= max_model_len:
        return "length: reached max_model_len"
    return None


def _priority_and_arrival(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_s)
