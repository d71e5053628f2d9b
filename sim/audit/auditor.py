"""The auditor: a wrapper between any caller and any block manager that checks every call.

It never changes what the manager decides. It observes each call, compares it with what the
preceding admission query promised, and checks pool invariants:

* conservation: free + held == total (O(1), after every call);
* admission consistency: an OK from `can_allocate` is followed by an `allocate` that succeeds
  (else `admission_undercount`) and takes no more blocks than were counted (else
  `admission_overtake`: the same undercount, survived because the pool had room);
* leaks: blocks taken by a failed allocation that no table owns;
* the sliding-window footprint bound of the design (at the cheap level, after calls that took
  blocks), and the watermark;
* refcounts (full level only, O(pool) per call): every table entry is held, and the held count
  agrees with the refcount map.

Worked example (the 4-vs-3 case, v0 BlockSpaceManagerV2, bs=16, W=24 so M=3, G=10)::

    can_allocate(A, 112 tokens) counts min(7, 3) = 3 -> OK
    allocate(A) takes 7 blocks -> F=3              => Violation(admission_overtake, 3 vs 7)
    can_allocate(B, 64 tokens)  counts min(4, 3) = 3 <= 3 -> OK
    allocate(B) needs 4, pops 3, raises NoFreeBlocksError     -> F=0
    => Violation(admission_undercount, counted=3, needed=4, free=3)
       Violation(leaked_blocks, 3 blocks; returned to the pool under the record policy)
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from sim.audit.violations import AuditError, Violation, ViolationKind, ViolationPolicy
from sim.kv.protocol import PoolIntrospection
from sim.kv.types import (
    AllocStatus,
    DoubleFreeError,
    NoFreeBlocksError,
    Sequence,
    SequenceGroup,
    cdiv,
)

#: Errors a manager raises on its own (vLLM's included: "null block should not be modified",
#: "Double free", an IndexError of the 0.5.4 block table, a RecursionError in a V2 fork). The
#: auditor records them as violations instead of letting them crash the simulator.
_MANAGER_ERRORS = (ValueError, AssertionError, KeyError, IndexError, RuntimeError)


class AuditLevel(enum.Enum):
    #: O(1) checks after every call (conservation, admission, leaks, footprint, watermark).
    CHEAP = "cheap"
    #: Also walks the refcount map and every live table after every call (tests, fuzzing).
    FULL = "full"


class _AuditorBase:
    def __init__(
        self,
        inner: PoolIntrospection,
        policy: ViolationPolicy = ViolationPolicy.RECORD,
        level: AuditLevel = AuditLevel.CHEAP,
        clock: Callable[[], tuple[float | None, int | None]] | None = None,
    ) -> None:
        self.inner = inner
        self.policy = policy
        self.level = level
        self.violations: list[Violation] = []
        self.num_calls = 0
        self._clock = clock or (lambda: (None, None))
        #: seq_id -> request_id for every sequence holding blocks (for the full level).
        self._live_seq_to_request: dict[int, int] = {}

    # ------------------------------------------------------------------ recording
    def _record(
        self, kind: ViolationKind, call: str, request_id: int | None, message: str, **counts
    ) -> Violation:
        time_s, step = self._clock()
        violation = Violation(kind, call, request_id, message, time_s=time_s, step=step, **counts)
        self.violations.append(violation)
        return violation

    def _fail(self, violation: Violation) -> AuditError:
        return AuditError(violation)

    def _free(self) -> int:
        return self.inner.pool_stats().num_free

    def _after_call(self, call: str, request_id: int | None) -> None:
        """Invariants that hold after every call, whatever it was."""
        self.num_calls += 1
        stats = self.inner.pool_stats()
        if not stats.is_conserved:
            self._record(
                ViolationKind.CONSERVATION,
                call,
                request_id,
                f"{call}: free {stats.num_free} + held {stats.num_held} != total {stats.num_total} "
                f"(evictable {stats.num_evictable})",
                free_blocks=stats.num_free,
            )
        if self.level is AuditLevel.FULL:
            self._check_refcounts(call, request_id, stats.num_held)

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
        return self.inner.decode_touch_len

    @property
    def sync_decode(self) -> Callable[[Sequence], None]:
        return self.inner.sync_decode

    # ------------------------------------------------------------------ delegation
    def __getattr__(self, name: str):
        # Read-only introspection (pool_stats, block_size, seq_block_ids, ...) passes through.
        return getattr(self.inner, name)


class AuditedV0Manager(_AuditorBase):
    """Audits a v0 `BlockSpaceManager` (`can_allocate` / `allocate` / `append_slots` / swap)."""

    def __init__(self, inner, **kwargs) -> None:
        super().__init__(inner, **kwargs)
        #: request_id -> (status, counted blocks, free blocks) of the last `can_allocate`.
        self._admitted: dict[int, tuple[AllocStatus, int, int]] = {}
        self._swap_in_ok: set[int] = set()
        self._swap_out_ok: set[int] = set()
        self._append_ok: set[int] = set()

    # --- admission and allocation ------------------------------------------------
    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        status = self.inner.can_allocate(seq_group)
        counted = self.inner.admission_blocks(seq_group)
        self._admitted[seq_group.request_id] = (status, counted, self._free())
        self._after_call("can_allocate", seq_group.request_id)
        return status

    def _needed_blocks(self, seq_group: SequenceGroup) -> int:
        needed = getattr(self.inner, "allocation_blocks", None)
        if needed is not None:
            return needed(seq_group)
        seq = seq_group.get_seqs()[0]
        return cdiv(seq.num_tokens, self.inner.block_size)

    def _describe(self, seq_group: SequenceGroup) -> str:
        seq = seq_group.get_seqs()[0]
        # v0-V1 calls it `block_sliding_window`; v0-V2 `max_block_sliding_window` (M).
        window = getattr(self.inner, "max_block_sliding_window", None) or getattr(
            self.inner, "block_sliding_window", None
        )
        extra = f", window {window} blocks" if window else ""
        return f"request {seq_group.request_id} ({seq.num_tokens} tokens{extra})"

    def allocate(self, seq_group: SequenceGroup) -> None:
        rid = seq_group.request_id
        status, counted, free_at_query = self._admitted.pop(rid, (None, None, None))
        free_before = self._free()
        try:
            self.inner.allocate(seq_group)
        except NoFreeBlocksError:
            needed = self._needed_blocks(seq_group)
            free_after = self._free()
            what = self._describe(seq_group)
            if status is AllocStatus.OK:
                violation = self._record(
                    ViolationKind.ADMISSION_UNDERCOUNT,
                    "allocate",
                    rid,
                    f"can_allocate counted {counted} blocks for {what} but allocate needed {needed} with {free_before} free",
                    counted_blocks=counted,
                    needed_blocks=needed,
                    free_blocks=free_before,
                )
            else:
                violation = self._record(
                    ViolationKind.MANAGER_ERROR,
                    "allocate",
                    rid,
                    f"allocate ran out of blocks for {what} without an OK admission ({needed} needed, {free_before} free)",
                    needed_blocks=needed,
                    free_blocks=free_before,
                )
            leaked = free_before - free_after
            if leaked > 0:
                recovered = (
                    self.inner.recover_leaked_blocks()
                    if self.policy is ViolationPolicy.RECORD
                    else 0
                )
                note = (
                    f"; the auditor returned {recovered} to the pool"
                    if recovered
                    else "; they stay lost (stop policy)"
                )
                self._record(
                    ViolationKind.LEAKED_BLOCKS,
                    "allocate",
                    rid,
                    f"failed allocate for {what} leaked {leaked} blocks that no table owns{note}",
                    needed_blocks=needed,
                    free_blocks=free_after,
                    recovered_blocks=recovered,
                )
            self._after_call("allocate", rid)
            raise self._fail(violation) from None
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("allocate", rid, exc) from None
        taken = free_before - self._free()
        for seq in seq_group.get_seqs():
            self._live_seq_to_request[seq.seq_id] = rid
        if status is AllocStatus.OK and counted is not None and taken > counted:
            self._record(
                ViolationKind.ADMISSION_OVERTAKE,
                "allocate",
                rid,
                f"can_allocate counted {counted} blocks for {self._describe(seq_group)} but allocate took {taken}",
                counted_blocks=counted,
                needed_blocks=taken,
                free_blocks=free_before,
            )
        wm = self.inner.watermark_blocks
        if status is AllocStatus.OK and self._free() < wm:
            self._record(
                ViolationKind.WATERMARK,
                "allocate",
                rid,
                f"admitting {self._describe(seq_group)} left {self._free()} free blocks, below the watermark {wm}",
                counted_blocks=counted,
                needed_blocks=taken,
                free_blocks=self._free(),
            )
        for seq in seq_group.get_seqs():
            self._check_footprint("allocate", rid, seq)
        self._after_call("allocate", rid)

    # --- decode-time slots --------------------------------------------------------
    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        ok = self.inner.can_append_slots(seq_group, num_lookahead_slots)
        if ok:
            self._append_ok.add(seq_group.request_id)
        else:
            self._append_ok.discard(seq_group.request_id)
        self._after_call("can_append_slots", seq_group.request_id)
        return ok

    def append_slots(
        self, seq: Sequence, num_lookahead_slots: int = 0, request_id: int | None = None
    ) -> list[tuple[int, int]]:
        rid = request_id if request_id is not None else self._live_seq_to_request.get(seq.seq_id)
        free_before = self._free()
        try:
            cows = self.inner.append_slots(seq, num_lookahead_slots)
        except NoFreeBlocksError:
            kind = (
                ViolationKind.APPEND_UNDERCOUNT
                if rid in self._append_ok
                else ViolationKind.MANAGER_ERROR
            )
            violation = self._record(
                kind,
                "append_slots",
                rid,
                f"can_append_slots said yes for request {rid} but append_slots ran out of blocks ({free_before} free)",
                free_blocks=free_before,
            )
            self._after_call("append_slots", rid)
            raise self._fail(violation) from None
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("append_slots", rid, exc) from None
        # The cheap level checks the footprint only when the call took blocks (a footprint
        # grows only by allocation); the full level checks it after every call.
        if rid is not None and (self.level is AuditLevel.FULL or self._free() < free_before):
            self._check_footprint("append_slots", rid, seq)
        self._after_call("append_slots", rid)
        return cows

    # --- lifecycle -----------------------------------------------------------------
    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        rid = self._live_seq_to_request.get(parent_seq.seq_id)
        try:
            self.inner.fork(parent_seq, child_seq)
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("fork", rid, exc) from None
        if rid is not None:
            self._live_seq_to_request[child_seq.seq_id] = rid
        self._after_call("fork", rid)

    def free(self, seq: Sequence) -> None:
        rid = self._live_seq_to_request.pop(seq.seq_id, None)
        try:
            self.inner.free(seq)
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("free", rid, exc) from None
        self._after_call("free", rid)

    # --- swapping ------------------------------------------------------------------
    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        ok = self.inner.can_swap_out(seq_group)
        (self._swap_out_ok.add if ok else self._swap_out_ok.discard)(seq_group.request_id)
        self._after_call("can_swap_out", seq_group.request_id)
        return ok

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        status = self.inner.can_swap_in(seq_group, num_lookahead_slots)
        (self._swap_in_ok.add if status is AllocStatus.OK else self._swap_in_ok.discard)(
            seq_group.request_id
        )
        self._after_call("can_swap_in", seq_group.request_id)
        return status

    def _swap(
        self, call: str, seq_group: SequenceGroup, promised: set[int]
    ) -> list[tuple[int, int]]:
        rid = seq_group.request_id
        try:
            mapping = getattr(self.inner, call)(seq_group)
        except NoFreeBlocksError:
            kind = ViolationKind.SWAP_UNDERCOUNT if rid in promised else ViolationKind.MANAGER_ERROR
            violation = self._record(
                kind,
                call,
                rid,
                f"{call} of request {rid} ran out of blocks after its admission said yes",
            )
            self._after_call(call, rid)
            raise self._fail(violation) from None
        except _MANAGER_ERRORS as exc:
            raise self._manager_error(call, rid, exc) from None
        promised.discard(rid)
        self._after_call(call, rid)
        return mapping

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        return self._swap("swap_out", seq_group, self._swap_out_ok)

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        mapping = self._swap("swap_in", seq_group, self._swap_in_ok)
        for seq in seq_group.get_seqs():
            self._live_seq_to_request[seq.seq_id] = seq_group.request_id
        return mapping


class AuditedV1Manager(_AuditorBase):
    """Audits a V1-engine `KVCacheManager` (`allocate_slots` counts and allocates at once)."""

    def get_computed_blocks(self, request: Sequence) -> tuple[list[int], int]:
        result = self.inner.get_computed_blocks(request)
        self._after_call("get_computed_blocks", request.seq_id)
        return result

    def allocate_slots(
        self,
        request: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: list[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        rid = request.seq_id
        try:
            blocks = self.inner.allocate_slots(
                request,
                num_new_tokens,
                num_new_computed_tokens,
                new_computed_block_ids,
                num_lookahead_tokens,
            )
        except NoFreeBlocksError as exc:
            violation = self._record(
                ViolationKind.ADMISSION_UNDERCOUNT,
                "allocate_slots",
                rid,
                f"allocate_slots counted enough free blocks for request {rid} but the pool ran dry: {exc}",
                free_blocks=self._free(),
            )
            self._after_call("allocate_slots", rid)
            raise self._fail(violation) from None
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("allocate_slots", rid, exc) from None
        if blocks is not None:
            self._live_seq_to_request[rid] = rid
            if blocks or self.level is AuditLevel.FULL:
                self._check_footprint("allocate_slots", rid, request)
        self._after_call("allocate_slots", rid)
        return blocks

    def free(self, request: Sequence) -> None:
        rid = request.seq_id
        self._live_seq_to_request.pop(rid, None)
        try:
            self.inner.free(request)
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("free", rid, exc) from None
        self._after_call("free", rid)

    @property
    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks


def audited(manager, **kwargs) -> AuditedV0Manager | AuditedV1Manager:
    """Wrap `manager` in the auditor for its API."""
    if hasattr(manager, "allocate_slots"):
        return AuditedV1Manager(manager, **kwargs)
    return AuditedV0Manager(manager, **kwargs)
