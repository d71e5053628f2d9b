"""kvsim's corrected v0 design: admission always equals allocation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, make_manager
from sim.kv.protocol import PoolIntrospection, V0BlockManager
from sim.kv.types import AllocStatus, SequenceStatus, TokenContent
from sim.kv.v0_fixed.manager import CorrectedBlockSpaceManager
from sim.kv.v0_v2.cpu_gpu import Device
from tests.harness.kv_v0 import admit, decode, group, used
from tests.kv.test_kv_v0_v2 import ops, run_ops


def make(num_gpu_blocks: int, **kw) -> CorrectedBlockSpaceManager:
    return CorrectedBlockSpaceManager(KVCacheConfig(num_gpu_blocks=num_gpu_blocks, **kw))


def test_registry_and_protocols():
    m = make_manager("v0-fixed", KVCacheConfig(num_gpu_blocks=10, sliding_window=24))
    assert isinstance(m, CorrectedBlockSpaceManager)
    assert isinstance(m, V0BlockManager) and isinstance(m, PoolIntrospection)


def test_docstring_worked_example_w24_64_tokens():
    m = make(10, sliding_window=24)
    first = group(1, 64)
    assert m.admission_blocks(first) == 4  # min(4, 3) + the null block
    m.allocate(first)
    assert m.get_block_table(first.seqs[0]) == [0, 1, 2, 3] and m.get_num_free_gpu_blocks() == 6
    second = group(2, 64)
    assert m.admission_blocks(second) == 3
    m.allocate(second)
    assert m.get_block_table(second.seqs[0]) == [0, 4, 5, 6]
    third = group(3, 64)
    assert m.can_allocate(third) is AllocStatus.OK
    m.allocate(third)
    assert m.get_num_free_gpu_blocks() == 0


@pytest.mark.parametrize("window", [16, 24])
def test_vector1_setup_does_not_crash(window):
    m = make(10, sliding_window=window)
    m.allocate(group(1, 112))
    assert m.get_num_free_gpu_blocks() == 10 - 4  # 3 real + null
    b = group(2, 64)
    free_before = m.get_num_free_gpu_blocks()
    assert m.can_allocate(b) is AllocStatus.OK
    m.allocate(b)
    assert free_before - m.get_num_free_gpu_blocks() == m.admission_blocks(group(9, 64)) == 3


def test_decode_footprint_w64_200_tokens():
    m = make(100, sliding_window=64)
    g = admit(m, group(1, 200))
    assert used(m) == 6 + 1
    for _ in range(300):
        assert m.can_append_slots(g)
        decode(m, g.seqs[0])
        assert m.num_seq_blocks(1) <= m.max_seq_footprint(g.seqs[0]) == 7
        assert used(m) <= 8


def test_swap_and_fork_skip_null_entries():
    m = make(20, num_cpu_blocks=20, sliding_window=16)
    g = admit(m, group(1, 100))  # R=7, M=3 -> null x4 + 3 real
    assert m.get_block_table(g.seqs[0])[:4] == [0, 0, 0, 0]
    child = g.seqs[0].fork(2)
    m.fork(g.seqs[0], child)
    assert m.block_refcounts() == {0: 1, 1: 2, 2: 2, 3: 2}
    m.free(child)
    assert m.can_swap_out(g)
    pairs = m.swap_out(g)
    assert len(pairs) == 3
    g.seqs[0].status = SequenceStatus.SWAPPED
    assert m.get_num_free_gpu_blocks() == 19
    m.swap_in(g)
    assert m.get_block_table(g.seqs[0])[:4] == [0, 0, 0, 0]


def test_continuing_chunk_on_full_table_does_not_index_error():
    m = make(10)
    g = admit(m, group(1, 64))
    g.seqs[0].num_computed_tokens = 32
    assert m.append_slots(g.seqs[0]) == []


@settings(max_examples=150, deadline=None)
@given(
    num_gpu_blocks=st.integers(4, 40), window=st.sampled_from([None, 16, 24, 40, 64]), op_list=ops
)
def test_property_corrected_never_mismatches(num_gpu_blocks, window, op_list):
    m = RecordingAdmission(make(num_gpu_blocks, sliding_window=window, watermark=0.1))

    def on_alloc(m, g, free_before, raised):
        assert not raised
        assert free_before - m.get_num_free_gpu_blocks() == m.admitted[g.request_id]

    run_ops(m, op_list, on_alloc, strict_append=True)


class RecordingAdmission:
    """The manager, with the blocks each `can_allocate` counted recorded (a wrapper: the
    compiled core's classes, `sim.native`, cannot have a method replaced on an instance)."""

    def __init__(self, inner):
        self.inner = inner
        self.admitted: dict[int, int] = {}

    def can_allocate(self, g):
        self.admitted[g.request_id] = self.inner.admission_blocks(g)
        return self.inner.can_allocate(g)

    def __getattr__(self, name):
        return getattr(self.inner, name)


# -- swap admission counts what swap (and the append after it) takes ------------------------
def swap_out(m, g):
    assert m.can_swap_out(g)
    m.swap_out(g)
    for seq in g.seqs:
        seq.status = SequenceStatus.SWAPPED


def test_swa_swap_in_append_undercount():
    """Regression (tests/regressions/v0_fixed_swa_swap_in_append_undercount.yaml): swap-in
    counted only the swapped blocks, but the scheduler's `append_slots` right after it needs a
    new block when the table is full. bs=4, W=1 -> M=2; 18 tokens -> [null x3, a, b]."""
    m = make(6, num_cpu_blocks=4, block_size=4, sliding_window=1, watermark=0.0)
    g = admit(m, group(1, 18))
    seq = g.seqs[0]
    assert m.get_block_table(seq) == [0, 0, 0, 1, 2]
    decode(m, seq)  # 19 tokens
    decode(m, seq)  # 20 tokens: all 5 blocks full
    seq.num_computed_tokens = 20
    seq.append_tokens(1)  # token 21 needs a 6th block
    swap_out(m, g)
    admit(m, group(2, 8))  # 2 blocks
    small = admit(m, group(3, 4))  # 1 block
    assert m.get_num_free_gpu_blocks() == 2
    real_blocks = [b for b in m.block_tables[1].blocks if not b.is_null]
    # V2's count would be 2 (<= 2 free: OK), then the append finds no free block.
    assert m.block_allocator.get_num_blocks_touched(real_blocks, Device.GPU) == 2
    assert m.append_after_swap_in_blocks(seq) == 1
    assert m.swap_in_blocks(g) == 3
    assert m.can_swap_in(g) is AllocStatus.LATER
    m.free(small.seqs[0])
    assert m.can_swap_in(g) is AllocStatus.OK
    m.swap_in(g)
    seq.status = SequenceStatus.RUNNING
    m.append_slots(seq)
    assert m.get_num_free_gpu_blocks() == 0  # exactly the 3 counted
    assert m.get_block_table(seq)[:3] == [0, 0, 0] and len(m.get_block_table(seq)) == 6


def test_swa_swap_in_append_credits_the_drop():
    """After swap-in the drop frees out-of-window blocks before the new one is taken."""
    m = make(8, num_cpu_blocks=4, block_size=4, sliding_window=1, watermark=0.0)
    g = admit(m, group(1, 8))  # R=2 <= M=2: [a, b], no null entry
    seq = g.seqs[0]
    decode(m, seq, num_tokens=4)  # 12 tokens, 3 full blocks; drop end 8//4 - 2 = 0
    seq.num_computed_tokens = 12
    seq.append_tokens(1)
    swap_out(m, g)
    # Drop end 12//4 - 2 = 1 frees index 0, then one new block: net 0.
    assert m.append_after_swap_in_blocks(seq) == 0
    assert m.swap_in_blocks(g) == 3
    free_before = m.get_num_free_gpu_blocks()
    assert m.can_swap_in(g) is AllocStatus.OK
    m.swap_in(g)
    seq.status = SequenceStatus.RUNNING
    m.append_slots(seq)
    assert free_before - m.get_num_free_gpu_blocks() == 3


def test_prefix_caching_swap_in_undercount():
    """Regression (tests/regressions/v0_fixed_prefix_caching_swap_in_undercount.yaml): V2
    counts a full block whose hash is cached as 0 even when the cached id is in the evictor,
    where reviving it takes a free block. bs=2: a 5-token prompt is [h0, h1, tail]."""
    m = make(7, num_cpu_blocks=3, block_size=2, enable_prefix_caching=True, watermark=0.0)
    g = admit(m, group(1, 5))
    swap_out(m, g)
    gpu = m.block_allocator.gpu
    assert gpu.num_evictable_blocks == 2 and m.get_num_free_gpu_blocks() == 7
    admit(m, group(2, 5))  # 3 hashless ids
    other = admit(m, group(3, 4))  # 2 hashless ids
    assert m.get_num_free_gpu_blocks() == 2 and gpu.num_evictable_blocks == 2
    blocks = m.block_tables[1].blocks
    assert m.block_allocator.get_num_blocks_touched(blocks, Device.GPU) == 1  # V2: 0 + 0 + 1
    assert m.swap_in_blocks(g) == 3
    assert m.can_swap_in(g) is AllocStatus.LATER
    m.free(other.seqs[0])
    assert m.get_num_free_gpu_blocks() == 4
    assert m.can_swap_in(g) is AllocStatus.OK
    m.swap_in(g)
    assert m.get_num_free_gpu_blocks() == 1  # exactly the 3 counted
    g.seqs[0].status = SequenceStatus.RUNNING
    m.free(g.seqs[0])  # V2's undercount left None ids here, and `free` asserted


def test_prefix_caching_swap_in_counts_held_cached_blocks_zero():
    """A full block whose cached id is held by a running sequence costs nothing to swap in."""
    m = make(10, num_cpu_blocks=4, block_size=2, enable_prefix_caching=True, watermark=0.0)
    prompt = TokenContent.unique(7, 5)
    g = admit(m, group(1, prompt.copy()))
    swap_out(m, g)
    admit(m, group(2, prompt.copy()))  # holds h0, h1 again
    assert m.swap_in_blocks(g) == 1  # only the tail
    free_before = m.get_num_free_gpu_blocks()
    m.swap_in(g)
    assert free_before - m.get_num_free_gpu_blocks() == 1


def test_fork_then_swap_out_counts_every_block_object():
    """V2 counts distinct ids (8) but swap gives each of the 12 block objects its own id."""
    m = make(20, num_cpu_blocks=11)
    g = admit(m, group(1, 64, num_seqs=2))
    for seq in g.seqs:
        decode(m, seq, num_tokens=17)
    blocks = [b for s in g.seqs for b in m.block_tables[s.seq_id].blocks]
    assert m.block_allocator.get_num_blocks_touched(blocks, Device.CPU) == 8
    assert m.swap_out_blocks(g) == 12
    assert not m.can_swap_out(g)  # 11 CPU blocks: V2 says yes and runs dry


swap_ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "decode", "decode", "decode", "out", "in", "in", "free"]),
        st.integers(1, 12),
    ),
    min_size=20,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(
    num_gpu_blocks=st.integers(4, 16),
    num_cpu_blocks=st.integers(2, 12),
    cache=st.sampled_from([(None, False), (None, True), (1, False), (4, False), (9, False)]),
    shared_prefix=st.booleans(),
    op_list=swap_ops,
)
def test_property_swap_admission_matches_what_swap_takes(
    num_gpu_blocks, num_cpu_blocks, cache, shared_prefix, op_list
):
    """Every yes from can_swap_out / can_swap_in (then the append) / can_append_slots is
    followed by an operation that succeeds and takes no more blocks than counted."""
    window, caching = cache
    m = make(
        num_gpu_blocks,
        num_cpu_blocks=num_cpu_blocks,
        block_size=2,
        sliding_window=window,
        enable_prefix_caching=caching,
        watermark=0.1,
    )
    running, swapped = [], []
    for i, (op, arg) in enumerate(op_list):
        if op == "alloc":
            prompt = TokenContent.unique(7, arg) if shared_prefix else arg
            g = group(100 + i, prompt)
            if m.can_allocate(g) is AllocStatus.OK:
                running.append(admit(m, g))
        elif op == "decode" and running:
            g = running[arg % len(running)]
            seq = g.seqs[0]
            if seq.num_tokens == m.block_tables[seq.seq_id].num_full_slots:
                seq.num_computed_tokens = seq.num_tokens
                seq.append_tokens(1)
            if m.can_append_slots(g):
                m.append_slots(seq)  # V2's count is an upper bound here: it must not raise
        elif op == "out" and running:
            g = running[arg % len(running)]
            if m.can_swap_out(g):
                cpu_before = m.get_num_free_cpu_blocks()
                counted = m.swap_out_blocks(g)
                swap_out(m, g)
                assert cpu_before - m.get_num_free_cpu_blocks() <= counted
                running.remove(g)
                swapped.append(g)
        elif op == "in" and swapped:
            g = swapped[arg % len(swapped)]
            if m.can_swap_in(g) is AllocStatus.OK:
                gpu_before = m.get_num_free_gpu_blocks()
                counted = m.swap_in_blocks(g)
                m.swap_in(g)
                g.seqs[0].status = SequenceStatus.RUNNING
                m.append_slots(g.seqs[0])
                assert gpu_before - m.get_num_free_gpu_blocks() <= counted
                swapped.remove(g)
                running.append(g)
        elif op == "free" and running:
            m.free(running.pop(arg % len(running)).seqs[0])
        assert m.pool_stats().is_conserved
