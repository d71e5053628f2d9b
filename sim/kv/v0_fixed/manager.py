"""kvsim's corrected v0 block manager: BlockSpaceManagerV2 whose admission count is what it allocates.

The V2 bug (spec section 4): `can_allocate` counts ``min(R, M)`` blocks but `allocate`
takes all R. Here the sliding-window table allocates only the last window at prefill: the
leading ``R - M`` indices point at the shared null block from the start, so a prompt of
R > M blocks takes exactly M real blocks. The null block is created by the first
sliding-window `allocate` (never lazily inside `append_slots`), and `can_allocate` counts
it while it does not exist yet, so::

    admission_blocks = min(R, M) + (1 if a window is set and the null block is missing else 0)

is exactly the number of blocks `allocate` takes; `can_append_slots` never misses the null
block either. The decode rule is V2's (indices ``< C//bs - M`` become null; they already
are for the leading ones). Swap and fork skip null entries instead of crashing.

Swap admission counts what the swap takes (`swap_blocks`), where V2's `_can_swap` counts
blocks *touched*: V2 counts a full block whose hash is cached as 0 even when the cached id
sits in the evictor (reusing it takes a free block), counts distinct ids where the swap gives
every block object its own id, and ignores the `append_slots` the scheduler runs right
after `swap_in` without asking `can_append_slots` (its new block). Here::

    swap_in_blocks = sum(swap_cost(each real block)) + sum(max(0, new - dropped) per seq)

Worked example (the append case, bs=4, W=1 -> M=2): an 18-token prompt is
``[null, null, null, a, b]``; at 21 tokens (20 computed, all 5 blocks full) it needs a 6th
block, finds none and is swapped out. V2 counts 2 to swap it back; the append then needs a
3rd with 0 free. Here: 2 (a, b) + 1 (new block; the drop end 20//4 - 2 = 3 frees nothing)
= 3, so with 2 free the answer is LATER.

Worked example (bs=16, W=24 -> M = 24//16 + 2 = 3; 64-token prompt -> R = 4, G = 10):

* fresh pool: can_allocate counts min(4, 3) + 1 (null) = 4; allocate takes null id 0 and
  real ids 1, 2, 3 for indices 1..3; table ``[0, 1, 2, 3]``, F = 10 - 4 = 6.
* a second 64-token prompt now counts 3 and takes ids 4, 5, 6: ``[0, 4, 5, 6]``, F = 3.
* a third counts 3 with F = 3 -> OK, takes 3, F = 0. No state admits what it cannot take.

Why the last M blocks suffice: a whole prefill writes KV only for its last W tokens
(vLLM v0 slot mapping), i.e. blocks from ``(L - W)//bs``, and ``R - M <= (L - W)//bs``.
Limitation: under chunked prefill the early chunks' tokens would map to null entries; the
model counts blocks correctly but such KV would be lost, so a real implementation must
allocate per chunk (as the V1 engine does).

Reuses the V2 components (`sim.kv.v0_v2`), following the vLLM 0.5.4 wheel everywhere else.
"""

from __future__ import annotations

from sim.kv.config import Design, KVCacheConfig
from sim.kv.types import AllocStatus, Sequence, SequenceGroup, SequenceStatus, TokenContent, cdiv
from sim.kv.v0_v2.block_table import BlockTable
from sim.kv.v0_v2.cpu_gpu import Device, DeviceAllocator
from sim.kv.v0_v2.manager import BlockSpaceManagerV2
from sim.kv.v0_v2.naive import Block


def swap_cost(allocator: DeviceAllocator, blocks: list[Block]) -> int:
    """Free blocks `allocator.swap_in(blocks)` takes: exactly, not V2's "touched" count.

    Without prefix caching every block object gets a fresh id (1 each, even objects that
    shared an id before). With it, a partial block is a fresh mutable block (1); a full block
    reuses the id cached under its hash: 0 if that id is held (refcount > 0), 1 if it sits in
    the evictor (reviving it takes a free block) or nothing is cached. A hash seen earlier in
    the same swap is held by then (0). An eviction during the swap can only turn a 1 (evictor
    hit) into a 1 (miss), never a 0 into a 1: held ids are never evicted.

    Example (bs=2, prefix caching): a swapped table of 3 blocks, two full ones whose hashes
    are in the GPU evictor and a partial tail: V2 counts 0 + 0 + 1 = 1, the swap takes 3.
    """
    if not allocator.uses_content_keys:
        return len(blocks)
    num_taken = 0
    claimed_hashes: set[int] = set()
    for block in blocks:
        content_hash = block.content_hash
        if block.num_tokens == allocator.block_size and content_hash is not None:
            if content_hash in claimed_hashes:
                continue
            claimed_hashes.add(content_hash)
            cached_id = allocator.cached_block_id(content_hash)  # type: ignore[union-attr]  # hashes: caching
            if cached_id is not None and allocator.refcounter.get(cached_id) > 0:
                continue
        num_taken += 1
    return num_taken


class WindowedBlockTable(BlockTable):
    """A V2 table that allocates only the last window and treats null entries as holes."""

    def allocate(self, content: TokenContent) -> None:
        """Null entries for the leading ``R - M`` blocks, real blocks for the last M (kvsim's fix;
        V2 allocates all R, `vllm/core/block/block_table.py:L76-95 (0.5.4)`)."""
        assert not self.blocks, "table already allocated"
        num_tokens = content.num_tokens
        assert num_tokens > 0, "cannot allocate an empty sequence"
        window = self.max_block_sliding_window
        if window is None:
            super().allocate(content)
            return
        null = self.allocator.allocate_or_get_null_block()
        num_null = max(0, cdiv(num_tokens, self.block_size) - window)
        self.blocks = [null] * num_null + self._allocate_blocks(content, num_null, num_tokens)
        self.num_leading_null = num_null
        self.num_full_slots = num_tokens

    def drop_out_of_window(self, num_computed_slots: int) -> None:
        """V2's drop (`vllm/core/block/block_table.py:L133-142 (0.5.4)`), after `allocate` has
        made the null block."""
        # The null block exists since allocate; never create it here.
        assert self.allocator.null_block is not None, "null block must exist before a drop"
        super().drop_out_of_window(num_computed_slots)

    def _write_tokens(self, content: TokenContent, num_new_tokens: int) -> None:
        if num_new_tokens == 0:
            return  # V2 indexes past a full table here (IndexError); nothing to write.
        super()._write_tokens(content, num_new_tokens)

    def fork(self) -> BlockTable:
        """V2's fork (`vllm/core/block/block_table.py:L187-208 (0.5.4)`) over the real blocks;
        null entries stay null in the child."""
        assert self.blocks
        shared = self.allocator.fork([b for b in self.blocks if not b.is_null])
        shared_iter = iter(shared)
        return self._child([b if b.is_null else next(shared_iter) for b in self.blocks])


class CorrectedBlockSpaceManager(BlockSpaceManagerV2):
    """V2 with `WindowedBlockTable` and exact swap counts: admission and allocation agree."""

    design = Design.V0_FIXED
    table_cls = WindowedBlockTable

    def __init__(self, config: KVCacheConfig) -> None:
        super().__init__(config)

    def admission_blocks(self, seq_group: SequenceGroup) -> int:
        """V2's ``min(R, M)``, plus 1 for the null block while it does not exist (module
        docstring): exactly what `allocate` takes."""
        num_required = super().admission_blocks(seq_group)
        if self.max_block_sliding_window is not None and self.block_allocator.null_block is None:
            num_required += 1
        return num_required

    def _swap_blocks(self, table: BlockTable) -> list[Block]:
        # The null block stays on the GPU and stays shared; only real blocks move.
        return [b for b in table.blocks if not b.is_null]

    def _blocks_for_swap(self, seq_group: SequenceGroup, status: SequenceStatus) -> list[Block]:
        return [b for b in super()._blocks_for_swap(seq_group, status) if not b.is_null]

    # -- swap admission: count what swap (and the append after swap-in) takes -----------
    def append_after_swap_in_blocks(self, seq: Sequence, num_lookahead_slots: int = 0) -> int:
        """Net free blocks `append_slots(seq)` takes right after `swap_in`, at its peak.

        The drop runs first and frees the swapped-in blocks left of the window (each has a
        fresh id of its own after swap-in: no sharing, and no copy-on-write later); then
        ``cdiv(new + lookahead - empty, bs)`` blocks are allocated. Example (bs=4, M=2): 5
        full blocks, 20 computed, 1 new token: drop end 20//4 - 2 = 3 covers only null
        entries, so 1 - 0 = 1.
        """
        table = self.block_tables[seq.seq_id]
        bs = self.block_size
        num_empty = len(table.blocks) * bs - table.num_full_slots
        num_wanted = self._num_unseen(seq, table) + num_lookahead_slots
        num_new = max(0, cdiv(num_wanted - num_empty, bs))
        num_dropped = 0
        if self.max_block_sliding_window is not None:
            end = seq.num_computed_tokens // bs - self.max_block_sliding_window
            num_dropped = sum(1 for b in table.blocks[: max(0, end)] if not b.is_null)
        return max(0, num_new - num_dropped)

    def swap_in_blocks(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> int:
        """GPU blocks `swap_in` plus the scheduler's following `append_slots` take."""
        blocks = self._blocks_for_swap(seq_group, SequenceStatus.SWAPPED)
        num_appended = sum(
            self.append_after_swap_in_blocks(seq, num_lookahead_slots)
            for seq in seq_group.get_seqs(SequenceStatus.SWAPPED)
        )
        return swap_cost(self.block_allocator.gpu, blocks) + num_appended

    def swap_out_blocks(self, seq_group: SequenceGroup) -> int:
        """CPU blocks `swap_out` takes (prefix caching: CPU-cached hashes held on the CPU)."""
        blocks = self._blocks_for_swap(seq_group, SequenceStatus.RUNNING)
        return swap_cost(self.block_allocator.cpu, blocks)

    def _can_swap(
        self,
        seq_group: SequenceGroup,
        device: Device,
        status: SequenceStatus,
        num_lookahead_slots: int = 0,
    ) -> AllocStatus:
        # V2's decision rule (NEVER / watermark on the GPU only) with the exact count.
        if device is Device.GPU:
            num_required = self.swap_in_blocks(seq_group, num_lookahead_slots)
        else:
            num_required = self.swap_out_blocks(seq_group)
        watermark = self.watermark_blocks if device is Device.GPU else 0
        if self.block_allocator.num_total_blocks(device) < num_required:
            return AllocStatus.NEVER
        if self.block_allocator.num_free_blocks(device) - num_required >= watermark:
            return AllocStatus.OK
        return AllocStatus.LATER

    # Decode fast path: V2's `decode_touch_len` and `sync_decode`, inherited (no pass-through
    # override: both run once per real decode call). The null block always exists here.
    # Example (bs=16, W=24 -> M=3): a 64-token prompt is ``[null, a, b, c]`` (1 leading null).
    # Candidates 4*16 + 1 = 65 and (1 + 3 + 1)*16 + 1 = 81, so decodes 65.. are not quiet: 65
    # is returned; after it (5 blocks) the answer is 81 (index 1 is dropped). `sync_decode`
    # then writes the skipped tokens (e.g. slots 65 -> 79 before a call at 80).

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """``M + 1 + cdiv(k_max, bs)`` live blocks with a window (`allocate` takes only the last
        M), None without one; kvsim's own."""
        window = self.max_block_sliding_window
        if window is None:
            return None
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return None
        return window + 1 + -(-table.max_lookahead_slots // self.block_size)  # cdiv
