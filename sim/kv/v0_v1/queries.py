"""kvsim's queries on the v0 `BlockSpaceManagerV1` model: the decode fast path and the pool
introspection the auditor reads. No upstream counterpart; `v0_v1.py` keeps upstream's methods
(`vllm/core/block_manager_v1.py:L213-704 (0.5.4)`) and mixes these in.

`decode_touch_len` / `sync_decode` are the manager side of `sim.kv.protocol.DecodeFastPath`
(tests/scheduler/test_decode_fast_path.py proves the skipped calls change nothing); the rest is
`sim.kv.protocol.PoolIntrospection`.
"""

from __future__ import annotations

from sim.kv.protocol import PoolStats
from sim.kv.types import NONE_HASH, Sequence, cdiv, chain_hash
from sim.kv.v0_v1.alloc import BlockAllocator, BlockTable, Device, PhysicalBlock
from sim.kv.v0_v1.hashing import SequenceBlockHasher


class ManagerQueries:
    """The queries, over the manager's state (declared here, set by its constructor)."""

    block_size: int
    enable_caching: bool
    num_total_gpu_blocks: int
    block_sliding_window: int | None
    gpu_allocator: BlockAllocator
    block_tables: dict[int, BlockTable]
    _leaked: list[tuple[PhysicalBlock, int]]
    _seq_gpu_ids: dict[int, tuple[BlockTable, int, PhysicalBlock, set[int]]]
    #: The content hashes of sequences' blocks (the manager's, `v0_v1_hashing`).
    _hasher: SequenceBlockHasher

    # ------------------------------------------------------------ decode fast path
    def decode_touch_len(self, seq: Sequence) -> int | None:
        """The first decode length at which `append_slots(seq)` may change anything.

        Called right after a real call on `seq`. A decode at length X (``X - 1`` computed)
        with X below the answer is quiet: `append_slots` changes nothing and
        `can_append_slots` of its one-sequence group is ``free >= 1``. Touch points:

        * ``len(table) * bs + 1``: the table grows (a new block, or a ring entry reused);
        * with prefix caching, the next X with ``X % bs == 0``: the last block fills and is
          promoted (re-keyed or swapped for a cached twin);
        * now, if the last block is shared (copy-on-write) or, with caching, is a partial
          block keyed by its content (a prompt tail, see the module docstring): an identical
          prompt admitted later would share it, so the next append might copy.

        Example (bs=16, no caching): a 20-token prompt has 2 blocks; decodes at 21..32 are
        quiet and 33 is returned (the third block). With caching the answer is 32 (block 1
        fills) unless block 1 is the prompt's content-keyed tail, then 20 (call every step
        until it fills). None when the table is unknown or swapped out.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq.seq_id)
        if not table:
            return None
        last_block = table[-1]
        if last_block.device is not Device.GPU:
            return None
        num_tokens = seq.content.num_tokens
        if last_block.ref_count != 1:
            return num_tokens
        bs = self.block_size
        touch_len = len(table) * bs + 1
        if self.enable_caching:
            touch_len = min(touch_len, cdiv(num_tokens, bs) * bs)
            if touch_len > num_tokens and self._is_content_keyed_tail(seq, table):
                return num_tokens
        return touch_len if touch_len > num_tokens else num_tokens  # max, without the call

    def _is_content_keyed_tail(self, seq: Sequence, table: BlockTable) -> bool:
        """Whether the partial last block carries the hash `allocate` gives a prompt tail.

        `allocate` keys a partial tail by the hash of the whole prompt (P tokens), so the
        candidates are the P in ``(s, s + bs)`` with ``s = (len(table) - 1) * bs``. A counter
        key that happens to equal one only makes the answer more cautious.
        """
        bs = self.block_size
        tail_idx = len(table) - 1
        start = tail_idx * bs
        stop = min(start + bs, seq.num_tokens + 1)
        if seq.num_tokens < start + 1:
            return True  # the table runs ahead of the tokens: be cautious
        parent = self._hasher.full_block_hashes(seq, tail_idx)[-1] if tail_idx else NONE_HASH
        block_hash = table[-1].block_hash
        return any(
            block_hash == chain_hash(parent, seq.content.span_key(start, num_prompt_tokens))
            for num_prompt_tokens in range(start + 1, stop)
        )

    def sync_decode(self, seq: Sequence) -> None:
        """Catch up on skipped quiet decodes: a no-op, this manager keeps no per-token state.

        (Its hash memo is extended lazily from the sequence's content when next needed.)

        kvsim's own (no upstream counterpart).
        """
        return None

    # ----------------------------------------------------------- introspection
    def pool_stats(self) -> PoolStats:
        """Free, used and cached block counts of the GPU pool (`sim.kv.protocol.PoolStats`).

        kvsim's own (no upstream counterpart).
        """
        gpu = self.gpu_allocator  # positional: called several times per engine step
        return PoolStats(
            self.num_total_gpu_blocks,
            self.gpu_allocator.count_free_blocks(),
            gpu.num_held_blocks,
            gpu.num_evictable_blocks,
        )

    def pool_is_conserved(self) -> bool:
        """`pool_stats().is_conserved` without building the stats: the auditor asks after
        every call. Example: 10 blocks, 4 free (1 evictable) and 6 held -> True.

        kvsim's own (no upstream counterpart).
        """
        gpu = self.gpu_allocator
        num_free = self.gpu_allocator.count_free_blocks()
        return (
            num_free + gpu.num_held_blocks == self.num_total_gpu_blocks
            and gpu.num_evictable_blocks <= num_free
        )

    def block_refcounts(self) -> dict[int, int]:
        """Refcount of every GPU block id that any table holds, for the auditor.

        kvsim's own (no upstream counterpart).
        """
        return {b.block_id: b.ref_count for b in self.gpu_allocator.blocks() if b.ref_count > 0}

    def seq_block_ids(self, seq_id: int) -> list[int]:
        """GPU table ids (ring repeats included); [] when unknown or swapped out.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq_id, [])
        return [b.block_id for b in table if b.device is Device.GPU]

    def num_seq_blocks(self, seq_id: int) -> int:
        """Distinct GPU block ids in the table (a ring repeats its blocks).

        Called after every allocation (the auditor's footprint check), so the id set is kept per
        sequence and only the entries appended since the last call are added to it. A table
        changes in place only by `append_slots` (append, or replace the last entry), so it
        is unchanged up to the entry that was last at the last call if that entry still is
        the same block; otherwise (copy-on-write replaced it, or the table is a new list)
        the set is rebuilt.

        kvsim's own (no upstream counterpart).
        """
        table = self.block_tables.get(seq_id)
        if not table:
            self._seq_gpu_ids.pop(seq_id, None)
            return 0
        gpu = Device.GPU
        num_entries = len(table)
        memo = self._seq_gpu_ids.get(seq_id)
        if memo is not None:
            memo_table, num_known, last_known, block_ids = memo
            if memo_table is table and table[num_known - 1] is last_known:
                if num_known == num_entries:
                    return len(block_ids)  # unchanged since the last call: so is the memo
                if num_known + 1 == num_entries:
                    # The usual call: right after `append_slots` added one entry.
                    block = table[-1]
                    if block.device is gpu:
                        block_ids.add(block.block_id)
                else:
                    for block in table[num_known:]:
                        if block.device is gpu:
                            block_ids.add(block.block_id)
                self._seq_gpu_ids[seq_id] = (table, num_entries, table[-1], block_ids)
                return len(block_ids)
        block_ids = {b.block_id for b in table if b.device is gpu}
        self._seq_gpu_ids[seq_id] = (table, num_entries, table[-1], block_ids)
        return len(block_ids)

    def max_seq_footprint(self, seq: Sequence) -> int | None:
        """The most GPU blocks one sequence can hold from now on, or None (unbounded).

        kvsim's own (no upstream counterpart).
        """
        return self.block_sliding_window

    def recover_leaked_blocks(self) -> int:
        """Give back ids no table holds (V1 leaks none: returns 0).

        kvsim's own (no upstream counterpart).
        """
        num_recovered = 0
        for block, num_refs in self._leaked:
            for _ in range(num_refs):
                if block.ref_count == 0:
                    break
                self.gpu_allocator.free(block)
            num_recovered += block.ref_count == 0
        self._leaked.clear()
        return num_recovered
