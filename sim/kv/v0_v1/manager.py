"""vLLM v0 `BlockSpaceManagerV1`, faithfully (bugs included).

Models `vllm/core/block_manager_v1.py:L213-704 (0.5.4)`, the 0.5.4 wheel the lockstep runs (spec:
vllm-semantics.md section 2; fc93e56 makes the same decisions). Our own code.

Sliding window is a ring of ``w = ceil(W / bs)`` physical blocks: logical block ``i >= w``
reuses ``table[i % w]``. Worked example, G=10, bs=16, W=24 (w=2), empty pool:

* a 64-token prompt has 4 logical blocks; blocks 0 and 1 pop 9 and 8 off the free list and
  blocks 2 and 3 reuse them: table ``[9, 8, 9, 8]``, 8 blocks free;
* `can_allocate` compared ``min(4, w) = 2`` with the free count, the same number `allocate`
  takes, so admission and allocation agree in this design.

Faithful quirks kept on purpose (each has a test):

* Ring reuse sets ``ref_count = num_seqs`` instead of incrementing it.
* `swap_out` of a wrapped ring frees the repeated entries once per table entry and raises
  `DoubleFreeError` ("Double free! ...") half-way.
* With a sliding window, copy-on-write into a forked ring breaks the ring (a slot's CoW copy
  is never reused; the original block, now owned by the sibling, is written again on the next
  lap) so refcounts stop matching the tables and `free` leaks or double-frees.
* With prefix caching, `allocate` of a group with several WAITING seqs gives each block one
  reference for all the copies of the table (upstream never reaches this: such groups are
  swapped, not recomputed).
* A prompt's partial last block is keyed by the hash of the whole prompt (upstream
  `hash_of_block` slices past the end), so identical prompts share it until copy-on-write.
* If `allocate` runs dry part-way the blocks it took are leaked; we remember them so that
  `recover_leaked_blocks` (the auditor's continue policy) can return them.

`free` releases ``set(table)`` in Python set order. Upstream blocks hash by object address (not
reproducible); we follow the order they have when hashed by ``(device, block number)``, as the
lockstep adapter pins them (see `v0_v1_hashing.set_order`), so runs are deterministic and
match it. Block content hashes (`Sequence.hash_of_block` upstream) are in `v0_v1_hashing` too.
Left out versus upstream (`vllm/core/block_manager_v1.py (0.5.4)`):

* encoder-decoder cross tables: `free_cross`, `get_cross_block_table` (L620-626, L642-644),
  the encoder count of `can_allocate` (L275-278) and its enc-dec refusals (kvsim groups have no
  encoder seq);
* `reset` (L628-636) and the public `get_all_computed_blocks` (L676-686; kept private here);
* swap moves ids only: the (src, dst) mapping is returned, no KV is copied;
* block hashes ignore LoRA (`hash_of_block` hashes ``(tokens, lora_int_id)``, vllm/sequence.py
  L317-325) and token ids are kvsim's segment contents, not real ids;
* sliding window with prefix caching is refused at construction, as vLLM's config refuses it
  (vllm/config.py:L492-499), not by the manager.
"""

from __future__ import annotations

from itertools import cycle, groupby, islice
from operator import attrgetter
from os.path import commonprefix

from sim.kv.config import KVCacheConfig
from sim.kv.types import (
    AllocStatus,
    NoFreeBlocksError,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    cdiv,
)
from sim.kv.v0_v1.access import DeferredAccess
from sim.kv.v0_v1.alloc import (
    OUT_OF_BLOCKS_MSG,
    BlockAllocator,
    BlockTable,
    CachedBlockAllocator,
    Device,
    PhysicalBlock,
    UncachedBlockAllocator,
)
from sim.kv.v0_v1.hashing import SequenceBlockHasher, set_order, unique
from sim.kv.v0_v1.queries import ManagerQueries

_DEVICE_OF = attrgetter("device")


class BlockSpaceManagerV1(ManagerQueries):
    """v0 block manager with ring sliding window and v1 prefix caching (see module docstring);
    kvsim's queries (decode fast path, introspection) are in `v0_v1_queries`."""

    def __init__(self, config: KVCacheConfig) -> None:
        if config.enable_prefix_caching and config.sliding_window is not None:
            # `vllm/config.py:L492-499 (0.5.4)` (NotImplementedError upstream; ValueError here).
            raise ValueError(
                "Prefix caching is not supported with sliding window (vLLM 0.5.4 forbids it)"
            )
        self.block_size = config.block_size
        self.num_total_gpu_blocks = config.num_gpu_blocks
        self.num_total_cpu_blocks = config.num_cpu_blocks
        self.watermark_blocks = config.watermark_blocks
        self.enable_caching = config.enable_prefix_caching
        # ceil(W / bs) with no +1: W=24, bs=16 -> 2 (L233-237).
        self.block_sliding_window: int | None = (
            None
            if config.sliding_window is None
            else cdiv(config.sliding_window, config.block_size)
        )
        alloc_cls = CachedBlockAllocator if self.enable_caching else UncachedBlockAllocator
        self.gpu_allocator: BlockAllocator = alloc_cls(Device.GPU, config.num_gpu_blocks)
        self.cpu_allocator: BlockAllocator = alloc_cls(Device.CPU, config.num_cpu_blocks)
        self.block_tables: dict[int, BlockTable] = {}
        #: Access times, written when a table changes (`sim.kv.v0_v1.access`); caching only.
        self._access: DeferredAccess | None = None
        if isinstance(self.gpu_allocator, CachedBlockAllocator) and isinstance(
            self.cpu_allocator, CachedBlockAllocator
        ):
            self._access = DeferredAccess(self.gpu_allocator, self.cpu_allocator)
        # (block, refs taken) by allocations that failed part-way; no table owns them.
        self._leaked: list[tuple[PhysicalBlock, int]] = []
        #: The content hashes prefix caching keys blocks by (`v0_v1_hashing`).
        self._hasher = SequenceBlockHasher(config.block_size)
        #: seq_id -> (table, its length, its last entry, distinct GPU block ids) at the last
        #: `num_seq_blocks` call, to extend instead of recount (see there).
        self._seq_gpu_ids: dict[int, tuple[BlockTable, int, PhysicalBlock, set[int]]] = {}

    def _is_last_block_full(self, seq: Sequence) -> bool:
        return seq.num_tokens > 0 and seq.num_tokens % self.block_size == 0

    # --------------------------------------------------------------- admission
    def admission_blocks(self, seq_group: SequenceGroup) -> int:
        """Blocks `can_allocate` compares: ``min(cdiv(L, bs), w)``; 112 tokens, w=2 -> 2.

        Upstream: the count in `BlockSpaceManagerV1.can_allocate`,
        `vllm/core/block_manager_v1.py:L273-284 (0.5.4)`.
        """
        seqs = seq_group.seqs
        if len(seqs) == 1 and seqs[0].status is SequenceStatus.WAITING:
            seq = seqs[0]  # `get_seqs(WAITING)[0]` of the common one-sequence group
        else:
            seq = seq_group.get_seqs(SequenceStatus.WAITING)[0]
        num_required = seq.n_blocks(self.block_size)
        if self.block_sliding_window is not None:
            num_required = min(num_required, self.block_sliding_window)
        return num_required

    def can_allocate(self, seq_group: SequenceGroup) -> AllocStatus:
        """NEVER if ``G - req < Wm``; OK if ``F - req >= Wm``; else LATER (L268-294).

        Upstream: `vllm/core/block_manager_v1.py:L267-293 (0.5.4)`.
        """
        num_required = self.admission_blocks(seq_group)
        if self.num_total_gpu_blocks - num_required < self.watermark_blocks:
            return AllocStatus.NEVER
        num_free = self.gpu_allocator.count_free_blocks()
        if num_free - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def _allocate_sequence(
        self, seq: Sequence, ref_count: int, taken: list[tuple[PhysicalBlock, int]]
    ) -> BlockTable:
        """Prompt table; `taken` records (block, refs added) so a failure can be undone later."""
        w = self.block_sliding_window
        num_blocks = seq.n_blocks(self.block_size)
        if not self.enable_caching and ref_count > 0:
            # The loop below, in bulk: take the table's own blocks (all of it, or the ring's
            # first w) at once; the ring entries repeat them, and their `set_ref` calls find
            # every own block at `ref_count` already, so they change nothing.
            num_own = num_blocks if w is None else min(num_blocks, w)
            own = self.gpu_allocator.allocate_n(num_own, ref_count)  # type: ignore[union-attr]  # uncached
            if len(own) < num_own:
                taken.extend((block, ref_count) for block in own)
                raise NoFreeBlocksError(OUT_OF_BLOCKS_MSG)
            return own if num_blocks == num_own else list(islice(cycle(own), num_blocks))
        table: BlockTable = []
        for logical_idx in range(num_blocks):
            if w is not None and logical_idx >= w:
                block = table[logical_idx % w]
                self.gpu_allocator.set_ref(block, ref_count)  # set, not +1: the ring quirk
            elif self.enable_caching:
                # One reference regardless of ref_count (see module docstring).
                block = self.gpu_allocator.allocate(
                    self._hasher.hash_of_block(seq, logical_idx),
                    self._hasher.num_hashed_tokens_of_block(logical_idx),
                )
                taken.append((block, 1))
            else:
                block = self.gpu_allocator.allocate()
                self.gpu_allocator.set_ref(block, ref_count)
                taken.append((block, ref_count))
            table.append(block)
        return table

    def allocate(self, seq_group: SequenceGroup) -> None:
        """Upstream: `vllm/core/block_manager_v1.py:L321-346 (0.5.4)`."""
        seqs = seq_group.seqs
        if len(seqs) == 1 and seqs[0].status is SequenceStatus.WAITING:
            waiting = seqs  # `get_seqs(WAITING)` of the common one-sequence group (only read)
        else:
            waiting = seq_group.get_seqs(SequenceStatus.WAITING)
        taken: list[tuple[PhysicalBlock, int]] = []
        if len(seqs) > 1 and self._access is not None:
            self._access.go_eager(self.block_tables)  # its tables will share blocks
        try:
            # `num_seqs()` counts every sequence: `len(seqs)`, without the list it copies.
            table = self._allocate_sequence(waiting[0], len(seqs), taken)
        except NoFreeBlocksError:
            # Upstream drops the half-built local table: its blocks stay referenced forever.
            self._leaked.extend(taken)
            raise
        for seq in waiting:
            self.block_tables[seq.seq_id] = list(table)

    # ------------------------------------------------------------------ decode
    def can_append_slots(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> bool:
        """One free block per RUNNING seq; no watermark (L353-364).

        Upstream: `vllm/core/block_manager_v1.py:L348-358 (0.5.4)`.
        """
        if num_lookahead_slots != 0:
            raise ValueError("lookahead allocation not supported in BlockSpaceManagerV1")
        seqs = seq_group.seqs
        if len(seqs) == 1:  # `num_seqs(RUNNING)` of the common one-sequence group
            num_running = 1 if seqs[0].status is SequenceStatus.RUNNING else 0
        else:
            num_running = seq_group.num_seqs(SequenceStatus.RUNNING)
        return num_running <= self.gpu_allocator.count_free_blocks()

    def _allocate_last_physical_block(self, seq: Sequence) -> PhysicalBlock:
        if not self.enable_caching:
            return self.gpu_allocator.allocate()
        n_blocks = seq.n_blocks(self.block_size)
        block_hash = (
            self._hasher.hash_of_block(seq, n_blocks - 1) if self._is_last_block_full(seq) else None
        )
        block = self.gpu_allocator.allocate(
            block_hash, self._hasher.num_hashed_tokens_of_block(n_blocks - 1)
        )
        assert block_hash is not None or block.ref_count == 1, f"unhashed block {block} is shared"
        return block

    def _maybe_promote_last_block(self, seq: Sequence, last_block: PhysicalBlock) -> PhysicalBlock:
        """When the last block just became full, key it by its content hash (or share the
        block already cached under that hash)."""
        if not self._is_last_block_full(seq):
            return last_block
        assert isinstance(self.gpu_allocator, CachedBlockAllocator)
        new_hash = self._hasher.hash_of_block(seq, seq.n_blocks(self.block_size) - 1)
        if self.gpu_allocator.contains_block(new_hash):
            self.gpu_allocator.free(last_block)
            return self.gpu_allocator.allocate(new_hash)
        self.gpu_allocator.update_hash(new_hash, last_block)
        return last_block

    def append_slots(self, seq: Sequence, num_lookahead_slots: int = 0) -> list[tuple[int, int]]:
        """Room for the newest token; returns ``[(old, new)]`` on copy-on-write (L424-474).

        Ring example, w=2, table [9, 8] and the seq grows to 33 tokens: logical block 2
        reuses ``table[2 % 2] = 9`` (no allocation), giving [9, 8, 9].

        Upstream: `vllm/core/block_manager_v1.py:L425-469 (0.5.4)`.
        """
        if num_lookahead_slots != 0:
            raise ValueError("lookahead allocation not supported in BlockSpaceManagerV1")
        n_blocks = seq.n_blocks(self.block_size)
        table = self.block_tables[seq.seq_id]
        num_entries = len(table)
        access = self._access
        if access is not None and (
            num_entries < n_blocks or table[-1].ref_count != 1 or self._is_last_block_full(seq)
        ):
            access.flush(seq.seq_id, table)  # a block may join or leave the table
        if num_entries < n_blocks:
            assert num_entries == n_blocks - 1, "append_slots adds at most one block"
            w = self.block_sliding_window
            if w is not None and num_entries >= w:
                table.append(table[num_entries % w])  # then falls through: may copy-on-write
            elif self.enable_caching:
                table.append(self._allocate_last_physical_block(seq))
                return []
            else:
                table.append(self.gpu_allocator.allocate())  # `_allocate_last_physical_block`
                return []
        last_block = table[-1]
        assert last_block.device is Device.GPU, f"append_slots on swapped-out seq {seq.seq_id}"
        if last_block.ref_count == 1:
            if self.enable_caching:
                table[-1] = self._maybe_promote_last_block(seq, last_block)
            return []
        new_block = self._allocate_last_physical_block(seq)
        table[-1] = new_block
        self.gpu_allocator.free(last_block)
        return [(last_block.block_id, new_block.block_id)]

    def fork(self, parent_seq: Sequence, child_seq: Sequence) -> None:
        """Child shares the parent's table; +1 per distinct block (ring tables repeat).

        Upstream: `vllm/core/block_manager_v1.py:L471-485 (0.5.4)`.
        """
        src = self.block_tables.get(parent_seq.seq_id)
        if src is None:
            return
        if self._access is not None:
            self._access.go_eager(self.block_tables)  # two tables will name the same blocks
        self.block_tables[child_seq.seq_id] = list(src)
        for block in unique(src):
            self.gpu_allocator.incref(block)

    # -------------------------------------------------------------------- swap
    def _get_physical_blocks(self, seq_group: SequenceGroup) -> BlockTable:
        blocks: dict[PhysicalBlock, None] = {}
        for seq in seq_group.get_unfinished_seqs():
            blocks.update(dict.fromkeys(self.block_tables[seq.seq_id]))
        return list(blocks)

    def can_swap_in(self, seq_group: SequenceGroup, num_lookahead_slots: int = 0) -> AllocStatus:
        """``need = distinct blocks + swapped seqs``; NEVER if ``G < need`` (L519-540).

        Upstream: `vllm/core/block_manager_v1.py:L503-523 (0.5.4)`.
        """
        if num_lookahead_slots != 0:
            raise ValueError("BlockSpaceManagerV1 does not support lookahead allocation")
        num_required = len(self._get_physical_blocks(seq_group)) + seq_group.num_seqs(
            SequenceStatus.SWAPPED
        )
        if self.num_total_gpu_blocks < num_required:
            return AllocStatus.NEVER
        if self.gpu_allocator.num_free_blocks - num_required >= self.watermark_blocks:
            return AllocStatus.OK
        return AllocStatus.LATER

    def can_swap_out(self, seq_group: SequenceGroup) -> bool:
        """Upstream: `vllm/core/block_manager_v1.py:L570-572 (0.5.4)`."""
        return len(self._get_physical_blocks(seq_group)) <= self.cpu_allocator.num_free_blocks

    def _swap_block_table(
        self,
        table: BlockTable,
        src: BlockAllocator,
        dst: BlockAllocator,
        mapping: dict[PhysicalBlock, PhysicalBlock],
    ) -> BlockTable:
        """Map every entry through `mapping` (sharing preserved) and free its source once per
        entry; a wrapped ring repeats entries, so the repeat raises DoubleFreeError."""
        new_table: BlockTable = []
        for from_block in table:
            to_block = mapping.get(from_block)
            if to_block is not None:
                dst.incref(to_block)
            else:
                to_block = dst.allocate(from_block.block_hash, from_block.num_hashed_tokens)
                mapping[from_block] = to_block
            new_table.append(to_block)
            src.free(from_block)
        return new_table

    def _swap(
        self,
        seq_group: SequenceGroup,
        status: SequenceStatus,
        src: BlockAllocator,
        dst: BlockAllocator,
    ) -> list[tuple[int, int]]:
        mapping: dict[PhysicalBlock, PhysicalBlock] = {}
        for seq in seq_group.get_seqs(status):
            if self._access is not None:
                self._access.flush(seq.seq_id, self.block_tables[seq.seq_id])
            self.block_tables[seq.seq_id] = self._swap_block_table(
                self.block_tables[seq.seq_id], src, dst, mapping
            )
        return [(a.block_id, b.block_id) for a, b in mapping.items()]

    def swap_in(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """SWAPPED seqs CPU -> GPU; returns [(cpu_id, gpu_id)].

        Upstream: `vllm/core/block_manager_v1.py:L546-568 (0.5.4)`.
        """
        return self._swap(seq_group, SequenceStatus.SWAPPED, self.cpu_allocator, self.gpu_allocator)

    def swap_out(self, seq_group: SequenceGroup) -> list[tuple[int, int]]:
        """RUNNING seqs GPU -> CPU; returns [(gpu_id, cpu_id)].

        Upstream: `vllm/core/block_manager_v1.py:L574-595 (0.5.4)`.
        """
        return self._swap(seq_group, SequenceStatus.RUNNING, self.gpu_allocator, self.cpu_allocator)

    # -------------------------------------------------------------------- free
    def _free_block_table(self, table: BlockTable) -> None:
        w = self.block_sliding_window
        # A ring's last w entries name every ring block once: free only those.
        # In upstream's `set` order (see `set_order`): it decides the evictor's order. Each
        # run of blocks on one device (the whole table, in practice) goes to its allocator
        # in one call.
        blocks = set_order(table[-w:] if w is not None else table)
        for device, run in groupby(blocks, key=_DEVICE_OF):
            allocator = self.gpu_allocator if device is Device.GPU else self.cpu_allocator
            allocator.free_n(run)

    def free(self, seq: Sequence) -> None:
        """Upstream: `vllm/core/block_manager_v1.py:L612-618 (0.5.4)`."""
        table = self.block_tables.pop(seq.seq_id, None)
        if table is None:
            return  # already freed or never scheduled
        self._hasher.forget(seq.seq_id)
        self._seq_gpu_ids.pop(seq.seq_id, None)
        if self._access is not None:
            self._access.flush(seq.seq_id, table)
        self._free_block_table(table)

    def get_block_table(self, seq: Sequence) -> list[int]:
        """Upstream: `vllm/core/block_manager_v1.py:L638-640 (0.5.4)`."""
        return [b.block_id for b in self.block_tables[seq.seq_id]]

    def get_num_free_gpu_blocks(self) -> int:
        """Upstream: `vllm/core/block_manager_v1.py:L646-647 (0.5.4)`."""
        return self.gpu_allocator.count_free_blocks()

    def get_num_free_cpu_blocks(self) -> int:
        """Upstream: `vllm/core/block_manager_v1.py:L649-650 (0.5.4)`."""
        return self.cpu_allocator.num_free_blocks

    # ---------------------------------------------------------- prefix caching
    def access_all_blocks_in_seq(self, seq: Sequence, access_time: float) -> None:
        """Upstream: `vllm/core/block_manager_v1.py:L652-662 (0.5.4)`: every block of the
        table gets `access_time`, written when the table next changes (`DeferredAccess`)."""
        if self._access is not None:
            self._access.access(seq.seq_id, self.block_tables[seq.seq_id], access_time)

    def _compute_full_blocks_in_seq(self, seq: Sequence) -> None:
        """Mark full blocks computed, backwards, stopping at the first computed one.

        Upstream walks ``reversed(range(L // bs - 1))``, which skips the last full block:
        L=48, bs=16 marks blocks 1 and 0, not 2.
        """
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return
        max_full_block = seq.num_tokens // self.block_size - 1
        for i in reversed(range(max(max_full_block, 0))):
            if table[i].computed:
                break
            table[i].computed = True

    def mark_blocks_as_computed(self, seq_group: SequenceGroup) -> None:
        """Upstream: `vllm/core/block_manager_v1.py:L701-704 (0.5.4)`."""
        if self.enable_caching:
            for seq in seq_group.get_seqs():
                self._compute_full_blocks_in_seq(seq)

    def _all_computed_block_ids(self, seq: Sequence) -> list[int]:
        table = self.block_tables.get(seq.seq_id)
        if table is None:
            return []
        ids = []
        for block in table[:-1]:  # never the last block (a full prompt hit breaks the runner)
            if not block.computed:
                break
            ids.append(block.block_id)
        return ids

    def get_common_computed_block_ids(self, seqs: list[Sequence]) -> list[int]:
        """Upstream: `vllm/core/block_manager_v1.py:L688-699 (0.5.4)`."""
        if not self.enable_caching:
            return []
        ids_list = [ids for ids in map(self._all_computed_block_ids, seqs) if ids]
        return list(commonprefix(ids_list)) if ids_list else []
