"""The engine: the only module where simulated time passes (SimPy).

An arrival process feeds requests at their trace times to a router; one process per replica
runs the step loop::

    plan = scheduler.schedule(now)               # pure
    dt   = step_time.predict_s(batch of plan)    # pure
    yield env.timeout(dt)
    scheduler.update(plan, now + dt)              # tokens appended, finished requests freed

An idle replica waits on an event that the next arrival triggers, instead of spinning. A replica
whose queue cannot make progress (nothing running, nothing admissible, no arrival to come)
aborts what is left with the reason, so every request ends in exactly one terminal state, and
records a `no_progress` violation that diagnoses the stuck queue (`sim.audit.liveness`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import simpy

from sim.audit import AuditedV0Manager, AuditedV1Manager, AuditLevel, ViolationPolicy
from sim.audit.liveness import Stall, diagnose
from sim.kv.config import Design, KVCacheConfig, make_manager
from sim.kv_connector.base import KVConnectorConfig
from sim.kv_connector.hooks import ConnectorHooks
from sim.latency.batch import BatchShape
from sim.routing import ReplicaView, Router, make_policy
from sim.scheduler import Request, RequestState, SchedulerConfig, StepPlan, V0Scheduler, V1Scheduler
from sim.workload.request import RequestSpec


@dataclass(frozen=True, slots=True)
class EngineConfig:
    design: Design
    kv: KVCacheConfig
    scheduler: SchedulerConfig
    num_replicas: int = 1
    router: Router = Router.ROUND_ROBIN
    #: The prefix-cache-aware router's load term (blocks per outstanding request).
    router_load_weight: float = 1.0
    violation_policy: ViolationPolicy = ViolationPolicy.RECORD
    audit_level: AuditLevel = AuditLevel.CHEAP
    #: Simulated-time limit; requests unfinished by then are aborted. None: run to completion.
    max_sim_time_s: float | None = None
    #: Builds the block manager instead of kvsim's model, e.g. vLLM's real code
    #: (`sim.vllm_real`): called as `factory(design, kv_config)`.
    manager_factory: Callable[[Design, KVCacheConfig], object] | None = None
    #: A V1 KV connector per replica (`sim.kv_connector`), e.g. CPU offloading; None: none.
    kv_connector: KVConnectorConfig | None = None


#: One row per scheduler call that ran a batch or changed the queues. A call that ran nothing
#: but preempted, ignored or failed requests (vLLM's engine step with an empty batch), and the
#: call in which the run ended (a fatal engine error, a stop policy), are rows with
#: `duration_s` 0 and no tokens, so `num_preempted` sums to the requests' preemptions.
STEP_COLUMNS = (
    "replica",
    "step",
    "start_s",
    "duration_s",
    "num_prefill_seqs",
    "num_prefill_tokens",
    "num_decode_seqs",
    "num_tokens",
    "num_context_tokens",
    "num_preempted",
    "num_waiting",
    "num_running",
    "num_swapped",
    "num_free_blocks",
    "num_used_blocks",
    "num_cached_blocks",
)


@dataclass(slots=True)
class RunRecords:
    """Plain records of one run; `sim.results` turns them into DataFrames."""

    requests: list[Request] = field(default_factory=list)
    steps: list[tuple] = field(default_factory=list)
    violations: list = field(default_factory=list)
    fatal_error: str | None = None
    stopped_early: str | None = None
    end_s: float = 0.0
    num_gpu_blocks: int = 0


class Replica:
    """One engine instance: an audited manager and a scheduler."""

    def __init__(
        self,
        index: int,
        config: EngineConfig,
        clock: Callable[[], tuple[float, int]],
        decode_window: int | None = None,
    ) -> None:
        self.index = index
        factory = config.manager_factory or make_manager
        manager: Any = factory(config.design, config.kv)
        kwargs: dict[str, Any] = dict(
            policy=config.violation_policy, level=config.audit_level, clock=clock
        )
        if config.design.api == "v1":
            self.manager: AuditedV0Manager | AuditedV1Manager = AuditedV1Manager(manager, **kwargs)
            connector = (
                config.kv_connector.build(index, config.kv.block_size)
                if config.kv_connector is not None
                else None
            )
            self.scheduler: V0Scheduler | V1Scheduler = V1Scheduler(
                config.scheduler, self.manager, connector
            )
        else:
            self.manager = AuditedV0Manager(manager, **kwargs)
            self.scheduler = V0Scheduler(config.scheduler, self.manager)
        if config.scheduler.decode_cohort:
            # The cohort sums decode contexts capped at the step-time model's attention window.
            self.scheduler.use_decode_cohort(decode_window)
        # Bound once: the auditor passes read-only queries through `__getattr__`, which would
        # cost a failed lookup on every step.
        self.pool_stats = self.manager.pool_stats
        self.num_steps = 0
        self.outstanding = 0
        self.wakeup: simpy.Event | None = None
        #: The scheduler's KV-connector side when a connector is configured, else None.
        self.connector_hooks: ConnectorHooks | None = None
        if isinstance(self.scheduler, V1Scheduler) and self.scheduler.connector_hooks.enabled:
            self.connector_hooks = self.scheduler.connector_hooks

    def next_kv_transfer_s(self) -> float | None:
        """When the next KV transfer in flight completes (None: none, or no connector)."""
        hooks = self.connector_hooks
        return None if hooks is None else hooks.next_completion_s()


def _request_of(spec: RequestSpec) -> Request:
    return Request.new(
        spec.request_id, spec.arrival_s, spec.prompt_content(), spec.output_tokens, spec.priority
    )


def batch_shape(plan: StepPlan) -> BatchShape:
    works = plan.scheduled
    if not works:  # the common step: the cohort and maybe a few quiet decodes
        return BatchShape(tuple(plan.quiet_contexts), (), plan.bulk)
    decodes = []
    chunks = []
    for work in works:
        if work.is_prefill:
            chunks.append((work.num_context_tokens, work.num_tokens))
        else:
            decodes.append(work.num_context_tokens)
    decodes += plan.quiet_contexts
    return BatchShape(tuple(decodes), tuple(chunks), plan.bulk)


class Engine:
    """Replays `specs` through `config.num_replicas` replicas with `step_time`."""

    def __init__(
        self,
        config: EngineConfig,
        specs: Iterable[RequestSpec],
        step_time,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.config = config
        self.specs = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
        self.step_time = step_time
        self.progress = progress
        self.env = simpy.Environment()
        self.records = RunRecords(num_gpu_blocks=config.kv.num_gpu_blocks)
        self._current_step = 0
        window = getattr(step_time, "decode_window", None)
        self.replicas = [
            Replica(i, config, self._clock, window) for i in range(config.num_replicas)
        ]
        self._arrivals_done = False
        self._policy = make_policy(config.router, config.kv.block_size, config.router_load_weight)
        self._views = [ReplicaView(r) for r in self.replicas]
        self._stop: str | None = None
        self._num_terminal = 0

    def _clock(self) -> tuple[float, int]:
        return (self.env.now, self._current_step)

    # ------------------------------------------------------------------ processes
    def _route(self, request: Request) -> Replica:
        return self.replicas[self._policy.choose(request, self._views)]

    def _arrivals(self):
        for spec in self.specs:
            delay = spec.arrival_s - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            if self._stop is not None:
                break
            request = _request_of(spec)
            self.records.requests.append(request)
            replica = self._route(request)
            request.replica = replica.index
            if (
                replica.scheduler.engine == "v1"
                and request.prompt_tokens > self.config.scheduler.max_model_len
            ):
                # The V1 frontend rejects the prompt before it reaches the scheduler.
                request.finish(
                    RequestState.IGNORED,
                    f"prompt ({request.prompt_tokens} tokens) is longer than max_model_len "
                    f"({self.config.scheduler.max_model_len})",
                    self.env.now,
                )
                self._on_terminal(1)
                continue
            replica.outstanding += 1
            replica.scheduler.add_request(request)
            self._wake(replica)
        self._arrivals_done = True
        for replica in self.replicas:
            self._wake(replica)

    def _idle(self, replica: Replica, transfer_s: float | None) -> simpy.Event:
        """What an idle replica waits for: the next arrival, or the next KV transfer's
        completion if one is in flight (whichever comes first)."""
        replica.wakeup = self.env.event()
        if transfer_s is None:
            return replica.wakeup
        return replica.wakeup | self.env.timeout(max(0.0, transfer_s - self.env.now))

    def _wake(self, replica: Replica) -> None:
        if replica.wakeup is not None and not replica.wakeup.triggered:
            replica.wakeup.succeed()

    def _on_terminal(self, count: int) -> None:
        self._num_terminal += count
        if self.progress is not None and count:
            self.progress(self._num_terminal, len(self.specs))

    def _replica_loop(self, replica: Replica):
        scheduler = replica.scheduler
        env = self.env
        policy = self.config.violation_policy
        stop_at_any = policy is ViolationPolicy.STOP_ANY
        stop_at_raise = policy is ViolationPolicy.STOP
        max_sim_time_s = self.config.max_sim_time_s
        predict_s = self.step_time.predict_s
        empty_streak = 0
        while self._stop is None:
            if not scheduler.has_unfinished():
                transfer_s = replica.next_kv_transfer_s()
                if self._arrivals_done and transfer_s is None:
                    return
                yield self._idle(replica, transfer_s)
                if replica.connector_hooks is not None:
                    replica.connector_hooks.poll(env.now)  # frees blocks kept for stores
                continue
            self._current_step = replica.num_steps
            plan = scheduler.schedule(self.env.now)
            ended = len(plan.ignored) + len(plan.failed)
            if ended:
                replica.outstanding -= ended
                self._on_terminal(ended)
            stop = self._stop_in(replica, plan, stop_at_any, stop_at_raise)
            if stop is not None:
                # The engine dies (or the policy ends the run) in this call: its row has no
                # batch (none ran) but keeps the preemptions made, which the requests count.
                self._record_step(replica, plan, BatchShape((), ()), env.now, 0.0)
                replica.num_steps += 1
                self._stop = stop
                return
            if plan.is_empty:
                if ended or plan.num_preempted:
                    # The queues changed, as after an empty engine step: the step gets its row
                    # (zero duration, no tokens) so that its preemptions are in the steps
                    # table too, and the scheduler runs again at once. A design that preempts
                    # and readmits forever without running anything (a livelock the real
                    # engine would share) is cut off.
                    self._record_step(replica, plan, batch_shape(plan), env.now, 0.0)
                    replica.num_steps += 1
                    empty_streak += 1
                    if empty_streak <= 2 * scheduler.num_unfinished() + 8:
                        continue
                    self._no_progress(replica, Stall.LIVELOCK, empty_streak)
                    self._abort(
                        scheduler.unfinished(),
                        "livelock: steps keep preempting without running anything",
                    )
                    return
                transfer_s = replica.next_kv_transfer_s()
                if not self._arrivals_done or transfer_s is not None:
                    # Waiting for an arrival, or for a KV transfer that lets a parked request
                    # (or freed blocks) make progress: not a stall.
                    yield self._idle(replica, transfer_s)
                    continue
                self._no_progress(replica, Stall.STALLED)
                self._abort(
                    scheduler.unfinished(),
                    "stalled: nothing running and no waiting request can be admitted "
                    f"({replica.pool_stats().num_free} free blocks)",
                )
                return
            empty_streak = 0
            shape = batch_shape(plan)
            duration_s = predict_s(shape)
            start_s = env.now
            yield env.timeout(duration_s)
            finished = scheduler.update(plan, env.now)
            if finished:
                replica.outstanding -= len(finished)
                self._on_terminal(len(finished))
            self._record_step(replica, plan, shape, start_s, duration_s)
            replica.num_steps += 1
            if plan.fatal_error is not None:
                # The step's update failed (e.g. freeing a finished request raised).
                self._stop = self._stop_in(replica, plan, False, False)
                return
            if max_sim_time_s is not None and env.now >= max_sim_time_s:
                self._stop = f"reached the simulated-time limit of {max_sim_time_s} s"

    def _stop_in(
        self, replica: Replica, plan: StepPlan, stop_at_any: bool, stop_at_raise: bool
    ) -> str | None:
        """Why the run ends in this scheduler call (a fatal engine error, a stop policy)."""
        if plan.fatal_error is not None:
            self.records.fatal_error = plan.fatal_error
            return f"fatal engine error: {plan.fatal_error}"
        if stop_at_any and replica.manager.violations:
            first = replica.manager.violations[0]
            return f"stopped at the first violation ({first.kind.value}): {first.message}"
        if stop_at_raise and replica.manager.first_raised is not None:
            first = replica.manager.first_raised
            return f"stopped where the real engine raises ({first.kind.value}): {first.message}"
        return None

    def _record_step(
        self, replica: Replica, plan: StepPlan, shape: BatchShape, start_s: float, duration_s: float
    ) -> None:
        stats = replica.pool_stats()
        scheduler = replica.scheduler
        chunks = shape.prefill_chunks
        num_prefill_tokens = 0
        prior_tokens = 0
        for prior, chunk in chunks:
            num_prefill_tokens += chunk
            prior_tokens += prior
        # The BatchShape properties, summed once here (this runs on every step).
        num_decode_seqs = shape.num_decode_seqs
        self.records.steps.append(
            (
                replica.index,
                replica.num_steps,
                start_s,
                duration_s,
                len(chunks),
                num_prefill_tokens,
                num_decode_seqs,
                num_decode_seqs + num_prefill_tokens,
                shape.decode_context_sum + prior_tokens,
                plan.num_preempted,
                len(scheduler.waiting),
                len(scheduler.running),
                len(scheduler.swapped) if scheduler.engine == "v0" else 0,  # type: ignore[union-attr]
                stats.num_free,
                stats.num_total - stats.num_free,
                stats.num_evictable,
            )
        )

    def _no_progress(self, replica: Replica, stall: Stall, num_empty_steps: int = 0) -> None:
        """Record the stuck queue as a `no_progress` violation, before its requests are
        aborted (the diagnosis reads the queues and the blocks they hold)."""
        diagnosis = diagnose(replica.scheduler, replica.manager, stall, num_empty_steps)
        replica.manager.record_no_progress(diagnosis)

    def _abort(self, requests: Iterable[Request], reason: str) -> None:
        count = 0
        for request in requests:
            if not request.state.is_terminal:
                request.finish(RequestState.ABORTED, reason, self.env.now)
                count += 1
        self._on_terminal(count)

    # ------------------------------------------------------------------ run
    def run(self) -> RunRecords:
        self.env.process(self._arrivals())
        for replica in self.replicas:
            self.env.process(self._replica_loop(replica))
        # The cyclic GC keeps re-walking the millions of live objects of a long replay (~10% of
        # its time) and finds nothing: requests, sequences and plans form no reference cycles
        # (peak memory is the same with it off). It is switched back on however the run ends.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.env.run()
        finally:
            if gc_was_enabled:
                gc.enable()
        # Requests that never arrived (run stopped early) are accounted for too.
        arrived = {r.request_id for r in self.records.requests}
        reason = self._stop or "run ended"
        for spec in self.specs:
            if spec.request_id not in arrived:
                request = _request_of(spec)
                request.finish(RequestState.ABORTED, f"never arrived: {reason}", self.env.now)
                self.records.requests.append(request)
        for replica in self.replicas:
            self._abort(replica.scheduler.unfinished(), reason)
            self.records.violations.extend(replica.manager.violations)
        self.records.stopped_early = self._stop
        self.records.end_s = self.env.now
        self.records.requests.sort(key=lambda r: r.request_id)
        return self.records
