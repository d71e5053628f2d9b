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

Reuses the V2 components (`sim.kv.v0_v2`), following vLLM 0.5.4 @ 00c3d68 everywhere else.
"""

from __future__ import annotations

from sim.kv.config import KVCacheConfig
from sim.kv.types import Sequence, SequenceGroup, TokenContent, cdiv
from sim.kv.v0_v2.block_table import BlockTable
from sim.kv.v0_v2.manager import BlockSpaceManagerV2
from sim.kv.v0_v2.naive import Block


class WindowedBlockTable(BlockTable):
    """A V2 table that allocates only the last window and treats null entries as holes."""

    def allocate(self, content: TokenContent) -> None:
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
        self.num_full_slots = num_tokens

    def drop_out_of_window(self, num_computed_slots: int) -> None:
        # The null block exists since allocate; never create it here.
        assert self.allocator.null_block is not None, "null block must exist before a drop"
        super().drop_out_of_window(num_computed_slots)

    def _write_tokens(self, content: TokenContent, num_new_tokens: int) -> None:
        if num_new_tokens == 0:
            return  # V2 indexes past a full table here (IndexError); nothing to write.
        super()._write_tokens(content, num_new_tokens)

    def fork(self) -> BlockTable:
        assert self.blocks
        shared = self.allocator.fork([b for b in self.blocks if not b.is_null])
        shared_iter = iter(shared)
        return self._child([b if b.is_null else next(shared_iter) for b in self.blocks])


class CorrectedBlockSpaceManager(BlockSpaceManagerV2):
    """V2 with `WindowedBlockTable`: admission and allocation always agree."""

    table_cls = WindowedBlockTable

    def __init__(self, config: KVCacheConfig) -> None:
        super().__init__(config)

    def admission_blocks(self, seq_group: SequenceGroup) -> int:
        num_required = super().admission_blocks(seq_group)
        if self.max_block_sliding_window is not None and self.block_allocator.null_block is None:
            num_required += 1
        return num_required

    def _swap_blocks(self, table: BlockTable) -> list[Block]:
        # The null block stays on the GPU and stays shared; only real blocks move.
        return [b for b in table.blocks if not b.is_null]

    def _blocks_for_swap(self, seq_group, status) -> list[Block]:
        return [b for b in super()._blocks_for_swap(seq_group, status) if not b.is_null]

    def decode_touch_len(self, seq: Sequence) -> int | None:
        """V2's rule (`BlockTable.decode_touch_len`); the null block always exists here.

        Example (bs=16, W=24 -> M=3): a 64-token prompt is ``[null, a, b, c]`` (1 leading
        null). Candidates 4*16 + 1 = 65 and (1 + 3 + 1)*16 + 1 = 81, so decodes 65.. are not
        quiet: 65 is returned; after it (5 blocks) the answer is 81 (index 1 is dropped).
        """
        return super().decode_touch_len(seq)

    def sync_decode(self, seq: Sequence) -> None:
        """V2's: write the skipped tokens (e.g. bs=16, slots 65 -> 79 before a call at 80)."""
        super().sync_decode(seq)

    def max_seq_footprint(self, seq) -> int | None:
        table = self.block_tables.get(seq.seq_id)
        if self.max_block_sliding_window is None or table is None:
            return None
        return self.max_block_sliding_window + 1 + cdiv(table.max_lookahead_slots, self.block_size)
