"""vLLM's `AsyncScheduler` (`vllm/v1/core/sched/async_scheduler.py`), 0.11.0 and 0.33.0.

With async scheduling the engine core schedules step N+1 while step N runs
(`sim.scheduler.v1.engine_core`), so `schedule()` sees requests whose last step has not
returned. Upstream, `AsyncScheduler` subclasses `Scheduler`; here its overrides are
`AsyncOutputs`, `V1Scheduler`'s output hooks (installed by `make_v1_scheduler`; hooks, not a
subclass, keep the compiled core's class closed), and what differs between the two releases
is one small class each (`AsyncRelease`):

* **Output placeholders** (`Request.num_output_placeholders`): a step that will sample adds
  one at schedule time (`_update_after_schedule`: 0.11.0 `async_scheduler.py:L16-27`, 0.33.0
  `L24-46`), the token it returns removes it (0.11.0 `L29-40`, 0.33.0
  `sched/scheduler.py:L2766-2769`). The running loop asks for `num_tokens + placeholders -
  num_computed_tokens` new tokens (0.11.0 `sched/scheduler.py:L213-215`, 0.33.0 `L838-842`),
  so a decode is scheduled again before its previous token is known.
* **In-flight tokens** (0.33.0 only, `Sequence.num_in_flight_tokens`): counted at schedule time
  (0.33.0 `L1859`), settled when the step's output is applied (`L2318`); out-of-window blocks
  are freed below C minus them (`kv_cache_manager.py:L558-568`, `sim.kv.pins`), and the
  full-sequence admission cap counts `max_in_flight_tokens = 2 x max_num_batched_tokens`
  (`config/vllm.py:L587-609`, `sim.scheduler.v1.release.FullSequenceGate`). 0.11.0 frees on C
  and has no such cap.
* **The settled basis of caching**: once a step's token is appended, blocks are cached up to
  C - placeholders (0.11.0 `async_scheduler.py:L42-46`) or C - in-flight (0.33.0
  `sched/scheduler.py:L2403-2416`), for a request that was running.
* **Finishes are seen a step late**: the token that ends a request comes back after the next
  step was scheduled, and 0.11.0 has scheduled the request once more (its slot allocated, its
  blocks freed with the finish); 0.33.0 skips a request whose in-flight step is already its
  last (`sched/scheduler.py:L798-812`). An output for a finished request is dropped (0.11.0
  `L886-891`, 0.33.0 `L2325-2334`).
* **Blocks a step in flight reads**: the auditor is told of each step when it is scheduled
  and when its output is back, and reports a sliding-window block pruned in between
  (`sim.audit.in_flight`: before 0.26.0 the prune counts the in-flight tokens as computed).
* **Preemption with a step in flight**: the step's token is still delivered, to the request
  now waiting (it may even finish there and leave the waiting queue, 0.11.0 `L929-934`,
  `L996-998`). 0.11.0 keeps its placeholders; 0.33.0 zeroes them and marks the in-flight
  tokens stale (`_preempt_request`, `L1826-1836`), so their output touches no counter
  (`L2319-2323`, `L2366-2369`).

Example (0.11.0, a 4-token prompt, max_tokens 2, a decode each step): step 0 schedules 4
tokens (placeholder 1); step 1 is scheduled before step 0's output (1 token: 4 + 1 - 4,
placeholders 2); step 0's output appends token 1 (placeholders 1); step 2 schedules 1 more
(placeholders 2); step 1's output appends token 2: the request finishes and step 2's output is
dropped. 0.33.0 does not schedule step 2 (its in-flight step 1 is the last).

Left out: speculative decoding (the spec-token placeholders, 0.33.0 `L26-49`), structured
output (`pending_structured_output_tokens`), PP / the V2 model runner's decode stagger (0.33.0
`L14-22`, `L51-56`), KV connectors (refused: a connector with async scheduling is not
modelled) and drop-mode stale outputs (connectors that require KV delivery, streaming
sessions).
"""

from __future__ import annotations

import abc

from sim.audit import AuditedV1Manager
from sim.errors import InputError
from sim.kv.pins import VllmPin
from sim.kv_connector.base import KVConnector
from sim.scheduler.config import SchedulerConfig
from sim.scheduler.lifecycle import finish, sample_token
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan
from sim.scheduler.v1.scheduler import V1Scheduler, check_stop


def add_sampling_placeholder(work: ScheduledWork) -> None:
    """0.19.1 on (`async_scheduler.py:L18-34 @0.19.1`, `L31-46 @0.33.0`): a step that is not a
    prefill chunk (C reaches every known and promised token) samples one token."""
    request = work.request
    seq = request.seq
    if seq.num_computed_tokens >= seq.num_tokens + request.num_output_placeholders:
        request.num_output_placeholders += 1
        work.samples = True


def last_step_reached(request: Request) -> bool:
    """0.33.0 `sched/scheduler.py:L798-812` (0.19.1 on): C + 2 - placeholders reaches
    prompt + max_tokens. Example: a 10-token prompt, max_tokens 1, its prefill in flight
    (C = 10, one placeholder): 10 + 2 - 1 = 11 >= 11, so it is not scheduled again."""
    seq = request.seq
    return (
        seq.num_computed_tokens + 2 - request.num_output_placeholders
        >= seq.prompt_len + request.max_tokens
    )


class AsyncRelease(abc.ABC):
    """What one release's `AsyncScheduler` does with placeholders and in-flight tokens."""

    @abc.abstractmethod
    def after_schedule(self, work: ScheduledWork) -> None:
        """After C advanced: give a step that samples its placeholder, mark `work.samples`."""

    @abc.abstractmethod
    def last_step_in_flight(self, request: Request) -> bool:
        """True: the step in flight is the request's last; the running loop skips it."""

    @abc.abstractmethod
    def on_preempted(self, request: Request) -> None:
        """The request was preempted with steps in flight."""

    @abc.abstractmethod
    def settle(self, work: ScheduledWork) -> bool:
        """The step's output arrived for `work`; True when it is stale (predates a
        preemption)."""

    @abc.abstractmethod
    def after_token(
        self, request: Request, stale: bool, was_running: bool, manager: AuditedV1Manager
    ) -> None:
        """The step's token was appended: resolve its placeholder, cache what is settled."""


class AsyncRelease0110(AsyncRelease):
    """0.11.0 (`async_scheduler.py:L14-47`); 4ac7713 is taken to decide the same (not
    verified: no 4ac7713 install is driven)."""

    def after_schedule(self, work: ScheduledWork) -> None:
        """L20-27: a step whose tokens reach every known and promised token samples one."""
        request = work.request
        seq = request.seq
        if seq.num_computed_tokens == seq.num_tokens + request.num_output_placeholders:
            request.num_output_placeholders += 1
            work.samples = True

    def last_step_in_flight(self, request: Request) -> bool:
        """0.11.0 has no such check: the request is scheduled once more."""
        return False

    def on_preempted(self, request: Request) -> None:
        """0.11.0 keeps the placeholders (`sched/scheduler.py:L272-277` resets C only)."""

    def settle(self, work: ScheduledWork) -> bool:
        """No stale outputs at 0.11.0."""
        return False

    def after_token(
        self, request: Request, stale: bool, was_running: bool, manager: AuditedV1Manager
    ) -> None:
        """L38-46: one placeholder resolved (even for a preempted request); a running one
        caches up to C - placeholders."""
        request.num_output_placeholders -= 1
        assert request.num_output_placeholders >= 0, request.request_id
        if was_running:
            seq = request.seq
            manager.cache_blocks(seq, seq.num_computed_tokens - request.num_output_placeholders)


class AsyncRelease0191(AsyncRelease0110):
    """0.19.1 to 0.25.1 (`async_scheduler.py:L18-58 @0.19.1`): the placeholder is added to a
    step that is not a prefill chunk, and a request whose in-flight step is its last is
    skipped (as 0.33.0); preemption keeps placeholders and caching is on C - placeholders (as
    0.11.0). No in-flight tokens."""

    def after_schedule(self, work: ScheduledWork) -> None:
        """`_update_after_schedule` (0.19.1 `sched/scheduler.py:L992-994`, then
        `async_scheduler.py:L18-34`): not a prefill chunk -> one placeholder."""
        add_sampling_placeholder(work)

    def last_step_in_flight(self, request: Request) -> bool:
        """0.19.1 `sched/scheduler.py:L390-403`, as 0.33.0's."""
        return last_step_reached(request)


class AsyncRelease0260(AsyncRelease0191):
    """0.26.0: 0.19.1's rules plus in-flight tokens (`sched/scheduler.py:L1250`, settled at
    `L1656` whatever the request's state since), which the processed-basis frees and the
    sliding-window cap read; a preempted request's output is still applied (no stale
    outputs: `_preempt_request`, L1212-1233, keeps the placeholders)."""

    def after_schedule(self, work: ScheduledWork) -> None:
        work.request.seq.num_in_flight_tokens += work.num_tokens
        super().after_schedule(work)

    def settle(self, work: ScheduledWork) -> bool:
        work.request.seq.num_in_flight_tokens -= work.num_tokens
        return False


class AsyncRelease0330(AsyncRelease):
    """0.33.0 (`async_scheduler.py:L24-49` and `sched/scheduler.py`'s in-flight tokens)."""

    def after_schedule(self, work: ScheduledWork) -> None:
        """`sched/scheduler.py:L1859-1865` (in-flight tokens, `is_prefill_chunk`), then
        `async_scheduler.py:L31-46`: a step that is not a prefill chunk samples one token."""
        work.request.seq.num_in_flight_tokens += work.num_tokens
        add_sampling_placeholder(work)

    def last_step_in_flight(self, request: Request) -> bool:
        """`sched/scheduler.py:L798-812`."""
        return last_step_reached(request)

    def on_preempted(self, request: Request) -> None:
        """`_preempt_request` L1826-1836: the in-flight share becomes stale, no placeholders."""
        request.num_stale_output_tokens = request.seq.num_in_flight_tokens
        request.num_output_placeholders = 0

    def settle(self, work: ScheduledWork) -> bool:
        """L2316-2323: the step's tokens leave the in-flight count; a stale share drains."""
        request = work.request
        request.seq.num_in_flight_tokens -= work.num_tokens
        if request.num_stale_output_tokens > 0:
            request.num_stale_output_tokens -= work.num_tokens
            assert request.num_stale_output_tokens >= 0, request.request_id
            return True
        return False

    def after_token(
        self, request: Request, stale: bool, was_running: bool, manager: AuditedV1Manager
    ) -> None:
        """L2402-2416 and L2766-2769: unless stale, the placeholder is resolved and a running
        request caches up to C - in-flight."""
        if stale:
            return
        had_placeholders = request.num_output_placeholders > 0
        if had_placeholders:
            request.num_output_placeholders -= 1
        if was_running and had_placeholders:
            seq = request.seq
            manager.cache_blocks(seq, seq.num_computed_tokens - seq.num_in_flight_tokens)


def async_release_for(pin: VllmPin) -> AsyncRelease:
    """The pinned release's `AsyncScheduler` rules."""
    if pin.drops_stale_outputs:
        return AsyncRelease0330()
    if pin.counts_in_flight_tokens:
        return AsyncRelease0260()
    if pin.skips_request_with_last_step_in_flight:
        return AsyncRelease0191()
    return AsyncRelease0110()


class AsyncOutputs:
    """`AsyncScheduler`'s overrides as `V1Scheduler`'s output hooks (module docstring);
    driven by `sim.scheduler.v1.engine_core.EngineCoreLoop`, which applies a step's output
    only after the next step was scheduled."""

    applies_outputs = True

    def __init__(self, scheduler: V1Scheduler) -> None:
        self.scheduler = scheduler
        self.async_release = async_release_for(scheduler.release_policies.release)
        #: Requests finished since the last `schedule()` (vLLM's `finished_req_ids`): the
        #: engine core keeps calling the scheduler while any are unreported
        #: (`has_requests`, `sched/interface.py`, 0.11.0 L126-129, 0.33.0 L205-208).
        self.num_finished_unreported = 0
        #: The auditor checks that no block a step in flight reads is pruned under it
        #: (`sim.audit.in_flight`); only a sliding-window group can be.
        self.tracks_in_flight_reads = scheduler.kv_cache_manager.tracks_in_flight_reads

    def last_step_in_flight(self, request: Request) -> bool:
        return self.async_release.last_step_in_flight(request)

    def on_preempted(self, request: Request) -> None:
        self.async_release.on_preempted(request)

    def after_schedule(self, plan: StepPlan) -> None:
        """`_update_after_schedule` (0.11.0 `async_scheduler.py:L16-27`, 0.33.0 L24-56): after
        C advanced as in the synchronous scheduler, the release's placeholder rule."""
        after_schedule = self.async_release.after_schedule
        for work in plan.scheduled:
            after_schedule(work)
        if self.tracks_in_flight_reads:  # the auditor's in-flight read check
            note = self.scheduler.kv_cache_manager.note_step_scheduled
            for work in plan.scheduled:
                note(work.request.seq, work.num_tokens)
        self.num_finished_unreported = 0

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        """`update_from_output` for a step scheduled one call earlier (0.11.0 L861-1002, 0.33.0
        L2259-2676 with `_update_request_with_output`): each sampled token goes to its request,
        running or preempted since; finished requests leave `running` or `waiting`."""
        scheduler, release = self.scheduler, self.async_release
        finished: list[Request] = []
        finished_waiting: list[Request] = []
        manager = scheduler.kv_cache_manager
        for work in plan.scheduled:
            request = work.request
            stale = release.settle(work)
            if self.tracks_in_flight_reads:
                manager.note_step_settled(request.seq, work.num_context_tokens)
            if request.state.is_terminal or not work.samples:
                continue  # finished already (its output is dropped), or a prefill chunk
            was_running = request.state is RequestState.RUNNING
            if was_running:
                request.is_prefill = False
            sample_token(request, now_s)
            reason = check_stop(request, scheduler.config.max_model_len)
            release.after_token(request, stale, was_running, scheduler.kv_cache_manager)
            if reason is None:
                continue
            scheduler.connector_hooks.free_finished(request)
            finish(request, reason, now_s)
            finished.append(request)
            if not was_running:
                finished_waiting.append(request)
        if finished:
            scheduler.running = [r for r in scheduler.running if not r.state.is_terminal]
            self.num_finished_unreported += len(finished)
        if finished_waiting:  # 0.11.0 L996-998, 0.33.0 the same
            scheduler.waiting = type(scheduler.waiting)(
                r for r in scheduler.waiting if not r.state.is_terminal
            )
            scheduler.tie_mirror.remove(finished_waiting)
        scheduler.speed.step_done(plan, finished, now_s)
        return finished


def make_v1_scheduler(
    config: SchedulerConfig,
    kv_cache_manager: AuditedV1Manager,
    kv_connector: KVConnector | None = None,
) -> V1Scheduler:
    """The scheduler class vLLM's `get_scheduler_cls()` picks: `AsyncScheduler` under async
    scheduling, else `Scheduler` (0.11.0 `config/scheduler.py:L229-231`, 0.33.0
    `config/scheduler.py`)."""
    if not config.async_scheduling:
        return V1Scheduler(config, kv_cache_manager, kv_connector)
    if kv_connector is not None:
        raise InputError(
            "scheduler.async_scheduling: async scheduling with a KV connector (cluster P/D "
            "or cache.cpu_offload) is not modelled; set async_scheduling: false"
        )
    scheduler = V1Scheduler(config, kv_cache_manager)
    scheduler.install_output_hooks(AsyncOutputs(scheduler))
    return scheduler
