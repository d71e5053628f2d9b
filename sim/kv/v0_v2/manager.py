"""vLLM v0 `BlockSpaceManagerV2`, faithfully (`vllm/core/block_manager_v2.py:L21-497 (0.5.4)`).

Including its bug (issue #7470, spec section 4): with a sliding window, `can_allocate`
counts ``min(R, M)`` blocks (``R = cdiv(L, bs)``, ``M = W//bs + 2``, `L75-86`, `L128-130`)
while `allocate` takes all R (`block_table.py:L76-95`). So it crashes iff
``R > M and M + Wm <= F < R``.

Worked example (spec 4.2): bs=16, W=24 -> M=3; G=10 -> Wm=0. Seq A (112 tokens) takes 7
blocks, F=3. Seq B (64 tokens, R=4): can_allocate counts min(4, 3)=3 <= 3 -> OK; allocate
pops ids 7, 8, 9, then the deque is empty -> NoFreeBlocksError, and those 3 ids leak (F=0).
`recover_leaked_blocks` gives them back (the real engine never does; it has crashed).

Left out versus upstream (`vllm/core/block_manager_v2.py (0.5.4)`):

* encoder-decoder cross tables: `free_cross`, `get_cross_block_table` (L260-277), the encoder
  count of `can_allocate` (L122-126) and `check_no_caching_or_swa_for_blockmgr_encdec`;
* swap moves ids only: the (src, dst) mapping is returned, no KV is copied; copy-on-write
  pairs likewise (`clear_copy_on_writes`);
* block hashes are kvsim's content keys over segments, not hashes of real token ids;
* vLLM rejects prefix caching with a sliding window at config time
  (`vllm/config.py:L492-499 (0.5.4)`); so does the constructor here;
* main's later evictor (#7193) and touched count (#6849), at 00c3d68 / fc93e56 but not in the
  0.5.4 release (`sim.kv.pins`).

Footprint bound (`max_seq_footprint`, spec 3.9): None until the table's first append of
an unseen token (prefill and continuing chunks keep the whole prompt: that is this design);
after that ``M + 1 + cdiv(k_max, bs)`` live blocks, k_max the largest lookahead used. Decode
with C computed: ``live = cdiv(C+1+k, bs) - (C//bs - M) = M + cdiv(C%bs + 1 + k, bs)``.
Without a window: None.
"""

from __future__ import annotations

from sim.kv.config import Design, KVCacheConfig
from sim.kv.pins import manager_pin
from sim.kv.protocol import PoolStats
from sim.kv.types import AllocStatus, Sequence, SequenceGroup, SequenceStatus
from sim.kv.v0_v2.block_table import BlockTable, Release054BlockTable
from sim.kv.v0_v2.cpu_gpu import CpuGpuBlockAllocator, Device
from sim.kv.v0_v2.naive import Block
from sim.kv.v0_v2.trackers import ComputedBlocksTracker, LastAccessBlocksTracker

_WAITING = SequenceStatus.WAITING
_RUNNING = SequenceStatus.RUNNING


class BlockSpaceManagerV2:
    #: The design this class models (its pins: `sim.kv.pins.PINS_BY_DESIGN`).
    design = Design.V0_V2
    table_cls: type[BlockTable] = BlockTable

    def __init__(self, config: KVCacheConfig) -> None:
        if config.sliding_window is not None and config.enable_prefix_caching:
            raise ValueError("Prefix caching is not supported with sliding window (vLLM 0.5.4)")
        self.config = config
        #: The pinned vLLM code (`sim.kv.pins`); None in the config is 0.5.4 + #7380.
        self.pin = manager_pin(self.design, config.vllm_pin)
        self.block_size = config.block_size
        self.num_total_gpu_blocks = config.num_gpu_blocks
        self.num_total_cpu_blocks = config.num_cpu_blocks
        self.sliding_window = config.sliding_window
        self.max_block_sliding_window: int | None = None
        if config.sliding_window is not None:
            # +1 because // rounds down, +1 because the last block may be partial.
            self.max_block_sliding_window = config.sliding_window // config.block_size + 2
        self.watermark_blocks = config.watermark_blocks
        self.enable_caching = config.enable_prefix_caching
        self.block_allocator = CpuGpuBlockAllocator(
            config.num_gpu_blocks,
            config.num_cpu_blocks,
            config.block_size,
            config.enable_prefix_caching,
        )
        #: The GPU allocator, read directly by the per-step queries
        #: (`get_num_free_gpu_blocks` runs several times per engine step).
        self._gpu = self.block_allocator.gpu
        self._gpu_refcounter = self._gpu.refcounter
        self.block_tables: dict[int, BlockTable] = {}
        self._computed_tracker = ComputedBlocksTracker(self.block_allocator)
        self._last_access_tracker = LastAccessBlocksTracker(self.block_allocator)

    # -- admission -----------------------------------------------------------------------
    def admission_blocks(self, seq_group: SequenceGroup) -> int:
        """Blocks `can_allocate` counts for the first WAITING sequence: ``min(cdiv(L, bs), M)``.

        Upstream: the count in `BlockSpaceManagerV2.can_allocate`,
        `vllm/core/block_manager_v2.py:L116-130 (0.5.4)`.
        """
        # The first WAITING seq (`get_seqs(WAITING)[0]` without building the list); the
        # auditor asks this right after every `can_allocate`, which asks it too.
        for seq in seq_group.seqs:
            if seq.status is _WAITING:
                break
        else:
            raise ValueError(f"request {seq_group.request_id} has no WAITING sequence")
        num_required = -(-seq.content.num_tokens // self.block_size)  # cdiv
        window = self.max_block_sliding_window
        if window is not None and window < num_required:
            num_required = window
        return num_required

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """Upstream: `vllm/core/block_manager_v2.py:L110-142 (0.5.4)`."""
        num_required = self.admission_blocks(seq_group)
        num_free = self._gpu.count_free_blocks()
        if self.num_total_gpu_blocks - num_required < self.watermark_blocks:
            return AllocStatus.NEVER
        if num_free - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def _new_table(self, blocks: list[Block] | None = None) -> BlockTable:
        table_cls = self.table_cls
        # v0-fixed's own table writes nothing on an empty append, whatever the pin.
        if self.pin.empty_append_raises and table_cls is BlockTable:
            table_cls = Release054BlockTable
        return table_cls(
            self.block_size, self.block_allocator, self.max_block_sliding_window, blocks
        )

    def _track(self, seq_id: int) -> None:
        self._computed_tracker.add_seq(seq_id)
        self._last_access_tracker.add_seq(seq_id)

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Upstream: `vllm/core/block_manager_v2.py:L154-193 (0.5.4)`."""
        block_tables = self.block_tables
        waiting = [s for s in seq_group.seqs if s.status is _WAITING]  # `get_seqs(WAITING)`
        assert waiting, "no WAITING sequence to allocate"
        assert not any(s.seq_id in block_tables for s in waiting), "block table already exists"
        table = self._new_table()
        table.allocate(waiting[0].content)  # may raise NoFreeBlocksError, leaking popped ids
        block_tables[waiting[0].seq_id] = table
        self._track(waiting[0].seq_id)
        for seq in waiting[1:]:
            block_tables[seq.seq_id] = table.fork()
            self._track(seq.seq_id)

    # -- appends -------------------------------------------------------------------------
    def _num_unseen(self, seq: Sequence, table: BlockTable) -> int:
        return seq.num_tokens - table.num_full_slots

    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """Upstream: `vllm/core/block_manager_v2.py:L195-222 (0.5.4)`."""
        num_touched = 0
        for seq in seq_group.seqs:  # the RUNNING ones, as `get_seqs(RUNNING)`
            if seq.status is _RUNNING:
                table = self.block_tables[seq.seq_id]
                num_touched += table.get_num_blocks_touched_by_append_slots(
                    self._num_unseen(seq, table), num_lookahead_slots
                )
        return num_touched <= self._gpu.count_free_blocks()

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Upstream: `vllm/core/block_manager_v2.py:L224-239 (0.5.4)`."""
        table = self.block_tables[seq.seq_id]
        table.append_token_ids(
            seq.content,
            self._num_unseen(seq, table),
            num_lookahead_slots,
            seq.num_computed_tokens,
        )
        return self._gpu.clear_copy_on_writes()

    # -- decode fast path ----------------------------------------------------------------
    def decode_touch_len(self, seq: Sequence) -> int | None:
        """The first decode length at which `append_slots(seq)` may change anything.

        Decodes at lengths X below it are quiet: `append_slots` would only write token
        ``X - 1`` into a block it already has (no drop, allocation, copy or promotion), and
        `can_append_slots` counts 1 block, so it is ``free >= 1``. The rule is the table's
        (`BlockTable.decode_touch_len`). Example (bs=16, no window, no caching): a 20-token
        prompt has 2 blocks; decodes at 21..32 are quiet and 33 is returned. None when the
        table is unknown or swapped out, or lookahead slots were used.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq.seq_id)
        if table is None or not table.is_on_gpu():
            return None
        return table.decode_touch_len(seq.content.num_tokens)

    def sync_decode(self, seq: Sequence) -> None:
        """Write the tokens of skipped quiet decodes into the table, silently.

        Right before a real call at length L the table must look as if every decode below L
        had been called: tokens ``0..L-2`` written. Example (bs=16): last call at X=21 (21
        slots), the scheduler skipped 22..25 and syncs at L=26: slots become 25, block 1
        holds 9 tokens. A no-op when nothing was skipped.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return
        num_full_slots = seq.content.num_tokens - 1
        # Nothing skipped -> nothing to write, on any device.
        if num_full_slots <= table.num_full_slots:
            return
        if table.is_on_gpu():
            table.write_quiet_tokens(num_full_slots)

    # -- fork / free ---------------------------------------------------------------------
    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """Upstream: `vllm/core/block_manager_v2.py:L319-328 (0.5.4)`."""
        if parent_seq.seq_id not in self.block_tables:
            return
        self.block_tables[child_seq.seq_id] = self.block_tables[parent_seq.seq_id].fork()
        self._track(child_seq.seq_id)

    def free(self, seq: Sequence) -> None:
        """Upstream: `vllm/core/block_manager_v2.py:L241-258 (0.5.4)`."""
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return
        tracker = self._last_access_tracker
        if tracker.has_access_time(seq.seq_id):  # only with prefix caching; else a no-op
            tracker.update_seq_blocks_last_access(seq.seq_id, table.physical_block_ids)
        tracker.remove_seq(seq.seq_id)
        self._computed_tracker.remove_seq(seq.seq_id)
        table.free()
        del self.block_tables[seq.seq_id]

    # -- swap ----------------------------------------------------------------------------
    def _blocks_for_swap(self, seq_group: SequenceGroup, status: SequenceStatus) -> list[Block]:
        return [
            b for seq in seq_group.get_seqs(status) for b in self.block_tables[seq.seq_id].blocks
        ]

    def _can_swap(
        self,
        seq_group: SequenceGroup,
        device: Device,
        status: SequenceStatus,
        num_lookahead_slots: int = 0,
    ) -> AllocStatus:
        blocks = self._blocks_for_swap(seq_group, status)
        num_touched = self.block_allocator.get_num_blocks_touched(
            blocks, device, num_lookahead_slots
        )
        watermark = self.watermark_blocks if device is Device.GPU else 0
        if self.block_allocator.num_total_blocks(device) < num_touched:
            return AllocStatus.NEVER
        if self.block_allocator.num_free_blocks(device) - num_touched >= watermark:
            return AllocStatus.OK
        return AllocStatus.LATER

    def _swap(
        self, seq_group: SequenceGroup, status: SequenceStatus, src: Device, dst: Device
    ) -> list[tuple[int, int]]:
        pairs: list[tuple[int, int]] = []
        alloc = self.block_allocator
        for seq in seq_group.get_seqs(status):
            blocks = self._swap_blocks(self.block_tables[seq.seq_id])
            if not blocks:
                continue
            mapping = alloc.swap(blocks, src, dst)
            pairs.extend(
                (alloc.get_physical_block_id(src, s), alloc.get_physical_block_id(dst, d))
                for s, d in mapping.items()
            )
        return pairs

    def _swap_blocks(self, table: BlockTable) -> list[Block]:
        """The blocks a swap moves: all of them, the null block included (which raises)."""
        return table.blocks

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        """Upstream: `vllm/core/block_manager_v2.py:L330-344 (0.5.4)`."""
        return self._can_swap(seq_group, Device.GPU, SequenceStatus.SWAPPED, num_lookahead_slots)

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Upstream: `vllm/core/block_manager_v2.py:L346-381 (0.5.4)`."""
        return self._swap(seq_group, SequenceStatus.SWAPPED, Device.CPU, Device.GPU)

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        """Upstream: `vllm/core/block_manager_v2.py:L383-399 (0.5.4)`."""
        return self._can_swap(seq_group, Device.CPU, SequenceStatus.RUNNING) is AllocStatus.OK

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """Upstream: `vllm/core/block_manager_v2.py:L401-436 (0.5.4)`."""
        return self._swap(seq_group, SequenceStatus.RUNNING, Device.GPU, Device.CPU)

    # -- queries -------------------------------------------------------------------------
    def get_block_table(self, seq: Sequence) -> list[int]:
        """Upstream: `vllm/core/block_manager_v2.py:L268-270 (0.5.4)`."""
        return self.block_tables[seq.seq_id].physical_block_ids

    def get_num_free_gpu_blocks(self) -> int:
        """Free GPU blocks (the GPU allocator's count).

        Upstream: `vllm/core/block_manager_v2.py:L438-439 (0.5.4)`.
        """
        return self._gpu.count_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        """Upstream: `vllm/core/block_manager_v2.py:L441-442 (0.5.4)`."""
        return self.block_allocator.num_free_blocks(Device.CPU)

    def access_all_blocks_in_seq(self, seq: Sequence, access_time: float) -> None:
        """Upstream: `vllm/core/block_manager_v2.py:L279-287 (0.5.4)`."""
        if self.enable_caching:
            self._last_access_tracker.update_last_access(seq.seq_id, access_time)

    def mark_blocks_as_computed(self, seq_group: SequenceGroup) -> None:
        """Upstream: `vllm/core/block_manager_v2.py:L289-294 (0.5.4)`."""
        return None  # "useless for block_v2" (block_manager_v2.py:L289-294)

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        """Upstream: `vllm/core/block_manager_v2.py:L296-317 (0.5.4)`."""
        per_seq = [
            self._computed_tracker.get_cached_computed_blocks_and_update(
                s.seq_id, self.block_tables[s.seq_id].physical_block_ids
            )
            for s in seqs
        ]
        return self.block_allocator.get_common_computed_block_ids(per_seq)

    # -- PoolIntrospection ---------------------------------------------------------------
    def pool_stats(self) -> PoolStats:
        """Free, used and cached block counts of the GPU pool (`sim.kv.protocol.PoolStats`).

        kvsim's own (no upstream counterpart).
        """
        return PoolStats(
            self.num_total_gpu_blocks,  # == gpu.num_total_blocks, fixed
            self._gpu.count_free_blocks(),
            self._gpu_refcounter.num_positive,
            self._gpu.num_evictable_blocks,
        )

    def pool_is_conserved(self) -> bool:
        """`pool_stats().is_conserved` without building the stats: the auditor asks after
        every call. Example: 10 blocks, 4 free (1 evictable) and 6 held -> True.

        kvsim's own (no upstream counterpart).
        """
        num_free = self._gpu.count_free_blocks()
        return (
            num_free + self._gpu_refcounter.num_positive == self.num_total_gpu_blocks
            and self._gpu.num_evictable_blocks <= num_free
        )

    def block_refcounts(self) -> dict[int, int]:
        """Refcount of every GPU block id in use, for the auditor.

        kvsim's own (no upstream counterpart).
        """
        return self.block_allocator.gpu.refcounter.positive()

    def seq_block_ids(self, seq_id: int) -> list[int]:
        """The GPU block ids of `seq`'s table, null entries included.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq_id)
        if table is None or not table.is_on_gpu():
            return []
        return table.physical_block_ids

    def num_seq_blocks(self, seq_id: int) -> int:
        """The number of entries in `seq`'s table, null entries included.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq_id)
        if table is None or not table.is_on_gpu():
            return 0
        return table.num_live_blocks()

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """The most live GPU blocks `seq` can hold from now on, or None (module docstring).

        kvsim's own (no upstream counterpart).
        """
        window = self.max_block_sliding_window
        if window is None:
            return None
        table = self.block_tables.get(seq.seq_id)
        if table is None or not table.has_decoded:
            return None
        return window + 1 + -(-table.max_lookahead_slots // self.block_size)  # cdiv

    def recover_leaked_blocks(self) -> int:
        """Give back ids popped by a failed `allocate` (the real engine has crashed there).

        kvsim's own (no upstream counterpart).
        """
        return self.block_allocator.gpu.recover_leaked_blocks()

    @property
    def null_block_id(self) -> int | None:
        """The id of the shared sliding-window null block, or None before it exists.

        kvsim's own (no upstream counterpart).
        """
        null = self.block_allocator.null_block
        return None if null is None else null.block_id
