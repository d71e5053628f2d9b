"""`access_all_blocks_in_seq` of v0 `BlockSpaceManagerV1` with prefix caching, by deferral.

Upstream (`vllm/core/block_manager_v1.py:L652-662 (0.5.4)`) writes the access time into every
block of the sequence's table, and vLLM 0.5.4's scheduler calls it for every scheduled
sequence on every step (`vllm/core/scheduler.py:L963-968`): O(table) per sequence per step,
~1,200 blocks for a long Mooncake prompt. The only reader is the LRU evictor
(`vllm/core/evictor_v1.py:L54-88`), which sees a block's `last_accessed` only once the block
is in it, and a block enters it only when its last owner frees it. So kvsim keeps, per
sequence, the tick and time of its last access, and writes them into the table's blocks
before the table changes (a block joins or leaves it, or it is freed or swapped): the blocks
named at the access are exactly the table's until then. Each call has a tick from one
counter; a block takes a pending write only if its tick is newer than the block's, so a block
two tables share ends with the latest write, as upstream's in-call-order writes leave it.

This holds while no table names a block sitting in the evictor, which kvsim's scheduler
never makes (one sequence per group). A fork or an `allocate` of several sequences can
(`CachedBlockAllocator.incref`): from then on (`go_eager`) every access writes at once, as
upstream does, and tells the evictor (`on_last_accessed_changed`).

Example: seq 1 accessed at t=3 (tick 1), seq 2, which shares block B, at t=4 (tick 2); seq 2
frees first: B gets t=4 (tick 2); then seq 1 frees: tick 1 < 2, B keeps t=4, as upstream's
second write left it.
"""

from __future__ import annotations

from sim.kv.v0_v1.alloc import CachedBlockAllocator, Device, PhysicalBlock


class DeferredAccess:
    """The pending access of each sequence (seq_id -> (tick, time)) of one manager."""

    def __init__(self, gpu: CachedBlockAllocator, cpu: CachedBlockAllocator) -> None:
        self.gpu = gpu
        self.cpu = cpu
        self.pending: dict[int, tuple[int, float]] = {}
        self.tick = 0
        #: Writes at once, as upstream (after a fork or a multi-sequence allocate).
        self.eager = False

    def access(self, seq_id: int, table: list[PhysicalBlock], access_time: float) -> None:
        """`access_all_blocks_in_seq` (`vllm/core/block_manager_v1.py:L652-662 (0.5.4)`):
        remember it, or (eager) write it now."""
        self.tick += 1
        if self.eager:
            self._write(table, self.tick, access_time, notify=True)
        else:
            self.pending[seq_id] = (self.tick, access_time)

    def flush(self, seq_id: int, table: list[PhysicalBlock]) -> None:
        """Write the sequence's pending access into `table` (about to change). kvsim's own
        (no upstream counterpart: upstream writes at once)."""
        if self.pending:
            pending = self.pending.pop(seq_id, None)
            if pending is not None:
                self._write(table, pending[0], pending[1], notify=False)

    def go_eager(self, tables: dict[int, list[PhysicalBlock]]) -> None:
        """From now on write at once: first every pending access (`tables`: the manager's).
        kvsim's own (no upstream counterpart)."""
        for seq_id in list(self.pending):
            table = tables.get(seq_id)
            if table is not None:
                self.flush(seq_id, table)
        self.pending.clear()
        self.eager = True

    def _write(
        self, table: list[PhysicalBlock], tick: int, access_time: float, notify: bool
    ) -> None:
        for block in table:
            if block.access_tick < tick:
                block.access_tick = tick
                block.last_accessed = access_time
                if notify:  # a table can name a block in the evictor: its entry moves
                    allocator = self.gpu if block.device is Device.GPU else self.cpu
                    allocator.evictor.on_last_accessed_changed(block)
