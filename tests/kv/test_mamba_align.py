"""Mamba prefix caching (vLLM's Mamba cache mode "align") in the V1-engine model: the
docstring example of `sim.kv.v1_engine.mamba` worked by hand, the same-step refusal, the
refusals by release, and hypothesis invariants over random steps (hits only at block
boundaries with one real state block, at most two real blocks per Mamba table, every pool
block accounted for). The lockstep against the real managers is in
tests/vllm_real/test_mamba_align_lockstep.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import Segment, Sequence, TokenContent
from sim.kv.v1_engine import HybridKVCacheManager

FULL_MAMBA = (KVCacheGroupSpec(), KVCacheGroupSpec(mamba=True))


def make(
    num_gpu_blocks: int,
    pin: str = "0.19.1",
    block_size: int = 4,
    groups=FULL_MAMBA,
    mode: str = "align",
):
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_cache_groups=groups,
        vllm_pin=pin,
        enable_prefix_caching=True,
        mamba_cache_mode=mode,
    )
    manager = make_manager("v1-engine", config)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def seq_of(seq_id: int, key: int, num_tokens: int) -> Sequence:
    content = TokenContent.from_segments([Segment(key, num_tokens)])
    return Sequence(seq_id, content, num_tokens)


def step(manager, seq: Sequence, num_new: int, hit=None) -> list[int] | None:
    """One scheduler step: `new_step_starts`, then `allocate_slots`; advances C on success."""
    manager.new_step_starts()
    ids, tokens = hit if hit is not None else ([], 0)
    out = manager.allocate_slots(seq, num_new, tokens, ids)
    if out is not None:
        seq.num_computed_tokens += tokens + num_new
    return out


@pytest.mark.parametrize("pin", ["0.19.1", "0.20.0", "0.25.1", "0.26.0"])
def test_the_docstring_example(pin):
    """`sim.kv.v1_engine.mamba`'s worked example, bs=4, groups [full, mamba]."""
    m = make(20, pin)
    a = seq_of(1, 7, 10)
    assert step(m, a, 8) == [1, 2, 0, 3]  # full [1, 2]; Mamba [null, m1=3]
    assert m.group_block_ids(1) == ([1, 2], [0, 3])
    assert step(m, a, 2) == [4, 5]  # C=8: Mamba grows to [null, m1, m2], last state index 1
    assert m.group_block_ids(1) == ([1, 2, 4], [0, 3, 5])
    a.append_tokens(1)
    free_before = m.num_free_blocks
    assert step(m, a, 1) == []  # C=10: (10 - 1) // 4 = 2, the walk back frees m1
    assert m.group_block_ids(1) == ([1, 2, 4], [0, 0, 5])
    assert m.num_free_blocks == free_before + 1
    # B shares A's first 9 tokens: the full hit is 2 blocks, the Mamba hit [null, m1] (m1
    # freed but still cached): 8 tokens.
    b = Sequence(2, TokenContent.from_segments([Segment(7, 9)]), 9)
    hit = m.get_computed_blocks(b)
    assert hit == ([1, 2, 0, 3], 8)
    assert step(m, b, 1, hit) == [6, 7]  # full block 6; Mamba pads nothing, appends 7
    assert m.group_block_ids(2) == ([1, 2, 6], [0, 3, 7])


def test_a_hit_on_a_state_cached_this_step_waits_for_the_next_step():
    """The last hit block was cached in this step (its state is this step's output): the
    count is num_gpu_blocks + 1, so allocate_slots refuses; after `new_step_starts` it fits."""
    m = make(20)
    a = seq_of(1, 7, 9)
    m.new_step_starts()
    assert m.allocate_slots(a, 8) is not None  # caches the Mamba state after 8 tokens
    b = Sequence(2, TokenContent.from_segments([Segment(7, 9)]), 9)
    ids, tokens = m.get_computed_blocks(b)
    assert tokens == 8
    assert m.allocate_slots(b, 1, tokens, ids) is None  # same step: refused
    m.new_step_starts()
    assert m.allocate_slots(b, 1, tokens, ids) is not None


def test_refusals_by_release_and_layout():
    assert make(20, pin="0.33.0").get_computed_blocks(Sequence.new(1, 9)) == ([], 0)
    with pytest.raises(ValueError, match="enable_prefix_caching: .*not vLLM 0.11.0"):
        make(20, pin="0.11.0")
    with pytest.raises(ValueError, match="full attention plus Mamba groups only"):
        make(20, groups=(*FULL_MAMBA, KVCacheGroupSpec(sliding_window=8)))


def _check_invariants(m, live: list[Sequence], num_gpu_blocks: int) -> None:
    held: set[int] = set()
    for seq in live:
        full, *mambas = m.group_block_ids(seq.seq_id)
        for table in mambas:
            real = [b for b in table if b != 0]
            assert len(real) <= 2, table  # the running state and, until freed, the previous
            held.update(real)
        held.update(b for b in full if b != 0)
    # Every block: the null block, a held one, or in the free queue (cached or not).
    stats = m.pool_stats()
    assert stats.num_free + len(held) + 1 == num_gpu_blocks, (stats, held)


@settings(max_examples=60, deadline=None)
@given(
    pin=st.sampled_from(["0.19.1", "0.20.0", "0.25.1", "0.26.0"]),
    block_size=st.sampled_from([1, 2, 4, 8]),
    num_mamba=st.integers(1, 3),
    num_gpu_blocks=st.integers(6, 40),
    ops=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 3), st.integers(1, 40)), max_size=60),
)
def test_hits_are_block_aligned_and_every_block_is_accounted_for(
    pin, block_size, num_mamba, num_gpu_blocks, ops
):
    groups = (KVCacheGroupSpec(),) + (KVCacheGroupSpec(mamba=True),) * num_mamba
    m = make(num_gpu_blocks, pin, block_size, groups)
    live: dict[int, Sequence] = {}
    next_id = 1
    for kind, key, n in ops:
        m.new_step_starts()
        if kind <= 1 or not live:  # a new request with a shared prefix key
            seq = seq_of(next_id, key, n)
            next_id += 1
            ids, tokens = m.get_computed_blocks(seq)
            assert tokens % block_size == 0 and tokens < seq.num_tokens
            tables = [
                ids[g * len(ids) // (1 + num_mamba) :][: len(ids) // (1 + num_mamba)]
                for g in range(1 + num_mamba)
            ]
            for mamba_hit in tables[1:]:
                # One real state block, the last; nulls before it.
                assert (not mamba_hit) or (mamba_hit[-1] != 0 and set(mamba_hit[:-1]) <= {0})
                assert len(mamba_hit) * block_size == tokens
            if m.allocate_slots(seq, seq.num_tokens - tokens, tokens, ids) is not None:
                seq.num_computed_tokens = seq.num_tokens
                live[seq.seq_id] = seq
        elif kind <= 3:  # a decode (or a refused one: preempt)
            seq = list(live.values())[key % len(live)]
            seq.append_tokens(1)
            if m.allocate_slots(seq, 1) is None:
                m.free(seq)
                del live[seq.seq_id]
            else:
                seq.num_computed_tokens += 1
        else:
            seq = list(live.values())[key % len(live)]
            m.free(seq)
            del live[seq.seq_id]
        _check_invariants(m, list(live.values()), num_gpu_blocks)
    for seq in list(live.values()):
        m.free(seq)
    assert m.num_free_blocks == num_gpu_blocks - 1  # all back (cached ones evictable)


@pytest.mark.parametrize("pin", ["0.19.1", "0.20.0", "0.25.1", "0.26.0"])
def test_mode_all_keeps_a_state_per_block_until_it_is_skipped(pin):
    """Mode "all" (bs=4): the Mamba table grows like attention's (a state per block, each
    cached when full); a step at C frees the blocks before ``(C - 1) // bs`` (nulls a prefix);
    a hit is the last cached state, as in "align"."""
    m = make(20, pin, mode="all")
    a = seq_of(1, 7, 10)
    assert step(m, a, 8) == [1, 2, 3, 4]  # full [1, 2], Mamba [3, 4]: both states cached
    assert step(m, a, 2) == [5, 6]  # C=8: (8 - 1) // 4 = 1, block 3 freed first
    assert m.group_block_ids(1) == ([1, 2, 5], [0, 4, 6])
    b = Sequence(2, TokenContent.from_segments([Segment(7, 9)]), 9)
    assert m.get_computed_blocks(b) == ([1, 2, 0, 4], 8)


def test_mode_all_is_refused_where_the_release_has_no_such_mode():
    with pytest.raises(ValueError, match="mamba_cache_mode: vLLM 0.33.0 has no 'all' mode"):
        make(20, pin="0.33.0", mode="all")
