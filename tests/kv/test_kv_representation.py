"""The data representations behind the KV managers' speed (issue #13): each one against the
representation it replaced, or against a scan of the state it summarises."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.audit.base import AuditLevel
from sim.audit.v1 import AuditedV1Manager
from sim.audit.violations import ViolationKind
from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from sim.kv.types import NoFreeBlocksError, Segment, Sequence, TokenContent, num_leading_nulls
from sim.kv.v0_v1.alloc import CachedBlockAllocator, Device, UncachedBlockAllocator
from sim.kv.v0_v2.naive import Block, NaiveBlockAllocator
from sim.kv.v1_engine import KVCacheManager, make_kv_cache_manager
from sim.kv.v1_engine.free_queue import FreeBlockQueue, UncachedFreeBlockQueue

BS = 4

QUEUE_OPS = st.lists(
    st.tuples(st.sampled_from(["pop", "pop_n", "append", "prepend"]), st.integers(0, 5)),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(ops=QUEUE_OPS)
def test_uncached_free_queue_pops_what_the_ordered_queue_pops(ops):
    """The deque queue (pools without caching) against the ordered-dict one: same ids popped,
    same order after any sequence of head pops and head/tail pushes of popped ids."""
    ordered, fast = FreeBlockQueue(range(12)), UncachedFreeBlockQueue(range(12))
    taken: deque[int] = deque()
    for op, n in ops:
        if op in ("pop", "pop_n") and len(ordered):
            if op == "pop":
                popped = [ordered.popleft()]
                assert fast.popleft() == popped[0]
            else:
                n = min(n, len(ordered))
                popped = ordered.popleft_n(n)
                assert fast.popleft_n(n) == popped
            taken.extend(popped)
        elif op in ("append", "prepend") and taken:
            back = [taken.popleft() for _ in range(min(n, len(taken)))]
            getattr(ordered, f"{op}_n")(back)
            getattr(fast, f"{op}_n")(back)
        assert fast.ids() == ordered.ids() and len(fast) == len(ordered)
    with pytest.raises(ValueError, match="cannot pop"):
        fast.popleft_n(len(fast) + 1)


def test_a_pool_without_caching_uses_the_deque_queue():
    plain = make_kv_cache_manager(KVCacheConfig(num_gpu_blocks=5, block_size=BS))
    cached = make_kv_cache_manager(
        KVCacheConfig(num_gpu_blocks=5, block_size=BS, enable_prefix_caching=True)
    )
    assert isinstance(plain.block_pool.free_block_queue, UncachedFreeBlockQueue)
    assert isinstance(cached.block_pool.free_block_queue, FreeBlockQueue)
    with pytest.raises(ValueError, match="no hits to touch"):
        plain.block_pool.free_block_queue.remove(1)


def _seq(seq_id: int, prefix_key: int, num_prefix: int, num_own: int) -> Sequence:
    segments = [Segment(prefix_key, num_prefix)] if num_prefix else []
    content = TokenContent.from_segments([*segments, Segment(1000 + seq_id, num_own)])
    return Sequence(seq_id, content, content.num_tokens)


def _check_null_counts(m: KVCacheManager) -> None:
    """The kept leading-null counts equal a scan of every table; nulls are a prefix."""
    for manager in m.coordinator.managers:
        for request_id, table in manager.req_to_blocks.items():
            num_nulls = num_leading_nulls(table)
            assert not any(block.is_null for block in table[num_nulls:])
            assert manager.num_leading_null_blocks(request_id) == num_nulls
    for request_id in m.coordinator.managers[0].req_to_blocks:
        ids = m.seq_block_ids(request_id)
        assert m.num_seq_blocks(request_id) == sum(1 for i in ids if i != 0)


GROUP_SETS = [
    None,
    (KVCacheGroupSpec(8),),
    (KVCacheGroupSpec(8), KVCacheGroupSpec(None)),
    (KVCacheGroupSpec(None), KVCacheGroupSpec(12), KVCacheGroupSpec(12)),
]


@pytest.mark.parametrize("groups", GROUP_SETS)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.integers(1, 12), st.booleans()), min_size=1, max_size=60
    ),
    caching=st.booleans(),
)
def test_sliding_null_counts_match_a_scan_of_the_tables(groups, steps, caching):
    """`SlidingWindowManager.req_to_num_null_blocks` (kept where nulls are made: a hit's
    padding, `remove_skipped_blocks`) against a scan, over random chunked schedules with
    shared prefixes (so sliding hits padded with nulls occur), one group and several."""
    config = KVCacheConfig(
        num_gpu_blocks=40,
        block_size=BS,
        sliding_window=16 if groups is None else None,
        kv_cache_groups=groups or (),
        enable_prefix_caching=caching,
    )
    m = make_kv_cache_manager(config)
    seqs: dict[int, Sequence] = {}
    next_id = 0
    for slot, num_tokens, finish in steps:
        seq = seqs.get(slot)
        if seq is None:
            next_id += 1
            seq = seqs[slot] = _seq(next_id, 1, 16 * (next_id % 3), 3 + num_tokens * 3)
        if finish:
            m.free(seq)
            del seqs[slot]
            continue
        is_new = seq.seq_id not in m.coordinator.managers[0].num_cached_block
        hit_ids, hit_tokens = m.get_computed_blocks(seq) if is_new else ([], 0)
        num_new = min(num_tokens, seq.num_tokens - seq.num_computed_tokens - hit_tokens)
        if num_new <= 0:
            seq.append_tokens(1)
            num_new = 1
        if m.allocate_slots(seq, num_new, hit_tokens, hit_ids) is not None:
            seq.num_computed_tokens += hit_tokens + num_new
        _check_null_counts(m)


def test_pool_is_conserved_agrees_with_pool_stats_and_the_auditor_reports_a_drift():
    """The auditor's O(1) check (`PoolQueries.pool_is_conserved`) is `pool_stats().is_conserved`;
    a counter that drifts from the queue is reported with the stats' numbers."""
    m = KVCacheManager(KVCacheConfig(num_gpu_blocks=10, block_size=BS))
    audited = AuditedV1Manager(m, level=AuditLevel.CHEAP)
    seq = Sequence.new(1, 9)
    audited.allocate_slots(seq, 9)
    assert m.pool_is_conserved() and m.pool_stats().is_conserved
    m.block_pool.num_held_blocks += 1  # a bug: a block counted held twice
    assert not m.pool_is_conserved() and not m.pool_stats().is_conserved
    audited.free(seq)
    assert [v.kind for v in audited.violations] == [ViolationKind.CONSERVATION]
    assert "free 9 + held 2 != total 10" in audited.violations[0].message


def test_unitary_peak_held_blocks_is_the_pools_peak():
    """One group's peak (the summary's per-group count) is the pool's, less the null block."""
    m = KVCacheManager(KVCacheConfig(num_gpu_blocks=10, block_size=BS))
    a, b = Sequence.new(1, 9), Sequence.new(2, 8)
    m.allocate_slots(a, 9)  # 3 blocks
    m.allocate_slots(b, 8)  # 2 more
    m.free(a)
    assert m.group_peak_held_blocks() == [5] and m.num_kv_cache_groups == 1
    hybrid = make_kv_cache_manager(
        KVCacheConfig(
            num_gpu_blocks=20,
            block_size=BS,
            kv_cache_groups=(KVCacheGroupSpec(8), KVCacheGroupSpec(None)),
        )
    )
    hybrid.allocate_slots(Sequence.new(1, 9), 9)
    assert hybrid.group_peak_held_blocks() == [3, 3] and hybrid.num_kv_cache_groups == 2


def test_allocate_decode_block_is_allocate_mutable_then_append_one_token():
    """The v0-v2 decode block (`NaiveBlockAllocator.allocate_decode_block`) against the two
    calls it replaces, on twin allocators: same id, token counts, refcounts, free list."""
    slow, fast = NaiveBlockAllocator(list(range(6)), BS), NaiveBlockAllocator(list(range(6)), BS)
    prev_slow, prev_fast = slow.allocate_mutable_block(None), fast.allocate_mutable_block(None)
    for prev in (prev_slow, prev_fast):
        prev.num_tokens = prev.num_tokens_total = BS
    expected = slow.allocate_mutable_block(prev_slow)
    slow.append_tokens(expected, 1, None)
    got = fast.allocate_decode_block(prev_fast)
    assert (got.block_id, got.num_tokens, got.num_tokens_total) == (
        expected.block_id,
        expected.num_tokens,
        expected.num_tokens_total,
    )
    assert got.prev is prev_fast and fast.refcounts == slow.refcounts
    assert fast.refcounter.num_positive == slow.refcounter.num_positive == 2
    assert fast.free_block_ids() == slow.free_block_ids()
    for _ in range(4):
        fast.allocate_block_id()
    with pytest.raises(NoFreeBlocksError):
        fast.allocate_decode_block(got)


def test_allocate_decode_block_copies_a_free_id_still_referenced():
    """A corrupt pool (a free id with a positive refcount) gets the copy on write that
    `append_tokens` would make."""
    alloc = NaiveBlockAllocator([0, 1, 2], BS)
    held = alloc.allocate_mutable_block(None)  # id 0
    alloc.free_block_ids()  # [1, 2]
    alloc.refcounter.incr(1)  # the bug: id 1 is free but referenced
    prev = Block(held.block_id, None, BS, None, BS)
    block = alloc.allocate_decode_block(prev)
    assert block.block_id == 2 and alloc.clear_copy_on_writes() == [(1, 2)]
    assert alloc.clear_copy_on_writes() == []


@pytest.mark.parametrize("cls", [UncachedBlockAllocator, CachedBlockAllocator])
def test_v0_v1_count_free_blocks_is_num_free_blocks(cls):
    alloc = cls(Device.GPU, 4)
    blocks = []
    for step in range(4):
        assert alloc.count_free_blocks() == alloc.num_free_blocks == 4 - step
        blocks.append(alloc.allocate() if cls is UncachedBlockAllocator else alloc.allocate(step))
    assert alloc.count_free_blocks() == 0
    alloc.free(blocks[0])
    assert alloc.count_free_blocks() == alloc.num_free_blocks == 1


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2", "v0-fixed"])
@pytest.mark.parametrize("caching", [False, True])
def test_v0_pool_is_conserved_agrees_with_pool_stats(design, caching):
    """The v0 managers' O(1) conservation check (what the auditor calls after every call)
    against `pool_stats().is_conserved`, on a healthy pool and on one whose held count
    drifted."""
    from sim.kv.config import make_manager
    from tests.harness.kv_v0 import admit, decode, group

    m = make_manager(
        design, KVCacheConfig(num_gpu_blocks=12, block_size=BS, enable_prefix_caching=caching)
    )
    groups = [admit(m, group(seq_id, 9)) for seq_id in (1, 2)]
    for _ in range(5):
        for g in groups:
            decode(m, g.seqs[0])
        assert m.pool_is_conserved() and m.pool_stats().is_conserved
    m.free(groups[0].seqs[0])
    assert m.pool_is_conserved() and m.pool_stats().is_conserved
    if design == "v0-v1":
        m.gpu_allocator.num_held_blocks += 1  # a bug: a block counted held twice
    else:
        m.block_allocator.gpu.refcounter.num_positive += 1
    assert not m.pool_is_conserved() and not m.pool_stats().is_conserved
