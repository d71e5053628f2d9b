"""vLLM v0 BlockSpaceManagerV1 model (`vllm/core/block_manager_v1.py (0.5.4)`).

Exact vectors, quirks, properties.

Vectors are from vllm-semantics.md section 9 (bs=16, watermark 0.01 unless noted).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig
from sim.kv.protocol import PoolIntrospection, V0BlockManager
from sim.kv.types import (
    AllocStatus,
    DoubleFreeError,
    NoFreeBlocksError,
    Segment,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    TokenContent,
    cdiv,
)
from sim.kv.v0_v1.alloc import CachedBlockAllocator, Device, LRUEvictor, PhysicalBlock
from sim.kv.v0_v1.manager import BlockSpaceManagerV1

RUNNING = SequenceStatus.RUNNING


def make(num_gpu_blocks: int, **kw) -> BlockSpaceManagerV1:
    return BlockSpaceManagerV1(KVCacheConfig(num_gpu_blocks=num_gpu_blocks, **kw))


def admit(
    m: BlockSpaceManagerV1, request_id: int, prompt: int | TokenContent, seq_id: int | None = None
):
    seq = Sequence.new(request_id if seq_id is None else seq_id, prompt)
    group = SequenceGroup(request_id, [seq])
    m.allocate(group)
    seq.status = RUNNING
    return seq, group


def decode(m: BlockSpaceManagerV1, seq: Sequence, num_steps: int) -> list[tuple[int, int]]:
    cows = []
    for _ in range(num_steps):
        seq.append_tokens(1)
        cows += m.append_slots(seq)
    return cows


def test_implements_protocols():
    m = make(10)
    assert isinstance(m, V0BlockManager)
    assert isinstance(m, PoolIntrospection)


def test_prefix_caching_with_sliding_window_is_rejected():
    with pytest.raises(ValueError, match="sliding window"):
        make(10, sliding_window=16, enable_prefix_caching=True)


# ------------------------------------------------------------------ vector 2 and ring allocation
@pytest.mark.parametrize(
    ("window_tokens", "a_free", "b_table", "b_free"),
    [(16, 9, [8, 8, 8, 8], 8), (24, 8, [7, 6, 7, 6], 6)],
)
def test_vector2_ring_tables(window_tokens, a_free, b_table, b_free):
    m = make(10, sliding_window=window_tokens)
    admit(m, 1, 112)
    assert m.get_num_free_gpu_blocks() == a_free
    b = Sequence.new(2, 64)
    group_b = SequenceGroup(2, [b])
    assert m.can_allocate(group_b) is AllocStatus.OK
    m.allocate(group_b)
    assert m.get_block_table(b) == b_table
    assert m.get_num_free_gpu_blocks() == b_free
    assert m.pool_stats().is_conserved


@pytest.mark.parametrize("window_tokens", [8, 16, 24, 33, 64])
@pytest.mark.parametrize("prompt_tokens", [1, 16, 17, 64, 112])
def test_four_vs_three_admission_equals_allocation(window_tokens, prompt_tokens):
    """G=10, A=112 tokens, then B: can_allocate's count is exactly what allocate takes."""
    m = make(10, sliding_window=window_tokens)
    admit(m, 1, 112)
    group_b = SequenceGroup(2, [Sequence.new(2, prompt_tokens)])
    expected = min(cdiv(prompt_tokens, 16), cdiv(window_tokens, 16))
    assert m.admission_blocks(group_b) == expected
    free_before = m.get_num_free_gpu_blocks()
    if m.can_allocate(group_b) is AllocStatus.OK:
        m.allocate(group_b)
        assert free_before - m.get_num_free_gpu_blocks() == expected
        assert m.num_seq_blocks(2) == expected


def test_four_vs_three_w24_setup():
    m = make(10, sliding_window=24)
    admit(m, 1, 112)
    group_b = SequenceGroup(2, [Sequence.new(2, 64)])
    assert m.admission_blocks(group_b) == 2  # min(4, ceil(24/16))
    assert m.can_allocate(group_b) is AllocStatus.OK
    m.allocate(group_b)
    assert m.get_num_free_gpu_blocks() == 6


@pytest.mark.parametrize(("window_tokens", "ring_blocks"), [(64, 4), (72, 5)])
def test_vector5_decode_footprint_is_ring(window_tokens, ring_blocks):
    m = make(100, sliding_window=window_tokens)
    seq, _ = admit(m, 1, 40)
    peak = 0
    for _ in range(300):
        decode(m, seq, 1)
        peak = max(peak, m.num_seq_blocks(1))
        assert m.num_seq_blocks(1) <= m.max_seq_footprint(seq) == ring_blocks
    assert peak == ring_blocks
    assert m.get_num_free_gpu_blocks() == 100 - ring_blocks
    assert len(m.get_block_table(seq)) == cdiv(340, 16)
    m.free(seq)
    assert m.get_num_free_gpu_blocks() == 100


def test_ring_reuse_sets_refcount_not_increments():
    m = make(10, sliding_window=24)
    a = Sequence.new(1, 64)
    b = Sequence.new(2, 64)
    group = SequenceGroup(1, [a, b])  # two WAITING seqs: one table, copied
    m.allocate(group)
    assert m.get_block_table(a) == m.get_block_table(b) == [9, 8, 9, 8]
    assert m.block_refcounts() == {9: 2, 8: 2}  # set to num_seqs, not 2 per ring lap


# ---------------------------------------------------------------- watermark and admission states
def test_watermark_never_later_ok_boundaries():
    m = make(200)  # Wm = int(0.01 * 200) = 2
    assert m.watermark_blocks == 2

    def status(num_blocks: int) -> AllocStatus:
        return m.can_allocate(SequenceGroup(9, [Sequence.new(9, 16 * num_blocks)]))

    assert status(199) is AllocStatus.NEVER  # 200 - 199 < 2
    assert status(198) is AllocStatus.OK  # 200 - 198 == 2, pool empty
    admit(m, 1, 16 * 100)  # F = 100
    assert status(98) is AllocStatus.OK  # 100 - 98 == 2
    assert status(99) is AllocStatus.LATER
    assert status(198) is AllocStatus.LATER  # NEVER only looks at the total


def test_small_pool_has_zero_watermark():
    m = make(10)
    assert m.watermark_blocks == 0
    assert m.can_allocate(SequenceGroup(1, [Sequence.new(1, 160)])) is AllocStatus.OK
    assert m.can_allocate(SequenceGroup(1, [Sequence.new(1, 161)])) is AllocStatus.NEVER


def test_can_append_slots_ignores_watermark():
    m = make(200)
    admit(m, 1, 16 * 199)
    _, group = admit(m, 2, 1)
    assert m.get_num_free_gpu_blocks() == 0
    assert not m.can_append_slots(group)
    m.free(group.seqs[0])
    assert m.can_append_slots(group)  # 1 free block >= 1 running seq; Wm=2 not consulted


# ------------------------------------------------------------------------------- allocators
def test_lifo_reuse_order():
    m = make(10)
    a, _ = admit(m, 1, 48)
    assert m.get_block_table(a) == [9, 8, 7]
    b, _ = admit(m, 2, 16)
    assert m.get_block_table(b) == [6]
    # Pushes set([9, 8, 7]) in set order (hash (device, number), see
    # `v0_v1_hashing.set_order`): 7, 8, 9.
    m.free(a)
    assert m.gpu_allocator.free_block_ids() == [0, 1, 2, 3, 4, 5, 7, 8, 9]
    c, _ = admit(m, 3, 32)
    assert m.get_block_table(c) == [9, 8]


def test_out_of_blocks_message_and_leak_recovery():
    m = make(3)
    group = SequenceGroup(1, [Sequence.new(1, 80)])
    assert m.can_allocate(group) is AllocStatus.NEVER
    with pytest.raises(NoFreeBlocksError, match=r"^Out of memory! No free blocks are available\.$"):
        m.allocate(group)
    assert issubclass(NoFreeBlocksError, ValueError)
    assert m.get_num_free_gpu_blocks() == 0  # upstream leaks the half-built table
    assert m.block_refcounts() == {2: 1, 1: 1, 0: 1}
    assert m.seq_block_ids(1) == []
    assert m.recover_leaked_blocks() == 3
    assert m.get_num_free_gpu_blocks() == 3
    assert m.recover_leaked_blocks() == 0
    assert m.pool_stats().is_conserved


def test_evictor_lru_then_most_hashed_tokens():
    ev = LRUEvictor()
    blocks = [
        PhysicalBlock(Device.GPU, 0, 100, 16, last_accessed=1.0),
        PhysicalBlock(Device.GPU, 1, 101, 48, last_accessed=1.0),
        PhysicalBlock(Device.GPU, 2, 102, 32, last_accessed=1.0),
        PhysicalBlock(Device.GPU, 3, 103, 64, last_accessed=2.0),
    ]
    for b in blocks:
        b.computed = True
        ev.add(b)
    victim = ev.evict()
    assert victim.block_id == 1  # t=1 ties: largest num_hashed_tokens
    assert victim.computed is False
    assert [ev.evict().block_id for _ in range(3)] == [2, 0, 3]
    with pytest.raises(NoFreeBlocksError, match="No usable cache memory left"):
        ev.evict()


def test_evictor_front_scan_quirk_is_not_global_lru():
    ev = LRUEvictor()
    ev.add(PhysicalBlock(Device.GPU, 0, 100, 16, last_accessed=5.0))
    ev.add(PhysicalBlock(Device.GPU, 1, 101, 16, last_accessed=1.0))
    ev.add(PhysicalBlock(Device.GPU, 2, 102, 16, last_accessed=9.0))
    # Scan: candidate t=5; t=1 does not stop it and has no more tokens; t=9 stops it.
    assert ev.evict().block_id == 0  # the older block 1 survives
    # An older entry with more tokens further on is taken, and then the stop uses its time.
    ev = LRUEvictor()
    ev.add(PhysicalBlock(Device.GPU, 0, 100, 16, last_accessed=5.0))
    ev.add(PhysicalBlock(Device.GPU, 1, 101, 32, last_accessed=1.0))
    ev.add(PhysicalBlock(Device.GPU, 2, 102, 64, last_accessed=3.0))
    assert ev.evict().block_id == 1


def test_cached_allocator_lazy_creation_revive_and_eviction():
    alloc = CachedBlockAllocator(Device.GPU, 2)
    assert alloc.num_free_blocks == 2 and list(alloc.blocks()) == []
    a = alloc.allocate(111, 16)
    b = alloc.allocate()  # counter hash 0
    assert (a.block_id, b.block_id, b.block_hash) == (0, 1, 0)
    assert alloc.allocate(111, 16) is a and a.ref_count == 2
    alloc.free(a)
    alloc.free(a)
    assert alloc.num_free_blocks == 1 and alloc.num_evictable_blocks == 1
    assert alloc.allocate(111, 16) is a  # revived from the evictor
    alloc.free(a)
    c = alloc.allocate(222, 32)  # pool full: evict a and re-key it
    assert c is a and c.block_hash == 222 and not alloc.contains_block(111)
    with pytest.raises(DoubleFreeError, match="Double free!"):
        alloc.free(PhysicalBlock(Device.GPU, 9, 9, 0))


# ------------------------------------------------------------------------------ fork, CoW, swap
def test_cow_after_fork():
    m = make(10)
    parent, group = admit(m, 1, 20)
    assert m.get_block_table(parent) == [9, 8]
    child = parent.fork(2)
    group.seqs.append(child)
    m.fork(parent, child)
    assert m.block_refcounts() == {9: 2, 8: 2}
    assert decode(m, parent, 1) == [(8, 7)]
    assert m.get_block_table(parent) == [9, 7]
    assert m.get_block_table(child) == [9, 8]
    assert m.block_refcounts() == {9: 2, 8: 1, 7: 1}
    assert decode(m, child, 1) == []  # block 8 is now the child's alone
    assert decode(m, parent, 12) == []  # 33 tokens: new block 6, no copy
    assert m.get_block_table(parent) == [9, 7, 6]


def test_vector8_fork_swap_preserves_sharing():
    m = make(20, num_cpu_blocks=20)
    parent, group = admit(m, 1, 64)
    child = parent.fork(2)
    group.seqs.append(child)
    m.fork(parent, child)
    child.status = RUNNING
    decode(m, parent, 32)
    decode(m, child, 32)
    distinct = set(m.get_block_table(parent)) | set(m.get_block_table(child))
    assert len(distinct) == 8
    assert m.can_swap_out(group)
    mapping = m.swap_out(group)
    assert len(mapping) == 8 and {g for g, _ in mapping} == distinct
    assert m.get_num_free_cpu_blocks() == 12  # 8 CPU blocks, not 12 as in V2
    assert m.get_num_free_gpu_blocks() == 20
    assert m.seq_block_ids(1) == [] and m.num_seq_blocks(1) == 0
    assert m.get_block_table(parent)[:4] == m.get_block_table(child)[:4]  # still shared on CPU
    for s in group.seqs:
        s.status = SequenceStatus.SWAPPED
    assert m.can_swap_in(group) is AllocStatus.OK  # need 8 + 2 swapped seqs
    assert len(m.swap_in(group)) == 8
    assert m.get_num_free_gpu_blocks() == 12 and m.get_num_free_cpu_blocks() == 20
    assert m.block_refcounts() == {
        b: (2 if b in m.seq_block_ids(1)[:4] else 1) for b in m.block_refcounts()
    }


def test_can_swap_in_counts_one_block_per_swapped_seq():
    m = make(10, num_cpu_blocks=10)
    seq, group = admit(m, 1, 80)  # 5 blocks
    m.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    admit(m, 2, 64)  # F = 6
    assert m.can_swap_in(group) is AllocStatus.OK  # 5 + 1 <= 6
    admit(m, 3, 1)  # F = 5
    assert m.can_swap_in(group) is AllocStatus.LATER
    m.free(seq)


def test_can_swap_in_never_when_pool_too_small():
    m = make(6, num_cpu_blocks=10)
    seq, group = admit(m, 1, 96)  # 6 blocks
    m.swap_out(group)
    seq.status = SequenceStatus.SWAPPED
    assert m.can_swap_in(group) is AllocStatus.NEVER  # 6 + 1 > G


def test_swap_out_of_wrapped_ring_double_frees():
    m = make(10, sliding_window=24, num_cpu_blocks=10)
    seq, group = admit(m, 1, 64)
    assert m.get_block_table(seq) == [9, 8, 9, 8]
    assert m.can_swap_out(group)  # counts 2 distinct blocks
    with pytest.raises(DoubleFreeError, match="Double free!") as info:
        m.swap_out(group)
    assert isinstance(info.value, ValueError)


def test_swap_of_unwrapped_ring_is_fine():
    m = make(10, sliding_window=24, num_cpu_blocks=10)
    seq, group = admit(m, 1, 32)
    assert m.swap_out(group) == [(9, 9), (8, 8)]
    assert m.get_num_free_gpu_blocks() == 10


def test_swa_fork_cow_breaks_ring():
    """Regression (faithful upstream bug): CoW into a forked, wrapped ring.

    Parent and child share ring [9, 8]; the parent's next lap copies slot 0 to 7 and later
    slot 1 to 6, but the lap after that goes back to table[i % w] = 9 and 8, now owned by the
    child alone. The parent then holds 4 > w blocks, `free(parent)` frees the child's blocks
    and leaks 6 and 7, and `free(child)` is a double free.
    """
    m = make(10, sliding_window=32, watermark=0.0)
    parent, group = admit(m, 1, 40)
    child = parent.fork(2)
    group.seqs.append(child)
    m.fork(parent, child)
    cows = []
    for _ in range(60):
        for s in (parent, child):
            cows += decode(m, s, 1)
    assert cows == [(9, 7), (8, 6)]
    assert m.num_seq_blocks(1) == 4 > m.max_seq_footprint(parent) == 2
    m.free(parent)
    assert m.block_refcounts() == {6: 1, 7: 1}  # leaked
    with pytest.raises(DoubleFreeError):
        m.free(child)


# ----------------------------------------------------------------------------- prefix caching
def shared_prompt(prefix_key: int, num_prefix: int, own_key: int, num_own: int) -> TokenContent:
    return TokenContent.from_segments([Segment(prefix_key, num_prefix), Segment(own_key, num_own)])


def test_prefix_cache_shares_full_blocks_and_counts_lazily():
    m = make(10, enable_prefix_caching=True)
    a, _ = admit(m, 1, shared_prompt(7, 32, 100, 8))
    b, _ = admit(m, 2, shared_prompt(7, 32, 200, 8))
    assert m.get_block_table(a) == [0, 1, 2]
    assert m.get_block_table(b) == [0, 1, 3]
    assert m.block_refcounts() == {0: 2, 1: 2, 2: 1, 3: 1}
    assert m.pool_stats() == m.pool_stats().__class__(10, 6, 4, 0)
    m.free(a)
    assert m.pool_stats().num_evictable == 1
    c, _ = admit(m, 3, shared_prompt(7, 32, 100, 8))  # same prompt as a: revives block 2
    assert m.get_block_table(c) == [0, 1, 2]


def test_identical_prompts_share_partial_last_block_until_cow():
    m = make(10, enable_prefix_caching=True)
    a, _ = admit(m, 1, shared_prompt(7, 20, 7, 0))
    b, _ = admit(m, 2, shared_prompt(7, 20, 7, 0))
    assert m.get_block_table(a) == m.get_block_table(b) == [0, 1]
    assert decode(m, a, 1) == [(1, 2)]  # a copies the shared partial block


def test_promotion_dedups_a_block_that_becomes_full():
    m = make(10, enable_prefix_caching=True)
    a, _ = admit(m, 1, shared_prompt(7, 32, 7, 0))  # blocks 0, 1 keyed by content
    b, _ = admit(m, 2, shared_prompt(7, 17, 7, 0))  # block 0 shared, partial block 2
    assert m.get_block_table(b) == [0, 2]
    b.content = shared_prompt(7, 31, 7, 0)  # tokens 17..30 equal a's
    assert m.append_slots(b) == []  # still partial: nothing to do
    b.content = shared_prompt(7, 32, 7, 0)
    assert m.append_slots(b) == []
    assert m.get_block_table(b) == [0, 1]  # promoted onto a's block 1; block 2 freed
    assert m.block_refcounts() == {0: 2, 1: 2}


def test_mark_computed_skips_last_full_block_and_common_ids():
    m = make(10, enable_prefix_caching=True)
    a, group_a = admit(m, 1, shared_prompt(7, 48, 7, 0))
    m.mark_blocks_as_computed(group_a)
    assert [b.computed for b in m.block_tables[1]] == [True, True, False]
    b, group_b = admit(m, 2, shared_prompt(7, 64, 9, 16))
    assert m.get_common_computed_block_ids([b]) == [0, 1]
    assert m.get_common_computed_block_ids([a, b]) == [0, 1]
    m.access_all_blocks_in_seq(b, 3.5)
    table = list(m.block_tables[2])
    m.free(b)  # kvsim writes the access when the table next changes (`sim.kv.v0_v1.access`)
    assert {blk.last_accessed for blk in table} == {3.5}
    assert make(10).get_common_computed_block_ids([a]) == []


def test_deferred_access_leaves_a_shared_block_with_the_latest_write():
    """`sim.kv.v0_v1.access`'s example: a and b share block 0; a accessed at t=3, b at t=4;
    b frees first (t=4 written), then a (its older t=3 is not written over it), as upstream's
    writes in call order leave it; a's own block gets t=3. Accessed again later, a block
    takes the newer time."""
    m = make(10, enable_prefix_caching=True)
    a, _ = admit(m, 1, shared_prompt(7, 16, 100, 1))
    b, _ = admit(m, 2, shared_prompt(7, 16, 200, 1))
    shared, own_a = m.block_tables[1]
    assert m.block_tables[2][0] is shared
    m.access_all_blocks_in_seq(a, 3.0)
    m.access_all_blocks_in_seq(b, 4.0)
    m.free(b)
    m.free(a)
    assert (shared.last_accessed, own_a.last_accessed) == (4.0, 3.0)
    c, _ = admit(m, 3, shared_prompt(7, 16, 300, 1))
    assert m.block_tables[3][0] is shared  # a hit on the evicted-to-be block
    m.access_all_blocks_in_seq(c, 5.0)
    m.free(c)
    assert shared.last_accessed == 5.0


def test_multi_seq_allocate_with_caching_undercounts_refs():
    """Faithful quirk: cached allocate gives one reference for all copies of the table."""
    m = make(10, enable_prefix_caching=True)
    a, b = Sequence.new(1, 32), Sequence.new(2, 32)
    m.allocate(SequenceGroup(1, [a, b]))
    assert m.block_refcounts() == {0: 1, 1: 1}
    m.free(a)
    with pytest.raises(DoubleFreeError):
        m.free(b)


# --------------------------------------------------------------------------- property tests
OPS = (
    "admit",
    "admit",
    "append",
    "append",
    "append",
    "fork",
    "fork",
    "free",
    "swap_out",
    "swap_out",
    "swap_in",
    "swap_in",
    "force_allocate",
)


def _expected_refcounts(m: BlockSpaceManagerV1, device: Device) -> dict[int, int]:
    counts: dict[int, int] = {}
    for table in m.block_tables.values():
        for block in {b for b in table if b.device is device}:
            counts[block.block_id] = counts.get(block.block_id, 0) + 1
    return counts


def _check_invariants(m: BlockSpaceManagerV1, seqs: list[Sequence]) -> None:
    stats = m.pool_stats()
    assert stats.is_conserved, stats
    assert stats.num_free == m.get_num_free_gpu_blocks()
    refcounts = m.block_refcounts()
    assert stats.num_held == len(refcounts)
    assert refcounts == _expected_refcounts(m, Device.GPU)
    cpu = {b.block_id: b.ref_count for b in m.cpu_allocator.blocks() if b.ref_count > 0}
    assert cpu == _expected_refcounts(m, Device.CPU)
    assert m.get_num_free_cpu_blocks() == m.num_total_cpu_blocks - len(cpu)
    assert all(b.ref_count >= 0 for b in m.gpu_allocator.blocks())
    for seq in seqs:
        bound = m.max_seq_footprint(seq)
        if bound is not None:
            assert m.num_seq_blocks(seq.seq_id) <= bound


@st.composite
def scenarios(draw):
    mode = draw(st.sampled_from(["plain", "swa", "cache"]))
    config = KVCacheConfig(
        num_gpu_blocks=draw(st.integers(4, 24)),
        block_size=draw(st.sampled_from([1, 4, 16])),
        num_cpu_blocks=draw(st.integers(0, 24)),
        sliding_window=draw(st.integers(1, 48)) if mode == "swa" else None,
        enable_prefix_caching=mode == "cache",
        watermark=draw(st.sampled_from([0.0, 0.1])),
    )
    ops = draw(
        st.lists(st.tuples(st.sampled_from(OPS), st.integers(0, 10**6)), min_size=5, max_size=80)
    )
    return config, ops


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_property_random_ops_keep_pool_consistent(scenario):
    """Random admit/append/fork/free/swap: conservation, refcounts == tables, ring bound.

    Fork is skipped under SWA (test_swa_fork_cow_breaks_ring) and a wrapped ring is never
    swapped (test_swap_out_of_wrapped_ring_double_frees): both are faithful upstream crashes.
    """
    config, ops = scenario
    m = BlockSpaceManagerV1(config)
    bs = config.block_size
    groups: dict[int, SequenceGroup] = {}
    next_id = 0
    for op, r in ops:
        live = sorted(groups)
        group = groups[live[r % len(live)]] if live else None
        status = group.seqs[0].status if group else None
        if op in ("admit", "force_allocate"):
            next_id += 1
            shared = r % 3  # prefix keys 0..2 give cache hits between requests
            prompt = shared_prompt(10_000 + shared, (r % 5) * bs, next_id, 1 + r % (3 * bs))
            new = SequenceGroup(next_id, [Sequence.new(next_id, prompt)])
            if m.can_allocate(new) is AllocStatus.OK:
                m.allocate(new)
            elif op == "force_allocate":
                before = m.get_num_free_gpu_blocks()
                try:
                    m.allocate(new)
                except NoFreeBlocksError:
                    m.recover_leaked_blocks()
                    assert m.get_num_free_gpu_blocks() == before
                    continue
            else:
                continue
            new.seqs[0].status = RUNNING
            groups[next_id] = new
        elif op == "append" and status is RUNNING:
            for _ in range(1 + r % (2 * bs + 3)):  # decode steps, enough to wrap small rings
                if not m.can_append_slots(group):
                    break
                for seq in group.seqs:
                    seq.append_tokens(1)
                    m.append_slots(seq)
        elif op == "fork" and status is RUNNING and config.sliding_window is None:
            next_id += 1
            parent = group.seqs[r % len(group.seqs)]
            child = parent.fork(next_id)
            group.seqs.append(child)
            m.fork(parent, child)
        elif op == "free":
            for seq in group.seqs if group else ():
                m.free(seq)
            groups.pop(group.request_id, None) if group else None
        elif op == "swap_out" and status is RUNNING and m.can_swap_out(group):
            tables = [m.block_tables[s.seq_id] for s in group.seqs]
            if any(len(set(t)) < len(t) for t in tables):
                continue  # wrapped ring: the faithful double free
            m.swap_out(group)
            for seq in group.seqs:
                seq.status = SequenceStatus.SWAPPED
        elif (
            op == "swap_in"
            and status is SequenceStatus.SWAPPED
            and m.can_swap_in(group) is AllocStatus.OK
        ):
            m.swap_in(group)
            for seq in group.seqs:
                seq.status = RUNNING
        _check_invariants(m, [s for g in groups.values() for s in g.seqs])
    for group in groups.values():
        for seq in group.seqs:
            m.free(seq)
    assert m.get_num_free_gpu_blocks() == config.num_gpu_blocks
    assert m.get_num_free_cpu_blocks() == config.num_cpu_blocks


def test_free_follows_vllm_set_order_into_the_evictor():
    """Regression (lockstep v0-v1 seeds 3, 6, 8, 9): `free` releases ``set(table)``.

    We used to free in table order; vLLM frees in set order (blocks hashed by
    (device, number), as the lockstep adapter pins it), which decides the LRU evictor's order
    and so which block a later allocation evicts: table [0..4] enters as [2, 1, 4, 0, 3].
    """
    m = make(5, enable_prefix_caching=True)
    a, _ = admit(m, 1, shared_prompt(7, 80, 7, 0))
    assert m.get_block_table(a) == [0, 1, 2, 3, 4]
    m.access_all_blocks_in_seq(a, 1.0)
    b, _ = admit(m, 2, shared_prompt(7, 32, 7, 0))  # shares blocks 0 and 1
    m.access_all_blocks_in_seq(b, 2.0)
    m.free(b)
    m.free(a)
    assert [blk.block_id for blk in m.gpu_allocator.evictor.hash_to_block.values()] == [
        2,
        1,
        4,
        0,
        3,
    ]
    # Scan: candidate 2 (t=1); block 1 (t=2) stops it. Table order would have evicted 4.
    c, _ = admit(m, 3, shared_prompt(9, 16, 9, 0))
    assert m.get_block_table(c) == [2]
    assert m.get_num_free_gpu_blocks() == 4


def test_evicting_a_block_revived_by_fork_increments_its_refcount():
    """Regression (lockstep v0-v1 seeds 15, 17, exposed once `free` followed set order).

    A fork increfs a block that is already in the evictor (the multi-seq allocate quirk
    left it there); evicting it later for a new hash adds one more reference, as upstream
    (`block.ref_count += 1`, no check). We used to assert the count was 0.
    """
    m = make(2, enable_prefix_caching=True)
    a, b = Sequence.new(1, 32), Sequence.new(2, 32)
    m.allocate(SequenceGroup(1, [a, b]))
    m.free(a)  # blocks 0 and 1 reach refcount 0 and enter the evictor; b still names them
    assert m.get_num_free_gpu_blocks() == 2
    m.fork(b, Sequence.new(3, 32))
    assert m.block_refcounts() == {0: 1, 1: 1} and m.get_num_free_gpu_blocks() == 2
    d, _ = admit(m, 4, shared_prompt(9, 16, 9, 0))  # evicts block 1 (longest prefix)
    assert m.get_block_table(d) == [1]
    assert m.block_refcounts() == {0: 1, 1: 2}
    assert m.get_num_free_gpu_blocks() == 1
