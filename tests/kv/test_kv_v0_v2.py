"""BlockSpaceManagerV2 (`vllm/core/block_manager_v2.py (0.5.4)`).

Spec vectors 1, 3, 4, 8, exact ids, prefix caching, properties.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig
from sim.kv.protocol import PoolIntrospection, V0BlockManager
from sim.kv.types import AllocStatus, NoFreeBlocksError, SequenceStatus, TokenContent, cdiv
from sim.kv.v0_v2 import BlockSpaceManagerV2
from tests.harness.kv_v0 import admit, decode, expected_refcounts, group, run, used


def make(num_gpu_blocks: int, **kw) -> BlockSpaceManagerV2:
    return BlockSpaceManagerV2(KVCacheConfig(num_gpu_blocks=num_gpu_blocks, **kw))


def test_implements_protocols():
    m = make(10)
    assert isinstance(m, V0BlockManager) and isinstance(m, PoolIntrospection)


@pytest.mark.parametrize("window", [16, 24])
def test_vector1_swa_admission_mismatch_crash(window):
    m = make(10, sliding_window=window)
    m.allocate(group(1, 112))
    assert m.get_num_free_gpu_blocks() == 3
    b = group(2, 64)
    assert m.admission_blocks(b) == 3
    assert m.can_allocate(b) is AllocStatus.OK
    with pytest.raises(NoFreeBlocksError):
        m.allocate(b)
    assert m.get_num_free_gpu_blocks() == 0
    assert 2 not in m.block_tables
    stats = m.pool_stats()
    assert stats.is_conserved and stats.num_held == 10
    assert m.block_refcounts() == expected_refcounts(m)
    # Recovery restores the pre-failure deque exactly.
    assert m.recover_leaked_blocks() == 3
    assert m.block_allocator.gpu.free_block_ids() == [7, 8, 9]


def test_vector3_decode_footprint_w64_200_tokens():
    m = make(100, sliding_window=64)
    g = admit(m, group(1, 200))
    seq = g.seqs[0]
    assert used(m) == 13
    assert m.max_seq_footprint(seq) is None
    decode(m, seq)
    assert used(m) == 8 and m.num_seq_blocks(1) == 7 and m.null_block_id == 13
    for _ in range(300):
        assert m.can_append_slots(g)
        decode(m, seq)
        assert used(m) == 8
        assert m.num_seq_blocks(1) <= m.max_seq_footprint(seq) == 7


def test_vector4_decode_footprint_w64_40_tokens():
    m = make(100, sliding_window=64)
    g = admit(m, group(1, 40))
    assert used(m) == 3
    decode(m, g.seqs[0])
    assert used(m) == 4
    peak = 4
    for _ in range(300):
        decode(m, g.seqs[0])
        peak = max(peak, used(m))
    assert peak == 8


def test_vector8_fork_then_swap_loses_sharing():
    m = make(20, num_cpu_blocks=20)
    g = admit(m, group(1, 64, num_seqs=2))
    for seq in g.seqs:
        decode(m, seq, num_tokens=17)
    assert len(m.block_refcounts()) == 8
    assert m.can_swap_out(g)
    pairs = m.swap_out(g)
    for seq in g.seqs:
        seq.status = SequenceStatus.SWAPPED
    assert m.get_num_free_cpu_blocks() == 20 - 12
    assert m.get_num_free_gpu_blocks() == 20
    assert pairs[:4] == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert m.seq_block_ids(1) == [] and m.get_block_table(g.seqs[0])[0] == 20
    assert m.can_swap_in(g) is AllocStatus.OK
    m.swap_in(g)
    assert m.get_num_free_gpu_blocks() == 20 - 12


def test_naive_popleft_appendleft_ids():
    m = make(10)
    a, b = group(1, 32), group(2, 16)
    m.allocate(a)
    m.allocate(b)
    assert m.get_block_table(a.seqs[0]) == [0, 1] and m.get_block_table(b.seqs[0]) == [2]
    m.free(a.seqs[0])
    assert m.block_allocator.gpu.free_block_ids()[:3] == [1, 0, 3]
    c = group(3, 48)
    m.allocate(c)
    assert m.get_block_table(c.seqs[0]) == [1, 0, 3]


def test_copy_on_write_of_shared_partial_block():
    m = make(10)
    g = admit(m, group(1, 20))
    parent = g.seqs[0]
    child = parent.fork(2)
    m.fork(parent, child)
    assert m.block_refcounts() == {0: 2, 1: 2}
    assert decode(m, child) == [(1, 2)]
    assert m.get_block_table(child) == [0, 2] and m.get_block_table(parent) == [0, 1]
    assert decode(m, parent) == []


def test_can_append_slots_worst_case_counting():
    m = make(4)
    admit(m, group(1, 32))  # 2 full blocks
    table = m.block_tables[1]
    assert table.get_num_blocks_touched_by_append_slots(1, 0) == 1
    assert table.get_num_blocks_touched_by_append_slots(0, 0) == 0
    assert table.get_num_blocks_touched_by_append_slots(1, 16) == 2
    g2 = admit(m, group(2, 20))
    assert m.block_allocator.gpu.num_free_blocks == 0
    assert not m.can_append_slots(g2)  # counts 1 although the tail has 12 empty slots


def test_null_block_not_counted_by_can_append_slots():
    """Finding: the lazily created null block makes append_slots raise after can_append_slots OK."""
    m = make(4, sliding_window=64)
    g = admit(m, group(1, 48))  # 3 full blocks, F=1
    assert m.can_append_slots(g)
    with pytest.raises(NoFreeBlocksError):
        decode(m, g.seqs[0])


def test_swap_out_swa_seq_with_null_entries_raises():
    m = make(100, num_cpu_blocks=100, sliding_window=16)
    g = admit(m, group(1, 100))
    decode(m, g.seqs[0])
    assert m.get_block_table(g.seqs[0])[0] == m.null_block_id
    assert m.can_swap_out(g)
    with pytest.raises(ValueError, match="null block should not be modified"):
        m.swap_out(g)


def test_fork_after_swa_drop_is_rejected():
    m = make(100, sliding_window=16)
    g = admit(m, group(1, 100))
    decode(m, g.seqs[0])
    with pytest.raises(ValueError, match="undefined"):
        m.fork(g.seqs[0], g.seqs[0].fork(2))


def test_empty_append_on_full_table_raises_in_the_0_5_4_release_only():
    """vLLM #7371: a continuing chunk (no unseen tokens) of a prompt that fills its last block.
    The 0.5.4 wheel indexes past the table (`vllm/core/block/block_table.py:L150-154 (0.5.4)`);
    pin 0.5.4+7380 (and a manager built without a pin) has the fix, #7380: nothing is written."""
    released = make(10, vllm_pin="0.5.4")
    g = admit(released, group(1, 64))
    g.seqs[0].num_computed_tokens = 32
    with pytest.raises(IndexError):
        released.append_slots(g.seqs[0])

    pinned = make(10)
    g = admit(pinned, group(1, 64))
    g.seqs[0].num_computed_tokens = 32
    assert pinned.append_slots(g.seqs[0]) == []
    assert pinned.get_num_free_gpu_blocks() == 6


def test_swa_with_prefix_caching_rejected():
    with pytest.raises(ValueError, match="Prefix caching"):
        make(10, sliding_window=16, enable_prefix_caching=True)


# -- prefix caching ------------------------------------------------------------------------
def test_prefix_cache_hit_shares_full_blocks():
    m = make(10, enable_prefix_caching=True)
    a, b = group(1, TokenContent.unique(7, 40)), group(2, TokenContent.unique(7, 40))
    m.allocate(a)
    assert m.can_allocate(b) is AllocStatus.OK and m.admission_blocks(b) == 3
    m.allocate(b)
    assert m.get_block_table(a.seqs[0]) == [0, 1, 2]
    assert m.get_block_table(b.seqs[0]) == [0, 1, 3]
    assert m.block_refcounts() == {0: 2, 1: 2, 2: 1, 3: 1}
    assert m.get_num_free_gpu_blocks() == 6


def test_prefix_cache_dedupe_on_promotion_changes_table_id():
    m = make(10, enable_prefix_caching=True)
    a = admit(m, group(1, TokenContent.unique(7, 24)))
    m.allocate(group(2, TokenContent.unique(7, 32)))
    assert m.get_block_table(a.seqs[0]) == [0, 1]
    seq = a.seqs[0]
    seq.num_computed_tokens = 24
    seq.content.append_output(7, 8)  # A's block 1 now holds the same tokens as B's block 1
    m.append_slots(seq)
    assert m.get_block_table(seq) == [0, 2]
    assert m.block_refcounts() == {0: 2, 2: 2}
    assert m.block_allocator.gpu.free_block_ids()[0] == 1


def test_prefix_cache_eviction_order_and_free_count():
    m = make(4, enable_prefix_caching=True)
    a, b = group(1, TokenContent.unique(7, 32)), group(2, TokenContent.unique(8, 32))
    m.allocate(a)
    m.allocate(b)
    m.access_all_blocks_in_seq(a.seqs[0], 1.0)
    m.access_all_blocks_in_seq(b.seqs[0], 2.0)
    m.free(a.seqs[0])
    m.free(b.seqs[0])
    gpu = m.block_allocator.gpu
    assert gpu.evictor.block_ids() == [0, 1, 2, 3]
    stats = m.pool_stats()
    assert (stats.num_free, stats.num_held, stats.num_evictable) == (4, 0, 4)
    # Oldest time 1.0 holds ids 0 (16 hashed tokens) and 1 (32): the longer prefix goes first.
    c = group(3, TokenContent.unique(9, 16))
    m.allocate(c)
    assert m.get_block_table(c.seqs[0]) == [1]
    # Key 7 again: block 0 hits id 0 out of the evictor; block 1 (evicted) misses and evicts
    # the next victim: time 2.0, ids 2 (16) and 3 (32) -> 3.
    d = group(4, TokenContent.unique(7, 32))
    m.allocate(d)
    assert m.get_block_table(d.seqs[0]) == [0, 3]
    assert m.get_num_free_gpu_blocks() == 1 == gpu.evictor.num_blocks


def test_prefix_cache_common_computed_blocks():
    m = make(10, enable_prefix_caching=True)
    a = group(1, TokenContent.unique(7, 48))
    m.allocate(a)
    m.free(a.seqs[0])
    b = group(2, TokenContent.unique(7, 48))
    m.allocate(b)
    # All three are hits (computed); the last block is skipped.
    assert m.get_common_computed_block_ids(b.seqs) == [0, 1]


def test_prefix_cache_swap_touched_counts_cached_blocks_zero():
    m = make(10, num_cpu_blocks=10, enable_prefix_caching=True)
    admit(m, group(1, TokenContent.unique(7, 40)))
    assert m.block_allocator.get_num_blocks_touched(m.block_tables[1].blocks, m_dev(m, "gpu")) == 1


def m_dev(m, name):
    from sim.kv.v0_v2.cpu_gpu import Device

    return Device.GPU if name == "gpu" else Device.CPU


# -- properties ----------------------------------------------------------------------------
ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "alloc", "decode", "decode", "decode", "free"]),
        st.integers(1, 200),
    ),
    min_size=1,
    max_size=40,
)


def run_ops(m, op_list, on_alloc, strict_append=False):
    running = []
    next_id = 1
    for op, arg in op_list:
        if op == "alloc":
            g = group(next_id, arg)
            next_id += 1
            free_before = m.get_num_free_gpu_blocks()
            status = m.can_allocate(g)
            if status is AllocStatus.OK:
                try:
                    m.allocate(g)
                    raised = False
                    running.append(run(g))
                except NoFreeBlocksError:
                    raised = True
                on_alloc(m, g, free_before, raised)
                if raised:
                    assert m.pool_stats().is_conserved
                    assert m.block_refcounts() == expected_refcounts(m)
                    m.recover_leaked_blocks()
        elif op == "decode" and running:
            g = running[arg % len(running)]
            seq = g.seqs[0]
            # As in the engine: the previous step computed every token and sampled a new one,
            # THEN the scheduler asks can_append_slots for the slot of that new token.
            seq.num_computed_tokens = seq.num_tokens
            seq.append_tokens(1)
            if m.can_append_slots(g):
                try:
                    m.append_slots(seq)
                except NoFreeBlocksError:
                    assert not strict_append, "append_slots raised after can_append_slots OK"
                    # Only the lazy null block can cause this (see the finding test above): it
                    # took the last free block, or creating it failed with none free.
                    assert m.null_block_id is not None or m.get_num_free_gpu_blocks() == 0
                    m.free(g.seqs[0])
                    running.remove(g)
        elif op == "free" and running:
            g = running.pop(arg % len(running))
            m.free(g.seqs[0])
        stats = m.pool_stats()
        assert stats.is_conserved
        assert m.block_refcounts() == expected_refcounts(m)
        for g in running:
            ids = m.seq_block_ids(g.seqs[0].seq_id)
            # Null entries are a prefix and the rest distinct: what num_seq_blocks relies on.
            live = [i for i in ids if i != m.null_block_id]
            assert ids[: len(ids) - len(live)] == [m.null_block_id] * (len(ids) - len(live))
            assert m.num_seq_blocks(g.seqs[0].seq_id) == len(set(live)) == len(live)
            bound = m.max_seq_footprint(g.seqs[0])
            if bound is not None:
                assert m.num_seq_blocks(g.seqs[0].seq_id) <= bound


@settings(max_examples=150, deadline=None)
@given(num_gpu_blocks=st.integers(4, 40), window=st.sampled_from([16, 24, 40, 64]), op_list=ops)
def test_property_v2_swa_mismatch_exactly_when_spec_says(num_gpu_blocks, window, op_list):
    m = make(num_gpu_blocks, sliding_window=window, watermark=0.1)
    M, wm = m.max_block_sliding_window, m.watermark_blocks

    def on_alloc(m, g, free_before, raised):
        r = cdiv(g.seqs[0].num_tokens, 16)
        assert raised == (r > M and M + wm <= free_before < r)

    run_ops(m, op_list, on_alloc)


@settings(max_examples=60, deadline=None)
@given(num_gpu_blocks=st.integers(4, 40), caching=st.booleans(), op_list=ops)
def test_property_v2_full_attention_never_mismatches(num_gpu_blocks, caching, op_list):
    m = make(num_gpu_blocks, enable_prefix_caching=caching)

    def on_alloc(m, g, free_before, raised):
        assert not raised

    run_ops(m, op_list, on_alloc)


def test_multi_block_append_recomputes_num_tokens_total_from_prev():
    """Regression (lockstep v0-v2 seeds 3, 6, 7): an append that adds two blocks at once.

    Both new blocks are allocated empty first, so the second one started with its
    predecessor's pre-write total. vLLM recomputes ``prev total + own tokens`` on every append
    (`PrefixCachingBlock._update_num_tokens_total`), giving totals 1, 2, 3 here; we used to
    keep 1, 2, 2, so the evictor's tie-break (longest prefix first) picked id 1, not 2.
    """
    m = make(3, block_size=1, enable_prefix_caching=True)
    a = admit(m, group(1, TokenContent.unique(7, 1)))
    seq = a.seqs[0]
    assert decode(m, seq, num_tokens=2) == []
    table = m.block_tables[1]
    assert table.physical_block_ids == [0, 1, 2]
    assert [b.num_tokens_total for b in table.blocks] == [1, 2, 3]
    m.access_all_blocks_in_seq(seq, 1.0)
    m.free(seq)
    assert m.block_allocator.gpu.evictor.block_ids() == [0, 1, 2]
    c = group(2, TokenContent.unique(9, 1))
    m.allocate(c)
    assert m.get_block_table(c.seqs[0]) == [2]  # all at t=1.0: the 3-token prefix goes first
    assert m.get_num_free_gpu_blocks() == 2


_FORK_SCRIPT = """
import sys
from sim.kv.config import KVCacheConfig
from sim.kv.v0_v2 import BlockSpaceManagerV2
from tests.harness.kv_v0 import admit, group

for caching in (False, True):
    m = BlockSpaceManagerV2(KVCacheConfig(10, 16, enable_prefix_caching=caching))
    parent = admit(m, group(1, 40)).seqs[0]  # 3 blocks
    m.fork(parent, parent.fork(2))
    print(sys.flags.optimize, caching, sorted(m.block_refcounts().values()))
"""


@pytest.mark.parametrize("flags", [[], ["-O"]], ids=["asserts-on", "python-O"])
def test_fork_refcount_increment_survives_python_O(flags):
    """Regression: the fork's refcount increment sat inside an `assert`, so under `python -O`
    a fork shared blocks without counting the child (refcount 1 instead of 2)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, *flags, "-c", _FORK_SCRIPT],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    optimize = 1 if flags else 0
    assert out[:2] == [f"{optimize} False [2, 2, 2]", f"{optimize} True [2, 2, 2]"]
