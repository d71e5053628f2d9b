"""Scheduler-level lockstep: kvsim's `V1Scheduler` against vLLM's real V1 `Scheduler`, per step.

A *workload* is one `SchedCase` (pool, block size, budget, chunking, prefix caching, sliding
window, FCFS or PRIORITY) and a few requests, each added before a given step. Both schedulers
get the same requests before the same steps; after every step we compare

* the scheduled requests and their token counts, in schedule order,
* the preemptions, in order,
* the requests that finished,
* the free blocks after `schedule()` and after the model output was applied.

The first disagreement ends the workload with a `SchedDivergence`. Where vLLM's own code raises
(the real engine would die), the workload ends with a `RealRaised` naming the exception's type
and the step; it is reported, never a crash of the comparison, and kvsim must end the run on
the same step (`StepPlan.fatal_error`; e.g. `sim.scheduler.v1.priority_ties`, on with
`V1Scheduler.use_exact_arrival_times`), else that is the divergence.

By default kvsim's scheduler runs with the decode fast path and cohort off, so its plan lists
every request in schedule order. With `fast_path=True` it runs as `kvsim run` does (fast path
and, under FCFS, decode cohort on): quiet decodes are listed after the rest and a cohort's
members decode in bulk, unnamed, so the scheduled work is compared as a multiset (kvsim's
named work plus `bulk` one-token decodes = vLLM's list).

Example: ``verify_scheduler(num_workloads=60, seed=0)`` -> a `SchedVerifyResult` whose
`summary()` reads "v1-engine @0.11.0 scheduler vs vLLM 0.11.0: identical over 60 workloads
(...)" when nothing diverged.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sim.audit.base import AuditLevel
from sim.audit.v1 import AuditedV1Manager
from sim.kv.config import Design, make_manager
from sim.kv.pins import resolve_pin
from sim.scheduler.fast.v1 import with_decode_shortcuts
from sim.scheduler.request import Request
from sim.scheduler.v1.async_scheduler import make_v1_scheduler
from sim.vllm_real.loader import VllmInstall, load_vllm
from sim.vllm_real.sched_case import RequestSpec, SchedCase, StepRecord, case_configs
from sim.vllm_real.sched_workloads import Workload, random_workloads
from sim.vllm_real.v1_sched_adapter import RealV1Scheduler, RealVllmRaised

#: kvsim pins whose scheduling decisions equal 0.11.0's (docs/vllm-v1-changes.md).
PINS_MATCHING_0_11_0 = ("0.11.0", "4ac7713")
#: A workload that has not drained after this many steps stops (both sides stalled alike).
MAX_STEPS = 400
_FIELDS = ("preempted", "finished", "free_after_schedule", "free_after_update")


@dataclass(frozen=True, slots=True)
class SchedDivergence:
    """The first step on which kvsim and vLLM decided differently."""

    workload_index: int
    step: int
    what: str
    kvsim: object
    real: object
    workload: Workload

    def describe(self) -> str:
        lines = [
            f"workload {self.workload_index}, step {self.step}: {self.what} differs",
            f"  kvsim: {self.kvsim!r}",
            f"  vLLM:  {self.real!r}",
            f"  case: {self.workload.case}",
            "  requests (id, prompt segments, output_len, arrival step, arrival_s, priority):",
        ]
        lines += [
            f"    {r.request_id} {r.prompt} {r.output_len} {r.arrival_step} {r.arrival_s} {r.priority}"
            for r in self.workload.requests
        ]
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class RealRaised:
    """vLLM's real scheduler raised at `step` (kvsim agreed on every step before it)."""

    workload_index: int
    step: int
    upstream_type: str
    phase: str
    message: str


@dataclass(slots=True)
class SchedVerifyResult:
    pin: str
    vllm_version: str
    fast_path: bool = False
    async_scheduling: bool = False
    num_workloads: int = 0
    num_steps: int = 0
    num_preemptions: int = 0
    num_prefix_hit_workloads: int = 0
    #: Workloads on a Mamba hybrid (`random_mamba_groups`) and their steps compared.
    num_mamba_workloads: int = 0
    num_mamba_steps: int = 0
    #: Of those, the workloads with a sink, R-SWA or circular-buffer group too.
    num_variant_workloads: int = 0
    #: Workloads with a sliding window under 0.33.0's sparse retention (`sliding_retention`,
    #: `vllm serve`'s default, which `case_configs` gives every such case).
    num_sparse_window_workloads: int = 0
    #: Fast path: one-token decodes kvsim ran in bulk (its decode cohort) and still matched.
    num_bulk_decodes: int = 0
    real_raised: list[RealRaised] = field(default_factory=list)
    divergence: SchedDivergence | None = None

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def summary(self) -> str:
        verdict = "identical over" if self.identical else "DIVERGED after"
        head = (
            f"v1-engine @{self.pin} {'async ' if self.async_scheduling else ''}scheduler"
            f"{' (fast path)' if self.fast_path else ''} "
            f"vs vLLM {self.vllm_version}: {verdict} "
            f"{self.num_workloads} workloads ({self.num_workloads - len(self.real_raised)} to "
            f"the end, {len(self.real_raised)} up to a real-vLLM raise; {self.num_steps} steps "
            f"compared, {self.num_preemptions} preemptions, "
            f"{self.num_prefix_hit_workloads} workloads with prefix hits"
            + (f", {self.num_bulk_decodes} cohort decodes" if self.fast_path else "")
            + (
                f", {self.num_sparse_window_workloads} sliding-window workloads with sparse "
                "retention"
                if self.num_sparse_window_workloads
                else ""
            )
            + (
                f"; {self.num_mamba_workloads} Mamba-hybrid workloads, "
                f"{self.num_mamba_steps} of their steps, {self.num_variant_workloads} with a "
                "sink, R-SWA or circular-buffer group"
                if self.num_mamba_workloads
                else ""
            )
            + ")"
        )
        lines = [head]
        if self.real_raised:
            kinds = sorted({f"{r.upstream_type} in {r.phase}" for r in self.real_raised})
            first = self.real_raised[0]
            lines.append(
                f"  real vLLM raised in {len(self.real_raised)} workloads ({'; '.join(kinds)}), "
                "and kvsim's engine died on the same step in each (`fatal_error`). "
                f"First: workload {first.workload_index}, "
                f"step {first.step}: {first.upstream_type}: {first.message}"
            )
        if self.divergence is not None:
            lines.append(self.divergence.describe())
        return "\n".join(lines)


# --------------------------------------------------------------------------- kvsim side
class _RecordingFrees:
    """kvsim's V1 manager with its `free` calls recorded while `freed` is a list: inside
    `schedule()` the only frees are preemptions, which the real side reports in that order. A
    wrapper, not a patched method: the compiled core's classes (`sim.native`) have fixed
    methods."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.freed: list[int] | None = None

    def free(self, seq: Any) -> None:
        if self.freed is not None:
            self.freed.append(seq.seq_id)
        self._inner.free(seq)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class KvsimSide:
    """kvsim's V1Scheduler on the same case, with the same step records as the real one."""

    def __init__(self, case: SchedCase, pin: str, fast_path: bool = False) -> None:
        config, kv = case_configs(case, pin, fast_path)
        self._frees = _RecordingFrees(make_manager(Design.V1_ENGINE, kv))
        manager = AuditedV1Manager(self._frees, level=AuditLevel.FULL)
        self.scheduler = with_decode_shortcuts(make_v1_scheduler(config, manager))
        self.scheduler.use_exact_arrival_times()  # arrival_s is vLLM's arrival_time here
        if fast_path:
            self.scheduler.use_decode_cohort(None)
        self.manager = manager
        self.requests: list[Request] = []

    def add_request(self, spec: RequestSpec) -> None:
        request = Request.new(
            spec.request_id, spec.arrival_s, spec.content(), spec.output_len, spec.priority
        )
        self.requests.append(request)
        self.scheduler.add_request(request)

    def step(self, now_s: float) -> StepRecord:
        record = StepRecord()
        self._frees.freed = []
        plan = self.scheduler.schedule(now_s)
        record.preempted, self._frees.freed = self._frees.freed, None
        if plan.fatal_error is not None:  # the engine dies here: no model run, no update
            record.fatal_error = plan.fatal_error
            return record
        record.scheduled = [(w.request.request_id, w.num_tokens) for w in plan.all_scheduled()]
        record.bulk_decodes = plan.num_bulk_decodes
        record.free_after_schedule = self.manager.num_free_blocks
        failed = [r.request_id for r in plan.failed]
        finished = self.scheduler.update(plan, now_s)
        record.finished = [r.request_id for r in finished] + [-1 - rid for rid in failed]
        record.free_after_update = self.manager.num_free_blocks
        return record

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()


# --------------------------------------------------------------------------- the comparison
def _same_work(mine: StepRecord, theirs: StepRecord, ordered: bool) -> bool:
    """Equal schedules: the same list in order, or (fast path: quiet decodes are listed last,
    a cohort's in bulk) the same multiset once the bulk stands for that many one-token decodes."""
    if ordered:
        return mine.scheduled == theirs.scheduled
    rest = sorted(theirs.scheduled)
    for work in mine.scheduled:
        if work not in rest:
            return False
        rest.remove(work)
    return len(rest) == mine.bulk_decodes and all(n == 1 for _, n in rest)


def run_workload(
    index: int,
    workload: Workload,
    pin: str,
    install: VllmInstall,
    result: SchedVerifyResult,
    fast_path: bool = False,
) -> SchedDivergence | RealRaised | None:
    """Step both schedulers through `workload`; the first divergence or real raise, else None."""
    ours = KvsimSide(workload.case, pin, fast_path)
    real = RealV1Scheduler(workload.case, install=install)
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
        drained = not ours.has_unfinished() and not real.has_unfinished()
        if raised is None and step > last_arrival and drained:
            break
        mine = ours.step(float(step))
        if raised is None:
            try:
                theirs = real.step()
            except RealVllmRaised as exc:
                raised = exc
        if raised is not None or mine.fatal_error is not None:
            # The engine dies in this step: on both sides (a finding kvsim models), or not.
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
        result.num_bulk_decodes += mine.bulk_decodes
        if not _same_work(mine, theirs, ordered=not fast_path):
            kvsim_work = [*mine.scheduled, *[("cohort", 1)] * mine.bulk_decodes]
            return SchedDivergence(index, step, "scheduled", kvsim_work, theirs.scheduled, workload)
        for name in _FIELDS:
            a, b = getattr(mine, name), getattr(theirs, name)
            if a != b:
                return SchedDivergence(index, step, name, a, b, workload)
    if any(r.num_prefix_hit_tokens for r in ours.requests):
        result.num_prefix_hit_workloads += 1
    return None


def verify_scheduler(
    num_workloads: int = 60,
    seed: int = 0,
    pin: str = "0.11.0",
    vllm_version: str = "0.11.0",
    install: VllmInstall | None = None,
    fast_path: bool = False,
    workloads: Sequence[Workload] | None = None,
    async_scheduling: bool = False,
    mamba_align: bool = False,
    hybrid: bool = False,
) -> SchedVerifyResult:
    """Compare kvsim's V1 scheduler pinned to `pin` with the real one over random workloads
    (or over `workloads`, e.g. `sched_traces.trace_windows`; `hybrid`: half of them Mamba
    hybrids, `random_mamba_groups`); `async_scheduling`: both run
    their `AsyncScheduler` through the engine core's batch queue, call for call
    (`sim.vllm_real.async_lockstep`); `mamba_align`: random full + Mamba hybrids with prefix
    caching instead (`random_mamba_align_workload`)."""
    from sim.vllm_real.async_lockstep import run_async_workload

    install = install or load_vllm(vllm_version=vllm_version)
    result = SchedVerifyResult(
        pin, install.version, fast_path=fast_path, async_scheduling=async_scheduling
    )
    rng = random.Random(seed)
    if workloads is None:
        workloads = random_workloads(
            rng, num_workloads, pin, mamba_align=mamba_align, hybrid=hybrid
        )
    run = run_async_workload if async_scheduling else run_workload
    # 0.33.0: a sliding window with caching runs `vllm serve`'s sparse retention (`case_configs`).
    sparse_windows = resolve_pin(Design.V1_ENGINE, pin).has_prefix_cache_retention
    for index, workload in enumerate(workloads):
        if async_scheduling:
            workload = Workload(replace(workload.case, async_scheduling=True), workload.requests)
        steps_before = result.num_steps
        outcome = run(index, workload, pin, install, result, fast_path)
        result.num_workloads += 1
        case = workload.case
        if case.sliding_window and case.enable_prefix_caching and sparse_windows:
            result.num_sparse_window_workloads += 1
        if any(g.mamba for g in workload.case.groups):
            result.num_mamba_workloads += 1
            result.num_mamba_steps += result.num_steps - steps_before
            if any(g.is_full_variant for g in workload.case.groups):
                result.num_variant_workloads += 1
        if isinstance(outcome, RealRaised):
            result.real_raised.append(outcome)
        elif isinstance(outcome, SchedDivergence):
            result.divergence = outcome
            break
    return result
