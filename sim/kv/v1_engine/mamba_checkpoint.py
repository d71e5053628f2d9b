"""vLLM 0.33.0's Mamba cache mode "align": what changed since 0.26.0, as one strategy.

`MambaManager` (`sim.kv.v1_engine.mamba`) models "align" on 0.19.1-0.26.0; 0.33.0
(`vllm/v1/core/single_type_kv_cache_manager.py:L1428-2136 @0.33.0`) changes five things
that reach kvsim's configurations (one block size for every group, so the hash block size
and the hit alignment are the block size bs; no EAGLE, no hash lookahead, no KV connector):

1. **Prefill checkpoint blocks.** A Mamba spec may declare `num_prefill_checkpoint_blocks = 1`
   with a `prefill_checkpoint_alignment` (`kv_cache_interface.py:L1093-1166`): Mamba2 layers
   always (`model_executor/layers/mamba/mamba_mixer2.py:L1108-1118`, alignment 1), GDN layers
   with the FlashInfer prefill backend (`gdn/qwen_gdn_linear_attn.py:L688-698, L736-751`,
   Hopper's default; alignment the prefix-cache grid, bs). The kernel then writes the state
   at the checkpoint position ``p = (T - 1) // bs * bs`` (`get_mamba_prefill_checkpoint_position`,
   `kv_cache_interface.py:L1169-1186`, T the chunk end) from inside the forward, into a
   reserved block at index ``cdiv(T, bs) - 2``. The manager reserves it when
   `_needs_internal_checkpoint` holds (`single_type_kv_cache_manager.py:L1659-1690`):
   checkpoint blocks on, ``T >= prefill_end`` (only under sparse retention; dense passes
   prefill_end 0, `kv_cache_coordinator.py:L237-238`), `is_mamba_prefill_checkpoint_valid`
   (`kv_cache_interface.py:L1189-1210`: the chunk start S on the hash grid, the checkpoint's
   column past the initial state's, ``S + bs <= p``, ``S < p < T``, ``(p - S) %
   alignment == 0``), and the index past the table or null there. With one block size
   every S and p are multiples of bs, so the alignment (1 or bs) never decides.
   `get_num_blocks_to_allocate` (`L1692-1795`) caps a positive need at ``1 + c`` blocks (c
   = 1 with a checkpoint) and, outside the full-sequence gate (`apply_admission_cap`),
   records the checkpoint per request (`_checkpoints`); `allocate_new_blocks` (`L1797-1923`)
   pads nulls only to ``cdiv(T, bs) - 1 - c`` entries, so the checkpoint block and the
   running block are both new, and skips its "nothing to do" return while one is recorded.
2. **Retired ranges.** `_remove_blocks_in_range` (`L1608-1627`) frees every real block
   below ``(C - 1) // bs`` from a per-request watermark (`_num_retired_blocks`) up, skipping
   nulls, where 0.26.0 walked back and stopped at the first null: a checkpoint block behind
   later nulls is freed too. The previous-state rule is unchanged (`L1629-1657`).
3. **The scheduler's split** (`sim.scheduler.v1.mamba_align`, `sched/scheduler.py:L546-664`):
   the last cacheable position is ``(L - 1) // bs * bs`` (0.26.0: ``L - L % bs``), chunk ends
   are floored while before the prefill end, and with checkpoint blocks the final chunk runs
   through.
4. **Partial tails and checkpoint re-keying** (`_cache_partial_tail_block`, `L2028-2136`):
   with the hash block the block size, the checkpoint and the prompt's last boundary are
   whole blocks that the shared caching has already keyed at the same length, so it caches
   nothing more (the lockstep confirms it); left out rather than mirrored.

5. **Sparse retention** (`prefix_cache_retention_interval`: `vllm serve` defaults it to 0,
   `config/cache.py:L275`, passed to `KVCacheConfig` by `kv_cache_planning.py:L665`; the
   dataclass field defaults to None, dense, `kv_cache_interface.py:L1541`). With 0 a Mamba
   group caches only the block ending at the replay boundary ``(P - 1) // bs * bs`` and at
   the request's shared-prefix junction (`reachable_block_mask`, `L1548-1606`; the
   boundaries from `cache_blocks`, `L477-530`, and `replay_boundaries`,
   `kv_cache_coordinator.py:L65-86`), and a checkpoint is reserved only by the chunk that
   reaches the prefill end (`kv_cache_coordinator.py:L237-238`, `L1668-1672`). Full
   attention ignores it. kvsim models None and 0 (`KVCacheConfig.prefix_cache_retention_
   interval`); a positive interval (periodic retention) is refused.

Not modelled, refused by name where a scenario can ask for them: a positive retention
interval, `prefix_match_unit` below the block size (fine-grained hits, copy-on-write partial
tails), `enable_mamba_shared_prefix_checkpoint` (EAGLE only), speculative blocks, KV
connectors. Sparse retention of sliding-window groups is `sim.kv.v1_engine.sliding_retention`
(kvsim takes Mamba prefix caching for full + Mamba layouts only, so the two never meet).

Worked example (bs=4, checkpoint blocks on, a 10-token prompt in one chunk, no hits): T=10,
``p = 9 // 4 * 4 = 8``, valid (S=0: 0 + 4 <= 8, 0 < 8 < 10), index ``cdiv(10, 4) - 2 = 1``:
the count is ``min(3, 1 + 1) = 2``; the table becomes [null, c, r] (c holds the state after 8
tokens and is cached as block 1; r the running state). Without checkpoint blocks the
scheduler would have stopped the chunk at 8 and run the last 2 tokens in a second step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.kv.types import cdiv
from sim.kv.v1_engine.block_pool import BlockPool, KVCacheBlock


def checkpoint_position(num_tokens: int, block_size: int) -> int:
    """The last block boundary strictly below `num_tokens` (no EAGLE drop, no lookahead).
    Example (bs=4): 10 -> 8; 8 -> 4; 1 -> 0.

    Upstream `get_mamba_prefill_checkpoint_position`:
    `vllm/v1/kv_cache_interface.py:L1169-1186 (0.33.0)`.
    """
    return max((num_tokens - 1) // block_size * block_size, 0)


def checkpoint_valid(query_start: int, query_end: int, position: int, block_size: int) -> bool:
    """Whether the kernel can export the state at `position` within the chunk
    [query_start, query_end), the hash block and the alignment both dividing bs. Example
    (bs=4): (0, 10, 8) -> True; (4, 10, 8) -> True (column ``cdiv(10, 4) - 2 = 1`` is past
    the initial state's ``3 // 4 = 0``); (4, 8, 4) -> False (p not inside the chunk).

    Upstream `is_mamba_prefill_checkpoint_valid`: `vllm/v1/kv_cache_interface.py:L1189-1210
    (0.33.0)`.
    """
    initial_state_col = (query_start - 1) // block_size
    checkpoint_col = cdiv(query_end, block_size) - 2
    return (
        query_start % block_size == 0
        and checkpoint_col > initial_state_col
        and query_start + block_size <= position
        and query_start < position < query_end
    )


@dataclass(slots=True)
class AlignCheckpoints:
    """0.33.0's "align" additions for one Mamba group (module docstring)."""

    block_size: int
    #: The spec's `num_prefill_checkpoint_blocks` (0 or 1).
    num_checkpoint_blocks: int
    #: Per request: the recorded checkpoint's block index (`_checkpoints`).
    checkpoints: dict[int, int] = field(default_factory=dict)
    #: Per request: blocks below this index were retired (`_num_retired_blocks`).
    num_retired_blocks: dict[int, int] = field(default_factory=dict)
    #: `prefix_cache_retention_interval == 0` (sparse): only reachable states are cached,
    #: and a checkpoint is reserved only on the chunk reaching the prefill end.
    sparse: bool = False

    def num_checkpoint_blocks_for(
        self,
        request_id: int,
        table: list[KVCacheBlock],
        query_start: int,
        query_end: int,
        *,
        record: bool,
        prefill_end: int = 0,
    ) -> int:
        """1 if this chunk reserves a checkpoint block, else 0; `record` (every count but the
        full-sequence gate's) keeps or drops the request's checkpoint; under sparse retention
        only a chunk reaching `prefill_end` reserves one (dense passes 0). Example (bs=4,
        empty table): (0, 10) -> 1 at index 1; (0, 8) -> 1 at index 0 (p=4); (0, 5) -> 0.

        Upstream `MambaManager._needs_internal_checkpoint` and its caller:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1659-1690, L1755-1785 (0.33.0)`.
        """
        bs = self.block_size
        index = cdiv(query_end, bs) - 2
        needed = (
            self.num_checkpoint_blocks > 0
            and (not self.sparse or query_end >= prefill_end)
            and checkpoint_valid(query_start, query_end, checkpoint_position(query_end, bs), bs)
            and index >= 0
            and (index >= len(table) or table[index].is_null)
        )
        if record:
            if needed:
                self.checkpoints[request_id] = index
            else:
                self.checkpoints.pop(request_id, None)
        return int(needed)

    def retained_mask(
        self, start_block: int, end_block: int, boundaries: tuple[int, ...]
    ) -> list[bool] | None:
        """Which of the blocks [start_block, end_block) keep their state (sparse retention):
        the block ending at each boundary floored to bs; None: dense, all of them. Example
        (bs=4, boundaries (9, 0)): block 8 // 4 - 1 = 1 only -> for [0, 3): [F, T, F].

        Upstream `MambaManager.reachable_block_mask` with `retention_interval=0`, its
        boundaries from `SingleTypeKVCacheManager.cache_blocks` (the replay boundary
        ``P - 1``, `replay_boundaries`, and the junction):
        `vllm/v1/core/single_type_kv_cache_manager.py:L477-530, L1548-1606`,
        `kv_cache_coordinator.py:L65-86 (0.33.0)`.
        """
        if not self.sparse:
            return None
        mask = [False] * (end_block - start_block)
        for boundary in boundaries:
            block = boundary // self.block_size - 1
            if start_block <= block < end_block:
                mask[block - start_block] = True
        return mask

    def remove_in_range(
        self, block_pool: BlockPool, request_id: int, table: list[KVCacheBlock], last: int
    ) -> None:
        """Free the real blocks in [retired, last), highest first, skipping nulls; the
        watermark moves to `last`. Example: [null, c, null, r] with last 3 frees c.

        Upstream `MambaManager._remove_blocks_in_range`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1608-1627 (0.33.0)`.
        """
        first = self.num_retired_blocks.get(request_id, 0)
        last = min(last, len(table))
        if first >= last:
            return
        null = block_pool.null_block
        freed: list[KVCacheBlock] = []
        for index in range(last - 1, first - 1, -1):
            if table[index].is_null:
                continue
            freed.append(table[index])
            table[index] = null
        if freed:
            block_pool.free_blocks(freed)
        self.num_retired_blocks[request_id] = last

    def forget(self, request_id: int) -> None:
        """Drop the request's checkpoint and watermark (`pop_blocks_for_free`, `L1952-1969`).

        Upstream `MambaManager.pop_blocks_for_free`:
        `vllm/v1/core/single_type_kv_cache_manager.py:L1952-1969 (0.33.0)`.
        """
        self.checkpoints.pop(request_id, None)
        self.num_retired_blocks.pop(request_id, None)
