"""The decode shortcuts: one opt-in layer over the faithful running phases of both schedulers.

Most decode steps change nothing in the KV pool: the token lands in a block that has room. The
layer has two levels, both exact (the steps and requests tables are the same with them off:
tests/scheduler/test_decode_fast_path.py, tests/scheduler/test_decode_cohort.py, tests/engine/test_engine.py):

* **the fast path** (`scheduler.decode_fast_path`, on by default). A manager that implements
  `sim.kv.protocol.DecodeFastPath` says, after each real call, at which sequence length the
  next decode must call it again (`decode_touch_len`); until then a decode is *quiet*: the
  scheduler skips the call and lets the manager catch up (`sync_decode`) before its next real
  call on that sequence. Example (bs=16, full attention): a request admitted with a 20-token
  prompt holds 2 blocks (32 slots); decodes at lengths 21..32 are quiet; the decode at length
  33 needs a third block and calls the manager.
* **the decode cohort** (`scheduler.decode_cohort`, on by default, needs the fast path and
  FCFS): quiet decodes are not even visited (`sim.scheduler.fast.cohort`), so a decode step costs
  what changes in it, not the batch size.

The seams. The v0 scheduler (`sim.scheduler.v0.scheduler`) is upstream's one class and calls
the layer only through the named hooks of `sim.scheduler.v0.hooks.V0Hooks` (`on_join`,
`on_leave`, `before_manager_call`, `after_manager_call`, `known_later`, `on_later`,
`lazy_running`, `quiet_turn`, `after_turn`, `requeue_lazy`, `after_requeue`, `after_update`,
`materialize`, `use_cohort`), held in `scheduler.shortcuts`: `NoShortcuts` (no-ops) with the
layer off, `V0DecodeShortcuts` (`sim.scheduler.fast.v0`) with it on.

The V1 scheduler names its own hooks (`sim.scheduler.v1.scheduler.SpeedHooks`:
`joined`, `left`, `before_call`, `after_call`, `refusal_known`, `refused`, `step_done`,
`materialize`, `use_cohort`; no-ops in its `NoSpeedLayer`): `V1DecodeShortcuts` implements
them and `sim.scheduler.fast.v1.with_decode_shortcuts` installs it, so `v1/` imports nothing
of this package (tests/scheduler/test_scheduler_layout.py).

The manager-side protocol is `DecodeFastPath` (`decode_touch_len`, `sync_decode`); the layer is
on only when the manager has both (`fast_path_enabled`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from collections.abc import Sequence as RequestList

from sim.audit.base import AuditorBase
from sim.kv.types import Sequence
from sim.scheduler.config import SchedulerConfig
from sim.scheduler.fast.cohort import DecodeCohort
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan


class FastPathScheduler:
    """What the V1 scheduler shares with the layer: the manager's catch-up before a real call
    and the touch length after it (the two seam calls in the faithful phases), and the layer
    itself when it is on."""

    _fast_path: bool
    _touch_len_of: Callable[[Sequence], int | None]
    _sync_decode: Callable[[Sequence], None]

    def _init_fast_path(self, config: SchedulerConfig, manager: AuditorBase) -> None:
        self._fast_path = fast_path_enabled(config, manager)
        if self._fast_path:
            # Bound once: they run on every touched decode, and the auditor's properties
            # would look the inner method up again on each read. Measured on the compiled
            # core (`sim.native`): reading the properties per call made the v1-engine Azure
            # replay 3.41 s instead of 3.15 s (medians of 5 runs each, alternating with
            # main's, which took 3.28 s and 3.26 s).
            self._touch_len_of = manager.decode_touch_len
            self._sync_decode = manager.sync_decode
        else:
            self._touch_len_of = _never_quiet
            self._sync_decode = _nothing_skipped

    def _refresh_touch(self, request: Request) -> None:
        """After a real call: ask the manager when the next decode must call it again."""
        if self._fast_path:
            request.touch_len = self._touch_len_of(request.seq)

    def _sync(self, request: Request) -> None:
        """Before a real call: let the manager catch up on the decodes it did not see."""
        if request.needs_sync:  # only ever set by the layer
            request.needs_sync = False
            self._sync_decode(request.seq)


class DecodeShortcuts(ABC):
    """The layer's state shared by both engines: the cohort (once `use_cohort` was called)
    and, with a cohort, the running requests that are not members ("outsiders", in no
    particular order). A scheduler's subclass supplies `event_len` (its quiet rules)."""

    def __init__(self) -> None:
        #: The decode cohort; None: every step walks `running` (the fast path alone).
        self.cohort: DecodeCohort | None = None
        #: With a cohort: the running requests that are not members, as an ordered set.
        self.outsiders: dict[Request, None] = {}
        #: The order key (`Request.order_key`) the next request appended to `running` gets
        #: under a cohort.
        self._back_key = 0

    def materialize(self) -> None:
        """Bring every member's tokens and timestamps up to date (they become outsiders)."""
        if self.cohort is not None:
            for request in self.cohort.release_all():
                self.outsiders[request] = None

    def join_running(self, requests: RequestList[Request]) -> None:
        """`requests` were appended to `running` (as outsiders)."""
        if self.cohort is not None:
            for request in requests:
                request.order_key = self._back_key
                self._back_key += 1
                self.outsiders[request] = None

    @abstractmethod
    def event_len(self, request: Request) -> int | None:
        """The first length at which a running decode is not quiet; None: never a member."""


def fast_path_enabled(config: SchedulerConfig, manager: object) -> bool:
    """On when asked for, for plain single-token decodes, and when the manager supports it.
    Off under V1 async scheduling: its decodes are scheduled with their previous token still
    in flight (placeholders, frees and caching on the settled basis), which the shortcuts'
    touch lengths do not model; the faithful path runs instead."""
    return (
        config.decode_fast_path
        and not config.async_scheduling
        and config.num_lookahead_slots == 0
        and callable(getattr(manager, "decode_touch_len", None))
        and callable(getattr(manager, "sync_decode", None))
    )


def _never_quiet(seq: Sequence) -> int | None:
    return None


def _nothing_skipped(seq: Sequence) -> None:
    raise AssertionError(f"kvsim: sync_decode for seq {seq.seq_id} with the fast path off")


def add_quiet_decode(request: Request, plan: StepPlan, finish_len: int) -> None:
    """Schedule a decode the manager declared quiet: no call now (synced before the next one).

    One that finishes after this step (it then has one more token: the output limit, or
    `finish_len` tokens already, i.e. v0's `max_model_len` or the V1 engine's
    `max_model_len - 1`) stays in `plan.scheduled`, where finished requests are freed in
    schedule order; the others go to `plan.quiet`.
    """
    seq = request.seq
    num_tokens = seq.content.num_tokens
    request.needs_sync = True
    if num_tokens + 1 - seq.prompt_len >= request.max_tokens or num_tokens >= finish_len:
        plan.scheduled.append(ScheduledWork(request, 1, seq.num_computed_tokens, False))
    else:
        plan.quiet.append(request)
        plan.quiet_contexts.append(seq.num_computed_tokens)


def sync(manager: AuditorBase, request: Request) -> None:
    """Before a real call: let the manager catch up on the decode steps that were skipped."""
    if request.needs_sync:
        request.needs_sync = False
        manager.sync_decode(request.seq)


def apply_quiet_decodes(quiet: list[Request], now_s: float, advance_computed: bool) -> None:
    """After the step: each quiet decode that is still running gets its token (none finishes).

    `advance_computed` is the v0 order (computed tokens advance after the step); the V1 engine
    advanced them at schedule time.
    """
    running = RequestState.RUNNING
    for request in quiet:
        if request.state is running:
            seq = request.seq
            if advance_computed:
                seq.num_computed_tokens += 1
            seq.content.append_output(-(seq.seq_id + 1), 1)  # == seq.append_tokens(1), hot path
            request.last_token_s = now_s
