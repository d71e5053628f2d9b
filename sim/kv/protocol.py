"""The two block-manager interfaces kvsim models, and the introspection the auditor needs.

vLLM has had two manager APIs:

* **v0** (`BlockSpaceManagerV1`, `BlockSpaceManagerV2`, and our corrected design): a separate
  admission query (`can_allocate` -> OK / LATER / NEVER) followed by an allocation command
  (`allocate`) that raises `NoFreeBlocksError` if the pool runs dry. Their disagreement is the
  bug class kvsim exists to expose, so the two are never derived from one formula.
* **V1 engine** (`KVCacheManager`): one call, `allocate_slots`, that counts and allocates with the
  same arithmetic and returns ``None`` instead of raising.

Every manager also implements `PoolIntrospection`, which the auditor uses to check invariants.
Counts are O(1); `block_refcounts` may be O(pool) and is used only by the full audit level.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from sim.kv.types import AllocStatus, Sequence, SequenceGroup


@dataclass(slots=True)  # not frozen: built per step/call, 3x cheaper
class PoolStats:
    """Where every GPU block of a pool is, at one instant.

    Conservation: ``num_free + num_held == num_total`` where ``num_free`` includes cached
    blocks that can be evicted (``num_evictable`` of them) and ``num_held`` counts distinct
    blocks with a positive refcount (the null block, when one exists, is held).
    """

    num_total: int
    num_free: int
    num_held: int
    num_evictable: int = 0

    @property
    def is_conserved(self) -> bool:
        return (
            self.num_free + self.num_held == self.num_total and self.num_evictable <= self.num_free
        )


@runtime_checkable
class PoolIntrospection(Protocol):
    """What the auditor reads from any manager."""

    block_size: int
    #: Watermark blocks kept free at admission (0 where the design has none).
    watermark_blocks: int

    def pool_stats(self) -> PoolStats: ...

    def block_refcounts(self) -> dict[int, int]:
        """GPU block id -> refcount for every block with refcount > 0 (O(pool))."""
        ...

    def seq_block_ids(self, seq_id: int) -> list[int]:
        """The sequence's current GPU block table (null entries included where the design has them)."""
        ...

    def num_seq_blocks(self, seq_id: int) -> int:
        """Distinct non-null GPU blocks the sequence holds (its footprint)."""
        ...

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """The design's bound on `num_seq_blocks` for `seq` right now, or None for no bound."""
        ...

    def recover_leaked_blocks(self) -> int:
        """Return to the pool blocks that a failed allocation took and no table owns.

        Real v0 code never does this; the auditor calls it only under a policy that
        continues after a violation. Returns the number of blocks recovered.
        """
        ...


@runtime_checkable
class DecodeFastPath(Protocol):
    """Optional capability: let a scheduler skip manager calls on quiet decode steps.

    Not part of vLLM's API and not required by `V0BlockManager` / `V1KVCacheManager`: every
    kvsim model has it, other implementations (the real-vLLM adapters) may not, and a
    scheduler uses it only when both methods exist. Skipping is exact: results are the same
    as calling the manager on every decode.

    A decode at length L has ``L - 1`` tokens computed: v0 calls `can_append_slots(group)`
    then `append_slots(seq)` (one-sequence group, no lookahead); the V1 engine calls
    `allocate_slots(seq, 1)`.
    """

    def decode_touch_len(self, seq: Sequence) -> int | None:
        """Called right after a real call on `seq`: the first length L' at which a decode
        may change anything the manager holds (or, v0, get a `can_append_slots` answer other
        than ``get_num_free_gpu_blocks() >= 1``). Decodes at ``L < L'`` are quiet and may be
        skipped; ``L' == seq.num_tokens`` means the next decode must call. None: do not skip
        (call on every decode and ask again). Valid until another call on `seq` (fork, swap,
        free); other sequences' calls do not invalidate it.

        Example (bs=16, full attention, no caching): right after a call at 20 tokens in 2
        blocks it returns 33, so decodes at 21..32 are skipped.
        """
        ...

    def sync_decode(self, seq: Sequence) -> None:
        """Before the next real call on `seq` at length L (or its free/preemption), bring the
        manager's per-sequence bookkeeping to what the skipped quiet decodes below L would
        have left. Safe when nothing was skipped.
        """
        ...


@runtime_checkable
class V0BlockManager(PoolIntrospection, Protocol):
    """vLLM v0 `BlockSpaceManager` API (`vllm/core/interfaces.py:L24-118 (0.5.4)`).

    kvsim's models also offer `DecodeFastPath` (`decode_touch_len`, `sync_decode`), an
    optional capability that is deliberately not a member here.
    """

    num_total_gpu_blocks: int
    num_total_cpu_blocks: int

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus: ...
    def allocate(self, seq_group: SequenceGroup) -> None: ...
    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool: ...
    def append_slots(
        self, seq: Sequence, num_lookahead_slots: int = 0
    ) -> list[tuple[int, int]]: ...
    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None: ...
    def can_swap_in(
        self, seq_group: SequenceGroup, num_lookahead_slots: int = 0
    ) -> AllocStatus: ...
    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]: ...
    def can_swap_out(self, seq_group: SequenceGroup) -> bool: ...
    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]: ...
    def free(self, seq: Sequence) -> None: ...
    def get_block_table(self, seq: Sequence) -> list[int]: ...
    def get_num_free_gpu_blocks(self) -> int: ...
    def get_num_free_cpu_blocks(self) -> int: ...
    def access_all_blocks_in_seq(self, seq: Sequence, access_time: float) -> None: ...
    def mark_blocks_as_computed(self, seq_group: SequenceGroup) -> None: ...
    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]: ...

    def admission_blocks(self, seq_group: SequenceGroup) -> int:
        """The block count `can_allocate` compares with the free pool (for violation messages)."""
        ...


@runtime_checkable
class V1KVCacheManager(PoolIntrospection, Protocol):
    """vLLM V1-engine `KVCacheManager` API (`vllm/v1/core/kv_cache_manager.py @4ac7713`).

    kvsim's model also offers the optional `DecodeFastPath` capability (not a member here).
    """

    def get_computed_blocks(self, request: Sequence) -> tuple[list[int], int]:
        """Prefix-cache hit: (block ids, number of computed tokens)."""
        ...

    def allocate_slots(
        self,
        request: Sequence,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_block_ids: list[int] | None = None,
        num_lookahead_tokens: int = 0,
    ) -> list[int] | None:
        """Newly allocated block ids, or None when the pool cannot hold the step."""
        ...

    def cache_blocks(self, request: Sequence, num_computed_tokens: int) -> None:
        """Cache the blocks the tokens fill (async scheduling, once a step's output is in)."""
        ...

    def free(self, request: Sequence) -> None: ...

    @property
    def num_free_blocks(self) -> int: ...
