"""The auditor of the V1-engine API: `allocate_slots` counts and allocates in one call.

With several KV-cache groups (the hybrid coordinator), the full level also checks that the
pool's held blocks are exactly the blocks in the groups' tables: a held block that no group
holds is leaked, and the groups cannot hold more than the pool has taken out. With the
conservation check (free + held == pool, the cached free blocks counted free) this accounts
for every block across the groups.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from sim.audit.base import _MANAGER_ERRORS, AuditLevel, AuditorBase
from sim.audit.in_flight import InFlightReads
from sim.audit.violations import ViolationKind, ViolationPolicy
from sim.kv.config import KVCacheConfig
from sim.kv.pins import V1_BASELINE, VllmPin
from sim.kv.protocol import V1KVCacheManager
from sim.kv.types import (
    NoFreeBlocksError,
    Sequence,
)


class AuditedV1Manager(AuditorBase):
    """Audits a V1-engine `KVCacheManager` (`allocate_slots` counts and allocates at once)."""

    inner: V1KVCacheManager

    #: What the V1 scheduler, the KV connector and the KV-event stream read of the model's
    #: manager: its pool and groups (events), caching switch, tables, and the
    #: admission count (`sim.scheduler.v1.release`).
    PASSED_THROUGH: ClassVar[frozenset[str]] = AuditorBase.PASSED_THROUGH | {
        "block_pool",
        "num_kv_cache_groups",
        "enable_caching",
        "get_block_ids",
        "num_blocks_to_admit",
        "mamba_align_block_size",
        "mamba_prefill_checkpoint_blocks",
        "num_uncached_common_prefix_tokens",
    }

    def __init__(
        self,
        inner: V1KVCacheManager,
        policy: ViolationPolicy = ViolationPolicy.RECORD,
        level: AuditLevel = AuditLevel.CHEAP,
        clock: Callable[[], tuple[float | None, int | None]] | None = None,
    ) -> None:
        super().__init__(inner, policy, level, clock)
        #: Under async scheduling, the blocks each step in flight reads (`note_step_scheduled`);
        #: None where no group has a window or the manager cannot say which block is where.
        self._in_flight: InFlightReads | None = _in_flight_reads(inner)

    def new_step_starts(self) -> None:
        """The scheduler's start-of-step call, passed on where the inner manager has it (it
        only clears "align" Mamba groups' cached-this-step sets: nothing to audit)."""
        step = getattr(self.inner, "new_step_starts", None)
        if step is not None:
            step()

    @property
    def pin(self) -> VllmPin:
        """The release the audited manager follows (`sim.kv.pins`): kvsim's own manager says;
        one that does not (the real-vLLM adapter of `--vllm-root`) follows 4ac7713's rules.
        The one place that default is taken: the V1 scheduler reads this property."""
        pin = getattr(self.inner, "pin", None)
        return pin if isinstance(pin, VllmPin) else V1_BASELINE

    def _free(self) -> int:
        return self.inner.num_free_blocks

    def _check_full(self, call: str, request_id: int | None) -> None:
        super()._check_full(call, request_id)
        self._check_groups(call, request_id)

    def _check_groups(self, call: str, request_id: int | None) -> None:
        """Held blocks (less the null block) == the sum over groups of their tables' blocks.

        Example: groups holding 2 and 3 distinct blocks and a pool that reports 6 held (the
        null block included) pass; a pool reporting 7 held has leaked one block.
        """
        if getattr(self.inner, "num_kv_cache_groups", 1) < 2:
            return  # one group (or a manager that does not say): the refcount walk covers it
        group_counts = getattr(self.inner, "group_num_held_blocks", None)
        if group_counts is None:  # a manager that does not count per group
            return
        counts = group_counts()
        # Less the null block and any sink blocks (held for good, in no table).
        num_held = self.inner.pool_stats().num_held - getattr(self.inner, "num_reserved_blocks", 1)
        if sum(counts) == num_held:
            return
        kind = ViolationKind.LEAKED_BLOCKS if sum(counts) < num_held else ViolationKind.CONSERVATION
        self._record(
            kind,
            call,
            request_id,
            f"{call}: the pool holds {num_held} blocks but the KV-cache groups' tables hold "
            f"{' + '.join(map(str, counts))} = {sum(counts)}",
            free_blocks=self._free(),
        )

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
            if blocks or self._full:
                self._check_footprint("allocate_slots", rid, request)
        if self._in_flight is not None:
            self._check_in_flight_reads(rid)
        self._after_call("allocate_slots", rid)
        return blocks

    # ------------------------------------------------------------------ async scheduling
    @property
    def tracks_in_flight_reads(self) -> bool:
        """True when a step in flight can have blocks pruned under it (a sliding window)."""
        return self._in_flight is not None

    def note_step_scheduled(self, request: Sequence, num_tokens: int) -> None:
        """Async scheduling: a step of `num_tokens` was scheduled for `request` (its C already
        counts them) and runs while the next step is scheduled (`sim.audit.in_flight`)."""
        if self._in_flight is not None:
            computed = request.num_computed_tokens
            self._in_flight.step_scheduled(request.seq_id, computed - num_tokens, computed)

    def note_step_settled(self, request: Sequence, first_position: int) -> None:
        """The request's step from `first_position` (its context length) returned."""
        if self._in_flight is not None:
            self._in_flight.step_settled(request.seq_id, first_position)

    def _check_in_flight_reads(self, rid: int) -> None:
        assert self._in_flight is not None
        for read in self._in_flight.pruned(rid):
            self._record(
                ViolationKind.FREED_WHILE_IN_FLIGHT,
                "allocate_slots",
                rid,
                f"allocate_slots freed block {read.block_id} (index {read.block_index} of "
                f"request {rid}'s group-{read.group} table) while a step in flight still "
                f"reads position {read.first_position} in it",
                free_blocks=self._free(),
            )

    def cache_blocks(self, request: Sequence, num_computed_tokens: int) -> None:
        """The async scheduler's caching once a step's output is applied (no block moves)."""
        try:
            self.inner.cache_blocks(request, num_computed_tokens)
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("cache_blocks", request.seq_id, exc) from None
        self._after_call("cache_blocks", request.seq_id)

    def free(self, request: Sequence) -> None:
        rid = request.seq_id
        self._live_seq_to_request.pop(rid, None)
        if self._in_flight is not None:
            self._in_flight.forget(rid)
        try:
            self.inner.free(request)
        except _MANAGER_ERRORS as exc:
            raise self._manager_error("free", rid, exc) from None
        self._after_call("free", rid)

    @property
    def num_free_blocks(self) -> int:
        return self.inner.num_free_blocks


def _in_flight_reads(inner: Any) -> InFlightReads | None:
    """The in-flight read tracker for a manager whose config has a sliding window."""
    config = getattr(inner, "config", None)
    block_id_at = getattr(inner, "block_id_at", None)
    if not isinstance(config, KVCacheConfig) or block_id_at is None:
        return None
    reads = InFlightReads(config.group_specs, config.block_size, block_id_at)
    return reads if reads.tracks_anything else None
