"""The V1 scheduler's release-dependent rules for WAITING requests, one small class each.

`V1Scheduler` asks `policies_for(manager, token_budget)` once; the manager says which vLLM
release it is pinned to (`pin`: kvsim's manager, or the auditor around any manager,
`sim.audit.v1.AuditedV1Manager.pin`, which takes a real-vLLM adapter as 4ac7713).

* Admission gate (may a waiting request be admitted at all, before its first chunk is
  allocated?):
  - `FirstChunkGate` (4ac7713 `sched/scheduler.py:L331-507`, 0.11.0 `L335-523`): always;
    `allocate_slots` for the first chunk is the only check.
  - `FullSequenceGate` (0.33.0 `sched/scheduler.py:L1435-1452`, `kv_cache_manager.py:L531-547`,
    default `scheduler_reserve_full_isl=True`): only if the blocks for the whole current
    sequence fit in the free pool (`sim.kv.v1_engine.admission`). Refused = `allocate_slots`
    None: the waiting loop stops (head-of-line), nothing is preempted.
* PRIORITY preemption in the running loop (the victim is the worst (priority, arrival)):
  - `KeepScheduledVictim` (4ac7713 `sched/scheduler.py:L254-275`; 0.11.0 `L261-291`, which
    drops the victim from its output list but keeps its tokens counted): a victim scheduled
    earlier in this step keeps its tokens and spent budget; the loop index is not corrected;
    a request that preempts itself ends the running loop.
  - `RefundScheduledVictim` (0.33.0 `sched/scheduler.py:L930-990`): such a victim is
    un-scheduled and its tokens go back to the budget; the loop index follows a victim
    removed before it; a request that preempts itself lets the loop go on to the next.
  FCFS preempts the last running request, never one scheduled earlier in the step, on every
  release.
* Prompt larger than the token budget without chunked prefill:
  - `SkipOversized` (4ac7713 `L420-424`, 0.11.0 `L431-435`): set it aside and try the next
    waiting request; the ones set aside return to the head in reverse order (0.11.0 `L541`);
  - `StopAtOversized` (0.33.0 `L1337-1344`): stop scheduling waiting requests this step.

* `long_prefill_token_threshold` with a single request (running + waiting = 1 when the step
  starts): 4ac7713 / 0.11.0 still cap its prefill chunk; 0.33.0 (`sched/scheduler.py:L754-762`)
  does not (there is no one to starve), so a lone 20-token prompt under a threshold of 12 and
  a budget of 24 is scheduled whole. Found by the scheduler lockstep against 0.33.0.

Example (bs=16, 10 free blocks, chunked prefill with a 64-token budget, a 200-token prompt at
the head): 4ac7713 admits it with 4 blocks for its first chunk; 0.33.0 refuses it (13 > 10)
and it waits until 13 blocks are free.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Protocol

from sim.kv.pins import AdmissionCap, VllmPin
from sim.kv.types import Sequence
from sim.scheduler.request import Request, StepPlan


class AdmissionManager(Protocol):
    """What an admission gate asks of the V1 manager."""

    @property
    def num_free_blocks(self) -> int: ...

    def num_blocks_to_admit(
        self, seq: Sequence, hit_block_ids: list[int], max_in_flight_tokens: int | None
    ) -> int: ...


class AdmissionGate(abc.ABC):
    """Decides whether a waiting request may be admitted before its first allocation."""

    @abc.abstractmethod
    def admits(self, manager: AdmissionManager, seq: Sequence, hit_block_ids: list[int]) -> bool:
        """True when the request may go on to `allocate_slots`."""


class FirstChunkGate(AdmissionGate):
    """4ac7713 / 0.11.0: no gate beyond the first chunk's own allocation."""

    def admits(self, manager: AdmissionManager, seq: Sequence, hit_block_ids: list[int]) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class FullSequenceGate(AdmissionGate):
    """0.19.1 on: the whole current sequence (from 0.20.0 SWA-capped) must fit in the pool."""

    #: The tokens the sliding-window cap counts (`policies_for`); None: no cap (0.19.1).
    max_in_flight_tokens: int | None

    def admits(self, manager: AdmissionManager, seq: Sequence, hit_block_ids: list[int]) -> bool:
        needed = manager.num_blocks_to_admit(seq, hit_block_ids, self.max_in_flight_tokens)
        return needed <= manager.num_free_blocks


class OversizedPromptRule(abc.ABC):
    """Without chunked prefill: what a waiting request larger than the budget does."""

    #: True: set it aside and try the next request; False: stop the waiting loop.
    skips_to_next: bool


class SkipOversized(OversizedPromptRule):
    """4ac7713 / 0.11.0: skip it, try the next. The skipped ones go back to the head after the
    waiting loop in reverse skip order (FCFS), as the real side queue returns them; found by
    the scheduler lockstep (`tests/vllm_real/test_vllm_sched_lockstep.py`)."""

    skips_to_next = True


class StopAtOversized(OversizedPromptRule):
    """0.33.0: stop admitting for this step (strict FCFS)."""

    skips_to_next = False


class PriorityVictimRule(abc.ABC):
    """PRIORITY policy: what preempting a running request does to the step being built."""

    #: A request that preempted itself ends the running loop (else the loop goes on).
    self_preemption_ends_loop: bool

    @abc.abstractmethod
    def unschedule(self, plan: StepPlan, victim: Request) -> int:
        """Take the victim's work of this step out of `plan`; the tokens refunded."""

    @abc.abstractmethod
    def index_after_removal(self, index: int, victim_index: int, was_scheduled: bool) -> int:
        """The running loop's index once `running[victim_index]` was removed
        (`was_scheduled`: it had been scheduled earlier in this step)."""


def unschedule_victim(plan: StepPlan, victim: Request) -> int:
    """Take the victim's work out of `plan`; the tokens it had (0 if it was not scheduled)."""
    for position, work in enumerate(plan.scheduled):
        if work.request is victim:
            del plan.scheduled[position]
            return work.num_tokens
    for position, request in enumerate(plan.quiet):
        if request is victim:  # a fast-path decode: one token
            del plan.quiet[position]
            del plan.quiet_contexts[position]
            return 1
    return 0


class KeepScheduledVictim(PriorityVictimRule):
    """4ac7713 / 0.11.0: nothing is refunded and the index stays (a request may be skipped)."""

    self_preemption_ends_loop = True

    def unschedule(self, plan: StepPlan, victim: Request) -> int:
        return 0

    def index_after_removal(self, index: int, victim_index: int, was_scheduled: bool) -> int:
        return index


class RefundVictimIfScheduled(PriorityVictimRule):
    """0.19.1 to 0.26.0 (0.19.1 `sched/scheduler.py:L476-506`, 0.26.0 `L580-608`): a victim
    scheduled earlier in this step is un-scheduled, its tokens go back to the budget and the
    loop index steps back by one; a victim not scheduled (skipped earlier in the loop) leaves
    the index as it is; a request that preempts itself ends the running loop.

    Example: running [a, b, c], a skipped (its last step is in flight), b scheduled (1
    token), c's chunk does not fit and a is the worst: a leaves, nothing is refunded and c
    (now at index 1) is not retried in place: the index stays 2 and the loop moves past it;
    had b been the worst, its token is refunded and the index becomes 1 (c retries).
    """

    self_preemption_ends_loop = True

    def unschedule(self, plan: StepPlan, victim: Request) -> int:
        return unschedule_victim(plan, victim)

    def index_after_removal(self, index: int, victim_index: int, was_scheduled: bool) -> int:
        return index - 1 if was_scheduled else index


class RefundScheduledVictim(PriorityVictimRule):
    """0.33.0: the victim's scheduled tokens return to the budget; the index follows.

    Example: running [a, b, c], a and b scheduled (10 and 1 tokens), c's chunk does not fit
    and a is the worst: a is freed, its 10 tokens refunded, and c (now at index 1) retries.
    """

    self_preemption_ends_loop = False

    def unschedule(self, plan: StepPlan, victim: Request) -> int:
        return unschedule_victim(plan, victim)

    def index_after_removal(self, index: int, victim_index: int, was_scheduled: bool) -> int:
        return index - 1 if victim_index < index else index


@dataclass(frozen=True, slots=True)
class V1ReleasePolicies:
    """The release-dependent rules of one scheduler."""

    release: VllmPin
    admission: AdmissionGate
    oversized_prompt: OversizedPromptRule
    priority_victim: PriorityVictimRule
    #: PRIORITY: two queued requests with equal (priority, arrival) crash the engine when its
    #: heap compares them (4ac7713 / 0.11.0; `sim.scheduler.v1.priority_ties`).
    unordered_priority_ties: bool = False
    #: `long_prefill_token_threshold` is not applied in a step that starts with one request in
    #: the scheduler (0.33.0).
    lone_request_ignores_threshold: bool = False


class PinnedManager(Protocol):
    """What `policies_for` reads of a manager: the release it follows."""

    @property
    def pin(self) -> VllmPin: ...


def policies_for(
    manager: PinnedManager, token_budget: int, max_concurrent_batches: int = 1
) -> V1ReleasePolicies:
    """The rules of the release `manager` is pinned to. The full-sequence gate's sliding-window
    cap counts the token budget (0.20.0, 0.25.1) or `max_in_flight_tokens` =
    `max_concurrent_batches` x the budget (0.26.0, 0.33.0); 0.19.1's gate has no cap.
    Example: 0.26.0 under async scheduling with a 2,048-token budget caps on 4,096 tokens."""
    release = manager.pin
    if not release.has_full_sequence_gate:  # 4ac7713, 0.11.0
        return V1ReleasePolicies(
            release, FirstChunkGate(), SkipOversized(), KeepScheduledVictim(), True
        )
    cap_tokens: int | None = release.window_bound_tokens(token_budget, max_concurrent_batches)
    if release.admission_cap is AdmissionCap.NONE:
        cap_tokens = None
    if release is VllmPin.V0_33_0:
        return V1ReleasePolicies(
            release,
            FullSequenceGate(cap_tokens),
            StopAtOversized(),
            RefundScheduledVictim(),
            lone_request_ignores_threshold=True,
        )
    return V1ReleasePolicies(
        release, FullSequenceGate(cap_tokens), StopAtOversized(), RefundVictimIfScheduled()
    )
