"""vLLM 0.33.0's Mamba "align" additions (`sim.kv.v1_engine.mamba_checkpoint`): the module's
worked example by hand, the retired-range free of a checkpoint block behind nulls (what
0.26.0's walk back leaves held), the full-sequence gate not recording a checkpoint, sparse retention (`vllm serve`'s
default), and a
hypothesis invariant (every pool block accounted for, at most three real blocks per Mamba
table). The lockstep against 0.33.0's real managers is in
tests/vllm_real/test_mamba_align_lockstep.py."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import Segment, Sequence, TokenContent
from sim.kv.v1_engine import HybridKVCacheManager
from sim.kv.v1_engine.mamba_checkpoint import checkpoint_position, checkpoint_valid
from tests.kv.test_mamba_align import seq_of, step

FULL_MAMBA = (KVCacheGroupSpec(), KVCacheGroupSpec(mamba=True))


def make(num_gpu_blocks: int, checkpoint_blocks: int = 1, block_size: int = 4, retention=None):
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_cache_groups=FULL_MAMBA,
        vllm_pin="0.33.0",
        enable_prefix_caching=True,
        mamba_cache_mode="align",
        mamba_prefill_checkpoint_blocks=checkpoint_blocks,
        prefix_cache_retention_interval=retention,
    )
    manager = make_manager("v1-engine", config)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def test_checkpoint_position_and_validity_examples():
    assert [checkpoint_position(n, 4) for n in (10, 8, 1)] == [8, 4, 0]
    assert checkpoint_valid(0, 10, 8, 4) and checkpoint_valid(4, 10, 8, 4)
    assert not checkpoint_valid(4, 8, 4, 4)  # p is the chunk start: nothing to export
    assert not checkpoint_valid(2, 10, 8, 4)  # the chunk starts off the block grid


def test_the_docstring_example_with_and_without_checkpoint_blocks():
    """bs=4, a 10-token prompt in one chunk: with a checkpoint block the Mamba table is
    [null, c, r] and c is the cached state after 8 tokens, which B (same first 9 tokens)
    hits; without, one running block [null, null, r] and nothing for B to hit."""
    m = make(20)
    a = seq_of(1, 7, 10)
    assert step(m, a, 10) == [1, 2, 3, 0, 4, 5]  # full [1, 2, 3]; Mamba [null, c, r]
    assert m.group_block_ids(1) == ([1, 2, 3], [0, 4, 5])
    m.new_step_starts()
    assert m.get_computed_blocks(seq_of(2, 7, 9)) == ([1, 2, 0, 4], 8)

    m = make(20, checkpoint_blocks=0)
    a = seq_of(1, 7, 10)
    assert step(m, a, 10) == [1, 2, 3, 0, 0, 4]
    assert m.group_block_ids(1) == ([1, 2, 3], [0, 0, 4])
    m.new_step_starts()
    assert m.get_computed_blocks(seq_of(2, 7, 9)) == ([], 0)


def test_a_removal_that_jumps_a_gap_retires_the_checkpoint_behind_it():
    """Two checkpointed chunks with no free between them (the second scheduled while the
    first was in flight) leave [null, c1, r1, null, null, c2, r2]; one removal at C=28 then
    frees c2, r1 and c1: the retired range skips the nulls, where 0.26.0's walk back would
    stop at index 4 and keep c1 held until the request ends."""
    m = make(40)
    a = seq_of(1, 7, 30)
    assert step(m, a, 12) is not None  # [0, 12): checkpoint at 8 -> [null, c1, r1]
    a.num_in_flight_tokens = 12  # nothing processed yet: the next removal frees nothing
    assert step(m, a, 16) is not None  # [12, 28): checkpoint at 24, index 5
    assert m.group_block_ids(1)[1] == [0, 4, 5, 0, 0, 10, 11]
    a.num_in_flight_tokens = 0
    free_before = m.num_free_blocks
    assert step(m, a, 1) is not None  # C=28: (28 - 1) // 4 = 6 -> indices 5, 2, 1 freed
    assert m.group_block_ids(1)[1] == [0, 0, 0, 0, 0, 0, 11, 13]
    assert m.num_free_blocks == free_before + 3 - 1 - 1  # one new block per group


def test_the_full_sequence_gate_does_not_record_a_checkpoint():
    m = make(20)
    a = seq_of(1, 7, 10)
    (mamba,) = [g for g in m.coordinator.managers if getattr(g, "checkpoints", None)]
    assert m.num_blocks_to_admit(a, [], None) == 3 + 2  # full 3, Mamba 1 + 1 checkpoint
    assert mamba.checkpoints.checkpoints == {}


def test_sparse_retention_keeps_only_the_replay_boundary_and_the_junction():
    """A 20-token prompt in chunks of 8 (bs=4, no checkpoint blocks): dense retention keys the
    states after 8 and 16 tokens, sparse (`vllm serve`'s 0) only the replay boundary's,
    ``19 // 4 * 4 = 16``, and the junction's when the lookup found one (8 here), so B, which
    shares 12 tokens, hits 8 tokens, nothing, and 8 again."""
    hits = []
    for retention, junction in ((None, 0), (0, 0), (0, 8)):
        m = make(40, checkpoint_blocks=0, retention=retention)
        a = seq_of(1, 7, 20)
        a.shared_prefix_boundary = junction
        for _ in range(3):
            assert step(m, a, min(8, 20 - a.num_computed_tokens)) is not None
        m.new_step_starts()
        b = Sequence(2, TokenContent.from_segments([Segment(7, 12), Segment(9, 8)]), 20)
        hits.append(m.get_computed_blocks(b)[1])
    assert hits == [8, 0, 8]


def test_sparse_retention_reserves_a_checkpoint_only_on_the_chunk_reaching_the_prefill_end():
    """bs=4, a 20-token prompt, chunk [0, 12): dense reserves the checkpoint at 8 (two new
    Mamba blocks), sparse does not (12 < 20: one)."""
    for retention, num_mamba in ((None, 2), (0, 1)):
        m = make(40, retention=retention)
        step(m, seq_of(1, 7, 20), 12)
        assert sum(1 for b in m.group_block_ids(1)[1] if b) == num_mamba


def test_retention_is_refused_where_it_is_not_modelled():
    import pytest

    with pytest.raises(ValueError, match="prefix_cache_retention_interval: a positive"):
        make(40, retention=64)
    config = KVCacheConfig(
        num_gpu_blocks=40,
        block_size=4,
        kv_cache_groups=FULL_MAMBA,
        vllm_pin="0.26.0",
        enable_prefix_caching=True,
        prefix_cache_retention_interval=0,
    )
    with pytest.raises(ValueError, match="prefix_cache_retention_interval: vLLM 0.26.0 has no"):
        make_manager("v1-engine", config)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 2), st.integers(1, 13), st.booleans()), max_size=40),
    st.integers(0, 1),
    st.sampled_from([None, 0]),
)
def test_blocks_are_conserved_and_mamba_tables_stay_small(steps, checkpoint_blocks, retention):
    m = make(30, checkpoint_blocks, retention=retention)
    live: dict[int, Sequence] = {}
    next_id = 1
    for slot, num_new, finish in steps:
        seq = live.get(slot)
        if seq is None:
            seq = live[slot] = seq_of(next_id, slot, 40)
            next_id += 1
            hit = m.get_computed_blocks(seq)
        else:
            hit = None
        num_new = min(num_new, seq.num_tokens - seq.num_computed_tokens - (hit or ([], 0))[1])
        if num_new > 0:
            step(m, seq, num_new, hit)
        if finish or seq.num_computed_tokens >= seq.num_tokens:
            m.free(seq)
            del live[slot]
        held = {b for s in live.values() for group in m.group_block_ids(s.seq_id) for b in group}
        held.discard(0)
        assert m.num_free_blocks + len(held) == 30 - 1  # the null block is never free
        for s in live.values():
            assert sum(1 for b in m.group_block_ids(s.seq_id)[1] if b) <= 3
