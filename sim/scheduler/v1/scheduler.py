"""The vLLM V1-engine scheduler, pure Python: one class, `V1Scheduler`, mirroring
`vllm/v1/core/sched/scheduler.py` (4ac7713 / 0.11.0 `Scheduler`; 0.33.0 where a release rule
differs, through `sim.scheduler.v1.release`).

There are no prefill/decode phases: each request has `num_computed_tokens` and is given
`num_tokens - num_computed_tokens` new tokens (1 for a decode), clamped by
`long_prefill_token_threshold`, the token budget and `max_model_len - 1 - C`.

1. RUNNING first, in list order, while budget remains (0.11.0 L208-320, 0.33.0 L793-1036).
   `allocate_slots` returning None preempts the last running request (or the worst priority)
   by recompute, until the current one fits or is itself the victim, which ends the loop.
2. WAITING only if nothing was preempted in this step (0.11.0 L334-541, 0.33.0 L1049-1610):
   stop at `max_num_seqs`; prefix hits are looked up for a request with no computed tokens;
   without chunked prefill a prompt larger than the budget is skipped (0.33.0: stops the
   loop); `allocate_slots` None breaks (head-of-line blocking, no preemption).
3. Every scheduled request's `num_computed_tokens` advances at schedule time
   (`_update_after_schedule`); a token is sampled only once all its tokens are computed.

Each loop takes one request per turn and the turn says what came of it: `TurnOutcome` for a
running request, `Admission` for a waiting one. The hooks beside the loops: the KV connector's
(`sim.kv_connector.hooks.ConnectorHooks`, no-ops without a connector), the 4ac7713 / 0.11.0
PRIORITY heap's tie mirror (`sim.scheduler.v1.priority_ties`, a `NoTieMirror` unless it can
die) and the speed layer's (`SpeedHooks`, a `NoSpeedLayer` unless
`sim.scheduler.fast.v1.with_decode_shortcuts` installs the decode shortcuts).

Line numbers (`L...`) are of `vllm/v1/core/sched/scheduler.py` in the release named, unless
another file is; 4ac7713 decides as 0.11.0 except where `sim.scheduler.v1.release` says.

There is no NEVER path: vLLM's frontend rejects a prompt longer than `max_model_len` before it
is queued, which kvsim reports as ignored at arrival.

What the model leaves out (upstream code that has no counterpart here): structured output
(grammar bitmasks, `get_grammar_bitmask`), speculative decoding (spec tokens, drafts,
`update_draft_token_ids`, lookahead beyond `num_lookahead_slots`), LoRA (`max_loras`), encoder
inputs and the encoder cache (`_try_schedule_encoder_inputs`, multimodal inputs, the EC
connector), pooling models, `finish_requests` / aborts, stop strings and EOS (a request stops
by length only, `check_stop`), stats and events (`make_stats`, KV events are `sim.kv_events`),
the KV connector's invalid-block and failed-load recovery, 0.33.0's streaming sessions, pause
states, DP prefill balancing and the adaptive long-prefill threshold. Async scheduling is the
`sim.scheduler.v1.async_scheduler.AsyncOutputs`, installed on this class as its `outputs`
hooks (upstream subclasses `Scheduler`; a hook object keeps the compiled core's class closed);
this class reads the placeholders where upstream's `Scheduler` does.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from sim.audit import AuditedV1Manager, AuditError
from sim.kv.types import Sequence, SequenceStatus
from sim.kv_connector.base import KVConnector, MatchStatus, NoConnector
from sim.kv_connector.hooks import ConnectorHooks
from sim.scheduler.config import Policy, SchedulerConfig
from sim.scheduler.lifecycle import fail, finish, sample_token
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan, priority_key
from sim.scheduler.v1.mamba_align import MambaAlignedSplit, SplitRule, split_rule_for
from sim.scheduler.v1.priority_ties import HeapTieMirror, NoTieMirror
from sim.scheduler.v1.release import policies_for


class Allocation(enum.Enum):
    """What `allocate_slots` for a running request came to (0.11.0 L254-292)."""

    #: It fits (after preempting victims from the tail, maybe).
    FITS = "fits"
    #: It was itself the victim: the running loop ends (FCFS and 4ac7713 / 0.11.0).
    PREEMPTED_SELF = "preempted_self"
    #: The manager call failed (the auditor recorded why): the request failed, left `running`.
    FAILED = "failed"


class TurnOutcome(enum.Enum):
    """One request's turn in the running loop."""

    SCHEDULED = "scheduled"
    #: No new tokens due (0.11.0 L238-252): the loop moves on (`continue`, not `break`).
    NOTHING_DUE = "nothing_due"
    PREEMPTED_SELF = "preempted_self"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class RunningTurn:
    """A running turn's outcome and the tokens it scheduled (0 unless SCHEDULED)."""

    outcome: TurnOutcome
    num_new_tokens: int = 0


class Admission(enum.Enum):
    """One waiting request's turn in the waiting loop."""

    #: Allocated: it moves to `running` with its new tokens.
    ADMITTED = "admitted"
    #: Set aside this step (its load runs, the connector says retry, or 0.11.0's oversized
    #: prompt): it returns to the head of the queue after the loop.
    SKIPPED = "skipped"
    #: The manager call failed (the auditor recorded why): it leaves the queue, failed.
    FAILED = "failed"
    #: The waiting loop ends here (refused: head-of-line blocking; 0.33.0's oversized prompt).
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class AdmissionTurn:
    """A waiting turn's outcome; for ADMITTED its new and computed tokens, for FAILED why."""

    outcome: Admission
    num_new_tokens: int = 0
    num_computed_tokens: int = 0
    error: AuditError | None = None


_NOTHING_DUE = RunningTurn(TurnOutcome.NOTHING_DUE)
_TURN_OF = {
    Allocation.PREEMPTED_SELF: RunningTurn(TurnOutcome.PREEMPTED_SELF),
    Allocation.FAILED: RunningTurn(TurnOutcome.FAILED),
}
_SKIPPED = AdmissionTurn(Admission.SKIPPED)
_STOP = AdmissionTurn(Admission.STOP)

#: One request's turn: (request, budget, plan, now_s) -> its outcome.
RequestTurn = Callable[[Request, int, StepPlan, float], RunningTurn]


class RunningPhase(Protocol):
    """The seam: a running phase, upstream's (`V1Scheduler.running_loop`) or the decode
    shortcuts' (`sim.scheduler.fast.v1`); returns the budget left."""

    def __call__(self, plan: StepPlan, budget: int, now_s: float) -> int: ...


class SpeedHooks(Protocol):
    """What the faithful scheduler tells the speed layer, and all it asks of it. Each call
    changes no decision; `NoSpeedLayer` does nothing (`sim.scheduler.fast.layer` explains
    the layer)."""

    def joined(self, request: Request) -> None:
        """`request` was appended to `running`."""

    def left(self, request: Request) -> None:
        """`request` left `running` (preempted or failed)."""

    def before_call(self, request: Request) -> None:
        """A real manager call on `request` follows (allocate, free)."""

    def after_call(self, request: Request) -> None:
        """A real `allocate_slots` on `request` succeeded."""

    def refusal_known(self, request: Request, num_new_tokens: int) -> bool:
        """True: `allocate_slots` for this waiting head is known to return None (skip it)."""
        ...

    def refused(self, request: Request, num_new_tokens: int) -> None:
        """`allocate_slots` for this waiting head returned None."""

    def step_done(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
        """`update_from_output` applied the step's outputs; `finished` left `running`."""

    def materialize(self) -> None:
        """Bring every request's tokens up to date."""

    def use_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a cohort; False where the layer cannot."""
        ...


class NoSpeedLayer:
    """The speed hooks with the layer off: every call is made, nothing is skipped."""

    def joined(self, request: Request) -> None:
        """Nothing to track."""

    def left(self, request: Request) -> None:
        """Nothing to track."""

    def before_call(self, request: Request) -> None:
        """Nothing was skipped, so the manager has nothing to catch up on."""

    def after_call(self, request: Request) -> None:
        """Nothing to track."""

    def refusal_known(self, request: Request, num_new_tokens: int) -> bool:
        """Never: every call is made."""
        return False

    def refused(self, request: Request, num_new_tokens: int) -> None:
        """Nothing to remember."""

    def step_done(self, plan: StepPlan, finished: list[Request], now_s: float) -> None:
        """No quiet decode or cohort to bring up to date."""

    def materialize(self) -> None:
        """Every request is always up to date."""

    def use_cohort(self, window: int | None) -> bool:
        """No cohort without the layer."""
        return False


class OutputHooks(Protocol):
    """When a step's output reaches the scheduler: at once (`SyncOutputs`), or a call later
    under async scheduling (`sim.scheduler.v1.async_scheduler.AsyncOutputs`)."""

    #: False: `V1Scheduler.update` applies the outputs itself.
    applies_outputs: bool
    #: Requests finished since the last `schedule()` (async: still reported to the loop).
    num_finished_unreported: int

    def last_step_in_flight(self, request: Request) -> bool:
        """The request's step in flight is its last: the running loop skips it."""
        ...

    def on_preempted(self, request: Request) -> None:
        """`request` was preempted (its C reset)."""

    def after_schedule(self, plan: StepPlan) -> None:
        """After `_update_after_schedule`: placeholders, in-flight tokens."""

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Apply `plan`'s outputs (only when `applies_outputs`)."""
        ...


class SyncOutputs:
    """The synchronous engine: outputs are applied in the step that scheduled them."""

    applies_outputs = False
    num_finished_unreported = 0

    def last_step_in_flight(self, request: Request) -> bool:
        """Nothing is ever in flight."""
        return False

    def on_preempted(self, request: Request) -> None:
        """Nothing in flight to mark."""

    def after_schedule(self, plan: StepPlan) -> None:
        """No placeholders."""

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """Never called (`applies_outputs` is False)."""
        raise AssertionError("SyncOutputs.update: V1Scheduler.update applies the outputs")


class V1Scheduler:
    """One replica's V1-engine scheduler over an audited `KVCacheManager`."""

    engine = "v1"

    def __init__(
        self,
        config: SchedulerConfig,
        kv_cache_manager: AuditedV1Manager,
        kv_connector: KVConnector | None = None,
    ) -> None:
        """`Scheduler.__init__` (0.11.0 L45-177, 0.33.0 L87-500), the parts modelled."""
        self.config = config
        self.kv_cache_manager = kv_cache_manager
        # What `SchedulerConfig.token_budget` resolves, never raised here: an explicit budget
        # below max_model_len without chunked prefill is refused at startup, as vLLM's
        # SchedulerConfig refuses it (`sim.scenario.startup.check_token_budget`).
        self.token_budget = config.token_budget("v1")
        #: `SchedulerConfig.max_concurrent_batches` (2 under async scheduling), read once.
        self.max_concurrent_batches = config.max_concurrent_batches
        #: The pinned release's waiting-side rules (`sim.scheduler.v1.release`); 0.33.0's gate
        #: caps a sliding window by `max_in_flight_tokens` (`config/vllm.py:L600-609`).
        self.release_policies = policies_for(
            kv_cache_manager, self.token_budget, self.max_concurrent_batches
        )
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        #: 4ac7713 / 0.11.0 under PRIORITY with exact arrival times: where the real waiting
        #: heap would raise on a tie (`use_exact_arrival_times`); else its no-op hooks.
        self._ties: HeapTieMirror | NoTieMirror = NoTieMirror()
        #: The PRIORITY victim's key: kvsim's total order, or vLLM's own (see there).
        self._victim_key: Callable[[Request], tuple[int, float] | tuple[int, float, int]] = (
            priority_key
        )
        #: When outputs are applied (`install_output_hooks`): at once, or async's a call later.
        self.outputs: OutputHooks = SyncOutputs()
        #: The speed layer's hooks (`install_speed_layer`); off: every call is made.
        self.speed: SpeedHooks = NoSpeedLayer()
        #: The running phase (the seam): upstream's loop, or the decode shortcuts' in its place.
        self.running_phase: RunningPhase = self.running_loop
        #: Prefix-cache hits can only happen with caching on (a manager that does not say is
        #: taken to have it); without, the lookup is a pure ([], 0) and is not made.
        self.prefix_hits_possible = getattr(kv_cache_manager, "enable_caching", True) is not False
        # PRIORITY preemptions during one running turn: the running-loop indices
        # of the victims and the tokens refunded to the budget (0.33.0's rule).
        self._victim_indices: list[tuple[int, bool]] = []
        self._refunded_tokens = 0
        #: `long_prefill_token_threshold` as it applies in the current step (`schedule`).
        self.step_threshold = config.long_prefill_token_threshold
        #: The KV connector's scheduler side (`sim.kv_connector`); no-ops without one.
        self.connector_hooks = ConnectorHooks(kv_connector or NoConnector(), kv_cache_manager)
        #: `need_mamba_block_aligned_split` (0.19.1 `L252-254`): Mamba prefix caching
        #: ("align" mode) trims prefill chunks to block boundaries (`mamba_align`).
        self.mamba_split: MambaAlignedSplit | None = None
        align_block_size = getattr(kv_cache_manager, "mamba_align_block_size", None)
        rule = split_rule_for(self.release_policies.release)
        if align_block_size is not None and rule is not None:
            self.mamba_split = self._mamba_split_for(rule, align_block_size)
        #: `kv_cache_manager.new_step_starts` (0.19.1 on, `L381`), where the manager has it.
        self._new_step_starts: Callable[[], None] | None = getattr(
            kv_cache_manager, "new_step_starts", None
        )

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
        return isinstance(self._ties, HeapTieMirror)

    def install_speed_layer(self, hooks: SpeedHooks, running_phase: RunningPhase) -> None:
        """Let the speed layer take the running phase and hear the hooks (no upstream
        counterpart; `sim.scheduler.fast.v1.with_decode_shortcuts`). Call before the first
        request."""
        self.speed = hooks
        self.running_phase = running_phase

    @property
    def tie_mirror(self) -> HeapTieMirror | NoTieMirror:
        """The PRIORITY heap's tie mirror (`use_exact_arrival_times`); its `error` is set where
        the real heap died."""
        return self._ties

    def install_output_hooks(self, hooks: OutputHooks) -> None:
        """Apply outputs as `hooks` say (async scheduling:
        `sim.scheduler.v1.async_scheduler.make_v1_scheduler`). Call before the first request."""
        self.outputs = hooks

    def use_decode_cohort(self, window: int | None) -> bool:
        """Keep steady decodes in a decode cohort (`sim.scheduler.fast.cohort`) where the speed
        layer can (no upstream counterpart); call before the first step. False: every step
        visits every request."""
        return self.speed.use_cohort(window)

    # ------------------------------------------------------------------ schedule
    def schedule(self, now_s: float) -> StepPlan:
        """`schedule` (0.11.0 L179-627, 0.33.0 L699-1784): the running loop, the waiting loop
        unless something was preempted, `_update_after_schedule`, the connector's metadata."""
        plan = StepPlan()
        self.connector_hooks.poll(now_s)  # the transfers the last step's worker reported
        self.step_threshold = self.config.long_prefill_token_threshold
        if self.release_policies.lone_request_ignores_threshold and self.num_unfinished() <= 1:
            self.step_threshold = 0  # 0.33.0 L754-762: nobody to starve (`release`)
        if self._new_step_starts is not None:
            self._new_step_starts()  # (0.19.1 L381): Mamba "align" forgets this step's caching
        budget = self.running_phase(plan, self.token_budget, now_s)
        if plan.num_preempted == 0:
            self._schedule_waiting(plan, budget, now_s)
        self._update_after_schedule(plan)
        self.outputs.after_schedule(plan)  # async: placeholders (`async_scheduler.py`)
        self.connector_hooks.build_connector_meta(plan, now_s)  # (0.11.0 L604-607)
        if self._ties.error is not None:
            plan.fatal_error = self._ties.error  # the real engine died in this call or before
        return plan

    def running_loop(
        self, plan: StepPlan, budget: int, now_s: float, request_turn: RequestTurn | None = None
    ) -> int:
        """The running loop (0.11.0 L208-320, 0.33.0 L793-1036); returns the token budget
        left. `request_turn` is one request's turn, `running_turn` unless the speed layer
        gives its own."""
        turn_of = request_turn or self.running_turn
        index = 0
        while index < len(self.running) and budget > 0:
            turn = turn_of(self.running[index], budget, plan, now_s)
            if self._victim_indices:  # PRIORITY victims left `running` (see `_preempt`)
                index, budget = self._after_priority_preemption(index, budget)
            outcome = turn.outcome
            if outcome is TurnOutcome.FAILED:
                continue  # it left `running`
            if outcome is TurnOutcome.PREEMPTED_SELF:
                if self.config.policy is Policy.FCFS or (
                    self.release_policies.priority_victim.self_preemption_ends_loop
                ):
                    break
                continue  # 0.33.0: the next request now sits at `index`
            budget -= turn.num_new_tokens
            index += 1
        return budget

    def running_turn(
        self, request: Request, budget: int, plan: StepPlan, now_s: float
    ) -> RunningTurn:
        """The running loop's body for one request (0.11.0 L211-300, 0.33.0 L796-1036): its
        new tokens, `allocate_slots` (preempting from the tail until they fit), the work."""
        seq = request.seq
        computed = seq.num_computed_tokens
        placeholders = request.num_output_placeholders  # 0 unless async (0.11.0 L213-215)
        if placeholders and self.outputs.last_step_in_flight(request):
            return _NOTHING_DUE
        num_new = self._clamp(seq.content.num_tokens + placeholders - computed, budget)
        num_new = min(num_new, self.config.max_model_len - 1 - computed)
        if self.mamba_split is not None and num_new > 0:  # (0.19.1 L437-440)
            num_new = self.mamba_split.split(
                num_new,
                computed,
                seq.content.num_tokens,
                seq.prompt_len,
                junction_tokens=request.mamba_junction_tokens,
            )
        if num_new <= 0:
            return _NOTHING_DUE
        self.speed.before_call(request)
        allocation = self.allocate_running(request, num_new, plan, now_s)
        if allocation is not Allocation.FITS:
            return _TURN_OF[allocation]
        self.speed.after_call(request)
        plan.scheduled.append(
            ScheduledWork(
                request, num_new, seq.num_computed_tokens, self._is_prefill(request, num_new)
            )
        )
        return RunningTurn(TurnOutcome.SCHEDULED, num_new)

    def _clamp(self, num_new: int, budget: int) -> int:
        """`long_prefill_token_threshold`, then the budget (0.11.0 L216-220, 0.33.0 L844-846).
        Example: 100 new tokens, threshold 64, budget 48: 48."""
        threshold = self.step_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return min(num_new, budget)

    def allocate_running(
        self, request: Request, num_new: int, plan: StepPlan, now_s: float
    ) -> Allocation:
        """`allocate_slots` for a running request, preempting until it fits (0.11.0 L254-292,
        0.33.0 L913-990)."""
        while True:
            try:
                blocks = self.kv_cache_manager.allocate_slots(
                    request.seq, num_new, 0, None, self.config.num_lookahead_slots
                )
            except AuditError as error:
                self.speed.left(request)
                self.running.remove(request)
                self._fail(request, plan, error, now_s)
                return Allocation.FAILED
            if blocks is not None:
                return Allocation.FITS
            if self._preempt(plan) is request:
                return Allocation.PREEMPTED_SELF

    def _preempt(self, plan: StepPlan) -> Request:
        """Preempt the last running request (PRIORITY: the worst) by recompute (0.11.0
        L262-282; 0.33.0 L930-990 and `_preempt_request`, L1799-1843)."""
        if self.config.policy is Policy.PRIORITY:
            victim = max(self.running, key=self._victim_key)
            victim_index = self.running.index(victim)
            del self.running[victim_index]
            refunded = self.release_policies.priority_victim.unschedule(plan, victim)
            # A scheduled victim refunds >= 1 token under every rule that reads this flag.
            self._victim_indices.append((victim_index, refunded > 0))
            self._refunded_tokens += refunded
        else:
            victim = self.running.pop()
        self.speed.left(victim)
        self.speed.before_call(victim)
        self.kv_cache_manager.free(victim.seq)
        victim.state = RequestState.WAITING
        victim.seq.status = SequenceStatus.PREEMPTED
        victim.seq.num_computed_tokens = 0
        self.outputs.on_preempted(victim)
        victim.num_preemptions += 1
        plan.num_preempted += 1
        self._enqueue(victim, front=True)
        self._ties.push(victim)
        return victim

    def _after_priority_preemption(self, index: int, budget: int) -> tuple[int, int]:
        """The running loop's index and budget after PRIORITY victims left `running`
        (`release.PriorityVictimRule`: unchanged at 0.11.0, corrected at 0.33.0 L960-990)."""
        rule = self.release_policies.priority_victim
        for victim_index, was_scheduled in self._victim_indices:
            index = rule.index_after_removal(index, victim_index, was_scheduled)
        self._victim_indices.clear()
        budget += self._refunded_tokens
        self._refunded_tokens = 0
        return index, budget

    def _schedule_waiting(self, plan: StepPlan, budget: int, now_s: float) -> None:
        """The waiting loop (0.11.0 L334-541, 0.33.0 L1049-1610): one `_admission_turn` per
        head until the budget or `max_num_seqs` (0.11.0 L337-338, 0.33.0 L1072-1074) runs
        out. 4ac7713 / 0.11.0 collect the skipped requests into a side queue that is then
        prepended whole (0.11.0 L434, L541; 0.33.0 L1054-1060, L1607-1610): they return to the
        head in *reverse* skip order ([A, B] skipped -> waiting [B, A, ...])."""
        skipped: list[Request] = []
        ties = self._ties
        while self.waiting and budget > 0:
            if len(self.running) == self.config.max_num_seqs:
                break
            request = self.waiting[0]
            turn = self._admission_turn(request, budget, now_s)
            outcome = turn.outcome
            if outcome is Admission.ADMITTED:
                self.waiting.popleft()
                ties.pop()
                self._admit(request, turn, plan, now_s)
                budget -= turn.num_new_tokens
            elif outcome is Admission.SKIPPED:
                skipped.append(self.waiting.popleft())
                ties.skip(request)
            elif outcome is Admission.FAILED:
                assert turn.error is not None
                self.waiting.popleft()
                ties.pop()
                self._fail(request, plan, turn.error, now_s)
            else:
                break
        for request in skipped:
            self._enqueue(request, front=True)
        if skipped:
            ties.return_skipped()

    def _admission_turn(self, request: Request, budget: int, now_s: float) -> AdmissionTurn:
        """The waiting loop's body for the head (0.11.0 L340-505, 0.33.0 L1076-1530): a load
        still running parks it (0.11.0 L343-353, 0.33.0 `_handle_blocked_waiting_request`
        L3519-3554); the local prefix hit and the connector's external tokens (0.11.0
        L376-402, 0.33.0 L1120-1160); its new tokens; `allocate_slots` behind the pinned
        release's admission gate (0.11.0 L471-483, 0.33.0 L1435-1461); the connector's
        `update_state_after_alloc` (0.11.0 L489-504, 0.33.0 L1478-1525)."""
        hooks = self.connector_hooks
        if request.state is RequestState.WAITING_FOR_REMOTE_KVS:
            if not hooks.update_waiting_for_remote_kv(request):
                return _SKIPPED
            request.state = RequestState.WAITING
        seq = request.seq
        uncached_prefix = 0
        if seq.num_computed_tokens == 0 and self.prefix_hits_possible:
            hit_block_ids, num_computed = self.kv_cache_manager.get_computed_blocks(seq)
            uncached_prefix = self._note_shared_prefix(request, num_computed)
        else:  # (without prefix caching the lookup is a pure ([], 0))
            hit_block_ids, num_computed = [], seq.num_computed_tokens
        num_external, load_async = 0, False
        if hooks.enabled and seq.num_computed_tokens == 0:
            match = hooks.get_num_new_matched_tokens(request, num_computed)
            if match.status is MatchStatus.RETRY_LATER:
                return _SKIPPED
            num_external, load_async = match.num_external_tokens, match.load_async
        # Loading: no new work until the load completes (0.11.0 L414-417).
        num_new = 0 if load_async else self._waiting_num_new(seq, num_computed + num_external)
        if num_new > budget and not self.config.enable_chunked_prefill:
            return _SKIPPED if self.release_policies.oversized_prompt.skips_to_next else _STOP
        num_new = min(num_new, budget)
        if self.mamba_split is not None and not load_async:  # (0.19.1 L701-709)
            num_new = self.mamba_split.split(
                num_new,
                num_computed + num_external,
                seq.num_tokens,
                seq.prompt_len,
                uncached_prefix_tokens=uncached_prefix,
                junction_tokens=request.mamba_junction_tokens,
            )
            if num_new == 0:
                return _STOP
        num_new_hit = num_computed if seq.num_computed_tokens == 0 else 0
        if self.speed.refusal_known(request, num_new):
            return _STOP
        try:
            blocks = self._allocate_waiting(seq, num_new + num_external, num_new_hit, hit_block_ids)
        except AuditError as error:
            return AdmissionTurn(Admission.FAILED, error=error)
        if blocks is None:
            self.speed.refused(request, num_new)
            return _STOP
        if hooks.enabled:
            hooks.update_state_after_alloc(request, num_new_hit, num_external, now_s)
            if load_async:
                request.state = RequestState.WAITING_FOR_REMOTE_KVS
                return _SKIPPED
            num_computed += num_external
        return AdmissionTurn(Admission.ADMITTED, num_new, num_computed)

    def _mamba_split_for(self, rule: SplitRule, block_size: int) -> MambaAlignedSplit:
        """The release's split; 0.33.0's reads the prefill limit (`max_num_scheduled_tokens`
        capped by a positive `long_prefill_token_threshold`) and whether the Mamba groups have
        prefill checkpoint blocks (`sched/scheduler.py:L445-449, L611-616 @0.33.0`).

        kvsim's own (no upstream counterpart).
        """
        limit = self.config.token_budget("v1")
        threshold = self.config.long_prefill_token_threshold
        if threshold > 0:
            limit = min(limit, threshold)
        checkpoint_blocks = bool(
            getattr(self.kv_cache_manager, "mamba_prefill_checkpoint_blocks", 0)
        )
        return MambaAlignedSplit(rule, block_size, limit, checkpoint_blocks)

    def _note_shared_prefix(self, request: Request, num_hit_tokens: int) -> int:
        """After a prefix lookup: the uncached shared prefix ``u`` (the full-attention hit less
        the final one) for 0.25.1's Mamba split, and the junction ``hit + u`` (0 when ``u =
        0``) kept on the request, for 0.26.0's Mamba split (`mamba_align`) and 0.33.0's
        sparse retention (Mamba and sliding groups). Example: hit 0, u = 20 -> junction 20.

        Upstream: `sched/scheduler.py:L728-734 (0.25.1)`, `kv_cache_manager.py:L264-281
        (0.26.0)`, `sched/scheduler.py:L1110-1126 (0.33.0)`.
        """
        uncached = int(getattr(self.kv_cache_manager, "num_uncached_common_prefix_tokens", 0))
        if self.mamba_split is None:
            # 0.33.0 keeps the junction on every lookup; a sliding group's sparse retention
            # caches the window there (`sim.kv.v1_engine.sliding_retention`).
            request.seq.shared_prefix_boundary = num_hit_tokens + uncached if uncached else 0
        elif self.mamba_split.rule in (
            SplitRule.STOPS,
            SplitRule.CHECKPOINTS,
        ):
            request.mamba_junction_tokens = num_hit_tokens + uncached if uncached else 0
            # 0.33.0's sparse retention keeps the state there (the manager reads the seq).
            request.seq.shared_prefix_boundary = request.mamba_junction_tokens
        return uncached

    def _waiting_num_new(self, seq: Sequence, num_computed: int) -> int:
        """A waiting request's new tokens before the budget: the rest of its tokens, capped by
        `long_prefill_token_threshold` (0.11.0 L415-428, 0.33.0 L1330-1333). Example: a
        300-token prompt with a 100-token hit under a threshold of 128: 128."""
        num_new = seq.num_tokens - num_computed
        threshold = self.step_threshold
        if 0 < threshold < num_new:
            num_new = threshold
        return num_new

    def _allocate_waiting(
        self, seq: Sequence, num_tokens: int, num_new_hit: int, hit_block_ids: list[int]
    ) -> list[int] | None:
        """`allocate_slots` for a waiting request (0.11.0 L471-483, 0.33.0 L1435-1452), behind
        the pinned release's admission gate (`release.AdmissionGate`: 0.33.0's full-sequence
        gate refuses like `allocate_slots`, None)."""
        manager = self.kv_cache_manager
        if not self.release_policies.admission.admits(
            manager, seq, hit_block_ids if num_new_hit else []
        ):
            return None
        return manager.allocate_slots(
            seq, num_tokens, num_new_hit, hit_block_ids, self.config.num_lookahead_slots
        )

    def _admit(self, request: Request, turn: AdmissionTurn, plan: StepPlan, now_s: float) -> None:
        """An allocated head joins `running` with its new tokens (0.11.0 L505-537, 0.33.0
        L1527-1590)."""
        seq = request.seq
        num_computed = turn.num_computed_tokens
        self.running.append(request)
        self.speed.joined(request)
        self.speed.after_call(request)
        request.state = RequestState.RUNNING
        seq.status = SequenceStatus.RUNNING
        if request.first_scheduled_s is None:
            request.first_scheduled_s = now_s
            request.num_prefix_hit_tokens = num_computed
        seq.num_computed_tokens = num_computed
        plan.scheduled.append(ScheduledWork(request, turn.num_new_tokens, num_computed, True))

    @staticmethod
    def _update_after_schedule(plan: StepPlan) -> None:
        """`_update_after_schedule` (0.11.0 L629-658, 0.33.0 L1845-1877): computed tokens
        advance now, for every scheduled request (at 4ac7713 this includes a priority victim
        scheduled earlier in the same step), the quiet decodes included."""
        for work in plan.scheduled:
            work.request.seq.num_computed_tokens += work.num_tokens
        for request in plan.quiet:
            request.seq.num_computed_tokens += 1

    # ------------------------------------------------------------------ outputs
    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """`update_from_output` (0.11.0 L861-1022, 0.33.0 L2259-2676): sample for requests
        whose tokens are all computed; finish them (`_free_request`, 0.11.0 L1147-1160,
        0.33.0 L3031-3062)."""
        if self.outputs.applies_outputs:
            return self.outputs.update(plan, now_s)  # async: a step scheduled a call earlier
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
            self.speed.before_call(request)
            self.connector_hooks.free_finished(request)
            finish(request, reason, now_s)
            finished.append(request)
        if finished:
            self.running = [r for r in self.running if not r.state.is_terminal]
        self.speed.step_done(plan, finished, now_s)
        return finished

    # ------------------------------------------------------------------ queues
    def add_request(self, request: Request) -> None:
        """`add_request` (0.11.0 L1097-1101, 0.33.0 L2931-2962): into the waiting queue."""
        self._enqueue(request, front=False)
        self._ties.push(request)

    def _enqueue(self, request: Request, front: bool) -> None:
        """FCFS: append (or prepend after preemption). PRIORITY: insert in (priority, arrival)
        order (`sched/request_queue.py`, both releases)."""
        if self.config.policy is Policy.PRIORITY:
            index = len(self.waiting)
            while index > 0 and priority_key(self.waiting[index - 1]) > priority_key(request):
                index -= 1
            self.waiting.insert(index, request)
        elif front:
            self.waiting.appendleft(request)
        else:
            self.waiting.append(request)

    def num_unfinished(self) -> int:
        """`get_num_unfinished_requests` (0.11.0 L1167-1168, 0.33.0 L3147-3155)."""
        return len(self.waiting) + len(self.running)

    def has_requests(self) -> bool:
        """`has_requests` (`sched/interface.py`, 0.11.0 L126-129): what the engine core asks
        before it schedules; kvsim's synchronous engine reports finishes at once, so it is
        `has_unfinished`; async, the finishes not yet reported count too."""
        return self.has_unfinished() or self.outputs.num_finished_unreported > 0

    def has_unfinished(self) -> bool:
        """`has_unfinished_requests` (`sched/interface.py`, 0.11.0 L106-109, 0.33.0 L185):
        anything waiting or running."""
        return bool(self.waiting or self.running)

    def unfinished(self) -> list[Request]:
        """Every request not finished, running first, each brought up to date (kvsim's; upstream
        keeps them in `self.requests`, 0.11.0 L1097-1101)."""
        self.materialize()
        return [*self.running, *self.waiting]

    def materialize(self) -> None:
        """Bring every request's tokens up to date (the speed layer's decode cohort; no upstream
        counterpart: upstream's requests are never behind)."""
        self.speed.materialize()

    def _fail(self, request: Request, plan: StepPlan, error: AuditError, now_s: float) -> None:
        fail(self.kv_cache_manager, request, plan, error, now_s)

    @staticmethod
    def _is_prefill(request: Request, num_new: int) -> bool:
        seq = request.seq
        num_tokens = seq.num_tokens + request.num_output_placeholders
        return not (
            num_new == 1
            and num_tokens > seq.prompt_len
            and seq.num_computed_tokens == num_tokens - 1
        )


def check_stop(request: Request, max_model_len: int) -> str | None:
    """`check_stop` (`sched/utils.py`, 0.11.0 L43-70, 0.33.0 L98-140), its length rules (0.11.0 L46-49,
    0.33.0 L114-119): the
    finish reason, or None while the request runs on. Example: a 100-token prompt with
    max_tokens 8 stops at 108 tokens ("length: generated max_tokens"); with max_model_len 105
    it stops at 105 already.
    """
    num_tokens = request.seq.content.num_tokens
    if num_tokens - request.seq.prompt_len >= request.max_tokens:
        return "length: generated max_tokens"
    if num_tokens >= max_model_len:
        return "length: reached max_model_len"
    return None


def _priority_and_arrival(request: Request) -> tuple[int, float]:
    return (request.priority, request.arrival_s)
