"""Chunked-local attention (Llama-4's RoPE layers): a token reads only its own chunk.

Models `ChunkedLocalAttentionManager` (`vllm/v1/core/single_type_kv_cache_manager.py:L404-527
(0.11.0)`, `L640-789 (0.20.0)`, `L1276-1427 (0.33.0)`) and the chunked-local spec's admission
cap (`ChunkedLocalAttentionSpec.max_admission_blocks_per_request`,
`vllm/v1/kv_cache_interface.py:L376-400 (0.20.0)`, `L861-888 (0.33.0)`).

With chunks of A tokens the token at position p reads positions ``[p // A * A, p]``. Once C
tokens are computed the next token is at C, so the blocks wholly before ``C // A * A`` are
freed and replaced by the null block, as a sliding window frees what left it. Worked example
(bs=4, A=8): at C=13 the chunk starts at 8, so blocks 0 and 1 are freed; at C=7 nothing is.

The releases differ in one place, the free (`remove_skipped_blocks`):

* 0.11.0 (`L486-519`): the first useful block is ``C // A * A // bs``, but never past the
  last cached block (``num_cached_block - 1``) while the request has any cached block ("we
  need to keep the last block to get the previous hash key"). With prefix caching at C = A
  (bs | A) that keeps block ``A / bs - 1`` one step longer.
* 0.19.1 on: the shared `remove_skipped_blocks` of every type (`L381-422 @0.20.0`) on
  `get_num_skipped_tokens` (``C // A * A``, `L737-781 @0.20.0`), capped at the table's length.

The cap a request is charged at admission and at start-up is ``cdiv(min(A + T, max_model_len),
bs)`` blocks, T the token budget (from 0.26.0 `max_in_flight_tokens`), without the sliding
window's "+1": a chunk starts on a block boundary when bs divides A.

kvsim models this type from vLLM 0.11.0 on (4ac7713 is not compared with it). Left out:
`get_num_common_prefix_blocks` (cascade attention is off for this type upstream too), EAGLE,
and decode/prefill context parallelism (upstream asserts them off for this type).
"""

from __future__ import annotations

from sim.kv.types import BlockHash, cdiv
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.single_type import SingleTypeManager


class ChunkedLocalAttentionManager(SingleTypeManager):
    """Chunked-local attention in chunks of `attention_chunk_size` tokens (module docstring)."""

    def __init__(
        self,
        block_pool: BlockPool,
        block_size: int,
        attention_chunk_size: int,
        *,
        keeps_last_cached_block: bool = True,
    ) -> None:
        super().__init__(block_pool, block_size)
        if attention_chunk_size <= 0:
            raise ValueError(f"attention_chunk_size must be positive, got {attention_chunk_size}")
        self.attention_chunk_size = attention_chunk_size
        #: 0.11.0's free keeps the last cached block; 0.19.1 on caps at the table instead
        #: (set by the manager from its pin, `VllmPin.clamps_skipped_to_table`).
        self.keeps_last_cached_block = keeps_last_cached_block

    def num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """``C // A * A``: the tokens before the current chunk. Example (A=8): 13 -> 8,
        8 -> 8, 7 -> 0.

        Upstream `ChunkedLocalAttentionManager.get_num_skipped_tokens`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L737-781 (0.20.0)`.
        """
        return num_computed_tokens // self.attention_chunk_size * self.attention_chunk_size

    def admission_cap_blocks(
        self, max_in_flight_tokens: int, max_model_len: int | None
    ) -> int | None:
        """``cdiv(min(A + T, max_model_len), bs)``. Example (bs=16, A=8,192, T=8,192,
        max_model_len 131,072): 1,024 blocks.

        Upstream `ChunkedLocalAttentionSpec.max_admission_blocks_per_request`:
        `vllm/v1/kv_cache_interface.py:L864-881 (0.33.0)`.
        """
        num_tokens = self.attention_chunk_size + max_in_flight_tokens
        if max_model_len is not None and max_model_len < num_tokens:
            num_tokens = max_model_len
        return cdiv(num_tokens, self.block_size)

    def num_freed_blocks_at_least(self, num_computed_tokens: int) -> int:
        """``C // A * A // bs``, one fewer on 0.11.0 (it may keep the last cached block).

        kvsim's own (no upstream counterpart).
        """
        num_blocks = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        if self.keeps_last_cached_block and num_blocks > 0:
            return num_blocks - 1
        return num_blocks

    def freeing_decode_len(self, num_null_blocks: int) -> int | None:
        """The first X with ``(X - 1) // A * A // bs > nulls``: ``cdiv((nulls + 1) * bs, A) *
        A + 1``. Example (bs=4, A=8, 0 nulls): 9 (the decode at C=8 frees blocks 0 and 1).
        0.11.0 may keep the last cached block past it; the caller then finds nothing freed
        and asks again.

        kvsim's own (no upstream counterpart).
        """
        chunk = self.attention_chunk_size
        return cdiv((num_null_blocks + 1) * self.block_size, chunk) * chunk + 1

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """Nulls for the chunks before the one `max_length` falls in, then the contiguous
        cached blocks from that chunk's first block.

        Example (bs=4, A=8): max_length 15 -> [NULL, NULL] + block 2 if cached (upstream's
        docstring example); max_length 16 -> four nulls, nothing looked up.

        Upstream `ChunkedLocalAttentionManager.find_longest_cache_hit`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L413-484 (0.11.0)`.
        """
        return chunked_local_hit(
            self.block_pool, [block_hashes], max_length, self.block_size, self.attention_chunk_size
        )[0]

    def remove_skipped_blocks(self, request_id: int, num_computed_tokens: int) -> None:
        """Free the blocks before the current chunk, walking back to the first null.

        Example (bs=4, A=8, 4 blocks, C=13): first useful block 8 // 4 = 2, so blocks 1 and 0
        are freed (in that order). 0.11.0 with 2 cached blocks at C=8: min(2, 2 - 1) = 1, so
        only block 0 is.

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L486-519 (0.11.0)`;
        `L381-422 (0.20.0)` (the shared free, from 0.19.1).
        """
        first_useful_block = self.num_skipped_tokens(num_computed_tokens) // self.block_size
        table = self.req_to_blocks.get(request_id)
        if table is None:
            table = self.req_to_blocks[request_id] = []
        if self.keeps_last_cached_block:
            num_cached_block = self.num_cached_block.get(request_id, 0)
            if num_cached_block > 0 and num_cached_block - 1 < first_useful_block:
                first_useful_block = num_cached_block - 1
        elif first_useful_block > len(table):
            first_useful_block = len(table)
        if first_useful_block > len(table):
            raise ValueError(
                f"request {request_id}: {num_computed_tokens} computed tokens but only "
                f"{len(table)} blocks in its table"
            )
        self._free_before(request_id, table, first_useful_block)


def chunked_local_hit(
    block_pool: BlockPool,
    hashes: list[list[BlockHash]],
    max_length: int,
    block_size: int,
    attention_chunk_size: int,
) -> list[list[KVCacheBlock]]:
    """`ChunkedLocalAttentionManager.find_longest_cache_hit` over several groups of one chunk
    size (each with its own keys): a block is a hit only if every group has it cached.

    Upstream `ChunkedLocalAttentionManager.find_longest_cache_hit`:
    `vllm/v1/core/single_type_kv_cache_manager.py:L413-484 (0.11.0)`, `L1282-1379 (0.33.0)`
    (unchanged but for the hit length it also returns).
    """
    max_num_blocks = max_length // block_size
    start_block = 0
    if max_length > 0:
        start_block = max_length // attention_chunk_size * attention_chunk_size // block_size
    null = block_pool.null_block
    hits = [[null] * start_block for _ in hashes]
    for index in range(start_block, max_num_blocks):
        found = []
        for keys in hashes:
            block = block_pool.get_cached_block(keys[index])
            if block is None:
                return hits
            found.append(block)
        for group_hits, block in zip(hits, found, strict=True):
            group_hits.append(block)
    return hits
