"""The full-sequence admission count of vLLM 0.33.0 (`full_sequence_must_fit`).

From 0.33.0 the scheduler admits a WAITING request only if the blocks for its *whole* current
sequence fit in the free pool, before it allocates the first chunk
(`scheduler_reserve_full_isl=True` by default, `config/scheduler.py:L190-194 @0.33.0`; the call
`sched/scheduler.py:L1435-1452 @0.33.0`; the check `kv_cache_manager.py:L531-547 @0.33.0`).
At 4ac7713 and 0.11.0 only the blocks of the first chunk are checked, so a long prompt can be
admitted on its first chunk and preempt others (or itself) chunk after chunk.

The count is `get_num_blocks_to_allocate` (`single_type_kv_cache_manager.py:L176-262 @0.33.0`)
for ``T = min(num_tokens, max_model_len)`` tokens with the admission cap applied:

* required blocks ``R = cdiv(T, bs)``; a sliding window of W tokens caps it at
  ``cdiv(min(W - 1 + max_in_flight_tokens, max_model_len), bs) + 1``
  (`SlidingWindowSpec.max_admission_blocks_per_request`, `kv_cache_interface.py:L918-944`),
  where kvsim's synchronous engine has ``max_in_flight_tokens = max_num_batched_tokens``
  (`config/vllm.py:L588-609`; async scheduling would double it);
* a request already holding a table needs ``max(R - len(table), 0)``;
* a new one with H hit blocks (C hit tokens) needs
  ``max(R - max(S, H), 0) + #{evictable hits past the first S}``, where
  ``S = floor(max(0, C - W + 1) / bs)`` blocks fall before the window (0 for full attention;
  ``floor(C // A * A / bs)`` for chunked-local attention in chunks of A, whose cap is
  ``cdiv(min(A + max_in_flight_tokens, max_model_len), bs)``: `chunked_local`).

Worked example (bs=16, full attention, no hits, 10 free blocks): a 200-token prompt needs
``cdiv(200, 16) = 13 > 10`` and is refused, although its first 64-token chunk (4 blocks)
would fit. With W=32 and a 64-token budget the cap is ``cdiv(31 + 64, 16) + 1 = 7``, so the
same prompt needs 7 blocks and is admitted.
"""

from __future__ import annotations

from sim.kv.v1_engine.block_pool import KVCacheBlock
from sim.kv.v1_engine.mamba import MambaManager
from sim.kv.v1_engine.single_type import SingleTypeManager, sliding_window_cap_blocks


def admission_cap_blocks(
    sliding_window: int | None,
    block_size: int,
    max_in_flight_tokens: int,
    max_model_len: int | None,
) -> int | None:
    """The per-request admission cap in blocks of a sliding window; None for full attention.

    kvsim's own (no upstream counterpart).
    """
    if sliding_window is None:
        return None
    return sliding_window_cap_blocks(
        sliding_window, block_size, max_in_flight_tokens, max_model_len
    )


def num_blocks_to_admit(
    manager: SingleTypeManager,
    request_id: int,
    num_tokens: int,
    hits: list[KVCacheBlock],
    num_computed_tokens: int,
    cap_blocks: int | None,
    num_tokens_main_model: int | None = None,
) -> int:
    """Blocks the free pool must hold to admit the request's whole sequence (see module doc).

    `num_tokens` is already clamped to max_model_len; `num_computed_tokens` counts the tokens
    computed before this step plus the prefix hits. A Mamba group in "align" mode has its
    own count, on `num_tokens_main_model` (None: `num_tokens`, as the full-sequence check
    passes it); in "all" mode the shared one after the same-step refusal
    (`sim.kv.v1_engine.mamba`).

    kvsim's own (no upstream counterpart).
    """
    if isinstance(manager, MambaManager) and manager.mamba_align:
        main = num_tokens if num_tokens_main_model is None else num_tokens_main_model
        # 0.33.0's gate neither records a checkpoint (`apply_admission_cap`, `L1776 @0.33.0`).
        return manager.get_num_blocks_to_allocate(
            request_id, main, hits, query_start=num_computed_tokens, record=False
        )
    if (
        isinstance(manager, MambaManager)
        and manager.mamba_all
        and hits
        and hits[-1].block_hash in manager.cached_blocks_this_step
    ):
        # The same-step refusal comes first in every count (found by the lockstep on 0.20.0,
        # whose capped count runs here in every `allocate_slots`).
        return manager.block_pool.num_gpu_blocks + 1
    block_size = manager.block_size
    num_required = manager.num_required_blocks(num_tokens)  # a circular buffer's: 1
    if cap_blocks is not None and cap_blocks < num_required:
        num_required = cap_blocks
    table = manager.req_to_blocks.get(request_id, ())
    if request_id in manager.num_cached_block:
        return max(num_required - len(table), 0)
    num_skipped_blocks = manager.num_skipped_tokens(num_computed_tokens) // block_size
    num_new = max(num_required - max(num_skipped_blocks, len(hits) + len(table)), 0)
    first_kept_hit = max(0, num_skipped_blocks - len(table))
    num_evictable = sum(1 for b in hits[first_kept_hit:] if b.ref_cnt == 0 and not b.is_null)
    return num_new + num_evictable
