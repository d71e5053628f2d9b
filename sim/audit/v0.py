"""The auditor of the v0 API: `can_allocate` / `allocate`, `append_slots`, fork, swap."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from sim.audit.base import _MANAGER_ERRORS, AuditLevel, AuditorBase
from sim.audit.violations import Violation, ViolationKind, ViolationPolicy
from sim.kv.protocol import V0BlockManager
from sim.kv.types import (
    AllocStatus,
    NoFreeBlocksError,
    Sequence,
    SequenceGroup,
    cdiv,
)


class AuditedV0Manager(AuditorBase):
    """Audits a v0 `BlockSpaceManager` (`can_allocate` / `allocate` / `append_slots` / swap)."""

    inner: V0BlockManager

    #: The v0 API's queries no invariant depends on (`V0BlockManager`), and the window in
    #: blocks the real managers report (named in violation messages).
    PASSED_THROUGH: ClassVar[frozenset[str]] = AuditorBase.PASSED_THROUGH | {
        "num_total_gpu_blocks",
        "num_total_cpu_blocks",
        "get_block_table",
        "get_num_free_cpu_blocks",
        "access_all_blocks_in_seq",
        "mark_blocks_as_computed",
        "get_common_computed_block_ids",
        "admission_blocks",
        "block_sliding_window",
        "max_block_sliding_window",
    }

    def _free(self) -> int:
        return self.inner.get_num_free_gpu_blocks()

    def get_num_free_gpu_blocks(self) -> int:
        """A pure query, passed through unrecorded (the scheduler asks several times a step:
        a method, not a lookup through `__getattr__`)."""
        return self.inner.get_num_free_gpu_blocks()

    def __init__(
        self,
        inner: V0BlockManager,
        policy: ViolationPolicy = ViolationPolicy.RECORD,
        level: AuditLevel = AuditLevel.CHEAP,
        clock: Callable[[], tuple[float | None, int | None]] | None = None,
    ) -> None:
        # Named, not **kwargs: mypyc (`sim.native`) passes a forwarded **kwargs to a compiled
        # base's __init__ as one positional dict.
        super().__init__(inner, policy, level, clock)
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
        self._after_query()
        return status

    def _needed_blocks(self, seq_group: SequenceGroup) -> int:
        needed: Callable[[SequenceGroup], int] | None = getattr(
            self.inner, "allocation_blocks", None
        )
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
        status, counted, _ = self._admitted.pop(rid, (None, None, None))
        free_before = self._free()
        try:
            self.inner.allocate(seq_group)
        except NoFreeBlocksError:
            violation = self._allocation_failed(seq_group, status, counted, free_before)
            self._after_call("allocate", rid)
            raise self._fail(violation) from None
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("allocate", rid, exc) from None
        for seq in seq_group.get_seqs():
            self._live_seq_to_request[seq.seq_id] = rid
        if status is AllocStatus.OK:
            self._check_admitted_allocation(seq_group, counted, free_before)
        for seq in seq_group.get_seqs():
            self._check_footprint("allocate", rid, seq)
        self._after_call("allocate", rid)

    def _allocation_failed(
        self,
        seq_group: SequenceGroup,
        status: AllocStatus | None,
        counted: int | None,
        free_before: int,
    ) -> Violation:
        """`allocate` ran dry: an undercount if it was admitted, and whatever it leaked."""
        rid = seq_group.request_id
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
            # The real code keeps the ids it popped; only the record policy gives them back.
            recovered = (
                self.inner.recover_leaked_blocks() if self.policy is ViolationPolicy.RECORD else 0
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
        return violation

    def _check_admitted_allocation(
        self, seq_group: SequenceGroup, counted: int | None, free_before: int
    ) -> None:
        """An admitted allocation succeeded: it must take no more than counted, and keep the watermark."""
        rid = seq_group.request_id
        free_after = self._free()
        taken = free_before - free_after
        if counted is not None and taken > counted:
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
        if free_after < wm:
            self._record(
                ViolationKind.WATERMARK,
                "allocate",
                rid,
                f"admitting {self._describe(seq_group)} left {free_after} free blocks, below the watermark {wm}",
                counted_blocks=counted,
                needed_blocks=taken,
                free_blocks=free_after,
            )

    # --- decode-time slots --------------------------------------------------------
    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        ok = self.inner.can_append_slots(seq_group, num_lookahead_slots)
        if ok:
            self._append_ok.add(seq_group.request_id)
        else:
            self._append_ok.discard(seq_group.request_id)
        self._after_query()
        return ok

    def append_slots(
        self, seq: Sequence, num_lookahead_slots: int = 0, request_id: int | None = None
    ) -> list[tuple[int, int]]:
        rid = request_id if request_id is not None else self._live_seq_to_request.get(seq.seq_id)
        free_before = self._free()
        # A yes covers the one append that follows it. Kept longer, a yes from an earlier step
        # made the append right after a swap-in (which no `can_append_slots` precedes, as in
        # vLLM) read as promised or not depending on whether the decode fast path had skipped
        # that earlier query (fuzz v0-v2 case seed 3644697408).
        promised = rid in self._append_ok
        self._append_ok.discard(rid)
        try:
            cows = self.inner.append_slots(seq, num_lookahead_slots)
        except NoFreeBlocksError:
            if promised:
                kind = ViolationKind.APPEND_UNDERCOUNT
                message = f"can_append_slots said yes for request {rid} but append_slots ran out of blocks ({free_before} free)"
            else:
                kind = ViolationKind.MANAGER_ERROR
                message = f"append_slots for request {rid} ran out of blocks ({free_before} free) with no can_append_slots yes before it"
            violation = self._record(kind, "append_slots", rid, message, free_blocks=free_before)
            self._after_call("append_slots", rid)
            raise self._fail(violation) from None
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("append_slots", rid, exc) from None
        # The cheap level checks the footprint only when the call took blocks (a footprint
        # grows only by allocation); the full level checks it after every call.
        if rid is not None and (self._full or self._free() < free_before):
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
        self._after_query()
        return ok

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        status = self.inner.can_swap_in(seq_group, num_lookahead_slots)
        (self._swap_in_ok.add if status is AllocStatus.OK else self._swap_in_ok.discard)(
            seq_group.request_id
        )
        self._after_query()
        return status

    def _swap(
        self, call: str, seq_group: SequenceGroup, promised: set[int]
    ) -> list[tuple[int, int]]:
        rid = seq_group.request_id
        try:
            mapping: list[tuple[int, int]] = getattr(self.inner, call)(seq_group)
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
