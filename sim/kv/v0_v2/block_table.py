"""Per-sequence block table of v0 V2 (`vllm/core/block/block_table.py @00c3d68`).

`allocate` takes blocks for the *whole* token list (`L76-95`), ignoring the sliding window.
`append_token_ids` (`L103-156`) then, in order: (1) with a window, gets or creates the null
block and replaces every index ``< C // bs - M`` by it, freeing the real block; (2) ensures
empty slots for the new tokens plus lookahead (`L158-185`); (3) writes the tokens, which may
copy a shared block (CoW) or, with prefix caching, promote/dedupe a block that fills up.

Worked example (bs=16, W=64 so M = 64//16 + 2 = 6, 200-token prompt):

* `allocate`: 13 blocks (12 full + 8-token tail).
* first decode, C=200: null block created; end = 200//16 - 6 = 6, so indices 0..5 become
  null (6 blocks freed); the tail has 8 empty slots, nothing new. Live blocks 7, plus null.
"""

from __future__ import annotations

from sim.kv.types import NoFreeBlocksError, TokenContent, cdiv, num_leading_nulls
from sim.kv.v0_v2.cpu_gpu import CpuGpuBlockAllocator, Device
from sim.kv.v0_v2.naive import Block


def signed_cdiv(a: int, b: int) -> int:
    """math.ceil(a / b) in integers, also for negative a: signed_cdiv(-15, 16) == 0."""
    return -(-a // b)


class BlockTable:
    #: The last chunk of a chunked prefill whose prompt is a multiple of the block size appends
    #: no token to a full table. The vLLM 0.5.4 release raises IndexError there (#7371); the
    #: pinned commit 00c3d68 includes the fix (#7380). See `Release054BlockTable`.
    empty_append_raises = False

    def __init__(
        self,
        block_size: int,
        allocator: CpuGpuBlockAllocator,
        max_block_sliding_window: int | None = None,
        blocks: list[Block] | None = None,
    ) -> None:
        self.block_size = block_size
        self.allocator = allocator
        self.max_block_sliding_window = max_block_sliding_window
        self.blocks: list[Block] = blocks if blocks is not None else []
        #: Tokens written into the table (vLLM `_num_full_slots`).
        self.num_full_slots = sum(b.num_tokens for b in self.blocks)
        #: Largest lookahead ever ensured (bounds the footprint).
        self.max_lookahead_slots = 0
        #: True once an append wrote a token the table had not seen at allocate (decode).
        self.has_decoded = False

    # -- allocation ----------------------------------------------------------------------
    def _content_keys(
        self, content: TokenContent, start_block: int, end_block: int
    ) -> list[tuple | None]:
        if not self.allocator.uses_content_keys:
            return [None] * (end_block - start_block)
        return [content.block_key(i, self.block_size) for i in range(start_block, end_block)]

    def allocate(self, content: TokenContent) -> None:
        """Blocks for every token of `content`: full blocks first, then one mutable tail."""
        assert not self.blocks, "table already allocated"
        num_tokens = content.num_tokens
        assert num_tokens > 0, "cannot allocate an empty sequence"
        self.blocks = self._allocate_blocks(content, 0, num_tokens)
        self.num_full_slots = num_tokens

    def _allocate_blocks(
        self, content: TokenContent, first_block: int, num_tokens: int
    ) -> list[Block]:
        """Blocks for tokens [first_block * bs, num_tokens) with no predecessor block."""
        num_full = num_tokens // self.block_size
        num_tail_tokens = num_tokens % self.block_size
        blocks: list[Block] = []
        if num_full > first_block:
            keys = self._content_keys(content, first_block, num_full)
            blocks = self.allocator.allocate_immutable_blocks(None, keys, Device.GPU)
        if num_tail_tokens:
            prev = blocks[-1] if blocks else None
            try:
                tail = self.allocator.allocate_mutable_block(prev, Device.GPU)
            except NoFreeBlocksError:
                # The full blocks were built but no table will own them.
                self.allocator.gpu.leaked_blocks.extend(blocks)
                raise
            self.allocator.append_tokens(tail, num_tail_tokens, None)
            blocks.append(tail)
        return blocks

    # -- appends -------------------------------------------------------------------------
    def drop_out_of_window(self, num_computed_slots: int) -> None:
        """Replace indices < C//bs - M by the null block, creating it first if needed."""
        assert self.max_block_sliding_window is not None
        null = self.allocator.allocate_or_get_null_block()
        end = num_computed_slots // self.block_size - self.max_block_sliding_window
        for idx in range(end):
            if self.blocks[idx] is not null:
                self.allocator.free(self.blocks[idx])
                self.blocks[idx] = null

    def append_token_ids(
        self,
        content: TokenContent,
        num_new_tokens: int,
        num_lookahead_slots: int = 0,
        num_computed_slots: int | None = None,
    ) -> None:
        """Append the `num_new_tokens` unseen tokens of `content` (BlockTable L103-156)."""
        assert self.blocks, "no blocks have been allocated"
        if self.max_block_sliding_window is not None:
            assert num_computed_slots is not None
            self.drop_out_of_window(num_computed_slots)
        self.ensure_num_empty_slots(num_new_tokens + num_lookahead_slots)
        self.max_lookahead_slots = max(self.max_lookahead_slots, num_lookahead_slots)
        self._write_tokens(content, num_new_tokens)
        if num_new_tokens > 0:
            self.has_decoded = True

    def _write_tokens(self, content: TokenContent, num_new_tokens: int) -> None:
        bs = self.block_size
        first_idx = self.num_full_slots // bs
        first_chunk = bs - self.num_full_slots % bs
        chunks = [min(num_new_tokens, first_chunk)]
        remaining = num_new_tokens - first_chunk
        while remaining > 0:
            chunks.append(min(bs, remaining))
            remaining -= bs
        for i, num in enumerate(chunks):
            idx = first_idx + i
            if idx >= len(self.blocks):
                if num == 0 and not self.empty_append_raises:
                    break  # the pinned commit 00c3d68 has #7380: nothing to write
                # The 0.5.4 release indexes blocks[first_idx] even for an empty append, so a
                # full table (num_full_slots % bs == 0, no lookahead) raises here
                # (block_table.py:L150-154 @0.5.4; vLLM #7371, fixed by #7380 on 2024-08-09).
                raise IndexError(
                    f"block index {idx} out of range for a {len(self.blocks)}-block table"
                )
            block = self.blocks[idx]
            key = None
            if self.allocator.uses_content_keys and block.num_tokens + num == bs:
                key = content.block_key(idx, bs)
            self.allocator.append_tokens(block, num, key)
        self.num_full_slots += num_new_tokens

    def ensure_num_empty_slots(self, num_empty_slots: int) -> None:
        num_empty = len(self.blocks) * self.block_size - self.num_full_slots
        if num_empty >= num_empty_slots:
            return
        for _ in range(cdiv(num_empty_slots - num_empty, self.block_size)):
            self.blocks.append(self.allocator.allocate_mutable_block(self.blocks[-1], Device.GPU))

    def get_num_blocks_touched_by_append_slots(
        self, num_new_tokens: int, num_lookahead_slots: int
    ) -> int:
        """Worst case ``1 + ceil((n - first) / bs)`` (L333-351): 1 for a plain decode."""
        first_chunk = self.block_size - self.num_full_slots % self.block_size
        return 1 + signed_cdiv(num_new_tokens + num_lookahead_slots - first_chunk, self.block_size)

    # -- decode fast path ----------------------------------------------------------------
    def decode_touch_len(self, num_tokens: int) -> int | None:
        """The first decode length X (token ``X - 1`` written, ``X - 1`` computed) at which
        `append_token_ids` may change anything; shorter decodes are quiet.

        Touch points: ``len(blocks) * bs + 1`` (a new block); with a window, the first X whose
        drop end ``(X - 1)//bs - M`` passes the leading null entries, and now if the null block
        does not exist yet (V2 creates it lazily); with prefix caching, the next X with
        ``X % bs == 0`` (the block fills: promotion or dedupe); now, if a block still to be
        written is shared (copy-on-write). `num_tokens` is the sequence's current length.

        Example (bs=16, W=64 so M=6, no caching): 200-token prompt, after the first decode
        (X=201) indices 0..5 are null and the table has 13 blocks. Candidates: 13*16 + 1 = 209
        and (6 + 6 + 1)*16 + 1 = 209, so decodes 202..208 are quiet and 209 is returned.
        None with lookahead slots (or an empty table).
        """
        if not self.blocks or self.max_lookahead_slots > 0:
            return None
        bs = self.block_size
        num_full_slots = self.num_full_slots
        for block in self.blocks[num_full_slots // bs :]:
            if block.is_null or block.block_id is None:
                return None
            if self.allocator.allocator_of(block.block_id).refcounter.get(block.block_id) != 1:
                return num_tokens  # the next write copies on write
        touch_len = len(self.blocks) * bs + 1
        window = self.max_block_sliding_window
        if window is not None:
            null = self.allocator.null_block
            if null is None:
                return num_tokens  # the next drop creates the null block
            num_leading_null = 0
            for block in self.blocks:
                if block is not null:
                    break
                num_leading_null += 1
            touch_len = min(touch_len, (num_leading_null + window + 1) * bs + 1)
        if self.allocator.uses_content_keys:
            touch_len = min(touch_len, cdiv(num_full_slots + 1, bs) * bs)
        return max(touch_len, num_tokens)

    def write_quiet_tokens(self, num_full_slots: int) -> None:
        """Count tokens up to `num_full_slots` as written, as skipped quiet decodes would have.

        Only bookkeeping changes (each block's token counts and `num_full_slots`): by
        `decode_touch_len`'s rule those tokens fit the existing blocks, which are unshared,
        and none fills a prefix-caching block. Example (bs=16): 13 blocks, 201 slots, target
        206 -> block 12 goes from 9 to 14 tokens.
        """
        pos = self.num_full_slots
        if num_full_slots <= pos:
            return
        bs = self.block_size
        caching = self.allocator.uses_content_keys
        while pos < num_full_slots:
            block = self.blocks[pos // bs]
            num = min(bs - pos % bs, num_full_slots - pos)
            assert not block.is_null and block.block_id is not None, "quiet write to a null block"
            assert block.num_tokens == pos % bs, (
                f"block holds {block.num_tokens} tokens, not {pos % bs}"
            )
            assert not caching or block.num_tokens + num < bs, (
                "a quiet write cannot fill a cached block"
            )
            assert self.allocator.allocator_of(block.block_id).refcounter.get(block.block_id) == 1
            block.num_tokens += num
            block.num_tokens_total += num
            pos += num
        self.num_full_slots = num_full_slots
        self.has_decoded = True

    # -- fork / free ---------------------------------------------------------------------
    def fork(self) -> BlockTable:
        assert self.blocks
        if any(b.is_null for b in self.blocks):
            # vLLM walks the prev_block chain, which here runs through block objects that
            # were freed (and maybe recycled) by the drop: undefined (spec section 10).
            raise ValueError(
                "fork of a sliding-window table after a drop is undefined in vLLM 0.5.4"
            )
        return self._child(self.allocator.fork(self.blocks))

    def _child(self, blocks: list[Block]) -> BlockTable:
        child = type(self)(self.block_size, self.allocator, self.max_block_sliding_window, blocks)
        child.num_full_slots = self.num_full_slots
        child.max_lookahead_slots = self.max_lookahead_slots
        child.has_decoded = self.has_decoded
        return child

    def free(self) -> None:
        for block in self.blocks:
            self.allocator.free(block)
        self.blocks = []

    # -- views ---------------------------------------------------------------------------
    @property
    def physical_block_ids(self) -> list[int]:
        return [b.block_id for b in self.blocks]  # type: ignore[misc]

    def is_on_gpu(self) -> bool:
        last_id = self.blocks[-1].block_id if self.blocks else None
        return last_id is not None and last_id < self.allocator.num_gpu_blocks

    def num_live_blocks(self) -> int:
        """Non-null blocks. The sliding-window drop nulls indices from 0 upward, so null entries
        are a prefix and the rest are distinct blocks: a binary search, not a set (this runs at
        every audited allocation). Example: [null, null, 7, 8] -> 2."""
        return len(self.blocks) - num_leading_nulls(self.blocks)


class Release054BlockTable(BlockTable):
    """The block table of the vLLM 0.5.4 wheel (2024-08-05), before #7380: an empty append to a
    full table raises IndexError. Chosen by `KVCacheConfig(vllm_pin="0.5.4")`."""

    empty_append_raises = True
