"""The scheduler lockstep under async scheduling: vLLM's real `AsyncScheduler`, driven by the
real `EngineCore.step_with_batch_queue` (`vllm/v1/engine/core.py`, 0.11.0 L300-352, 0.33.0
L708-822), against kvsim's `V1Scheduler` with `AsyncOutputs`, driven by `EngineCoreLoop`, call for call.

The real engine core's method runs unchanged, bound to a stand-in that has only what it reads:
the batch queue (size 2, `max_concurrent_batches`), the scheduler (the real one, behind a
recorder), and a fake executor. The executor's futures are never done when first asked (the
GPU outlasts scheduling, `sim.scheduler.v1.engine_core`); a batch's tokens are made when its
result is taken: one for each request the scheduler gave an output placeholder in that
`schedule()` (the worker samples those and discards the rest).

Per engine-core call both sides report: the batch scheduled (None when `schedule()` was not
called), the preemptions, the requests whose finish was applied, the free blocks after
`schedule()` and after the call. The first difference ends the workload (`SchedDivergence`).

Example: ``verify_scheduler(60, async_scheduling=True, pin="0.33.0", vllm_version="0.33.0")``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

from sim.kv.pins import VllmPin
from sim.scheduler.request import Request, StepPlan
from sim.scheduler.v1.engine_core import EngineCoreLoop
from sim.vllm_real.loader import VllmInstall, import_vllm
from sim.vllm_real.sched_case import RequestSpec, SchedCase
from sim.vllm_real.v1_sched_adapter import RealV1Scheduler, RealVllmRaised


@dataclass(slots=True)
class CallRecord:
    """What one engine-core call did, as plain comparable values."""

    scheduled: list[tuple[int, int]] | None = None
    preempted: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)
    free_after_schedule: int | None = None
    free_after_call: int = 0
    #: kvsim only: the engine died in this call (`StepPlan.fatal_error`).
    fatal_error: str | None = None


#: The fields compared after `scheduled` (in this order).
CALL_FIELDS = ("preempted", "finished", "free_after_schedule", "free_after_call")


class _FakeFuture:
    """A result that is never done before it is taken; made when taken."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make

    def done(self) -> bool:
        return False

    def result(self) -> Any:
        return self._make()


class _FakeExecutor:
    """`execute_model(..., non_block=True)` and 0.33.0's `sample_tokens`: the future of the
    batch's output, tokens for the requests that got a placeholder in that `schedule()`."""

    def __init__(self, core: RealAsyncCore) -> None:
        self._core = core
        self._pending: _FakeFuture | None = None

    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> _FakeFuture:
        sampling = set(self._core.sampling_ids)
        future = _FakeFuture(lambda: self._core.runner_output(scheduler_output, sampling))
        self._pending = future
        return future

    def sample_tokens(self, grammar_output: Any, non_block: bool = False) -> _FakeFuture:
        assert self._pending is not None
        return self._pending


class _CoreStandIn:
    """What `EngineCore.step_with_batch_queue` reads of `self` (every V1 pin's release)."""

    is_mm_encoder_only = False
    is_pooling_model = False
    check_for_draft_tokens = False
    #: 0.19.1-0.26.0: True without an encoder-cache transfer config (`core.py:L193-196`
    #: @0.19.1); a step counts as run only then.
    is_ec_consumer = True
    use_spec_decode = False

    def __init__(self, core: RealAsyncCore, batch_queue_size: int) -> None:
        self.scheduler = core
        self.model_executor = _FakeExecutor(core)
        self.batch_queue_size = batch_queue_size
        self.batch_queue: deque[Any] = deque(maxlen=batch_queue_size)

    def execute_model_with_error_logging(self, fn: Callable[[Any], Any], out: Any) -> Any:
        return fn(out)

    def _should_throttle_prefills(self) -> bool:
        return False

    @contextmanager
    def log_error_detail(self, out: Any) -> Iterator[None]:
        yield

    @contextmanager
    def capture_iteration_details(self, out: Any) -> Iterator[None]:
        yield None

    @contextmanager
    def log_iteration_details(self, out: Any) -> Iterator[None]:
        yield None

    def _process_aborts_queue(self) -> None:
        pass

    def _attach_iteration_details(self, outputs: Any, details: Any) -> None:
        pass

    def _attach_weight_version(self, outputs: Any) -> None:
        pass


class RealAsyncCore:
    """The real `AsyncScheduler` behind the real engine-core loop; records each call. It is
    the stand-in's `scheduler`: `schedule`, `update_from_output` and the rest pass through."""

    def __init__(self, case: SchedCase, install: VllmInstall) -> None:
        self.adapter = RealV1Scheduler(case, install=install)
        self.real = self.adapter.real
        self.sampling_ids: list[str] = []
        self._record = CallRecord()
        core_mod = import_vllm("v1.engine.core", install)
        self._stand_in = _CoreStandIn(self, batch_queue_size=2)
        self._step = MethodType(core_mod.EngineCore.step_with_batch_queue, self._stand_in)

    # -- what the engine core calls on its scheduler
    def has_requests(self) -> bool:
        return bool(self.real.has_requests())

    def schedule(self, *args: Any) -> Any:
        requests = self.real.requests
        before = {rid: r.num_output_placeholders for rid, r in requests.items()}
        adapter = self.adapter
        adapter._freed_in_schedule = []
        try:
            output = adapter._guard("schedule", self.real.schedule, *args)
        finally:
            self._record.preempted = [int(r) for r in adapter._freed_in_schedule]
            adapter._freed_in_schedule = None
        self._record.scheduled = [(int(r), n) for r, n in output.num_scheduled_tokens.items()]
        self._record.free_after_schedule = adapter.num_free_blocks
        self.sampling_ids = [
            rid
            for rid in output.num_scheduled_tokens
            if rid in requests and requests[rid].num_output_placeholders > before.get(rid, 0)
        ]
        return output

    def get_grammar_bitmask(self, scheduler_output: Any) -> Any:
        return self.real.get_grammar_bitmask(scheduler_output)

    def update_from_output(self, scheduler_output: Any, model_output: Any) -> Any:
        outputs = self.adapter._guard(
            "update_from_output", self.real.update_from_output, scheduler_output, model_output
        )
        for outs in outputs.values():
            for out in outs.outputs:
                if out.finish_reason is not None:
                    self._record.finished.append(int(out.request_id))
        return outputs

    def runner_output(self, scheduler_output: Any, sampling: set[str]) -> Any:
        """The batch's `ModelRunnerOutput`: one token each for `sampling`."""
        req_ids = list(scheduler_output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            if req_id in sampling:
                content = self.adapter._contents[req_id]
                content.append_output(-(int(req_id) + 1), 1)
                n = content.num_tokens
                sampled.append(content.token_ids(n - 1, n))
            else:
                sampled.append([])
        return self.adapter._outputs.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )

    # -- the lockstep's side
    def add_request(self, spec: RequestSpec) -> None:
        self.adapter.add_request(spec)

    def has_work(self) -> bool:
        return self.has_requests() or bool(self._stand_in.batch_queue)

    def call(self) -> CallRecord:
        """One `step_with_batch_queue` call (raises `RealVllmRaised` where vLLM raised)."""
        self._record = CallRecord()
        self._step()
        self._record.free_after_call = self.adapter.num_free_blocks
        return self._record


class _RecordingScheduler:
    """kvsim's scheduler as the loop sees it, recording what `schedule()` did (its frees are
    its preemptions) into the current call's record."""

    def __init__(self, side: Any) -> None:
        self.side = side
        self.record = CallRecord()

    def has_requests(self) -> bool:
        return bool(self.side.scheduler.has_requests())

    def schedule(self, now_s: float) -> StepPlan:
        side, record = self.side, self.record
        side._frees.freed = []
        plan: StepPlan = side.scheduler.schedule(now_s)
        record.preempted, side._frees.freed = side._frees.freed, None
        record.fatal_error = plan.fatal_error
        record.scheduled = [(w.request.request_id, w.num_tokens) for w in plan.scheduled]
        record.free_after_schedule = side.manager.num_free_blocks
        record.finished += [-1 - r.request_id for r in plan.failed]
        return plan

    def update(self, plan: StepPlan, now_s: float) -> list[Request]:
        finished: list[Request] = self.side.scheduler.update(plan, now_s)
        self.record.finished += [r.request_id for r in finished]
        # 0.11.0 PRIORITY: a finish in `waiting` heapifies the real heap, which may die there.
        self.record.fatal_error = self.record.fatal_error or self.side.scheduler.tie_mirror.error
        return finished


class KvsimAsyncCalls:
    """kvsim's side: `EngineCoreLoop` over a `KvsimSide`'s scheduler (async on)."""

    def __init__(self, side: Any, pin: str) -> None:
        self._recorder = _RecordingScheduler(side)
        self.side = side
        self.loop = EngineCoreLoop(
            self._recorder, VllmPin(pin), batch_queue_size=side.scheduler.max_concurrent_batches
        )

    def add_request(self, spec: RequestSpec) -> None:
        self.side.add_request(spec)

    def has_work(self) -> bool:
        return self.loop.has_work()

    def call(self, now_s: float) -> CallRecord:
        """One engine-core call of kvsim's loop."""
        record = self._recorder.record = CallRecord()
        self.loop.step(now_s)
        record.free_after_call = self.side.manager.num_free_blocks
        return record


def run_async_workload(
    index: int, workload: Any, pin: str, install: VllmInstall, result: Any, fast_path: bool
) -> Any:
    """`sched_lockstep.run_workload` under async scheduling: call for call."""
    from sim.vllm_real.sched_lockstep import MAX_STEPS, KvsimSide, RealRaised, SchedDivergence

    ours = KvsimAsyncCalls(KvsimSide(workload.case, pin, fast_path), pin)
    real = RealAsyncCore(workload.case, install)
    last_arrival = max(r.arrival_step for r in workload.requests)
    for step in range(MAX_STEPS):
        raised: RealVllmRaised | None = None
        try:
            for spec in workload.requests:
                if spec.arrival_step == step:
                    ours.add_request(spec)
                    real.add_request(spec)
        except RealVllmRaised as exc:
            raised = exc
        if raised is None and step > last_arrival and not (ours.has_work() or real.has_work()):
            break
        mine = ours.call(float(step))
        theirs = CallRecord()
        if raised is None:
            try:
                theirs = real.call()
            except RealVllmRaised as exc:
                raised = exc
        if raised is not None or mine.fatal_error is not None:
            real_error = None if raised is None else f"{raised.upstream_type} in {raised.phase}"
            if raised is None or mine.fatal_error is None:
                return SchedDivergence(
                    index, step, "engine crash", mine.fatal_error, real_error, workload
                )
            return RealRaised(
                index, step, raised.upstream_type, raised.phase, str(raised.__cause__)
            )
        result.num_steps += 1
        result.num_preemptions += len(theirs.preempted)
        if mine.scheduled != theirs.scheduled:
            return SchedDivergence(
                index, step, "scheduled", mine.scheduled, theirs.scheduled, workload
            )
        for name in CALL_FIELDS:
            a, b = getattr(mine, name), getattr(theirs, name)
            if a != b:
                return SchedDivergence(index, step, name, a, b, workload)
    if any(r.num_prefix_hit_tokens for r in ours.side.requests):
        result.num_prefix_hit_workloads += 1
    return None
