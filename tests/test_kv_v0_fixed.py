"""kvsim's corrected v0 design: admission always equals allocation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, make_manager
from sim.kv.protocol import PoolIntrospection, V0BlockManager
from sim.kv.types import AllocStatus, SequenceStatus
from sim.kv.v0_fixed import CorrectedBlockSpaceManager
from tests.kv_v0_helpers import admit, decode, group, used
from tests.test_kv_v0_v2 import ops, run_ops


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
    m = make(num_gpu_blocks, sliding_window=window, watermark=0.1)

    def on_alloc(m, g, free_before, raised):
        assert not raised
        assert free_before - m.get_num_free_gpu_blocks() == admitted[g.request_id]

    admitted: dict[int, int] = {}
    orig = m.can_allocate

    def can_allocate(g):
        admitted[g.request_id] = m.admission_blocks(g)
        return orig(g)

    m.can_allocate = can_allocate
    run_ops(m, op_list, on_alloc, strict_append=True)
