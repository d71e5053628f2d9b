"""Mamba state groups in the V1-engine model (caching off, vLLM's default mode): the docstring
example of `sim.kv.v1_engine.mamba` worked by hand, the one-block invariant under random
steps, and the refusals. The lockstep against the real managers is in tests/vllm_real."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import Segment, Sequence, TokenContent
from sim.kv.v1_engine import HybridKVCacheManager
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.mamba import MambaManager

FULL_MAMBA = (KVCacheGroupSpec(), KVCacheGroupSpec(mamba=True))


def make(
    num_gpu_blocks: int,
    groups: tuple[KVCacheGroupSpec, ...] = FULL_MAMBA,
    pin: str | None = "0.33.0",
    max_model_len: int | None = 4096,
    **kwargs,
) -> HybridKVCacheManager:
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=16,
        kv_cache_groups=groups,
        vllm_pin=pin,
        max_model_len=max_model_len,
        **kwargs,
    )
    manager = make_manager("v1-engine", config)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def seq_of(seq_id: int, num_tokens: int) -> Sequence:
    content = TokenContent.from_segments([Segment(seq_id, num_tokens)])
    return Sequence(seq_id, content, content.num_tokens)


def test_docstring_example_one_state_block_per_request():
    m = make(10)
    a = seq_of(1, 40)
    assert m.allocate_slots(a, 40) == [1, 2, 3, 4]
    assert m.group_block_ids(1) == ([1, 2, 3], [4])
    for length in range(41, 50):  # decode to 49 tokens
        a.num_computed_tokens = length - 1
        a.content = TokenContent.from_segments([Segment(1, length)])
        new = m.allocate_slots(a, 1)
        assert new == ([5] if length == 49 else [])
    assert m.group_block_ids(1) == ([1, 2, 3, 5], [4])
    m.free(a)
    # Group 0 frees 5, 3, 2, 1 (tail first), then group 1 frees 4: all back in the queue.
    assert m.block_pool.num_held_blocks == 1  # the null block
    assert len(m.block_pool.free_block_queue) == 9


def test_skipped_tokens_and_the_free_never_reach_the_state_block():
    m = MambaManager(BlockPool(4, False), 64)
    assert [m.num_skipped_tokens(c) for c in (0, 1, 40, 64)] == [-1, 0, 39, 63]
    assert m.get_num_blocks_to_allocate(7, 10, []) == 1
    m.allocate_new_blocks(7, 10)
    assert m.get_num_blocks_to_allocate(7, 64, []) == 0
    m.remove_skipped_blocks(7, 64)  # (64 - 1) // 64 = 0: nothing freed
    assert [b.block_id for b in m.req_to_blocks[7]] == [1]
    assert m.admission_cap_blocks(8192, 64) is None
    assert m.freeing_decode_len(0) == 66  # past max_model_len: a decode never frees it


def test_the_shared_free_would_free_past_the_block_size():
    # Not reachable through the manager (C <= max_model_len); the formula is upstream's.
    m = MambaManager(BlockPool(4, False), 8)
    m.allocate_new_blocks(1, 16)  # 2 blocks of 8
    m.remove_skipped_blocks(1, 10)  # (10 - 1) // 8 = 1 block skipped
    assert [b.block_id for b in m.req_to_blocks[1]] == [0, 2]


def test_full_sequence_gate_charges_one_block_per_mamba_group():
    m = make(200, groups=(KVCacheGroupSpec(mamba=True),) * 3 + (KVCacheGroupSpec(),))
    # cdiv(200, 16) = 13 for the full group, 1 per Mamba group, with any in-flight cap.
    assert m.num_blocks_to_admit(seq_of(1, 200), [], 64) == 13 + 3


def test_any_group_order_and_a_sliding_group_beside():
    groups = (
        KVCacheGroupSpec(mamba=True),
        KVCacheGroupSpec(),
        KVCacheGroupSpec(sliding_window=8),
        KVCacheGroupSpec(mamba=True),
    )
    m = make(20, groups=groups)
    a = seq_of(1, 33)
    assert m.allocate_slots(a, 33) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert m.group_block_ids(1) == ([1], [2, 3, 4], [5, 6, 7], [8])


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=12),
    max_model_len=st.integers(min_value=16, max_value=200),
)
def test_every_live_request_holds_exactly_one_block_per_mamba_group(steps, max_model_len):
    m = make(64, max_model_len=max_model_len)
    seqs = {}
    for step_index, n in enumerate(steps):
        seq = seqs.setdefault(step_index % 3, seq_of(step_index % 3 + 1, max_model_len))
        n = min(n, max_model_len - seq.num_computed_tokens)
        if n <= 0:
            m.free(seq)
            seqs.pop(step_index % 3)
            continue
        if m.allocate_slots(seq, n) is not None:
            seq.num_computed_tokens += n
        for live in seqs.values():
            mamba_table = m.group_block_ids(live.seq_id)[1]
            assert len(mamba_table) == (1 if live.num_computed_tokens else 0)
            assert all(block_id != 0 for block_id in mamba_table)


def test_refusals_name_the_field():
    with pytest.raises(ValueError, match="kv_cache_groups: Mamba groups are modelled from"):
        make(10, pin=None)  # 4ac7713
    with pytest.raises(ValueError, match="enable_prefix_caching: .*'align'"):
        make(10, pin="0.11.0", enable_prefix_caching=True)
    with pytest.raises(ValueError, match="max_model_len: a Mamba group's block size"):
        make(10, max_model_len=None)
    with pytest.raises(ValueError, match="one Mamba group"):
        make(10, groups=(KVCacheGroupSpec(mamba=True),))
    with pytest.raises(ValueError, match="no sliding_window"):
        KVCacheGroupSpec(sliding_window=8, mamba=True)


@pytest.mark.parametrize("pin", ["0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0"])
def test_earlier_releases_are_modelled_the_same(pin):
    m = make(10, pin=pin)
    assert m.allocate_slots(seq_of(1, 40), 40) == [1, 2, 3, 4]
