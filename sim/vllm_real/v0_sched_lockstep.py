"""v0 scheduler lockstep: kvsim's `V0Scheduler` against vLLM 0.5.4's real `Scheduler`, per step.

kvsim's side is `V0Scheduler` over its audited v0 manager of the case's design (v0-v1 for
BlockSpaceManagerV1, v0-v2 for BlockSpaceManagerV2, both pinned to the 0.5.4 release); vLLM's is
`sim.vllm_real.v0_sched_adapter.RealV0Scheduler`, the real scheduler over the real manager of
the same kind, driven as `LLMEngine.step` drives it. Both get the same requests before the
same steps; after every step we compare (`V0StepRecord`)

* the scheduled groups and their token chunk sizes, in `SchedulerOutputs` order (new
  prefills, running prefills, swapped-in prefills, running decodes, swapped-in decodes), and
  how many are prefills;
* the groups preempted by recompute, swapped out and swapped in, each in order;
* the ignored groups and the finished ones;
* free GPU and CPU blocks after `schedule()` and after the outputs were applied;
* the waiting, running and swapped queues, front to back (the order the next steps read).

The first disagreement ends the workload with a `SchedDivergence`. Where vLLM's own code raises
(the real engine dies: no CPU swap space, the v0-V2 sliding-window undercount), the workload
ends with a `RealRaised`; kvsim must end the run (`fatal_error`) or fail a request in the
manager (the auditor's record) on the same step, else that is the divergence.

Example: ``verify_v0_scheduler(num_workloads=100, seed=0)`` -> a `V0SchedVerifyResult` whose
`summary()` reads "v0 scheduler (v0-v1, v0-v2 @0.5.4) vs vLLM 0.5.4: identical over 100
workloads (...)" when nothing diverged.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from sim.audit import AuditedV0Manager
from sim.audit.base import AuditLevel
from sim.kv.config import make_manager
from sim.scheduler.request import Request
from sim.scheduler.v0.scheduler import V0Scheduler
from sim.vllm_real.loader import VllmInstall, load_vllm
from sim.vllm_real.sched_case import RequestSpec
from sim.vllm_real.sched_lockstep import MAX_STEPS, RealRaised, SchedDivergence
from sim.vllm_real.v0_sched_adapter import RealV0Scheduler, RecordingManager
from sim.vllm_real.v0_sched_case import (
    V0StepRecord,
    V0Workload,
    random_v0_workload,
    v0_case_configs,
)
from sim.vllm_real.v1_sched_adapter import RealVllmRaised

_FIELDS = (
    "num_prefill_groups",
    "tables",
    "preempted",
    "swapped_out",
    "swapped_in",
    "ignored",
    "finished",
    "free_gpu_after_schedule",
    "free_cpu_after_schedule",
    "free_gpu_after_update",
    "free_cpu_after_update",
    "queues",
)


@dataclass(slots=True)
class V0SchedVerifyResult:
    vllm_version: str
    kinds: tuple[str, ...]
    fast_path: bool = False
    num_workloads: int = 0
    num_steps: int = 0
    num_preemptions: int = 0
    num_swap_outs: int = 0
    num_bulk_decodes: int = 0
    #: Workloads per design, and of them with prefix caching / chunked prefill / a window.
    per_design: Counter[str] = field(default_factory=Counter)
    num_caching_workloads: int = 0
    num_chunked_workloads: int = 0
    num_window_workloads: int = 0
    real_raised: list[RealRaised] = field(default_factory=list)
    divergence: SchedDivergence | None = None

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        designs = ", ".join(f"{n} {d}" for d, n in sorted(self.per_design.items()))
        verdict = "identical over" if self.identical else "DIVERGED after"
        lines = [
            f"v0 scheduler{' (fast path)' if self.fast_path else ''} @0.5.4 vs vLLM "
            f"{self.vllm_version}: {verdict} {self.num_workloads} workloads ({designs}; "
            f"{self.num_workloads - len(self.real_raised)} to the end, "
            f"{len(self.real_raised)} up to a real-vLLM raise; {self.num_steps} steps compared, "
            f"{self.num_preemptions} recompute preemptions, {self.num_swap_outs} swap-outs; "
            f"{self.num_caching_workloads} with prefix caching, {self.num_chunked_workloads} "
            f"chunked, {self.num_window_workloads} with a sliding window"
            + (f"; {self.num_bulk_decodes} cohort decodes" if self.fast_path else "")
            + ")"
        ]
        if self.real_raised:
            kinds = sorted({f"{r.upstream_type} in {r.phase}" for r in self.real_raised})
            first = self.real_raised[0]
            lines.append(
                f"  real vLLM raised in {len(self.real_raised)} workloads ({'; '.join(kinds)}), "
                "and kvsim's engine died or failed the request on the same step in each. "
                f"First: workload {first.workload_index}, step {first.step}: "
                f"{first.upstream_type}: {first.message}"
            )
        if self.divergence is not None:
            lines.append(self.divergence.describe())
        return "\n".join(lines)


# --------------------------------------------------------------------------- kvsim side
class KvsimV0Side:
    """kvsim's V0Scheduler on the same case, with the same step records as the real one."""

    def __init__(self, workload: V0Workload, fast_path: bool = False) -> None:
        config, kv = v0_case_configs(workload.case, fast_path)
        self._recorder = RecordingManager(make_manager(workload.case.design, kv))
        manager = AuditedV0Manager(self._recorder, level=AuditLevel.FULL)
        self.scheduler = V0Scheduler(config, manager)
        if fast_path:
            self.scheduler.use_decode_cohort(None)
        self.fast_path = fast_path
        self.manager = manager
        self.requests: list[Request] = []

    def add_request(self, spec: RequestSpec) -> None:
        request = Request.new(spec.request_id, spec.arrival_s, spec.content(), spec.output_len)
        self.requests.append(request)
        self.scheduler.add_request(request)

    def _queues(self) -> tuple[list[int], list[int], list[int]]:
        s = self.scheduler
        return tuple([r.request_id for r in q] for q in (s.waiting, s.running, s.swapped))  # type: ignore[return-value]

    def _free_blocks(self) -> tuple[int, int]:
        return self.manager.get_num_free_gpu_blocks(), self.manager.get_num_free_cpu_blocks()

    def step(self, now_s: float) -> V0StepRecord:
        record = V0StepRecord()
        s = self.scheduler
        self._recorder.events = []
        plan = s.schedule(now_s)
        events, self._recorder.events = self._recorder.events, None
        if plan.fatal_error is not None or plan.failed:
            record.fatal_error = plan.fatal_error or f"failed {[r.request_id for r in plan.failed]}"
            return record
        for kind, request_id in events:
            getattr(record, kind).append(request_id)
        works = plan.scheduled  # upstream's output order (`V0Scheduler._output_order`)
        record.scheduled = [(w.request.request_id, w.num_tokens) for w in works]
        record.scheduled += [(r.request_id, 1) for r in plan.quiet]
        record.bulk_decodes = plan.num_bulk_decodes
        record.tables = [
            (w.request.request_id, self.manager.get_block_table(w.request.seq)) for w in works
        ]
        record.num_prefill_groups = sum(w.is_prefill for w in works)
        record.ignored = [r.request_id for r in plan.ignored]
        record.free_gpu_after_schedule, record.free_cpu_after_schedule = self._free_blocks()
        finished = s.update(plan, now_s)
        record.finished = [r.request_id for r in finished]
        record.free_gpu_after_update, record.free_cpu_after_update = self._free_blocks()
        record.queues = self._queues()
        return record

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()


# --------------------------------------------------------------------------- the comparison
def _same_work(mine: V0StepRecord, theirs: V0StepRecord, ordered: bool) -> bool:
    """Equal schedules: the same list in order, or (fast path: a cohort's decodes in bulk) the
    same multiset once the bulk stands for that many one-token decodes."""
    if ordered:
        return mine.scheduled == theirs.scheduled
    rest = Counter(theirs.scheduled)
    rest.subtract(Counter(mine.scheduled))
    if any(n < 0 for n in rest.values()):
        return False
    left = [work for work, n in rest.items() for _ in range(n)]
    return len(left) == mine.bulk_decodes and all(n == 1 for _, n in left)


def _compare(
    index: int, step: int, mine: V0StepRecord, theirs: V0StepRecord, w: V0Workload, fast: bool
) -> SchedDivergence | None:
    """The first field on which the two step records differ (`_FIELDS`' order), else None."""
    if not _same_work(mine, theirs, ordered=not fast):
        kvsim_work = [*mine.scheduled, *[("cohort", 1)] * mine.bulk_decodes]
        return SchedDivergence(index, step, "scheduled", kvsim_work, theirs.scheduled, w)  # type: ignore[arg-type]
    for name in _FIELDS:
        a, b = getattr(mine, name), getattr(theirs, name)
        if fast and name in ("num_prefill_groups", "tables"):
            continue  # quiet decodes are not listed as work
        if a != b:
            return SchedDivergence(index, step, name, a, b, w)  # type: ignore[arg-type]
    return None


def run_v0_workload(
    index: int,
    workload: V0Workload,
    install: VllmInstall,
    result: V0SchedVerifyResult,
    fast_path: bool = False,
) -> SchedDivergence | RealRaised | None:
    """Step both schedulers through `workload`; the first divergence or real raise, else None."""
    ours = KvsimV0Side(workload, fast_path)
    real = RealV0Scheduler(workload.case, install=install)
    last_arrival = max(r.arrival_step for r in workload.requests)
    for step in range(MAX_STEPS):
        for spec in workload.requests:
            if spec.arrival_step == step:
                ours.add_request(spec)
                real.add_request(spec)
        if step > last_arrival and not ours.has_unfinished() and not real.has_unfinished():
            break
        mine = ours.step(float(step))
        raised: RealVllmRaised | None = None
        try:
            theirs = real.step(float(step))
        except RealVllmRaised as exc:
            raised = exc
        if raised is not None or mine.fatal_error is not None:
            if raised is None or mine.fatal_error is None:
                real_error = None if raised is None else f"{raised.upstream_type} in {raised.phase}"
                return SchedDivergence(
                    index,
                    step,
                    "engine crash",
                    mine.fatal_error,
                    real_error,
                    workload,  # type: ignore[arg-type]
                )
            return RealRaised(
                index, step, raised.upstream_type, raised.phase, str(raised.__cause__)
            )
        result.num_steps += 1
        result.num_preemptions += len(theirs.preempted)
        result.num_swap_outs += len(theirs.swapped_out)
        result.num_bulk_decodes += mine.bulk_decodes
        divergence = _compare(index, step, mine, theirs, workload, fast_path)
        if divergence is not None:
            return divergence
    return None


def verify_v0_scheduler(
    num_workloads: int = 100,
    seed: int = 0,
    kinds: tuple[str, ...] = ("v1", "v2"),
    install: VllmInstall | None = None,
    fast_path: bool = False,
    workloads: Sequence[V0Workload] | None = None,
) -> V0SchedVerifyResult:
    """Compare kvsim's v0 scheduler with vLLM 0.5.4's over random workloads (`kinds`: the
    real block managers drawn from, "v1" -> kvsim's v0-v1, "v2" -> v0-v2), or `workloads`."""
    install = install or load_vllm(vllm_version="0.5.4")
    result = V0SchedVerifyResult(install.version, kinds, fast_path=fast_path)
    rng = random.Random(seed)
    if workloads is None:
        workloads = [random_v0_workload(rng, rng.choice(kinds)) for _ in range(num_workloads)]
    for index, workload in enumerate(workloads):
        outcome = run_v0_workload(index, workload, install, result, fast_path)
        case = workload.case
        result.num_workloads += 1
        result.per_design[case.design.value] += 1
        result.num_caching_workloads += case.enable_prefix_caching
        result.num_chunked_workloads += case.enable_chunked_prefill
        result.num_window_workloads += case.sliding_window is not None
        if isinstance(outcome, RealRaised):
            result.real_raised.append(outcome)
        elif isinstance(outcome, SchedDivergence):
            result.divergence = outcome
            break
    return result
