"""The vLLM V1-engine scheduler (`vllm/v1/core/sched/scheduler.py @4ac7713`, ~0.10), pure Python.

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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from sim.audit import AuditedV1Manager, AuditError
from sim.kv.types import SequenceStatus
from sim.kv_connector.base import KVConnector, MatchStatus, NoConnector
from sim.kv_connector.hooks import ConnectorHooks
from sim.scheduler.cohort import DecodeCohort
from sim.scheduler.config import Policy, SchedulerConfig
from sim.scheduler.fast_path import FastPathScheduler, add_quiet_decode, apply_quiet_decodes
from sim.scheduler.lifecycle import fail, finish, sample_token
from sim.scheduler.priority_ties import HeapTieMirror
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan, priority_key
from sim.scheduler.v1_release import policies_for


class V1Scheduler(FastPathScheduler):
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
        self.token_budget = config.token_budget("v1")
        if not config.enable_chunked_prefill:
            # vLLM V1 without chunked prefill sets max_num_batched_tokens = max_model_len.
            self.token_budget = max(self.token_budget, config.max_model_len)
        #: The pinned release's waiting-side rules (`sim.scheduler.v1_release`).
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
        # Prefix-cache hits can only happen with caching on (a manager that does not say is
        # taken to have it). Without them the waiting phase can skip known refusals.
        self._prefix_hits_possible = getattr(kv_cache_manager, "enable_caching", True) is not False
        if not self._prefix_hits_possible:
            self._num_free_blocks: Callable[[], int] = lambda: kv_cache_manager.num_free_blocks
        # PRIORITY preemptions during one `_schedule_tokens` call: the running-loop indices
        # of the victims and the tokens refunded to the budget (0.33.0's rule).
        self._victim_indices: list[int] = []
        self._refunded_tokens = 0
        self._later_key: tuple[int, int, int] | None = None
        self._later_num_new = 0
        self._later_free = 0
        self._next_key = 0
        #: `long_prefill_token_threshold` as it applies in the current step (`schedule`).
        self._step_threshold = config.long_prefill_token_threshold
        #: The KV connector's scheduler side (`sim.kv_connector`); no-ops without one.
        self.connector_hooks = ConnectorHooks(kv_connector or NoConnector(), kv_cache_manager)

    # ------------------------------------------------------------------ queues
    def use_exact_arrival_times(self) -> bool:
        """Take `arrival_s` as vLLM's own `arrival_time` (the scheduler lockstep does): then
        equal ones are real ties, and 4ac7713 / 0.11.0's PRIORITY heap dies on comparing two
        (`sim.scheduler.priority_ties`; the step's `fatal_error`). Off by default: a simulated
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
    def use_decode_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a `DecodeCohort` (see `sim.scheduler.cohort`). Needs the
        decode fast path and FCFS (a priority victim may sit anywhere in `running`). Call
        before the first step; `materialize` brings every request up to date."""
        if not self._fast_path or self.config.policy is not Policy.FCFS:
            return False
        self._cohort = DecodeCohort(window)
        for request in self.running:
            self._add_outsider(request)
        return True

    def _add_outsider(self, request: Request) -> None:
        request.order_key = self._next_key
        self._next_key += 1
        self._outsiders[request] = None

    def _event_len(self, request: Request) -> int | None:
        """The first length at which a running one-token decode fails the walk's quiet test or
        is finished by the step; None: not a decode the fast path may skip."""
        touch_len = request.touch_len
        if touch_len is None or request.state is not RequestState.RUNNING:
            return None
        seq = request.seq
        num_tokens = seq.content.num_tokens
        if seq.num_computed_tokens != num_tokens - 1 or num_tokens <= seq.prompt_len:
            return None
        return min(
            touch_len, seq.prompt_len + request.max_tokens - 1, self.config.max_model_len - 1
        )

    def _clamp(self, num_new: int, budget: int) -> int:
        threshold = self._step_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def _preempt(self, plan: StepPlan) -> Request:
        if self.config.policy is Policy.PRIORITY:
            victim = max(self.running, key=self._victim_key)
            victim_index = self.running.index(victim)
            del self.running[victim_index]
            self._victim_indices.append(victim_index)
            self._refunded_tokens += self.release_policies.priority_victim.unschedule(plan, victim)
        else:
            victim = self.running.pop()
        if self._cohort is not None:
            if victim.cohort_clock >= 0:
                self._cohort.leave(victim)
            self._outsiders.pop(victim, None)
        self._sync(victim)
        victim.touch_len = None
        self.kv_cache_manager.free(victim.seq)
        victim.state = RequestState.WAITING
        victim.seq.status = SequenceStatus.PREEMPTED
        victim.seq.num_computed_tokens = 0
        victim.num_preemptions += 1
        plan.num_preempted += 1
        self._enqueue(victim, front=True)
        if self._ties is not None:
            self._ties.push(victim)
        return victim

    def _fail(self, request: Request, plan: StepPlan, error: AuditError, now_s: float) -> None:
        fail(self.kv_cache_manager, request, plan, error, now_s)

    def _schedule_running(self, plan: StepPlan, budget: int, now_s: float) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            # Fast path: a one-token decode (all but the newest token computed, outputs exist)
            # that the manager declared quiet would get [] from allocate_slots and change
            # nothing, so the call is skipped and synced before the next real one.
            if self._is_quiet(request):
                add_quiet_decode(request, plan, self.config.max_model_len - 1)
                budget -= 1
                index += 1
                continue
            num_new = self._schedule_tokens(request, budget, plan, now_s)
            if self._victim_indices:  # PRIORITY victims left `running` (see `_preempt`)
                index, budget = self._after_priority_preemption(index, budget)
            if num_new is None:
                continue  # failed: it left `running`
            if num_new < 0:  # preempted itself
                if self.config.policy is Policy.FCFS or (
                    self.release_policies.priority_victim.self_preemption_ends_loop
                ):
                    break
                continue  # 0.33.0: the next request now sits at `index`
            budget -= num_new
            index += 1
        return budget

    def _after_priority_preemption(self, index: int, budget: int) -> tuple[int, int]:
        """The running loop's index and budget after PRIORITY victims left `running`."""
        rule = self.release_policies.priority_victim
        for victim_index in self._victim_indices:
            index = rule.index_after_removal(index, victim_index)
        self._victim_indices.clear()
        budget += self._refunded_tokens
        self._refunded_tokens = 0
        return index, budget

    def _schedule_running_lazy(self, plan: StepPlan, budget: int, now_s: float) -> int | None:
        """`_schedule_running` with a cohort: visit only the outsiders and the members whose
        event is due, in queue order; the other members decode in bulk (`plan.bulk`).

        The members take one token each where they stand in the queue. When every request's
        demand fits the budget, nothing is cut off. Otherwise the budget runs out somewhere;
        that is still exact lazily when it runs out after the last member (the usual case: a
        long prefill admitted last takes what remains), so the members' tokens are counted
        just before the first request behind them. Else this returns None (nothing changed
        yet) and the full walk decides who is cut off. A preemption victim (the last running
        request) that is a member leaves the cohort first. Returns the budget left.
        """
        cohort = self._cohort
        max_model_len = self.config.max_model_len
        touched = []
        for request in cohort.pop_due():
            seq = request.seq
            if seq.content.num_tokens >= min(
                seq.prompt_len + request.max_tokens - 1, max_model_len - 1
            ):
                cohort.leave(request)  # finishes after this step: the explicit path frees it
                self._outsiders[request] = None
            else:
                touched.append(request)  # reached touch_len: calls here, stays a member
        members = len(cohort)
        if not touched and not self._outsiders:
            # Half the steps of a replay: nothing but members, one token each.
            if members > budget:
                return None  # some are cut off: the full walk decides which
            if members:
                plan.bulk = cohort.bulk()
            return budget - members
        explicit = [*self._outsiders, *touched]
        if len(explicit) > 1:
            explicit.sort(key=_order_key)
        last_computable = max_model_len - 1
        threshold = self._step_threshold
        quiet_flags = []
        demands = []
        for request in explicit:
            seq = request.seq
            if request.cohort_clock >= 0:
                quiet_flags.append(False)
                demands.append(0)  # counted with the members
                continue
            quiet = self._is_quiet(request)
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
                return None
        elif members:
            members_key = explicit[-1].order_key + 1 if explicit else 0  # count them at the end
        members_counted = not members
        running = RequestState.RUNNING
        for request, quiet in zip(explicit, quiet_flags, strict=True):
            if not members_counted and request.order_key > members_key:
                budget -= len(cohort)
                members_counted = True
            if budget <= 0:
                break
            if request.state is not running:
                continue  # preempted earlier in this walk
            computed = request.seq.num_computed_tokens
            if request.cohort_clock >= 0:
                # A due member whose decode needs the manager: the walk's real-call branch.
                self._sync(request)
                outcome = self._allocate_running(request, 1, plan, now_s)
                if outcome is None:
                    continue
                if not outcome:
                    break
                self._refresh_touch(request)
                event_len = self._event_len(request)
                if event_len is not None:
                    cohort.refile(request, event_len)
                else:  # every call from now on: this decode runs as an outsider's
                    cohort.leave(request)
                    self._outsiders[request] = None
                    plan.scheduled.append(ScheduledWork(request, 1, computed, False))
                    budget -= 1
                continue
            if quiet:
                add_quiet_decode(request, plan, self.config.max_model_len - 1)
                budget -= 1
                continue
            num_new = self._schedule_tokens(request, budget, plan, now_s)
            if num_new is None:
                continue  # failed: it left `running`
            if num_new < 0:
                break  # preempted itself
            budget -= num_new
        if not members_counted:
            budget -= len(cohort)
        if len(cohort):
            plan.bulk = cohort.bulk()
        return budget

    def _schedule_tokens(
        self, request: Request, budget: int, plan: StepPlan, now_s: float
    ) -> int | None:
        """The running phase's real-call branch for one request: its new tokens (clamped by
        the threshold, the budget and `max_model_len - 1`), `allocate_slots` (preempting from
        the tail until they fit), the work recorded. Returns the tokens scheduled (0: none
        due), None when the call failed (the request failed and left `running`), or -1 when
        the request preempted itself (the running phase ends)."""
        seq = request.seq
        computed = seq.num_computed_tokens
        num_new = self._clamp(seq.content.num_tokens - computed, budget)
        num_new = min(num_new, self.config.max_model_len - 1 - computed)
        if num_new <= 0:
            return 0
        self._sync(request)
        outcome = self._allocate_running(request, num_new, plan, now_s)
        if outcome is None:
            return None
        if not outcome:
            return -1
        self._refresh_touch(request)
        plan.scheduled.append(
            ScheduledWork(
                request, num_new, seq.num_computed_tokens, self._is_prefill(request, num_new)
            )
        )
        return num_new

    def _is_quiet(self, request: Request) -> bool:
        """The walk's fast-path test: a one-token decode the manager declared quiet."""
        seq = request.seq
        num_tokens = seq.content.num_tokens
        touch_len = request.touch_len
        computed = seq.num_computed_tokens
        return (
            self._fast_path
            and touch_len is not None
            and num_tokens < touch_len
            and computed == num_tokens - 1
            and num_tokens > seq.prompt_len
            and computed < self.config.max_model_len - 1
        )

    def _allocate_running(
        self, request: Request, num_new: int, plan: StepPlan, now_s: float
    ) -> bool | None:
        """`allocate_slots` for a running request, preempting from the tail until it fits.

        True: it fits. False: it was itself the victim (the running phase ends). None: the
        manager call failed; the request failed and left `running`.
        """
        while True:
            try:
                blocks = self.kv_cache_manager.allocate_slots(
                    request.seq, num_new, 0, None, self.config.num_lookahead_slots
                )
            except AuditError as error:
                if request.cohort_clock >= 0:
                    self._cohort.leave(request)
                self.running.remove(request)
                self._outsiders.pop(request, None)
                self._fail(request, plan, error, now_s)
                return None
            if blocks is not None:
                return True
            if self._preempt(plan) is request:
                return False

    @staticmethod
    def _is_prefill(request: Request, num_new: int) -> bool:
        seq = request.seq
        return not (
            num_new == 1 and seq.output_len > 0 and seq.num_computed_tokens == seq.num_tokens - 1
        )

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
            if self._cohort is not None:
                self._add_outsider(request)
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
        budget = None
        if self._cohort is not None:
            budget = self._schedule_running_lazy(plan, self.token_budget, now_s)
            if budget is None:
                self.materialize()
        if budget is None:
            budget = self._schedule_running(plan, self.token_budget, now_s)
        if plan.num_preempted == 0:
            self._schedule_waiting(plan, budget, now_s)
        # `_update_after_schedule`: computed tokens advance now, for every scheduled request
        # (at 4ac7713 this includes a priority victim scheduled earlier in the same step).
        for work in plan.scheduled:
            work.request.seq.num_computed_tokens += work.num_tokens
        for request in plan.quiet:
            request.seq.num_computed_tokens += 1
        self.connector_hooks.build_connector_meta(plan, now_s)  # (0.11.0 L604-607)
        if self._ties is not None and self._ties.error is not None:
            plan.fatal_error = self._ties.error  # the real engine died in this call or before
        return plan

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """`update_from_output`: sample for requests whose tokens are all computed; finish them."""
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
            # `check_stop` (sched/utils.py @4ac7713), inlined: this loop runs once per token.
            if content.num_tokens - seq.prompt_len >= request.max_tokens:
                reason = "length: generated max_tokens"
            elif content.num_tokens >= max_model_len:
                reason = "length: reached max_model_len"
            else:
                continue
            self._sync(request)
            self.connector_hooks.free_finished(request)  # `_free_request` (0.11.0 L1145-1158)
            finish(request, reason, now_s)
            finished.append(request)
        apply_quiet_decodes(plan.quiet, now_s, advance_computed=False)
        if finished:
            self.running = [r for r in self.running if not r.state.is_terminal]
        cohort = self._cohort
        if cohort is not None:
            if plan.bulk is not None:
                cohort.tick(now_s)
            for request in finished:
                del self._outsiders[request]
            self._join_cohort()
        return finished


def _order_key(request: Request) -> int:
    return request.order_key


def _priority_and_arrival(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_s)
