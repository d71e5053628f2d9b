"""vLLM 0.33.0's sparse prefix-cache retention of sliding-window groups
(`sim.kv.v1_engine.sliding_retention`): the mask's examples, the module's worked example by
hand (one sliding group), the shared-prefix junction of a full + sliding hybrid, full and
chunked-local groups left dense, the refusal on earlier pins, and a hypothesis invariant
(sparse caches a subset of what dense caches, and a hit is never longer). The lockstep against
0.33.0's real managers and scheduler is tests/vllm_real/test_sliding_retention_lockstep.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import Segment, Sequence, TokenContent
from sim.kv.v1_engine.sliding_retention import SparseWindowRetention


def seq_of(seq_id: int, *segments: tuple[int, int]) -> Sequence:
    content = TokenContent.from_segments([Segment(key, n) for key, n in segments])
    return Sequence(seq_id, content, content.num_tokens)


def make(retention, groups=(), window=None, pin="0.33.0", num_gpu_blocks=80, block_size=4):
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        sliding_window=window,
        enable_prefix_caching=True,
        vllm_pin=pin,
        kv_cache_groups=groups,
        prefix_cache_retention_interval=retention,
    )
    return make_manager("v1-engine", config)


def admit(manager, seq: Sequence) -> tuple[list[int], int]:
    """A scheduler's admission of a whole prompt: the lookup, the junction kept on the request
    (hit plus the uncached common prefix, 0 when none), one allocation of the rest."""
    ids, hit = manager.get_computed_blocks(seq)
    uncached = manager.num_uncached_common_prefix_tokens
    seq.shared_prefix_boundary = hit + uncached if uncached else 0
    out = manager.allocate_slots(seq, seq.num_tokens - hit, hit, ids)
    assert out is not None
    seq.num_computed_tokens = seq.num_tokens
    return ids, hit


def num_cached(manager) -> int:
    return len(manager.block_pool.cached_block_hash_to_block)


def test_the_mask_examples():
    retention = SparseWindowRetention(block_size=4, num_contiguous_blocks=2)
    assert retention.retained_mask(0, 7, (29, 0)) == [False] * 5 + [True, True]
    assert retention.retained_mask(6, 8, (29, 0)) == [True, False]
    # Two boundaries, one window each; W = 1 (n = 0) keeps nothing.
    expected = [False, True, True, False, False, True, True, False]
    assert retention.retained_mask(0, 8, (29, 12)) == expected
    assert SparseWindowRetention(4, 0).retained_mask(0, 8, (29, 12)) == [False] * 8


def test_the_module_example_one_sliding_group():
    """bs=4, W=9 (2 blocks a hit), a 30-token prompt: sparse caches blocks 5 and 6, dense all
    seven; a replay of the prompt hits 28 tokens both ways, a request sharing 20 tokens hits
    20 densely and nothing sparsely."""
    for retention, cached, shared_hit in ((0, 2, 0), (None, 7, 20)):
        m = make(retention, window=9)
        a = seq_of(1, (7, 30))
        admit(m, a)
        assert num_cached(m) == cached
        table = m.group_block_ids(1)[0]
        assert m.get_computed_blocks(seq_of(2, (7, 30))) == ([0] * 5 + table[5:7], 28)
        assert m.get_computed_blocks(seq_of(3, (7, 20), (99, 5)))[1] == shared_hit


FULL_SLIDING = (KVCacheGroupSpec(), KVCacheGroupSpec(9))


def test_the_junction_keeps_the_shared_window_in_a_hybrid():
    """full + sliding (W=9, bs=4). A (30 tokens) caches every full block and sliding blocks 5,
    6. B shares A's first 20 tokens: the full group hits 20, the sliding group nothing, so
    the hit is 0 with 20 uncached and B's junction is 20: B's sliding group caches blocks 3,
    4 (the window ending at 20) besides 5, 6. C, sharing the same 20 tokens, then hits 20
    tokens in both groups; without the junction (B's boundary left 0) C hits nothing."""
    for keep_junction, c_hit in ((True, 20), (False, 0)):
        m = make(0, groups=FULL_SLIDING)
        admit(m, seq_of(1, (7, 30)))
        b = seq_of(2, (7, 20), (100, 10))
        ids, hit = m.get_computed_blocks(b)
        assert (hit, m.num_uncached_common_prefix_tokens) == (0, 20)
        b.shared_prefix_boundary = 20 if keep_junction else 0
        assert m.allocate_slots(b, 30) is not None
        b.num_computed_tokens = 30
        c_ids, got = m.get_computed_blocks(seq_of(3, (7, 20), (200, 10)))
        assert got == c_hit
        if keep_junction:
            b_sliding = m.group_block_ids(2)[1]
            assert c_ids[5:] == [0, 0, 0, b_sliding[3], b_sliding[4]]


@pytest.mark.parametrize(
    "groups", [(KVCacheGroupSpec(), KVCacheGroupSpec(attention_chunk_size=8))], ids=["chunked"]
)
def test_full_and_chunked_local_groups_stay_dense(groups):
    """0.33.0 sparsifies only sliding and Mamba groups: with retention 0 a full +
    chunked-local hybrid caches exactly what dense does."""
    seen = []
    for retention in (0, None):
        m = make(retention, groups=groups)
        for seq_id, segments in enumerate([((7, 30),), ((7, 20), (9, 13)), ((7, 30),)], 1):
            admit(m, seq_of(seq_id, *segments))
        seen.append((num_cached(m), [m.group_block_ids(i) for i in (1, 2, 3)]))
    assert seen[0] == seen[1]


def test_retention_before_0_33_0_is_refused():
    with pytest.raises(ValueError, match="prefix_cache_retention_interval: vLLM 0.26.0 has no"):
        make(0, window=9, pin="0.26.0")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 2), st.integers(1, 40), st.integers(1, 20)),
        min_size=1,
        max_size=12,
    ),
    st.sampled_from([1, 2, 4]),
    st.integers(1, 14),
    st.booleans(),
)
def test_sparse_caches_a_subset_and_never_hits_longer(requests, block_size, window, hybrid):
    """With a pool large enough that nothing is evicted, the same requests (a shared prefix of
    one of three streams, then their own tokens) leave the sparse manager's cache keys a
    subset of the dense manager's, each lookup hits no more than dense, and a replay of the
    last prompt hits as much as dense (the replay boundary's window is always kept)."""
    groups = FULL_SLIDING[:1] + (KVCacheGroupSpec(window),) if hybrid else ()
    sliding = None if hybrid else window
    sparse, dense = (
        make(r, groups, sliding, num_gpu_blocks=4000, block_size=block_size) for r in (0, None)
    )
    last = None
    for seq_id, (key, shared, own) in enumerate(requests, 1):
        segments = ((key, shared), (1000 + seq_id, own))
        _, sparse_hit = admit(sparse, seq_of(seq_id, *segments))
        _, dense_hit = admit(dense, seq_of(seq_id, *segments))
        assert sparse_hit <= dense_hit
        last = segments
    assert set(sparse.block_pool.cached_block_hash_to_block) <= set(
        dense.block_pool.cached_block_hash_to_block
    )
    replay = len(requests) + 1
    assert (
        sparse.get_computed_blocks(seq_of(replay, *last))[1]
        == dense.get_computed_blocks(seq_of(replay, *last))[1]
    )
