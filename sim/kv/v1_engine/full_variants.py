"""Full attention's variants: static sink tokens, reference sliding-window attention (R-SWA)
and a circular buffer of one block per request.

All three are `FullAttentionManager` subclasses upstream
(`vllm/v1/core/single_type_kv_cache_manager.py`); kvsim models them in the hybrid
coordinator, with prefix caching off or on (what each release does with a hit over them, and
the layouts kvsim refuses with caching: `sim.kv.v1_engine.variant_caching`).

**Sink** (`SinkFullAttentionManager`, 0.19.1 `L1091-1112`, 0.20.0 `L1112-1133`; spec
`SinkFullAttentionSpec`, `vllm/v1/kv_cache_interface.py:L1232-1289 (0.33.0)`; used by
`StaticSinkAttention`, `model_executor/layers/attention/static_sink_attention.py`, in
openPangu). Full attention in every decision; the layer prepends `sink_len` learned sink
tokens whose K/V live in the pool's blocks 1..sink_len/bs (the attention builder points the
first table entries of every request there, `static_sink_attention.py:L66-77 (0.33.0)`, and
writes them once to slots ``[bs, bs + sink_len)``, `L192-207`). 0.19.1 and 0.20.0 take those
blocks from the head of the free queue when the manager is built
(`free_block_queue.popleft_n(sink_len // bs)`: blocks 1, 2, ... right after the null block)
and never return them. The startup check charges the group as full attention
(`FullAttentionSpec.max_memory_usage_bytes`), the sink blocks not included.

0.25.1, 0.26.0 and 0.33.0 cannot build this manager: its constructor keeps fixed parameters
while the coordinator passes every manager `scheduler_block_size` (0.25.1) and
`needs_kv_cache_zeroing` (0.26.0 on), so vLLM raises TypeError at startup for any sink model
(`VllmPin.sink_manager_fails_to_build`; vllm PR #44951). kvsim refuses such a scenario there,
naming the crash. (0.33.0's constructor no longer takes the sink blocks either, while the
attention layer still writes them to blocks 1..n; unreachable while the constructor fails.)

Worked example (0.20.0, bs=4, 10 blocks, groups [full, sink 8]): the sink group takes
blocks 1 and 2 at construction, leaving 7 free (3..9); a 6-token prompt then takes 3, 4
(full) and 5, 6 (sink). On 0.33.0 the same prompt takes 1, 2 and 3, 4.

**R-SWA** (`RSWAManager`, 0.25.1 `L625-666`, 0.26.0 `L806-850`, 0.33.0 `L900-944`; spec
`RSWASpec`, `kv_cache_interface.py:L816-858 (0.33.0)`): the prompt stays visible to every
later token, generated tokens only within the last `rswa_window`. `allocate_slots` passes the
prompt length to `remove_skipped_blocks` (0.25.1 `kv_cache_manager.py:L403-408`, 0.33.0
`L564-568`), which frees the *gap*: the blocks wholly inside
``[cdiv(P, bs) * bs, max(P, C - rswa_window))``, walking back from the gap's end to the
first null (`_remove_blocks_in_range`, 0.25.1 `L480-505`, 0.33.0 `L655-680`), so the nulls of
an R-SWA table sit between the prompt's blocks and the window's. Counted, allocated and
capped as full attention (no admission cap: `get_manager_for_kv_cache_spec`, 0.33.0
`L2630-2645`); startup charges ``cdiv(max_model_len, bs)``.

Worked example (bs=4, W=8, a 6-token prompt, decoding): P=6 -> the gap starts at block
cdiv(6, 4) = 2. At C=17 the window starts at max(6, 9) = 9: gap [2, 9 // 4 = 2), nothing.
At C=20: max(6, 12) = 12 -> block 2 is freed. At C=24: [2, 4) -> block 3 is freed (the walk
back stops at block 2, already null). The table is then [b0, b1, NULL, NULL, b4, b5, b6].

**Circular buffer** (`CircularBufferManager`, 0.33.0 `L1186-1274`; spec
`CircularBufferSpec`, `kv_cache_interface.py:L968-1005`: the raw keys of the token group a
compressed-attention layer is still compressing): one block per request for its whole life,
claimed by its first allocation; a count of 1 for a request without it, 0 after; never
skips, caches or hits; startup charges one page (`max_memory_usage_bytes`), and no
admission cap applies.

Left out: prefix caching over a sink or R-SWA group beside a third attention type (the
fixed-point hybrid hit, `variant_caching`), EAGLE / speculative blocks, KV connectors (the
scheduler's connector path also frees the R-SWA gap, 0.33.0 `sched/scheduler.py:L3369-3375`),
a lone group of these types (one KV-cache group: the unitary coordinator), and the sink
layer's own K/V writes (what the 0.33.0 change means for blocks 1..n, which the pool now
hands to requests, is not checked here).
"""

from __future__ import annotations

from sim.kv.config import KVCacheGroupSpec
from sim.kv.types import BlockHash, cdiv
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock
from sim.kv.v1_engine.single_type import FullAttentionManager


def make_full_variant_manager(
    block_pool: BlockPool, block_size: int, group: KVCacheGroupSpec
) -> FullAttentionManager:
    """The manager of a sink, R-SWA or circular-buffer group (`get_manager_for_kv_cache_spec`,
    `vllm/v1/core/single_type_kv_cache_manager.py:L2608-2651 (0.33.0)`, for these specs).

    kvsim's own (no upstream counterpart).
    """
    if group.sink_len is not None:
        return SinkFullAttentionManager(block_pool, block_size, group.sink_len)
    if group.rswa_window is not None:
        return RSWAManager(block_pool, block_size, group.rswa_window)
    if group.circular_buffer:
        return CircularBufferManager(block_pool, block_size)
    raise ValueError(f"not a sink, R-SWA or circular-buffer group: {group.kind}")


class SinkFullAttentionManager(FullAttentionManager):
    """Full attention with `sink_len` static sink tokens (module docstring)."""

    def __init__(self, block_pool: BlockPool, block_size: int, sink_len: int) -> None:
        super().__init__(block_pool, block_size)
        if sink_len <= 0 or sink_len % block_size:
            # Upstream: `assert sink_len > 0 and sink_len % self.block_size == 0`.
            raise ValueError(
                f"sink_len must be a positive multiple of the block size {block_size}, "
                f"got {sink_len}"
            )
        self.sink_len = sink_len
        #: The blocks holding the sink tokens' K/V (none on 0.33.0, which takes none).
        self.sink_blocks: list[KVCacheBlock] = []

    def reserve_sink_blocks(self) -> None:
        """Take ``sink_len // bs`` blocks from the free queue for good (0.19.1 to 0.26.0; the
        manager calls it right after building the groups, in group order, as upstream's
        constructors run). Example (bs=4, sink_len 8, a fresh pool): blocks 1 and 2.

        Upstream `SinkFullAttentionManager.__init__`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1092-1112 (0.19.1)`.
        """
        self.sink_blocks = self.block_pool.reserve_blocks(self.sink_len // self.block_size)


class RSWAManager(FullAttentionManager):
    """Reference sliding-window attention: the prompt and the last `rswa_window` tokens."""

    def __init__(self, block_pool: BlockPool, block_size: int, rswa_window: int) -> None:
        super().__init__(block_pool, block_size)
        if rswa_window <= 0:
            raise ValueError(f"rswa_window must be positive, got {rswa_window}")
        self.rswa_window = rswa_window
        #: Per request: its prompt length, as the last `remove_skipped_blocks` was given it.
        self.req_to_num_prompt_tokens: dict[int, int] = {}
        #: Per request: the null entries of its gap (one run from block cdiv(P, bs) on).
        self.req_to_num_gap_blocks: dict[int, int] = {}

    def _gap(self, num_computed_tokens: int, num_prompt_tokens: int) -> tuple[int, int]:
        """``[cdiv(P, bs), max(P, C - W) // bs)``: the blocks no later token reads."""
        first_gap_block = cdiv(num_prompt_tokens, self.block_size)
        window_start = max(num_prompt_tokens, num_computed_tokens - self.rswa_window)
        return first_gap_block, window_start // self.block_size

    def remove_skipped_blocks(
        self, request_id: int, num_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the gap between the prompt's blocks and the window's (module docstring);
        without the prompt length, full attention's no-op.

        Example (bs=4, W=8, P=6, 7 blocks): C=24 -> gap [2, 4): blocks 3, 2 are freed.

        Upstream `RSWAManager.remove_skipped_blocks`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L913-944 (0.33.0)`, `L638-666 (0.25.1)`.
        """
        if num_prompt_tokens is None:
            return
        self.req_to_num_prompt_tokens[request_id] = num_prompt_tokens
        first_gap_block, last_gap_block = self._gap(num_computed_tokens, num_prompt_tokens)
        self._remove_blocks_in_range(request_id, first_gap_block, last_gap_block)

    def _remove_blocks_in_range(self, request_id: int, first_block: int, last_block: int) -> None:
        """Null and free ``[first_block, last_block)``, walking back from its end to the
        first null (an earlier call nulled what lies before it).

        Upstream `SingleTypeKVCacheManager._remove_blocks_in_range`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L655-680 (0.33.0)`, `L480-505 (0.25.1)`.
        """
        table = self.req_to_blocks.get(request_id)
        if table is None or first_block >= last_block:
            return
        last_block = min(last_block, len(table))
        null = self.block_pool.null_block
        removed: list[KVCacheBlock] = []
        for index in range(last_block - 1, first_block - 1, -1):
            if table[index].is_null:
                break
            removed.append(table[index])
            table[index] = null
        if removed:
            self.req_to_num_gap_blocks[request_id] = self.req_to_num_gap_blocks.get(
                request_id, 0
            ) + len(removed)
            self.block_pool.free_blocks(removed)

    def free(self, request_id: int) -> None:
        """The shared free, and the request's gap counters.

        Upstream `SingleTypeKVCacheManager.free`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L591-610 (0.33.0)`.
        """
        super().free(request_id)
        self.req_to_num_prompt_tokens.pop(request_id, None)
        self.req_to_num_gap_blocks.pop(request_id, None)

    def num_null_blocks(self, request_id: int) -> int:
        """The gap's null entries. kvsim's own (no upstream counterpart)."""
        return self.req_to_num_gap_blocks.get(request_id, 0)

    def num_freed_blocks_of(self, request_id: int, num_computed_tokens: int) -> int:
        """The gap entries a `remove_skipped_blocks` at C left null (within the table).
        Example (bs=4, W=8, P=6, 7 blocks, C=24): 2. kvsim's own (no upstream counterpart)."""
        num_prompt_tokens = self.req_to_num_prompt_tokens.get(request_id)
        table = self.req_to_blocks.get(request_id)
        if num_prompt_tokens is None or not table:
            return 0
        first_gap_block, last_gap_block = self._gap(num_computed_tokens, num_prompt_tokens)
        return max(0, min(last_gap_block, len(table)) - first_gap_block)

    def next_freeing_decode_len(self, request_id: int) -> int | None:
        """The first decode length X (``C = X - 1``) whose gap passes the nulled run's end
        e: ``(C - W) // bs >= e + 1``, so ``X = (e + 1) * bs + W + 1``. Example (bs=4, W=8,
        P=6, nothing nulled yet: e = 2): 21 (C=20 frees block 2). kvsim's own (no upstream
        counterpart)."""
        num_prompt_tokens = self.req_to_num_prompt_tokens.get(request_id)
        if num_prompt_tokens is None:
            return None
        gap_end = cdiv(num_prompt_tokens, self.block_size) + self.num_null_blocks(request_id)
        return (gap_end + 1) * self.block_size + self.rswa_window + 1


class CircularBufferManager(FullAttentionManager):
    """One ring block per request for its whole life; caching off (module docstring)."""

    def get_num_blocks_to_allocate(
        self, request_id: int, num_tokens: int, new_computed_blocks: list[KVCacheBlock]
    ) -> int:
        """1 for a request without its ring block, else 0.

        Upstream `CircularBufferManager.get_num_blocks_to_allocate`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1203-1214 (0.33.0)`.
        """
        return 0 if self.blocks_of(request_id) else 1

    def allocate_new_blocks(self, request_id: int, num_tokens: int) -> list[KVCacheBlock]:
        """Claim the ring block once (`_claim_ring_block`).

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L1216-1219 (0.33.0)` (and
        `_claim_ring_block`, `L1191-1201`).
        """
        table = self.blocks_of(request_id)
        if table:
            return []
        new_blocks = self.block_pool.get_new_blocks(1)
        table.extend(new_blocks)
        return new_blocks

    def find_longest_cache_hit(
        self, block_hashes: list[BlockHash], max_length: int
    ) -> list[KVCacheBlock]:
        """No hits.

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L1231-1243 (0.33.0)`.
        """
        return []

    def cache_blocks(self, request_id: int, block_hashes: list[BlockHash], num_tokens: int) -> None:
        """Never caches.

        Upstream: `vllm/v1/core/single_type_kv_cache_manager.py:L1245-1253 (0.33.0)`.
        """
        return None

    def num_required_blocks(self, num_tokens: int) -> int:
        """1, whatever the length. kvsim's own (no upstream counterpart)."""
        return 1

    def next_growth_decode_len(self, table_len: int) -> int | None:
        """Never grows past its one block. kvsim's own (no upstream counterpart)."""
        return None if table_len else 1
