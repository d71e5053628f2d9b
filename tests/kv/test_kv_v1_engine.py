"""V1-engine KVCacheManager model (vLLM ~0.10 @ 4ac7713): exact block ids, spec vectors 6-7,
prefix caching, sliding-window hits, and property tests over random schedules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, make_manager
from sim.kv.protocol import PoolIntrospection, PoolStats, V1KVCacheManager
from sim.kv.types import Segment, Sequence, TokenContent, cdiv
from sim.kv.v1_engine import KVCacheManager
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.free_queue import FreeBlockQueue
from sim.kv.v1_engine.single_type import SlidingWindowManager

BS = 16


def make(num_gpu_blocks: int = 11, **kwargs) -> KVCacheManager:
    return KVCacheManager(KVCacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS, **kwargs))


def seq_of(seq_id: int, *segments: tuple[int, int]) -> Sequence:
    """A sequence whose prompt is the given (content key, num_tokens) segments."""
    content = TokenContent.from_segments([Segment(k, n) for k, n in segments])
    return Sequence(seq_id, content, content.num_tokens)


def free_ids(m: KVCacheManager) -> list[int]:
    return m.block_pool.free_block_queue.ids()


# --------------------------------------------------------------------------- free queue, pool
def test_free_queue_lru_order():
    q = FreeBlockQueue(range(5))
    assert q.popleft_n(1) == [0]
    assert q.popleft_n(2) == [1, 2]
    q.append_n([2, 1])
    assert q.ids() == [3, 4, 2, 1]
    q.remove(2)
    assert q.ids() == [3, 4, 1]
    with pytest.raises(ValueError):
        q.popleft_n(4)


def test_null_block_reserved_at_init():
    m = make(11)
    assert isinstance(m, V1KVCacheManager) and isinstance(m, PoolIntrospection)
    assert make_manager("v1-engine", KVCacheConfig(num_gpu_blocks=11)).num_free_blocks == 10
    assert free_ids(m) == list(range(1, 11))
    assert m.pool_stats() == PoolStats(num_total=11, num_free=10, num_held=1, num_evictable=0)
    assert m.block_refcounts() == {0: 1}
    assert m.watermark_blocks == 0
    assert m.recover_leaked_blocks() == 0


def test_first_allocation_takes_ids_in_order_and_free_is_reverse():
    m = make(11)
    a, b = Sequence.new(1, 40), Sequence.new(2, 20)
    assert m.allocate_slots(a, 40) == [1, 2, 3]
    assert m.allocate_slots(b, 20) == [4, 5]
    m.free(a)
    assert free_ids(m) == [6, 7, 8, 9, 10, 3, 2, 1]
    assert m.allocate_slots(Sequence.new(3, 100), 100) == [6, 7, 8, 9, 10, 3, 2]
    assert m.allocate_slots(Sequence.new(4, 16), 16) == [1]


def test_allocate_slots_rejects_bad_input():
    m = make(11)
    s = Sequence.new(1, 16)
    with pytest.raises(ValueError, match="num_new_tokens"):
        m.allocate_slots(s, 0)
    with pytest.raises(ValueError, match="prefix caching is disabled"):
        m.allocate_slots(s, 16, 16, [1])
    with pytest.raises(ValueError, match="does not match"):
        make(11, enable_prefix_caching=True).allocate_slots(s, 16, 16, [])


def test_get_new_blocks_raises_when_short():
    pool = BlockPool(3, enable_caching=False)
    with pytest.raises(ValueError, match="Cannot get 3 free blocks"):
        pool.get_new_blocks(3)


def test_max_model_len_caps_slots_and_lookahead_is_not_cached():
    m = make(11, max_model_len=40, enable_prefix_caching=True)
    s = Sequence.new(1, 32)
    # need = min(32 + 16 lookahead, 40) = 40 -> 3 blocks; only the 2 full prompt blocks cached.
    assert m.allocate_slots(s, 32, num_lookahead_tokens=16) == [1, 2, 3]
    assert [b.block_hash is not None for b in m.single_type_manager.req_to_blocks[1]] == [
        True,
        True,
        False,
    ]


def test_incremental_hashes_match_content_block_hashes():
    m = make(40, enable_prefix_caching=True)
    s = Sequence.new(1, 20)
    m.allocate_slots(s, 20)
    s.num_computed_tokens = 20
    for _ in range(50):
        s.append_tokens(1)
        assert m.allocate_slots(s, 1) is not None
        s.num_computed_tokens += 1
    assert m.req_to_block_hashes[1] == s.content.block_hashes(BS, s.num_tokens // BS)


# --------------------------------------------------------------------------- spec vector 6
@pytest.mark.parametrize(
    ("window", "second_chunk", "free_after_chunk", "freed_by_decode", "live_after_decode"),
    [(16, [10, 8], 0, 6, 2), (24, None, 1, 5, 3)],
)
def test_spec_vector_6_swa_chunked_admission(
    window, second_chunk, free_after_chunk, freed_by_decode, live_after_decode
):
    m = make(11, sliding_window=window)
    a, b = Sequence.new(1, 112), Sequence.new(2, 64)
    assert m.allocate_slots(a, 112) == [1, 2, 3, 4, 5, 6, 7]
    assert m.num_free_blocks == 3
    assert m.allocate_slots(b, 64) is None  # whole prompt: 4 > 3
    assert m.num_free_blocks == 3 and m.seq_block_ids(2) == []
    assert m.allocate_slots(b, 32) == [8, 9]
    assert m.num_free_blocks == 1
    b.num_computed_tokens = 32
    # W=16: floor((32-16+1)/16) = 1, so block 8 is freed before counting; W=24: nothing is.
    assert m.allocate_slots(b, 32) == second_chunk
    assert m.num_free_blocks == free_after_chunk
    if second_chunk is not None:
        assert m.seq_block_ids(2) == [0, 9, 10, 8] and m.num_seq_blocks(2) == 3
    a.num_computed_tokens = 112
    a.append_tokens(1)
    free_before = m.num_free_blocks
    new_ids = m.allocate_slots(a, 1)
    assert new_ids is not None and len(new_ids) == 1
    assert m.num_free_blocks == free_before + freed_by_decode - 1
    assert m.num_seq_blocks(1) == live_after_decode
    assert m.seq_block_ids(1)[:freed_by_decode] == [0] * freed_by_decode
    assert m.max_seq_footprint(a) == live_after_decode
    assert m.pool_stats().is_conserved


def test_spec_vector_6_decode_frees_window_in_reverse_order():
    m = make(11, sliding_window=16)
    a = Sequence.new(1, 112)
    m.allocate_slots(a, 112)
    a.num_computed_tokens = 112
    a.append_tokens(1)
    # Blocks 6..1 (indices 5..0) go to the tail in that order; the new block is the queue head.
    assert m.allocate_slots(a, 1) == [8]
    assert free_ids(m) == [9, 10, 6, 5, 4, 3, 2, 1]
    assert m.seq_block_ids(1) == [0, 0, 0, 0, 0, 0, 7, 8]


def test_failed_allocation_keeps_remove_skipped_frees():
    m = make(9, sliding_window=16)
    a = Sequence.new(1, 112)
    m.allocate_slots(a, 112)  # 7 blocks, 1 free
    a.num_computed_tokens = 112
    a.content = TokenContent.unique(1, 240)  # a long prompt still being prefilled
    before = _snapshot(m)
    # The window frees 6 blocks (1 + 6 = 7 free), but 128 more tokens need 15 - 7 = 8.
    assert m.allocate_slots(a, 128) is None
    assert m.num_free_blocks == 7  # the window frees stand
    assert m.seq_block_ids(1) == [0, 0, 0, 0, 0, 0, 7]
    _check_failed_step(before, _snapshot(m), seq_id=1)


# --------------------------------------------------------------------------- spec vector 7
def _max_decode_live(window: int, num_steps: int) -> int:
    m = make(300, sliding_window=window)
    s = Sequence.new(1, 1)
    assert m.allocate_slots(s, 1) is not None
    s.num_computed_tokens = 1
    peak = 0
    for _ in range(num_steps):
        s.append_tokens(1)
        assert m.allocate_slots(s, 1) is not None
        s.num_computed_tokens += 1
        live = m.num_seq_blocks(1)
        assert live <= m.max_seq_footprint(s)
        peak = max(peak, live)
    return peak


def test_spec_vector_7_decode_live_blocks_every_window():
    for window in range(8, 140):
        assert _max_decode_live(window, window + 3 * BS) == cdiv(window - 1, BS) + 1, window


def test_spec_vector_7_window_4096():
    assert _max_decode_live(4096, 4096 + 2 * BS) == 257


# --------------------------------------------------------------------------- prefix caching
def test_caching_off_returns_no_hits():
    m = make(11)
    a = Sequence.new(1, 64)
    m.allocate_slots(a, 64)
    assert m.get_computed_blocks(seq_of(2, (1, 64))) == ([], 0)


def test_prefix_hit_full_hit_recomputes_last_block_and_duplicates_are_cached():
    m = make(11, enable_prefix_caching=True)
    a, b = seq_of(1, (100, 64)), seq_of(2, (100, 64))
    assert m.allocate_slots(a, 64) == [1, 2, 3, 4]
    hit_ids, hit_tokens = m.get_computed_blocks(b)
    assert (hit_ids, hit_tokens) == ([1, 2, 3], 48)  # capped at 63 tokens -> 3 blocks
    assert m.allocate_slots(b, 16, hit_tokens, hit_ids) == [5]
    assert m.block_refcounts() == {0: 1, 1: 2, 2: 2, 3: 2, 4: 1, 5: 1}
    last_hash = m.req_to_block_hashes[1][3]
    assert list(m.block_pool.cached_block_hash_to_block[last_hash]) == [4, 5]  # no dedupe
    m.free(a)
    assert free_ids(m) == [6, 7, 8, 9, 10, 4]
    m.free(b)
    assert free_ids(m) == [6, 7, 8, 9, 10, 4, 5, 3, 2, 1]
    assert m.pool_stats().num_evictable == 5
    # A longer request hits all 4 blocks; the duplicate lookup returns the first cached (4).
    c = seq_of(3, (100, 64), (200, 16))
    assert m.get_computed_blocks(c) == ([1, 2, 3, 4], 64)
    assert m.allocate_slots(c, 16, 64, [1, 2, 3, 4]) == [6]
    assert m.num_free_blocks == 5 and m.pool_stats().num_evictable == 1
    # Allocating past the never-cached blocks evicts block 5's duplicate hash.
    assert m.allocate_slots(Sequence.new(4, 80), 80) == [7, 8, 9, 10, 5]
    assert list(m.block_pool.cached_block_hash_to_block[last_hash]) == [4]
    assert m.pool_stats().num_evictable == 0


def test_touch_of_evictable_hits_counts_against_free():
    m = make(6, enable_prefix_caching=True)
    a = seq_of(1, (100, 64))
    m.allocate_slots(a, 64)
    m.free(a)
    assert free_ids(m) == [5, 4, 3, 2, 1] and m.pool_stats().num_evictable == 4
    b = seq_of(2, (100, 64), (7, 32))  # 96 tokens: 4 hits (all evictable) + 2 new
    hit_ids, hit_tokens = m.get_computed_blocks(b)
    assert hit_ids == [1, 2, 3, 4]
    # 6 - 4 - 0 + 4 evictable = 6 > 5 free, although only 2 blocks are new.
    assert m.allocate_slots(b, 32, hit_tokens, hit_ids) is None
    assert free_ids(m) == [5, 4, 3, 2, 1] and m.seq_block_ids(2) == []
    c = seq_of(3, (100, 64), (7, 16))  # 80 tokens: 5 - 4 + 4 = 5 <= 5
    hit_ids, hit_tokens = m.get_computed_blocks(c)
    assert m.allocate_slots(c, 16, hit_tokens, hit_ids) == [5]
    assert m.num_free_blocks == 0


def test_eviction_is_lru_and_tail_first_within_a_request():
    m = make(11, enable_prefix_caching=True)
    a, b = seq_of(1, (100, 32)), seq_of(2, (200, 32))
    assert m.allocate_slots(a, 32) == [1, 2]
    assert m.allocate_slots(b, 32) == [3, 4]
    m.free(a)
    m.free(b)
    assert free_ids(m) == [5, 6, 7, 8, 9, 10, 2, 1, 4, 3]
    # 7 new blocks: the 6 never-used ones, then A's tail block 2.
    assert m.allocate_slots(Sequence.new(3, 112), 112) == [5, 6, 7, 8, 9, 10, 2]
    assert m.get_computed_blocks(seq_of(4, (100, 48))) == ([1], 16)  # A's head survives
    assert m.get_computed_blocks(seq_of(5, (200, 48))) == ([3, 4], 32)


def _sliding_pool_with_cached(indices: list[int], block_ids: list[int]):
    """A bs=4, W=8 sliding-window manager whose block ids[i] caches hash index indices[i]."""
    pool = BlockPool(12, enable_caching=True)
    manager = SlidingWindowManager(pool, block_size=4, sliding_window=8)
    hashes = TokenContent.unique(1, 40).block_hashes(4, 10)
    blocks = {b.block_id: b for b in pool.get_new_blocks(11)}
    for index, block_id in zip(indices, block_ids, strict=True):
        table = [pool.null_block] * index + [blocks[block_id]]
        pool.cache_full_blocks(table, hashes, index, index + 1)
    return manager, hashes


def test_sliding_window_hit_pads_with_null_blocks():
    # Upstream's docstring example: bs=4, W=8 -> cdiv(7, 4) = 2 contiguous blocks.
    manager, hashes = _sliding_pool_with_cached([0, 2, 3], [3, 7, 8])
    assert [b.block_id for b in manager.find_longest_cache_hit(hashes, 19)] == [0, 0, 7, 8]


def test_sliding_window_hit_trims_trailing_blocks():
    manager, hashes = _sliding_pool_with_cached([2, 3, 5], [8, 3, 9])
    assert [b.block_id for b in manager.find_longest_cache_hit(hashes, 27)] == [0, 0, 8, 3]


def test_sliding_window_hit_without_full_run_uses_leading_run():
    manager, hashes = _sliding_pool_with_cached([0, 2], [3, 7])
    assert [b.block_id for b in manager.find_longest_cache_hit(hashes, 19)] == [3]
    manager, hashes = _sliding_pool_with_cached([1, 2], [5, 6])
    assert manager.find_longest_cache_hit(hashes, 11) == []  # block 0 missed: no leading run


def test_sliding_window_prefix_hit_end_to_end():
    m = make(11, sliding_window=32, enable_prefix_caching=True)  # needs cdiv(31, 16) = 2 hits
    a = seq_of(1, (100, 80))
    assert m.allocate_slots(a, 80) == [1, 2, 3, 4, 5]
    m.free(a)
    b = seq_of(2, (100, 80), (7, 16))
    assert m.get_computed_blocks(b) == ([0, 0, 0, 4, 5], 80)
    # 6 - 5 - 0 + 2 evictable = 3 <= 10; nulls are neither counted nor touched.
    assert m.allocate_slots(b, 16, 80, [0, 0, 0, 4, 5]) == [6]
    assert m.seq_block_ids(2) == [0, 0, 0, 4, 5, 6] and m.num_seq_blocks(2) == 3
    assert m.num_free_blocks == 7 and m.block_refcounts()[0] == 1
    b.num_computed_tokens = 96
    b.append_tokens(1)
    # floor((96 - 32 + 1) / 16) = 4: block 4 (index 3) is freed, the walk stops at index 2.
    assert m.allocate_slots(b, 1) == [7]
    assert m.seq_block_ids(2) == [0, 0, 0, 0, 5, 6, 7]
    assert m.pool_stats().is_conserved


# --------------------------------------------------------------------------- properties
def _check_invariants(m: KVCacheManager) -> None:
    pool = m.block_pool
    stats = m.pool_stats()
    assert stats.is_conserved, stats
    queue = set(free_ids(m))
    assert len(queue) == stats.num_free
    assert 0 not in queue and pool.null_block.block_hash is None
    references: dict[int, int] = {}
    for table in m.single_type_manager.req_to_blocks.values():
        for block in table:
            if not block.is_null:
                references[block.block_id] = references.get(block.block_id, 0) + 1
    for block in pool.blocks[1:]:
        assert block.ref_cnt == references.get(block.block_id, 0), block
        assert (block.ref_cnt == 0) == (block.block_id in queue), block
    # The blocks not built yet (`BlockPool.block`) were never handed out: all free.
    assert all(i in queue for i in range(len(pool.blocks), pool.num_gpu_blocks))
    assert stats.num_held == 1 + len(references)
    assert stats.num_evictable == sum(1 for i in queue if pool.block(i).block_hash is not None)
    cached = {(h, i) for h, by_id in pool.cached_block_hash_to_block.items() for i in by_id}
    assert cached == {(b.block_hash, b.block_id) for b in pool.blocks if b.block_hash is not None}
    for seq_id in m.single_type_manager.req_to_blocks:
        table = m.seq_block_ids(seq_id)
        # Null entries only ever form a prefix of a table, and no block repeats in it, which
        # `num_seq_blocks` relies on (a binary search, not a set).
        assert table[: table.count(0)] == [0] * table.count(0)
        assert (
            m.num_seq_blocks(seq_id)
            == len({b for b in table if b != 0})
            == len(table) - table.count(0)
        )


def _snapshot(m: KVCacheManager):
    return (
        free_ids(m),
        m.block_refcounts(),
        {k: [b.block_id for b in v] for k, v in m.single_type_manager.req_to_blocks.items() if v},
        {h: list(v) for h, v in m.block_pool.cached_block_hash_to_block.items()},
    )


def _check_failed_step(before, after, seq_id: int) -> int:
    """A None from allocate_slots changed nothing but the request's out-of-window blocks.

    Returns how many blocks the window freed."""
    free_before, refs_before, tables_before, cached_before = before
    free_after, refs_after, tables_after, cached_after = after
    assert cached_after == cached_before
    old_table = tables_before.get(seq_id, [])
    new_table = tables_after.get(seq_id, [])
    assert len(new_table) == len(old_table)
    nulled = [old for old, new in zip(old_table, new_table, strict=True) if old != new]
    assert all(new == 0 for old, new in zip(old_table, new_table, strict=True) if old != new)
    for k in set(tables_before) | set(tables_after):
        if k != seq_id:
            assert tables_after.get(k) == tables_before.get(k)
    released = [i for i in reversed(nulled) if refs_before[i] == 1]
    assert free_after == free_before + released
    expected_refs = dict(refs_before)
    for i in nulled:
        expected_refs[i] -= 1
        if expected_refs[i] == 0:
            del expected_refs[i]
    assert refs_after == expected_refs
    return len(nulled)


OP_STRATEGY = st.tuples(
    st.sampled_from(["step", "step", "step", "step", "preempt", "finish", "new"]),
    st.integers(0, 3),  # request slot
    st.integers(1, 64),  # chunk tokens / shared-prefix tokens
    st.sampled_from([0, 1, 1, 2]),  # shared-prefix key (0: none)
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(OP_STRATEGY, min_size=5, max_size=80),
    num_gpu_blocks=st.integers(2, 14),
    window=st.sampled_from([None, 8, 16, 24, 40]),
    caching=st.booleans(),
)
def test_property_random_schedules(ops, num_gpu_blocks, window, caching):
    m = make(num_gpu_blocks, sliding_window=window, enable_prefix_caching=caching)
    seqs: dict[int, Sequence] = {}
    running: set[int] = set()
    next_id = 0
    for kind, slot, num_tokens, prefix_key in ops:
        if kind == "new" or (slot not in seqs and kind == "step"):
            if slot in seqs:
                m.free(seqs[slot])  # the old request finishes
            next_id += 1
            prompt = [(prefix_key, num_tokens)] if prefix_key else []
            seqs[slot] = seq_of(next_id, *prompt, (1000 + next_id, 1 + (7 * num_tokens) % 160))
            running.discard(slot)
            continue
        seq = seqs.get(slot)
        if seq is None:
            continue
        if kind in ("preempt", "finish"):
            m.free(seq)
            running.discard(slot)
            seq.num_computed_tokens = 0  # V1 preemption recomputes from scratch
            if kind == "finish":
                del seqs[slot]
        else:
            hit_ids, hit_tokens = ([], 0) if slot in running else m.get_computed_blocks(seq)
            assert hit_tokens <= seq.num_tokens - 1 and hit_tokens % BS == 0
            num_new = min(num_tokens, seq.num_tokens - seq.num_computed_tokens - hit_tokens)
            before = _snapshot(m)
            result = m.allocate_slots(seq, num_new, hit_tokens, hit_ids)
            event("prefix hit" if hit_ids else "no hit")
            if 0 in hit_ids:
                event("sliding-window hit with null padding")
            event("step failed" if result is None else "step allocated")
            if result is None:
                if _check_failed_step(before, _snapshot(m), seq.seq_id):
                    event("failed step kept window frees")
            else:
                running.add(slot)
                seq.num_computed_tokens += hit_tokens + num_new
                table = m.seq_block_ids(seq.seq_id)
                assert len(table) == cdiv(seq.num_computed_tokens, BS)
                assert result == table[len(table) - len(result) :]
                if window is not None:
                    assert m.num_seq_blocks(seq.seq_id) <= m.max_seq_footprint(seq)
                if seq.num_computed_tokens == seq.num_tokens:
                    seq.append_tokens(1)  # decode: the step sampled one token
        _check_invariants(m)
    for seq in seqs.values():
        m.free(seq)
    _check_invariants(m)
    assert m.num_free_blocks == num_gpu_blocks - 1
