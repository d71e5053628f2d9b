"""What every auditor shares: recording violations, the invariants checked after any call."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any, ClassVar, cast

from sim.audit.liveness import NoProgress
from sim.audit.violations import AuditError, Violation, ViolationKind, ViolationPolicy
from sim.kv.protocol import DecodeFastPath, PoolIntrospection, PoolStats
from sim.kv.types import (
    DoubleFreeError,
    ManagerError,
    Sequence,
)

#: The failures of vLLM's own code ("null block should not be modified", "Double free", the
#: 0.5.4 block table's IndexError, a RecursionError in a real V2 fork, ...): a model raises them
#: on purpose as named `ManagerError`s, the real-vLLM adapters translate vLLM's. The auditor
#: records these as violations; any other exception (a KeyError or an assert in kvsim's own
#: model, say) is a kvsim bug and propagates, so it never reads as a vLLM finding.
_MANAGER_ERRORS = (ManagerError,)


class AuditLevel(enum.Enum):
    #: O(1) checks after every call (conservation, admission, leaks, footprint, watermark).
    CHEAP = "cheap"
    #: Also walks the refcount map and every live table after every call (tests, fuzzing).
    FULL = "full"


class AuditorBase:
    """What every auditor shares. A manager attribute the auditor does not define is passed
    through only if it is in `PASSED_THROUGH` (reads that change no block state, and the
    leak recovery of the record policy); any other raises AttributeError, so a new manager
    method is either audited (defined on the auditor) or listed here on purpose.
    """

    #: Pool introspection (`sim.kv.protocol.PoolIntrospection`) and the settings every design
    #: has; the subclasses add their API's unaudited queries.
    PASSED_THROUGH: ClassVar[frozenset[str]] = frozenset(
        {
            "block_refcounts",
            "seq_block_ids",
            "num_seq_blocks",
            "max_seq_footprint",
            "recover_leaked_blocks",
            "block_size",
            "watermark_blocks",
        }
    )

    def __init__(
        self,
        inner: PoolIntrospection,
        policy: ViolationPolicy = ViolationPolicy.RECORD,
        level: AuditLevel = AuditLevel.CHEAP,
        clock: Callable[[], tuple[float | None, int | None]] | None = None,
    ) -> None:
        self.inner = inner
        #: The conservation check after every call: the manager's own O(1) `pool_is_conserved`
        #: where it has one (no `PoolStats` built per call), else `pool_stats().is_conserved`.
        self._pool_is_conserved: Callable[[], bool] = (
            getattr(inner, "pool_is_conserved", None) or self._stats_are_conserved
        )
        self.policy = policy
        self.level = level
        #: `level is AuditLevel.FULL`, read once: the after-call checks test it on every call
        #: (~600 k calls per Azure replay), and the enum-member lookup costs ~100 ns each.
        self._full = level is AuditLevel.FULL
        self.violations: list[Violation] = []
        #: The first violation whose call raised to the caller (where the real engine raises).
        self.first_raised: Violation | None = None
        self.num_calls = 0
        self._clock = clock or (lambda: (None, None))
        #: seq_id -> request_id for every sequence holding blocks (for the full level).
        self._live_seq_to_request: dict[int, int] = {}

    # ------------------------------------------------------------------ recording
    def _record(
        self, kind: ViolationKind, call: str, request_id: int | None, message: str, **counts: Any
    ) -> Violation:
        time_s, step = self._clock()
        violation = Violation(kind, call, request_id, message, time_s=time_s, step=step, **counts)
        self.violations.append(violation)
        return violation

    def record_no_progress(self, diagnosis: NoProgress) -> Violation:
        """The engine found this replica's queue stuck (`sim.audit.liveness`): a violation of
        liveness, recorded like any other (the call is the scheduler's, not the manager's)."""
        return self._record(
            ViolationKind.NO_PROGRESS,
            "schedule",
            diagnosis.head_request_id,
            diagnosis.message,
            needed_blocks=diagnosis.needed_blocks,
            free_blocks=diagnosis.free_blocks,
        )

    def _fail(self, violation: Violation) -> AuditError:
        """The error for a call that failed: the real engine raises at this call."""
        if self.first_raised is None:
            self.first_raised = violation
        return AuditError(violation)

    def _free(self) -> int:
        """Free GPU blocks. The v0 and V1 auditors override this with their API's own O(1)
        count (`get_num_free_gpu_blocks`, `num_free_blocks`), cheaper than a whole `pool_stats`."""
        return self.inner.pool_stats().num_free

    def _after_query(self) -> None:
        """After an admission query (can_allocate, can_append_slots, can_swap_*): queries change
        no state, so the cheap level checks nothing more; the full level checks everything."""
        self.num_calls += 1
        if self._full:
            self.num_calls -= 1
            self._after_call("query", None)

    def _stats_are_conserved(self) -> bool:
        return self.inner.pool_stats().is_conserved

    def _after_call(self, call: str, request_id: int | None) -> None:
        """Invariants that hold after every call, whatever it was."""
        self.num_calls += 1
        if not self._pool_is_conserved():
            stats = self.inner.pool_stats()  # read only to describe the violation
            self._record(
                ViolationKind.CONSERVATION,
                call,
                request_id,
                f"{call}: free {stats.num_free} + held {stats.num_held} != total {stats.num_total} "
                f"(evictable {stats.num_evictable})",
                free_blocks=stats.num_free,
            )
        if self._full:
            self._check_full(call, request_id)

    def _check_full(self, call: str, request_id: int | None) -> None:
        """The full level's walks after a call (refcounts and live tables)."""
        self._check_refcounts(call, request_id, self.inner.pool_stats().num_held)

    def _check_refcounts(self, call: str, request_id: int | None, num_held: int) -> None:
        refcounts = self.inner.block_refcounts()
        negative = [b for b, r in refcounts.items() if r < 0]
        if negative:
            self._record(
                ViolationKind.DOUBLE_FREE,
                call,
                request_id,
                f"{call}: negative refcount on blocks {negative[:5]}",
            )
        held = sum(1 for r in refcounts.values() if r > 0)
        if held != num_held:
            self._record(
                ViolationKind.REFCOUNT,
                call,
                request_id,
                f"{call}: {held} blocks have a positive refcount but the pool reports {num_held} held",
            )
        for seq_id, req_id in self._live_seq_to_request.items():
            for block_id in self.inner.seq_block_ids(seq_id):
                if block_id is not None and refcounts.get(block_id, 0) <= 0:
                    self._record(
                        ViolationKind.REFCOUNT,
                        call,
                        req_id,
                        f"{call}: seq {seq_id} of request {req_id} references block {block_id} with refcount 0",
                    )
                    return

    def _check_footprint(self, call: str, request_id: int, seq: Sequence) -> None:
        bound = self.inner.max_seq_footprint(seq)
        if bound is None:
            return
        held = self.inner.num_seq_blocks(seq.seq_id)
        if held > bound:
            self._record(
                ViolationKind.SLIDING_WINDOW_FOOTPRINT,
                call,
                request_id,
                f"{call}: request {request_id} holds {held} blocks ({seq.num_tokens} tokens) "
                f"but the design's sliding-window bound is {bound}",
                counted_blocks=bound,
                needed_blocks=held,
            )

    def _manager_error(self, call: str, request_id: int | None, exc: Exception) -> AuditError:
        kind = (
            ViolationKind.DOUBLE_FREE
            if isinstance(exc, DoubleFreeError)
            else ViolationKind.MANAGER_ERROR
        )
        text = str(exc) or type(exc).__name__
        violation = self._record(
            kind,
            call,
            request_id,
            f"{call} raised {type(exc).__name__}: {text} (request {request_id})",
        )
        return self._fail(violation)

    # ------------------------------------------------------------------ decode fast path
    # Plain pass-throughs, recorded nowhere. Properties, not methods, so that an inner manager
    # without the optional capability (a real-vLLM adapter) reads as lacking it here too:
    # `getattr(audited, "sync_decode", None)` is then None.
    @property
    def decode_touch_len(self) -> Callable[[Sequence], int | None]:
        return cast(DecodeFastPath, self.inner).decode_touch_len

    @property
    def sync_decode(self) -> Callable[[Sequence], None]:
        return cast(DecodeFastPath, self.inner).sync_decode

    # ------------------------------------------------------------------ delegation
    def pool_stats(self) -> PoolStats:
        """The inner manager's counts (read after every engine step: a method, not a lookup
        through `__getattr__`)."""
        return self.inner.pool_stats()

    def __getattr__(self, name: str) -> Any:
        # Only for names not found on the auditor: the listed queries pass through unaudited.
        if name in type(self).PASSED_THROUGH:
            return getattr(self.inner, name)
        raise AttributeError(
            f"{type(self).__name__} neither audits nor passes through {name!r}: define it on "
            "the auditor, or list it in PASSED_THROUGH (sim.audit) if it changes nothing"
        )
