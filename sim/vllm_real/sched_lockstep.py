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
from sim.kv.config import Design, KVCacheGroupSpec, make_manager
from sim.kv.pins import resolve_pin
from sim.scheduler.fast.v1 import with_decode_shortcuts
from sim.scheduler.request import Request
from sim.scheduler.v1.async_scheduler import make_v1_scheduler
from sim.vllm_real.loader import VllmInstall, load_vllm
from sim.vllm_real.lockstep import full_variant_kinds
from sim.vllm_real.v1_sched_adapter import (
    RealV1Scheduler,
    RealVllmRaised,
    RequestSpec,
    SchedCase,
    StepRecord,
    case_configs,
)

#: kvsim pins whose scheduling decisions equal 0.11.0's (docs/vllm-v1-changes.md).
PINS_MATCHING_0_11_0 = ("0.11.0", "4ac7713")
#: A workload that has not drained after this many steps stops (both sides stalled alike).
MAX_STEPS = 400
_FIELDS = ("preempted", "finished", "free_after_schedule", "free_after_update")


@dataclass(frozen=True, slots=True)
class Workload:
    case: SchedCase
    requests: tuple[RequestSpec, ...]


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


# --------------------------------------------------------------------------- workloads
def random_mamba_groups(
    rng: random.Random, block_size: int, max_model_len: int, variants: tuple[str, ...] = ()
) -> tuple[tuple[KVCacheGroupSpec, ...], int]:
    """A Mamba hybrid's KV-cache groups (1-2 full, 1-3 Mamba state groups, in half of them a
    sliding group of 2-3 blocks' window too; with `variants`, in half of them one group of a
    kind the release has: sink, R-SWA or circular buffer, `sim.kv.v1_engine.full_variants`;
    any order) and the blocks one max_model_len request needs with the sink blocks: a full,
    sliding, sink or R-SWA group ``cdiv(max_model_len, bs)``, a Mamba group or a ring one."""
    groups = [KVCacheGroupSpec()] * rng.randint(1, 2)
    groups += [KVCacheGroupSpec(mamba=True)] * rng.randint(1, 3)
    if rng.random() < 0.5:
        groups.append(KVCacheGroupSpec(block_size * rng.choice([2, 3]) + rng.randint(0, 1)))
    if variants and rng.random() < 0.5:
        kind = rng.choice(variants)
        if kind == "sink":
            groups.append(KVCacheGroupSpec(sink_len=block_size * rng.randint(1, 2)))
        elif kind == "rswa":
            groups.append(KVCacheGroupSpec(rswa_window=rng.randint(1, 2 * block_size)))
        else:
            groups.append(KVCacheGroupSpec(circular_buffer=True))
    rng.shuffle(groups)
    need = sum(
        1 if g.mamba or g.circular_buffer else -(-max_model_len // block_size) for g in groups
    )
    need += sum((g.sink_len or 0) // block_size for g in groups)
    return tuple(groups), need


def random_workload(
    rng: random.Random,
    *,
    ties: bool | None = None,
    mamba: bool = False,
    variants: tuple[str, ...] = (),
) -> Workload:
    """A small random workload; `ties` forces (or forbids) equal (priority, arrival_s) pairs;
    `mamba`: in half the workloads a Mamba hybrid's groups (`random_mamba_groups`), prefix
    caching off, as kvsim models them."""
    block_size = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 96, 128])
    min_blocks = -(-max_model_len // block_size) + 1  # one request alone always fits
    groups: tuple[KVCacheGroupSpec, ...] = ()
    if mamba and rng.random() < 0.5:
        groups, need = random_mamba_groups(rng, block_size, max_model_len, variants)
        min_blocks = need + 1
    chunked = rng.random() < 0.8
    max_num_seqs = rng.randint(2, 6)
    budget = rng.choice([16, 24, 32, 64, 128]) if chunked else max_model_len + rng.choice([0, 32])
    policy = rng.choice(["fcfs", "priority"])
    if ties is None:
        ties = policy == "priority" and rng.random() < 0.3
    case = SchedCase(
        num_blocks=min_blocks + rng.randint(0, min_blocks),
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=rng.random() < 0.5,
        sliding_window=rng.choice([None, None, block_size * 2, block_size * 3 + 1]),
        long_prefill_token_threshold=rng.choice([0, 0, 0, 12]),
        policy=policy,
    )
    if groups:
        case = replace(case, kv_cache_groups=groups, enable_prefix_caching=False)
        case = replace(case, sliding_window=None)
    tie_across = rng.random() < 0.5
    requests = []
    num_requests = rng.randint(3, 10)
    for rid in range(num_requests):
        prompt: list[tuple[int, int]] = []
        if rng.random() < 0.5:  # a shared prefix (3 keys), whole blocks or not
            prompt.append((rng.randint(0, 2), rng.choice([block_size, 2 * block_size, 20])))
        tail = rng.randint(1, max_model_len // 2)
        prompt.append((1000 + rid, tail))
        prompt_len = sum(n for _, n in prompt)
        if prompt_len > max_model_len - 1:
            prompt = [(1000 + rid, max_model_len - 1)]
        arrival_step = rng.randint(0, 8)
        # Ties within a step (pushed together), or across steps (at most one still queued).
        arrival_s = (
            (0.0 if tie_across else float(arrival_step)) if ties else arrival_step + rid / 1000
        )
        priority = rng.choice([0, 1, 2]) if policy == "priority" and not ties else 0
        requests.append(
            RequestSpec(rid, tuple(prompt), rng.randint(1, 24), arrival_step, arrival_s, priority)
        )
    return Workload(case, tuple(requests))


def random_mamba_align_workload(rng: random.Random) -> Workload:
    """A full + Mamba hybrid (1-2 Mamba groups) with prefix caching on (vLLM's Mamba mode
    "align", a third of them "all") and chunked prefill, budgets that split prompts mid-block, and shared prefixes
    of whole blocks or not, so that the block-aligned split and Mamba hits both decide."""
    block_size = rng.choice([4, 8, 16])
    max_model_len = rng.choice([64, 96, 128])
    num_groups = 1 + rng.randint(1, 2)
    min_blocks = num_groups * (-(-max_model_len // block_size) + 2)
    max_num_seqs = rng.randint(2, 6)
    budget = rng.choice([block_size // 2, block_size + 3, 24, 32, 64, 128])
    case = SchedCase(
        num_blocks=min_blocks + rng.randint(0, min_blocks),
        block_size=block_size,
        max_model_len=max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max(budget, max_num_seqs),
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
        long_prefill_token_threshold=rng.choice([0, 0, 0, 12]),
        mamba_groups=num_groups - 1,
        mamba_cache_mode=rng.choice(["align", "align", "all"]),
    )
    requests = []
    for rid in range(rng.randint(3, 10)):
        prompt: list[tuple[int, int]] = []
        if rng.random() < 0.7:
            prompt.append((rng.randint(0, 2), rng.choice([block_size, 3 * block_size, 20, 41])))
        prompt.append((1000 + rid, rng.randint(1, max_model_len // 2)))
        if sum(n for _, n in prompt) > max_model_len - 1:
            prompt = [(1000 + rid, max_model_len - 1)]
        arrival_step = rng.randint(0, 8)
        requests.append(
            RequestSpec(
                rid, tuple(prompt), rng.randint(1, 24), arrival_step, arrival_step + rid / 1000
            )
        )
    return Workload(case, tuple(requests))


def _as_033_align(index: int, workload: Workload) -> Workload:
    """0.33.0 has no "all": every draw runs "align", two in three with a prefill checkpoint
    block, half with sparse retention (`sim.kv.v1_engine.mamba_checkpoint`); no rng draw, so
    other pins' walks stay."""
    case = replace(
        workload.case,
        mamba_cache_mode="align",
        mamba_prefill_checkpoint_blocks=int(index % 3 != 0),
        prefix_cache_retention_interval=0 if index % 2 else None,
    )
    return Workload(case, workload.requests)


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
        if mamba_align:
            workloads = [random_mamba_align_workload(rng) for _ in range(num_workloads)]
            if resolve_pin(Design.V1_ENGINE, pin).mamba_align_has_checkpoints:
                workloads = [_as_033_align(i, w) for i, w in enumerate(workloads)]
        else:
            # `hybrid`: Mamba hybrids where the pin models Mamba groups (0.11.0 on).
            release = resolve_pin(Design.V1_ENGINE, pin)
            mamba = hybrid and release.models_mamba_groups
            variants = full_variant_kinds(pin) if hybrid else ()
            workloads = [
                random_workload(rng, mamba=mamba, variants=variants) for _ in range(num_workloads)
            ]
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
