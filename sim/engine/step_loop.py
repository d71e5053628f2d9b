"""The replica step loop: one SimPy process per replica, shared by every engine.

Each replica of `sim.engine.engine.Engine` (co-located) and of `sim.engine.disagg.DisaggEngine`
(a prefill or a decode pool) runs `ReplicaStepLoop.run`::

    plan = scheduler.schedule(now)               # pure
    dt   = step_time.predict_s(batch of plan)    # pure
    yield env.timeout(dt)                        # or, when no event is due first, no yield
    scheduler.update(plan, now + dt)              # tokens appended, finished requests freed

What the engines do differently is behind `StepHooks`: where a request's row goes when it
ends (and what follows it: a session's next turn, a hand-off to the decode pool), what an idle
replica waits for, what may still give it work, when the run stops, and how a stuck queue is
reported. The loop itself owns the rest, the same for both:

* idle: a replica with nothing unfinished, or whose scheduler call gives an empty plan, waits
  on the event `StepHooks.idle` gives while `StepHooks.may_get_work` says something is still to
  come, and ends otherwise;
* stall: an empty plan with nothing to come is reported (`StepHooks.stall`) and the loop ends;
* livelock: an empty plan that still ended or preempted requests changed the queues, as an
  empty engine step does, so it gets a row (zero duration, no tokens) and the scheduler runs
  again at once; `livelock_limit` such steps in a row end the loop (`StepHooks.livelock`);
* the clock: `advance_clock` moves the clock itself (`Clock.advance_to`) for a step that ends
  before any other event is due, instead of a timeout that would only resume this process.

With V1 async scheduling (`SchedulerConfig.async_scheduling`) `_step_async` runs a plan: the
engine core's batch queue of 2 (`sim.scheduler.v1.engine_core`, `vllm/v1/engine/core.py`
`step_with_batch_queue`), in time. A call schedules step N+1, whose CPU work
(`sim.latency.overlap`) ends before the GPU may start it; the GPU runs it once step N is done;
the call then waits for step N's GPU end and applies its output there. A busy engine steps at
max(GPU time, CPU time) instead of their sum; a step's row starts where the previous row ended
(or at its own scheduling, after idling) and lasts to its GPU end, so rows still add up to the
busy time. Tokens are stamped when their step's GPU work ends.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import simpy

from sim.engine.replica import Clock, Replica, SimProcess, batch_shape
from sim.latency.batch import BatchShape
from sim.latency.overlap import overlapped_cpu_s
from sim.latency.protocol import StepTimeModel
from sim.scheduler import Request, StepPlan, V1Scheduler
from sim.scheduler.v1.engine_core import EarlyReturn, early_return_for


def livelock_limit(num_unfinished: int) -> int:
    """How many empty steps in a row (each preempting or ending requests, none running a
    token) a replica may take before the loop calls it a livelock.

    Each unfinished request may be preempted and readmitted twice, plus a margin of 8 for the
    steps that only end (ignore or fail) requests. Example: 1 unfinished request: 10 such steps
    are allowed, the 11th ends the loop.

    The co-located engine's rule. The disaggregated engine's own loop once allowed
    `8 + 2 * len(running)` and then idled (or stalled) instead of aborting; no bundled
    scenario, golden job, test or disaggregated fuzz case (seeds 0-399) ever took more than 8
    such steps in a row, so one rule changes no table.
    """
    return 2 * num_unfinished + 8


class StepHooks(Protocol):
    """What an engine decides for its replicas' step loops (see the module docstring)."""

    def stopped(self) -> bool:
        """Whether the run has ended (a stop rule, the simulated-time limit)."""
        ...

    def stop(self, reason: str) -> None:
        """End the run, for `reason`."""
        ...

    def begin_step(self, replica: Replica) -> None:
        """`replica` is about to call its scheduler (its step count is the clock's step)."""
        ...

    def ended(self, replica: Replica, requests: Sequence[Request]) -> None:
        """`requests` of `replica` reached their terminal state (its count is already down)."""
        ...

    def stepped(self, replica: Replica, finished: Sequence[Request]) -> None:
        """`replica`'s step ran and is recorded; `finished` are the requests it finished."""
        ...

    def record_step(
        self, replica: Replica, plan: StepPlan, shape: BatchShape, start_s: float, duration_s: float
    ) -> None:
        """The step's row in the steps table."""
        ...

    def stop_in(self, replica: Replica, plan: StepPlan) -> str | None:
        """Why the run ends at this scheduler call (a fatal error, a stop policy), or None."""
        ...

    def fatal_stop(self, replica: Replica, plan: StepPlan) -> str | None:
        """Why the run ends after a step whose update failed (`plan.fatal_error`), or None
        when the engine carries on."""
        ...

    def may_get_work(self, replica: Replica) -> bool:
        """Whether something still to come could give `replica` work or free its blocks."""
        ...

    def idle(self, replica: Replica) -> simpy.Event:
        """The event an idle `replica` waits for (an arrival, a hand-off, a transfer)."""
        ...

    def retire(self, replica: Replica) -> None:
        """`replica`'s loop ends for good (nothing to come, or its queue was aborted)."""
        ...

    def stall(self, replica: Replica) -> None:
        """Nothing runs, nothing can be admitted, nothing is to come: abort the queue."""
        ...

    def livelock(self, replica: Replica, num_empty_steps: int) -> None:
        """`num_empty_steps` empty steps in a row only preempted or ended requests."""
        ...


@dataclass(slots=True)
class _InFlight:
    """A batch in the async batch queue: its plan, shape, when `schedule()` made it and when
    its GPU work ends (its output can be applied)."""

    plan: StepPlan
    shape: BatchShape
    scheduled_s: float
    ready_s: float


#: A step-loop generator that returns the plan it applied (None: none).
_Applying = Generator[simpy.Event, Any, StepPlan | None]


class ReplicaStepLoop:
    """The step loop of one replica (`run` is its SimPy process)."""

    __slots__ = (
        "replica",
        "hooks",
        "env",
        "predict_s",
        "cpu_s",
        "max_sim_time_s",
        "advance_clock",
        "batch_queue",
        "gpu_free_s",
        "row_end_s",
    )

    def __init__(
        self,
        replica: Replica,
        hooks: StepHooks,
        env: Clock,
        step_time: StepTimeModel,
        max_sim_time_s: float | None,
        *,
        advance_clock: bool,
    ) -> None:
        self.replica = replica
        self.hooks = hooks
        self.env = env
        self.predict_s = step_time.predict_s
        #: The engine CPU work of a step's predicted time (overlapped under async scheduling).
        self.cpu_s = overlapped_cpu_s(step_time)
        self.max_sim_time_s = max_sim_time_s
        self.advance_clock = advance_clock
        #: Async scheduling: the batches scheduled and not applied (newest first), when the GPU
        #: is done with the last of them, and where the next step's row starts.
        self.batch_queue: deque[_InFlight] = deque()
        self.gpu_free_s = self.row_end_s = 0.0

    def run(self) -> SimProcess:
        replica, hooks, env = self.replica, self.hooks, self.env
        scheduler = replica.scheduler
        asynchronous = scheduler.config.async_scheduling  # V1 only (the schema refuses v0)
        early_return = self._start_async() if asynchronous else None
        empty_streak = 0
        while not hooks.stopped():
            has_requests = scheduler.has_unfinished()
            if asynchronous:
                assert isinstance(scheduler, V1Scheduler)
                has_requests = scheduler.has_requests()
            if not has_requests:
                if not (yield from self._without_requests()):
                    return
                continue
            hooks.begin_step(replica)
            plan = scheduler.schedule(env.now)
            ended = plan.ignored + plan.failed
            if ended:
                replica.outstanding -= len(ended)
                hooks.ended(replica, ended)
            stop = hooks.stop_in(replica, plan)
            if stop is not None:
                self._stop_in_call(plan, stop)
                return
            if plan.is_empty and not self._gpu_has_work():
                if not scheduler.has_unfinished():
                    continue  # async: only unreported finishes were left (idle above)
                if ended or plan.num_preempted:
                    empty_streak += 1
                    if self._empty_step(plan, empty_streak):
                        continue
                    return
                if not (yield from self._idle_or_stall()):
                    return
                continue
            empty_streak = 0
            if early_return is None:
                yield from self._step(plan)
                if not self._after_step(plan):
                    return
            elif not self._after_step((yield from self._step_async(plan, early_return))):
                return

    def _start_async(self) -> EarlyReturn:
        """Async scheduling: the release's early-return rule for the batch queue, and the GPU
        (and the next row) free from now."""
        scheduler = self.replica.scheduler
        assert isinstance(scheduler, V1Scheduler)
        self.gpu_free_s = self.row_end_s = self.env.now
        return early_return_for(scheduler.release_policies.release)

    def _without_requests(self) -> Generator[simpy.Event, Any, bool]:
        """Nothing to schedule: apply a batch still in the queue (async), else wait for work to
        come; False (the loop ends) when none can, or when the applied batch ends the run."""
        replica, hooks = self.replica, self.hooks
        if self.batch_queue:  # async: nothing to schedule, a batch still to apply
            return self._after_step((yield from self._apply_oldest()))
        if not hooks.may_get_work(replica):
            hooks.retire(replica)
            return False
        yield hooks.idle(replica)
        if replica.connector_hooks is not None:
            replica.connector_hooks.poll(self.env.now)  # frees blocks kept for stores/sends
        return True

    def _stop_in_call(self, plan: StepPlan, stop: str) -> None:
        """The engine dies (or the policy ends the run) in this scheduler call: its row has no
        batch (none ran) but keeps the preemptions made, which the requests count."""
        replica = self.replica
        self.hooks.record_step(replica, plan, BatchShape((), ()), self.env.now, 0.0)
        replica.num_steps += 1
        self.hooks.stop(stop)

    def _idle_or_stall(self) -> Generator[simpy.Event, Any, bool]:
        """An empty plan that changed nothing: wait if work may still come (an arrival, or a KV
        transfer that lets a parked request, or freed blocks, make progress: not a stall);
        else report the stall and end the loop (False)."""
        replica, hooks = self.replica, self.hooks
        if hooks.may_get_work(replica):
            yield hooks.idle(replica)
            return True
        hooks.stall(replica)
        hooks.retire(replica)
        return False

    def _after_step(self, plan: StepPlan | None) -> bool:
        """After a plan was applied (None: none was): a failed update, the time limit. False:
        the loop ends."""
        hooks = self.hooks
        if plan is not None and plan.fatal_error is not None:
            # The step's update failed (e.g. freeing a finished request raised).
            stop = hooks.fatal_stop(self.replica, plan)
            if stop is not None:
                hooks.stop(stop)
                return False
        if self.max_sim_time_s is not None and self.env.now >= self.max_sim_time_s:
            # Also ends a livelock the real engine would share that still runs tokens
            # (e.g. a prompt of max_model_len tokens that can never take its token).
            hooks.stop(f"reached the simulated-time limit of {self.max_sim_time_s} s")
        return True

    def _empty_step(self, plan: StepPlan, empty_streak: int) -> bool:
        """An empty plan that ended or preempted requests: the queues changed, as after an
        empty engine step. The step gets its row (zero duration, no tokens) so that its
        preemptions are in the steps table too, and the scheduler runs again at once (True).
        A design that preempts and readmits forever without running anything (a livelock the
        real engine would share) is cut off after `livelock_limit` such steps (False)."""
        replica, hooks = self.replica, self.hooks
        hooks.record_step(replica, plan, batch_shape(plan), self.env.now, 0.0)
        replica.num_steps += 1
        if empty_streak <= livelock_limit(replica.scheduler.num_unfinished()):
            return True
        hooks.livelock(replica, empty_streak)
        hooks.retire(replica)
        return False

    def _step(self, plan: StepPlan) -> SimProcess:
        """Run the plan's batch for its predicted time, then apply it."""
        replica, hooks, env = self.replica, self.hooks, self.env
        shape = batch_shape(plan)
        duration_s = self.predict_s(shape)
        start_s = env.now
        end_s = start_s + duration_s  # the float a timeout would end at
        if self.advance_clock and end_s < env.peek():
            # Nothing else can run before the step ends (`Clock`): no yield.
            env.advance_to(end_s)
        else:
            yield env.timeout(duration_s)
        finished = replica.scheduler.update(plan, env.now)
        if finished:
            replica.outstanding -= len(finished)
            hooks.ended(replica, finished)
        hooks.record_step(replica, plan, shape, start_s, duration_s)
        replica.num_steps += 1
        hooks.stepped(replica, finished)

    # ------------------------------------------------------------------ async scheduling
    def _gpu_has_work(self) -> bool:
        """A queued batch runs tokens (never, synchronously). Queued empty batches are
        applied now (no-ops but their rows): an engine that cannot admit anything then idles
        or stalls as `run` says, instead of spinning at one instant."""
        queue = self.batch_queue
        if any(not batch.plan.is_empty for batch in queue):
            return True
        while queue:
            self._apply_async(queue.pop())
        return False

    def _step_async(self, plan: StepPlan, early_return: EarlyReturn) -> _Applying:
        """`step_with_batch_queue` in time: queue the plan (its GPU start after its CPU work
        and the previous batch); return after that CPU work if the release's rule says so
        (None), else wait for the oldest batch and apply it (returned)."""
        env, queue = self.env, self.batch_queue
        shape = batch_shape(plan)
        cpu_s = self.cpu_s(shape)
        ready_s = env.now
        if not plan.is_empty:
            gpu_start_s = max(env.now + cpu_s, self.gpu_free_s)
            self.gpu_free_s = ready_s = gpu_start_s + self.predict_s(shape) - cpu_s
        queue.appendleft(_InFlight(plan, shape, env.now, ready_s))
        scheduler = self.replica.scheduler
        assert isinstance(scheduler, V1Scheduler)
        has_room = len(queue) < scheduler.max_concurrent_batches
        if early_return.returns(not plan.is_empty, has_room, scheduler.has_requests()):
            yield from self._wait_until(env.now + cpu_s)
            return None
        return (yield from self._apply_oldest())

    def _apply_oldest(self) -> _Applying:
        """Wait for the oldest queued batch's GPU end and apply it; the plan."""
        batch = self.batch_queue.pop()
        yield from self._wait_until(batch.ready_s)
        self._apply_async(batch)
        return batch.plan

    def _apply_async(self, batch: _InFlight) -> None:
        """Apply a queued batch's output now; its row runs from the previous row's end (or
        its own scheduling, after idling) to now."""
        replica, hooks, env = self.replica, self.hooks, self.env
        finished = replica.scheduler.update(batch.plan, env.now)
        if finished:
            replica.outstanding -= len(finished)
            hooks.ended(replica, finished)
        plan = batch.plan
        if not plan.is_empty or plan.ignored or plan.failed or plan.num_preempted:
            start_s = max(self.row_end_s, batch.scheduled_s)
            hooks.record_step(replica, plan, batch.shape, start_s, env.now - start_s)
            replica.num_steps += 1
            self.row_end_s = env.now
        hooks.stepped(replica, finished)

    def _wait_until(self, end_s: float) -> SimProcess:
        """Let the clock reach `end_s` (no yield where nothing else is due first)."""
        env = self.env
        if end_s <= env.now:
            return
        if self.advance_clock and end_s < env.peek():
            env.advance_to(end_s)
        else:
            yield env.timeout(end_s - env.now)
