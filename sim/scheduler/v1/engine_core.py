"""The order in which vLLM's engine core calls `schedule()` and `update_from_output()`, pure
Python (no clock): `EngineCore.step` without a batch queue, `step_with_batch_queue` with one.

* Synchronous (`core.py` `step`, 0.11.0 L272-291, 0.33.0 L667-700): schedule, run, apply, in
  one call.
* Async scheduling (`step_with_batch_queue`, 0.11.0 L300-352, 0.33.0 L708-822; the queue holds
  `max_concurrent_batches` = 2 batches, `core.py` 0.11.0 L145-151, 0.33.0 L208-214): each call
  schedules a batch if the scheduler has requests and puts it in the queue; it returns without
  applying anything while the queue has room (below), else it waits for the oldest batch and
  applies its output. So step N+1 is scheduled before step N's output is applied, and in the
  steady state a call is "schedule N+1, apply N".

When a call returns early (the `EarlyReturn` rule, the one difference between the releases):

* 0.11.0 (L331-336): the batch ran tokens, the queue has room and the oldest batch is not done.
  kvsim takes "not done" always: the executor's result arrives at the next call at the
  earliest (the GPU step outlasts the CPU's scheduling of the next one). An empty batch is
  applied at once.
* 0.33.0 (L764-769): the queue has room and the batch ran tokens *or the scheduler still has
  requests*: an empty batch is queued like any other.

Example (one request of a 4-token prompt and 2 output tokens; "S" schedule, "A" apply; tested
in tests/scheduler/test_async_scheduler.py): 0.33.0: call 1 S0; call 2 S1 A0; call 3 S2 (empty:
token 2 is in flight and is the last) A1 (the request finishes); call 4 S3 (empty: the finish
is unreported until a schedule) A2; call 5 A3. 0.11.0: S2 schedules the request once more, and
call 4's empty S3 is applied at once, after A2. Left out: PP (a queue of `pp_size`), deferred structured
output sampling (L757-760, L802-820), aborts (L792) and DP prefill throttling (L662-665).
"""

from __future__ import annotations

import abc
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from sim.kv.pins import VllmPin
from sim.scheduler.request import Request, StepPlan


class LoopScheduler(Protocol):
    """What the loop calls on a scheduler (`V1Scheduler`, synchronous or with `AsyncOutputs`)."""

    def schedule(self, now_s: float) -> StepPlan: ...

    def update(self, plan: StepPlan, now_s: float) -> list[Request]: ...

    def has_requests(self) -> bool: ...


@dataclass(slots=True)
class CoreStep:
    """One engine-core call: the batch it scheduled (None: `schedule()` was not called), the
    batch whose output it applied (None: none) and the requests that finished."""

    scheduled: StepPlan | None = None
    applied: StepPlan | None = None
    finished: list[Request] = field(default_factory=list)


class EarlyReturn(abc.ABC):
    """Whether `step_with_batch_queue` returns after queueing a batch, applying nothing."""

    @abc.abstractmethod
    def returns(self, ran_tokens: bool, queue_has_room: bool, has_requests: bool) -> bool:
        """True: the call ends here."""


class EarlyReturn0110(EarlyReturn):
    """0.11.0 `core.py:L331-336`; the oldest batch is never done yet (module docstring)."""

    def returns(self, ran_tokens: bool, queue_has_room: bool, has_requests: bool) -> bool:
        return ran_tokens and queue_has_room


class EarlyReturn0330(EarlyReturn):
    """0.33.0 `core.py:L764-769`."""

    def returns(self, ran_tokens: bool, queue_has_room: bool, has_requests: bool) -> bool:
        return queue_has_room and (ran_tokens or has_requests)


def early_return_for(pin: VllmPin) -> EarlyReturn:
    """The pinned release's rule (4ac7713 taken as 0.11.0; 0.19.1 / 0.20.0 keep 0.11.0's,
    0.25.1 / 0.26.0 have 0.33.0's, `VllmPin.queues_empty_batches`)."""
    return EarlyReturn0330() if pin.queues_empty_batches else EarlyReturn0110()


class EngineCoreLoop:
    """The engine core's calls over one scheduler: `step` is one `step_fn()` call."""

    def __init__(self, scheduler: LoopScheduler, pin: VllmPin, batch_queue_size: int) -> None:
        self.scheduler = scheduler
        self.batch_queue_size = batch_queue_size
        #: The batches scheduled and not yet applied, newest first (`appendleft`, `pop`).
        self.batch_queue: deque[StepPlan] = deque()
        self.early_return = early_return_for(pin)

    def has_work(self) -> bool:
        """The engine core steps while the scheduler has requests or a batch is queued
        (`_process_input_queue`, 0.11.0 `core.py:L733-736`)."""
        return self.scheduler.has_requests() or bool(self.batch_queue)

    def step(self, now_s: float) -> CoreStep:
        """One call; a batch with `fatal_error` ends the engine (nothing applied)."""
        if self.batch_queue_size <= 1:
            return self._step_sync(now_s)
        scheduler = self.scheduler
        call = CoreStep()
        if scheduler.has_requests():
            plan = scheduler.schedule(now_s)
            call.scheduled = plan
            if plan.fatal_error is not None:
                return call
            self.batch_queue.appendleft(plan)
            queue_has_room = len(self.batch_queue) < self.batch_queue_size
            if self.early_return.returns(
                not plan.is_empty, queue_has_room, scheduler.has_requests()
            ):
                return call
        elif not self.batch_queue:
            return call
        call.applied = self.batch_queue.pop()
        call.finished = scheduler.update(call.applied, now_s)
        return call

    def _step_sync(self, now_s: float) -> CoreStep:
        """`step` (0.11.0 `core.py:L272-291`)."""
        call = CoreStep()
        if not self.scheduler.has_requests():
            return call
        plan = call.scheduled = self.scheduler.schedule(now_s)
        if plan.fatal_error is None:
            call.applied = plan
            call.finished = self.scheduler.update(plan, now_s)
        return call
