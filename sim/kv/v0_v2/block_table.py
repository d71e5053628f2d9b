"""Per-sequence block table of v0 V2 (`vllm/core/block/block_table.py:L9-365 (0.5.4)`).

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

from sim.kv.types import ContentKey, EmptyAppendIndexError, NoFreeBlocksError, TokenContent, cdiv
from sim.kv.v0_v2.cpu_gpu import CpuGpuBlockAllocator
from sim.kv.v0_v2.naive import Block, NaiveBlockAllocator


def signed_cdiv(a: int, b: int) -> int:
    """math.ceil(a / b) in integers, also for negative a: signed_cdiv(-15, 16) == 0.

    kvsim's own (no upstream counterpart).
    """
    return -(-a // b)


class BlockTable:
    #: The last chunk of a chunked prefill whose prompt is a multiple of the block size appends
    #: no token to a full table. The vLLM 0.5.4 release raises IndexError there (#7371); the
    #: pin 0.5.4+7380 has the fix (#7380, merged after the release). See `Release054BlockTable`.
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
        #: How many leading entries are the null block. The sliding-window drop nulls indices
        #: from 0 upward (and the corrected design allocates a null prefix), so these are the
        #: only null entries; kept up to date wherever entries change, so the drop and the
        #: fast-path queries need not scan them.
        self.num_leading_null = 0
        for block in self.blocks:
            if not block.is_null:
                break
            self.num_leading_null += 1
        #: Whether the allocator wants content keys (prefix caching); fixed for its life.
        self._uses_content_keys = allocator.uses_content_keys
        #: The GPU allocator and the GPU/CPU id boundary, fixed for the allocator's life.
        self._gpu = allocator.gpu
        self._num_gpu_blocks = allocator.num_gpu_blocks
        #: Tokens written into the table (vLLM `_num_full_slots`).
        self.num_full_slots = sum(b.num_tokens for b in self.blocks)
        #: Largest lookahead ever ensured (bounds the footprint).
        self.max_lookahead_slots = 0
        #: True once an append wrote a token the table had not seen at allocate (decode).
        self.has_decoded = False

    # -- allocation ----------------------------------------------------------------------
    def _content_keys(
        self, content: TokenContent, start_block: int, end_block: int
    ) -> list[ContentKey | None]:
        if not self._uses_content_keys:
            return [None] * (end_block - start_block)
        return [content.block_key(i, self.block_size) for i in range(start_block, end_block)]

    def allocate(self, content: TokenContent) -> None:
        """Blocks for every token of `content`: full blocks first, then one mutable tail.

        Upstream: `vllm/core/block/block_table.py:L76-95 (0.5.4)`.
        """
        assert not self.blocks, "table already allocated"
        num_tokens = content.num_tokens
        assert num_tokens > 0, "cannot allocate an empty sequence"
        self.blocks = self._allocate_blocks(content, 0, num_tokens)
        self.num_full_slots = num_tokens

    def _allocate_blocks(
        self, content: TokenContent, first_block: int, num_tokens: int
    ) -> list[Block]:
        """Blocks for tokens [first_block * bs, num_tokens) with no predecessor block."""
        # Straight to the GPU allocator: `CpuGpuBlockAllocator` would only pick it (Device.GPU;
        # the fresh tail's id is a GPU id, and a fresh block is never the null block).
        gpu = self._gpu
        num_full, num_tail_tokens = divmod(num_tokens, self.block_size)
        blocks: list[Block] = []
        if num_full > first_block:
            keys = self._content_keys(content, first_block, num_full)
            blocks = gpu.allocate_immutable_blocks(None, keys)
        if num_tail_tokens:
            prev = blocks[-1] if blocks else None
            try:
                tail = gpu.allocate_mutable_block(prev)
            except NoFreeBlocksError:
                # The full blocks were built but no table will own them.
                gpu.leaked_blocks.extend(blocks)
                raise
            gpu.append_tokens(tail, num_tail_tokens, None)
            blocks.append(tail)
        return blocks

    # -- appends -------------------------------------------------------------------------
    def drop_out_of_window(self, num_computed_slots: int) -> None:
        """Replace indices < C//bs - M by the null block, creating it first if needed.

        Indices below `num_leading_null` are null already, so the scan starts there (a
        one-token decode moves the end by at most one index). Example (bs=16, M=6): 3 leading nulls and
        C=160 give end 4, so only index 3 is freed and nulled.

        Upstream: the window drop at the top of `BlockTable.append_token_ids`,
        `vllm/core/block/block_table.py:L133-142 (0.5.4)`.
        """
        assert self.max_block_sliding_window is not None
        null = self.allocator.allocate_or_get_null_block()
        end = num_computed_slots // self.block_size - self.max_block_sliding_window
        blocks = self.blocks
        free = self.allocator.free
        for idx in range(self.num_leading_null, end):
            if blocks[idx] is not null:
                free(blocks[idx])
                blocks[idx] = null
            self.num_leading_null = idx + 1  # per index: right even if a free raises

    def append_token_ids(
        self,
        content: TokenContent,
        num_new_tokens: int,
        num_lookahead_slots: int = 0,
        num_computed_slots: int | None = None,
    ) -> None:
        """Append the `num_new_tokens` unseen tokens of `content` (BlockTable L103-156).

        Upstream: `vllm/core/block/block_table.py:L103-156 (0.5.4)`.
        """
        blocks = self.blocks
        assert blocks, "no blocks have been allocated"
        bs = self.block_size
        window = self.max_block_sliding_window
        if window is not None:
            assert num_computed_slots is not None
            # Skip the call when it would do nothing: the null block exists and the drop end
            # does not pass the leading null entries (most decodes).
            if (
                self.allocator.null_block is None
                or num_computed_slots // bs - window > self.num_leading_null
            ):
                self.drop_out_of_window(num_computed_slots)
        num_full_slots = self.num_full_slots
        num_empty = len(blocks) * bs - num_full_slots
        if (
            num_empty == 0
            and num_new_tokens == 1
            and num_lookahead_slots == 0
            and not self._uses_content_keys
        ):
            # fast path: the commonest touch of a replay (a decode that crosses a block
            # boundary, no prefix caching, no lookahead): `ensure_num_empty_slots(1)` then
            # `_write_tokens` are one new block behind the full last block, holding the token.
            gpu = self._gpu
            assert isinstance(gpu, NaiveBlockAllocator)  # no content keys: no caching
            blocks.append(gpu.allocate_decode_block(blocks[-1]))
            self.num_full_slots = num_full_slots + 1
            self.has_decoded = True
            return
        num_wanted = num_new_tokens + num_lookahead_slots
        if num_empty < num_wanted:  # else ensure is a no-op
            self.ensure_num_empty_slots(num_wanted)
        if num_lookahead_slots > self.max_lookahead_slots:
            self.max_lookahead_slots = num_lookahead_slots
        self._write_tokens(content, num_new_tokens)
        if num_new_tokens > 0:
            self.has_decoded = True

    def _write_tokens(self, content: TokenContent, num_new_tokens: int) -> None:
        """Write the tokens chunk by chunk: first the rest of the partial block (a chunk of 0
        for an empty append, which still runs the CoW check), then one chunk per block.

        Example (bs=16, 20 slots, 30 new tokens): chunks 12, 16, 2 into blocks 1, 2, 3.
        """
        bs = self.block_size
        blocks = self.blocks
        allocator = self.allocator
        caching = self._uses_content_keys
        idx = self.num_full_slots // bs
        num = bs - self.num_full_slots % bs  # room in the first block: 1..bs
        if num > num_new_tokens:
            num = num_new_tokens
        remaining = num_new_tokens
        while True:
            if idx >= len(blocks):
                message = f"block index {idx} out of range for a {len(blocks)}-block table"
                if num != 0:
                    raise IndexError(message)  # tokens past the table: a kvsim bug
                if not self.empty_append_raises:
                    break  # #7380 (pin 0.5.4+7380): nothing to write
                # The 0.5.4 release indexes blocks[first_idx] even for an empty append, so a
                # full table (num_full_slots % bs == 0, no lookahead) raises here
                # (block_table.py:L150-154 @0.5.4; vLLM #7371, fixed by #7380 on 2024-08-09).
                raise EmptyAppendIndexError(message)
            block = blocks[idx]
            key = None
            if caching and block.num_tokens + num == bs:
                key = content.block_key(idx, bs)
            allocator.append_tokens(block, num, key)
            remaining -= num
            if remaining <= 0:
                break
            idx += 1
            num = bs if remaining > bs else remaining
        self.num_full_slots += num_new_tokens

    def ensure_num_empty_slots(self, num_empty_slots: int) -> None:
        """Upstream: `vllm/core/block/block_table.py:L158-185 (0.5.4)`."""
        num_empty = len(self.blocks) * self.block_size - self.num_full_slots
        if num_empty >= num_empty_slots:
            return
        blocks = self.blocks
        allocate = self.allocator.gpu.allocate_mutable_block
        for _ in range(-(-(num_empty_slots - num_empty) // self.block_size)):  # cdiv
            blocks.append(allocate(blocks[-1]))

    def get_num_blocks_touched_by_append_slots(
        self, num_new_tokens: int, num_lookahead_slots: int
    ) -> int:
        """Worst case ``1 + ceil((n - first) / bs)`` (L333-351): 1 for a plain decode.

        Upstream: `vllm/core/block/block_table.py:L333-351 (0.5.4)`.
        """
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

        kvsim's own (no upstream counterpart).
        """
        blocks = self.blocks
        if not blocks or self.max_lookahead_slots > 0:
            return None
        bs = self.block_size
        num_full_slots = self.num_full_slots
        num_blocks = len(blocks)
        # The blocks still to be written: usually just the partial tail block, or none when
        # the last block is full (right after a touch that allocated one and wrote 1 token,
        # it is that block).
        idx = num_full_slots // bs
        while idx < num_blocks:
            block = blocks[idx]
            block_id = block.block_id
            if block.is_null or block_id is None:
                return None
            if self.allocator.refcount(block_id) != 1:
                return num_tokens  # the next write copies on write
            idx += 1
        touch_len = num_blocks * bs + 1
        window = self.max_block_sliding_window
        if window is not None:
            if self.allocator.null_block is None:
                return num_tokens  # the next drop creates the null block
            drop_len = (self.num_leading_null + window + 1) * bs + 1
            if drop_len < touch_len:
                touch_len = drop_len
        if self._uses_content_keys:
            fill_len = cdiv(num_full_slots + 1, bs) * bs
            if fill_len < touch_len:
                touch_len = fill_len
        return touch_len if touch_len > num_tokens else num_tokens

    def write_quiet_tokens(self, num_full_slots: int) -> None:
        """Count tokens up to `num_full_slots` as written, as skipped quiet decodes would have.

        Only bookkeeping changes (each block's token counts and `num_full_slots`): by
        `decode_touch_len`'s rule those tokens fit the existing blocks, which are unshared,
        and none fills a prefix-caching block. Example (bs=16): 13 blocks, 201 slots, target
        206 -> block 12 goes from 9 to 14 tokens.

        kvsim's own (no upstream counterpart).
        """
        pos = self.num_full_slots
        if num_full_slots <= pos:
            return
        bs = self.block_size
        blocks = self.blocks
        caching = self._uses_content_keys
        while pos < num_full_slots:  # usually one pass: the tokens fit the tail block
            offset = pos % bs
            block = blocks[pos // bs]
            num = bs - offset
            if num > num_full_slots - pos:
                num = num_full_slots - pos
            block_id = block.block_id
            assert not block.is_null and block_id is not None, "quiet write to a null block"
            assert block.num_tokens == offset, (
                f"block holds {block.num_tokens} tokens, not {offset}"
            )
            assert not caching or block.num_tokens + num < bs, (
                "a quiet write cannot fill a cached block"
            )
            assert self.allocator.refcount(block_id) == 1
            block.num_tokens += num
            block.num_tokens_total += num
            pos += num
        self.num_full_slots = num_full_slots
        self.has_decoded = True

    # -- fork / free ---------------------------------------------------------------------
    def fork(self) -> BlockTable:
        """Upstream: `vllm/core/block/block_table.py:L187-208 (0.5.4)`."""
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
        """Free every block in order (in bulk: tables hold hundreds of blocks).

        Upstream: `vllm/core/block/block_table.py:L210-221 (0.5.4)`.
        """
        self.allocator.free_blocks(self.blocks)
        self.blocks = []
        self.num_leading_null = 0

    # -- views ---------------------------------------------------------------------------
    @property
    def physical_block_ids(self) -> list[int]:
        """Upstream: `vllm/core/block/block_table.py:L224-238 (0.5.4)`."""
        return [b.block_id for b in self.blocks]  # type: ignore[misc]

    def is_on_gpu(self) -> bool:
        """GPU ids are ``0..G-1``: a table is on the GPU iff its last id is below G.

        kvsim's own (no upstream counterpart).
        """
        last_id = self.blocks[-1].block_id if self.blocks else None
        return last_id is not None and last_id < self._num_gpu_blocks

    def num_live_blocks(self) -> int:
        """Non-null blocks. The sliding-window drop nulls indices from 0 upward, so null entries
        are a prefix (`num_leading_null` long) and the rest are distinct blocks: O(1), not a set
        (this runs at every audited allocation). Example: [null, null, 7, 8] -> 2.

        kvsim's own (no upstream counterpart).
        """
        return len(self.blocks) - self.num_leading_null


class Release054BlockTable(BlockTable):
    """The block table of the vLLM 0.5.4 wheel (2024-08-05), before #7380: an empty append to a
    full table raises IndexError. Chosen by `KVCacheConfig(vllm_pin="0.5.4")`."""

    empty_append_raises = True
