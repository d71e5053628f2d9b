"""Prefix caching over sink, R-SWA and circular-buffer groups (`sim.kv.v1_engine.variant_caching`):
examples worked by hand per release, the two kvsim bugs the lockstep found when a ring is
group 0, an invariant under random layouts, and the layout refusal. The lockstep against
the real managers is tests/vllm_real/test_full_variants_lockstep.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheGroupSpec
from sim.kv.v1_engine.variant_caching import split_variant_groups
from tests.kv.test_full_variants import FULL, RING, RSWA8, SINK8, decode_to, make, seq_of

SLIDING8 = KVCacheGroupSpec(8)


def test_split_variant_groups_docstring_example():
    assert split_variant_groups((FULL, RSWA8, RING)) == ([0, 1], [], [2])
    assert split_variant_groups((RING, SLIDING8, FULL)) == ([2], [1], [0])
    with pytest.raises(ValueError, match="beside a third attention type"):
        split_variant_groups((FULL, SINK8, SLIDING8))
    with pytest.raises(ValueError, match="beside a third attention type"):
        split_variant_groups((FULL, SINK8, KVCacheGroupSpec(sink_len=4)))
    with pytest.raises(ValueError, match="needs a full-attention group"):
        split_variant_groups((RING, SLIDING8))


@pytest.mark.parametrize(
    ("variant", "pin"), [(SINK8, "0.19.1"), (SINK8, "0.20.0"), (RSWA8, "0.25.1"), (RSWA8, "0.33.0")]
)
def test_a_resent_prompt_hits_in_the_full_and_the_variant_group(variant, pin):
    """bs=4, 13-token prompt: 3 full blocks cached per group, so a resend hits 12 tokens, the
    first three blocks of each of A's tables."""
    m = make(40, (FULL, variant), pin=pin, enable_prefix_caching=True)
    a = seq_of(1, 13)
    assert m.allocate_slots(a, 13) is not None
    tables = m.group_block_ids(1)
    m.free(a)
    ids, num_hit_tokens = m.get_computed_blocks(seq_of(1, 13))
    assert num_hit_tokens == 12
    assert ids == tables[0][:3] + tables[1][:3]


def test_a_hit_is_the_shortest_of_the_full_type_groups():
    """The R-SWA group's third block evicted, the full group's kept: the hit is 8 tokens in
    both (the simple hybrid's second type truncates the first)."""
    m = make(40, (FULL, RSWA8), enable_prefix_caching=True)
    a = seq_of(1, 13)
    m.allocate_slots(a, 13)
    rswa_third = m.group_block_ids(1)[1][2]
    m.free(a)
    m.block_pool._evict_cached_block(m.block_pool.blocks[rswa_third])  # its hash dropped
    ids, num_hit_tokens = m.get_computed_blocks(seq_of(1, 13))
    assert num_hit_tokens == 8 and len(ids) == 4


def test_a_ring_takes_no_part_in_a_hit_and_the_others_hit_without_it():
    """0.33.0, [ring, full]: the resend hits 2 full blocks (8 of 11 tokens), the ring none;
    the ring claims a fresh block on the first allocation."""
    m = make(40, (RING, FULL), enable_prefix_caching=True)
    a = seq_of(1, 11)
    m.allocate_slots(a, 11)
    ring_a, full_a = m.group_block_ids(1)
    m.free(a)
    b = seq_of(1, 11)
    b.seq_id = 2
    ids, num_hit_tokens = m.get_computed_blocks(b)
    assert (ids, num_hit_tokens) == (full_a[:2], 8)
    m.allocate_slots(b, 3, 8, ids)
    ring_b, full_b = m.group_block_ids(2)
    assert full_b[:2] == full_a[:2] and len(ring_b) == 1


def test_regression_ring_group_0_hit_taken_out_of_the_free_queue():
    """Found by the lockstep (0.33.0, [ring, ring, full], caching): kvsim touched the hits
    only when group 0 had any, so with a ring first the full group's evictable hits stayed
    in the free queue (35 free where vLLM has 33: 38 usable less 2 rings, 2 hits, 1 new)."""
    m = make(39, (RING, RING, FULL), enable_prefix_caching=True, max_model_len=13)
    a = seq_of(1, 12)
    m.allocate_slots(a, 12, num_lookahead_tokens=2)
    m.free(a)
    b = seq_of(1, 12)
    b.seq_id = 2
    ids, num_hit_tokens = m.get_computed_blocks(b)
    assert num_hit_tokens == 8
    assert m.allocate_slots(b, 4, 8, ids) is not None
    assert m.num_free_blocks == 33
    assert m.pool_stats().is_conserved


def test_regression_ring_group_0_admission_count_splits_hits_over_the_hit_groups():
    """The full-sequence count divided a hit's ids over every group, rings included: with
    [ring, full] and a 2-block hit it read 1 block per group. It must equal what the
    allocation then takes: 1 ring block + 1 new full block (the 2 hits are held)."""
    m = make(40, (RING, FULL), enable_prefix_caching=True)
    a = seq_of(1, 12)
    m.allocate_slots(a, 12)
    m.free(a)
    b = seq_of(1, 12)
    b.seq_id = 2
    ids, _ = m.get_computed_blocks(b)
    assert len(ids) == 2
    count = m.num_blocks_to_admit(b, ids, None)
    free_before = m.num_free_blocks
    m.allocate_slots(b, 4, 8, ids)
    assert count == free_before - m.num_free_blocks == 2 + 2  # 2 evictable hits, ring, 1 new


def test_rswa_gap_blocks_stay_cached_and_a_longer_resend_hits_them():
    """[full, rswa 8], bs=4: a 6-token prompt decoded to 25 tokens nulls R-SWA blocks 2 and
    3 (the gap) but they stay cached; a resend of all 25 tokens hits 6 blocks in both groups,
    the gap's two among them."""
    m = make(40, (FULL, RSWA8), enable_prefix_caching=True)
    a = seq_of(1, 6)
    m.allocate_slots(a, 6)
    decode_to(m, a, 25)
    rswa_table = m.group_block_ids(1)[1]
    assert rswa_table[2:4] == [0, 0]
    m.free(a)
    resend = seq_of(1, 25)
    resend.content = a.content
    ids, num_hit_tokens = m.get_computed_blocks(resend)
    assert num_hit_tokens == 24
    assert 0 not in ids[6:]  # the R-SWA group's hits are real blocks, the gap's included


@settings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(
        [
            ((FULL, SINK8), "0.20.0"),
            ((SINK8, FULL, FULL), "0.19.1"),
            ((FULL, RSWA8), "0.26.0"),
            ((RSWA8, RING, FULL), "0.33.0"),
            ((RING, SLIDING8, FULL), "0.33.0"),
        ]
    ),
    prompt=st.integers(2, 40),
    decodes=st.integers(0, 12),
)
def test_every_hit_group_gets_the_same_hit_and_a_ring_none(layout, prompt, decodes):
    """Invariant: after a request finishes, a resend of its prompt hits the same number of
    blocks in every group but a ring, those blocks are A's own (a sliding group's: where
    neither is null), and the pool is conserved."""
    groups, pin = layout
    m = make(120, groups, pin=pin, enable_prefix_caching=True)
    a = seq_of(1, prompt)
    m.allocate_slots(a, prompt)
    decode_to(m, a, prompt + decodes)
    tables = m.group_block_ids(1)
    m.free(a)
    b = seq_of(1, prompt)
    b.seq_id = 2
    ids, num_hit_tokens = m.get_computed_blocks(b)
    hit_groups = [i for i, g in enumerate(groups) if not g.circular_buffer]
    num_hit_blocks = num_hit_tokens // 4
    assert len(ids) == num_hit_blocks * len(hit_groups)
    for k, group_id in enumerate(hit_groups):
        share = ids[k * num_hit_blocks : (k + 1) * num_hit_blocks]
        own = tables[group_id][:num_hit_blocks]
        if groups[group_id].sliding_window is None:
            assert share == own
        else:  # a sliding hit pads with nulls; A's freed (null) entries may hit cached blocks
            assert all(h in (0, o) or o == 0 for h, o in zip(share, own, strict=True))
    if num_hit_tokens:
        assert m.allocate_slots(b, prompt - num_hit_tokens, num_hit_tokens, ids) is not None
    assert m.pool_stats().is_conserved
