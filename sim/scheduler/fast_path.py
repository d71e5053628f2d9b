"""The decode fast path both schedulers share.

Most decode steps change nothing in the KV pool: the token lands in a block that has room. A
manager that implements `decode_touch_len` / `sync_decode` (`sim.kv.protocol.DecodeFastPath`)
says, after each real call, at which sequence length the next decode must call it again; until
then the scheduler skips the call (the step is "quiet") and lets the manager catch up with
`sync_decode` before its next real call. Results are identical with the fast path off
(`scheduler.decode_fast_path: false`; see tests/test_engine.py and test_decode_fast_path.py).

Example (bs=16, full attention): a request admitted with a 20-token prompt holds 2 blocks
(32 slots); decodes at lengths 21..32 are quiet; the decode at length 33 needs a third block
and calls the manager.

The engine goes one step further with a decode cohort (`sim.scheduler.cohort`): quiet decodes
are then not even visited; this module's per-request quiet path remains for steps that must
walk every request, and for schedulers used without a cohort.
"""

from __future__ import annotations

from sim.audit.base import AuditorBase
from sim.scheduler.cohort import DecodeCohort
from sim.scheduler.config import SchedulerConfig
from sim.scheduler.request import Request, RequestState, ScheduledWork, StepPlan


class FastPathScheduler:
    """What both schedulers share around the fast path and the decode cohort: the bound
    manager calls, the sync before a real call and the touch refresh after it, and the
    cohort's outsider bookkeeping. A scheduler supplies `_event_len` (its quiet rules)."""

    _fast_path: bool
    _cohort: DecodeCohort | None
    _outsiders: dict[Request, None]

    def _init_fast_path(self, config: SchedulerConfig, manager: AuditorBase) -> None:
        self._fast_path = fast_path_enabled(config, manager)
        # The fast-path calls, bound once (they run on every touched decode).
        self._touch_len_of = manager.decode_touch_len if self._fast_path else None
        self._sync_decode = manager.sync_decode if self._fast_path else None
        #: The decode cohort (`use_decode_cohort`); None: every step walks `running`.
        self._cohort = None
        #: With a cohort: the running requests that are not members, in no particular order.
        self._outsiders = {}

    def materialize(self) -> None:
        """Bring every member's tokens and timestamps up to date (they become outsiders)."""
        if self._cohort is not None:
            for request in self._cohort.release_all():
                self._outsiders[request] = None

    def _join_cohort(self) -> None:
        """After a step: every running decode that has a quiet stretch ahead joins."""
        if self._outsiders:
            self._cohort.join_outsiders(self._outsiders, self._event_len)

    def _event_len(self, request: Request) -> int | None:
        raise NotImplementedError

    def _refresh_touch(self, request: Request) -> None:
        """After a real call: ask the manager when the next decode must call it again."""
        request.touch_len = self._touch_len_of(request.seq) if self._fast_path else None

    def _sync(self, request: Request) -> None:
        """Before a real call: let the manager catch up on the decodes it did not see."""
        if request.needs_sync:  # only ever set with the fast path on
            request.needs_sync = False
            self._sync_decode(request.seq)


def fast_path_enabled(config: SchedulerConfig, manager: object) -> bool:
    """On when asked for, for plain single-token decodes, and when the manager supports it."""
    return (
        config.decode_fast_path
        and config.num_lookahead_slots == 0
        and callable(getattr(manager, "decode_touch_len", None))
        and callable(getattr(manager, "sync_decode", None))
    )


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
