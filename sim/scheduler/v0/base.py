"""The v0 scheduler's state and the helpers every phase uses (`vllm/core/scheduler.py @fc93e56`,
0.5.4): the three queues, `_get_num_new_tokens`, `_preempt`, `_append_slots`, and the fatal
engine errors that end `schedule`.

The phases are one module each, as upstream orders them: `sim.scheduler.v0.prefills`
(`_schedule_prefills`, L641-755, and the priority policy's preemption), `sim.scheduler.v0.swapped`
(`_schedule_swapped`, L518-624), `sim.scheduler.v0.running` (`_schedule_running`, L408-516), and
`sim.scheduler.v0.scheduler` (the policies that order them, `_schedule_default` /
`_schedule_chunked_prefill`, and the step's outputs). Each phase's class extends the one before
it (`V0SchedulerBase` <- prefills <- swapped <- running <- `V0Scheduler`) rather than all four
mixing in side by side: single inheritance is what mypyc compiles (`sim.native`), and no phase
overrides another's method, so the chain resolves every name as the mixins did.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sim.audit import AuditedV0Manager, AuditError
from sim.kv.types import SequenceStatus
from sim.scheduler.budget import SchedulingBudget
from sim.scheduler.config import Policy, PreemptionMode, SchedulerConfig
from sim.scheduler.fast.layer import FastPathScheduler
from sim.scheduler.lifecycle import fail
from sim.scheduler.request import Request, RequestState, StepPlan, priority_key

if TYPE_CHECKING:
    from sim.scheduler.fast.v0 import V0DecodeShortcuts

SWAP_SPACE_ERROR = (
    "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."
)


class RunningWalk(enum.Enum):
    """How the running phase treated `running`, which decides how `_requeue` refills it."""

    #: The phase did not run (the default policy scheduled prefills): `running` is untouched.
    NONE = "none"
    #: Upstream's walk: every request visited was taken off `running`; `_requeue` refills it.
    FULL = "full"
    #: The decode cohort's lazy step: `running` still holds every request, except the
    #: scheduled prefill-stage ones in `prefill` (they go back in front when chunking).
    LAZY = "lazy"


@dataclass(slots=True, init=False)
class RunningOutputs:
    """What the running phase returns (`SchedulerRunningOutputs`, L172-205): the requests kept
    running (prefill stage and decodes, in queue order each), those preempted by recompute and
    those swapped out (in preemption order)."""

    walk: RunningWalk
    prefill: list[Request]
    decode: list[Request]
    preempted: list[Request]
    swapped_out: list[Request]

    def __init__(self, walk: RunningWalk) -> None:
        # Written out (dataclass(init=False)): one per engine step, and the generated
        # __init__ with four factories costs twice as much.
        self.walk = walk
        self.prefill = []
        self.decode = []
        self.preempted = []
        self.swapped_out = []

    @property
    def kept(self) -> list[Request]:
        """Upstream's requeue order: the prefill-stage groups, then the decodes."""
        return self.prefill + self.decode


class RunningStep(enum.Enum):
    """One request's turn in the running phase."""

    #: Scheduled, preempted (itself or victims from the tail) or failed: the walk goes on.
    DONE = "done"
    #: No new tokens (the chunked budget ran out): the walk ends, the request stays queued.
    NO_TOKENS = "no_tokens"


class V0SchedulerBase(FastPathScheduler):
    """One replica's v0 scheduler state over an audited v0 block manager (`Scheduler.__init__`,
    L264-333)."""

    engine = "v0"

    def __init__(self, config: SchedulerConfig, block_manager: AuditedV0Manager) -> None:
        self.config = config
        self.block_manager = block_manager
        self.token_budget = config.token_budget("v0")
        self.waiting: deque[Request] = deque()
        self.running: deque[Request] = deque()
        self.swapped: deque[Request] = deque()
        self.num_cumulative_preemption = 0
        self._init_fast_path(config, block_manager)
        #: The decode shortcuts (`sim.scheduler.fast.layer`); None: every call is made.
        #: (`V0Scheduler` sets it up when the fast path is on.)
        self.shortcuts: V0DecodeShortcuts | None = None
        # The prompt limit of `_get_prompt_limit` (L626-639).
        if config.enable_chunked_prefill:
            self.prompt_limit = config.max_model_len
        else:
            self.prompt_limit = min(config.max_model_len, self.token_budget)

    # ------------------------------------------------------------------ queues
    def add_request(self, request: Request) -> None:
        """`add_seq_group` (L343-345); the priority policy keeps `waiting` sorted by
        (priority, arrival), equal keys in arrival order."""
        if self.config.policy is Policy.PRIORITY:
            index = len(self.waiting)
            while index > 0 and priority_key(self.waiting[index - 1]) > priority_key(request):
                index -= 1
            self.waiting.insert(index, request)
        else:
            self.waiting.append(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped)

    def unfinished(self) -> list[Request]:
        self.materialize()
        return [*self.running, *self.swapped, *self.waiting]

    def materialize(self) -> None:
        """Bring every request's tokens up to date (the decode cohort's members)."""
        if self.shortcuts is not None:
            self.shortcuts.materialize()

    def _new_budget(self) -> SchedulingBudget:
        return SchedulingBudget(self.token_budget, self.config.max_num_seqs)

    # ------------------------------------------------------------------ helpers
    def _num_new_tokens(self, request: Request, budget: SchedulingBudget, chunking: bool) -> int:
        """`_get_num_new_tokens`: 1 for a decode, the uncomputed rest for a prefill (L1189-1213)."""
        seq = request.seq
        num_new = seq.num_tokens - seq.num_computed_tokens if request.is_prefill else 1
        if chunking:
            num_new = min(num_new, budget.remaining_token_budget())
        return num_new

    def _preempt(
        self, request: Request, plan: StepPlan, now_s: float, mode: PreemptionMode | None = None
    ) -> PreemptionMode:
        """`_preempt` (L1070-1114): recompute or swap; swap without CPU space is fatal.

        A manager call that fails here (v0-V1's double free swapping out a wrapped
        sliding-window ring, v0-V2's swap-out of a table holding the null block) is fatal too:
        vLLM's exception leaves `schedule` and the engine dies, with the table half swapped or
        half freed, a state no later step of the real engine starts from (see `_die`).
        """
        if mode is None:
            mode = self.config.preemption_mode
            if mode is PreemptionMode.AUTO:
                mode = (
                    PreemptionMode.RECOMPUTE
                    if request.group.get_max_num_running_seqs() == 1
                    else PreemptionMode.SWAP
                )
        self.num_cumulative_preemption += 1
        request.num_preemptions += 1
        plan.num_preempted += 1
        if self.shortcuts is not None:
            self.shortcuts.leave_running(request)
        self._sync(request)
        try:
            return self._preempt_as(mode, request, plan)
        except AuditError as error:
            raise _die(plan, error) from None

    def _preempt_as(self, mode: PreemptionMode, request: Request, plan: StepPlan) -> PreemptionMode:
        """`_preempt_by_recompute` (L1116-1125) or `_preempt_by_swap` / `_swap_out`
        (L1127-1158)."""
        if mode is PreemptionMode.RECOMPUTE:
            request.seq.status = SequenceStatus.WAITING
            request.state = RequestState.WAITING
            self.block_manager.free(request.seq)
            request.seq.num_computed_tokens = 0
            request.is_prefill = True
            return mode
        if not self.block_manager.can_swap_out(request.group):
            plan.fatal_error = SWAP_SPACE_ERROR
            raise _FatalError(SWAP_SPACE_ERROR)
        mapping = self.block_manager.swap_out(request.group)
        plan.num_blocks_swapped_out += len(mapping)
        request.seq.status = SequenceStatus.SWAPPED
        request.state = RequestState.SWAPPED
        return mode

    def _fail(self, request: Request, plan: StepPlan, error: AuditError, now_s: float) -> None:
        fail(self.block_manager, request, plan, error, now_s)

    def _append_slots(self, request: Request, plan: StepPlan) -> None:
        """`_append_slots` (L1048-1068): the copy-on-write pairs count as copied blocks."""
        cows = self.block_manager.append_slots(request.seq, self.config.num_lookahead_slots)
        plan.num_blocks_copied += len(cows)
        self._refresh_touch(request)

    def _append_running(self, requests: Sequence[Request]) -> None:
        """`_add_seq_group_to_running` (L347-350) for each, in order."""
        self.running.extend(requests)
        if self.shortcuts is not None:
            self.shortcuts.join_running(requests)


class _FatalError(Exception):
    """Internal: unwinds `schedule` after a fatal engine error recorded in the plan."""


def _die(plan: StepPlan, error: AuditError) -> _FatalError:
    """Record a manager failure the run cannot go on from as the plan's fatal engine error.

    The record policy carries on after a failed `allocate` or `append_slots`: the request
    fails, its table is released whole (and the auditor returns what a failed allocate
    leaked), so the pool stays consistent. A failed swap or free leaves a table half moved or
    half released (ids back in the pool while the table still names them, or blocks with no
    id at all), which no later call can undo; vLLM raises out of the engine at that call, so
    the run ends there under every policy. The auditor has recorded the violation. Returns
    the exception that unwinds `schedule`.
    """
    plan.fatal_error = error.violation.message
    return _FatalError(plan.fatal_error)
