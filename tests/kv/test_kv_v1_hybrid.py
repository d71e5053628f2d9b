"""Hybrid KV-cache groups in the V1-engine model: the layout vLLM derives, exact block ids per
group on hand-worked cases, and invariants over random schedules."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.protocol import V1KVCacheManager
from sim.kv.types import Segment, Sequence, TokenContent, cdiv
from sim.kv.v1_engine import HybridKVCacheManager, KVCacheManager, make_kv_cache_manager
from sim.kv.v1_engine.hybrid_layout import alternating_layer_windows, hybrid_layout

BS = 4
SLIDING_FULL = (KVCacheGroupSpec(8), KVCacheGroupSpec(None))


def make(num_gpu_blocks: int, groups=SLIDING_FULL, **kwargs) -> HybridKVCacheManager:
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks, block_size=BS, kv_cache_groups=groups, **kwargs
    )
    manager = make_manager("v1-engine", config)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def seq_of(seq_id: int, *segments: tuple[int, int]) -> Sequence:
    content = TokenContent.from_segments([Segment(k, n) for k, n in segments])
    return Sequence(seq_id, content, content.num_tokens)


def free_ids(m: HybridKVCacheManager) -> list[int]:
    return m.block_pool.free_block_queue.ids()


# ------------------------------------------------------------------------------ layout
def test_gemma2_layout_is_sliding_group_then_full_group():
    layout = hybrid_layout(alternating_layer_windows(42, 4096))
    assert layout.groups == (KVCacheGroupSpec(4096), KVCacheGroupSpec(None))
    assert layout.group_size == 21 and layout.num_padding_layers == 0
    assert layout.group_layers[0] == tuple(range(0, 42, 2))
    assert layout.group_layers[1] == tuple(range(1, 42, 2))
    # 20,000 blocks are reported as 20,000 // 2 * 16 tokens.
    assert layout.reported_tokens(20_000, 16) == 160_000
    # available // page // group_size: 21 layers of 1 KiB pages per block.
    assert layout.num_blocks(21 * 1024 * 100 + 5, 1024) == 100


def test_gemma3_five_to_one_layout_has_five_sliding_groups():
    windows = [None if i % 6 == 5 else 1024 for i in range(12)]
    layout = hybrid_layout(windows)
    assert layout.group_size == 2
    assert [g.sliding_window for g in layout.groups] == [1024] * 5 + [None]
    # sliding layers 0-4, 6-10 split as layers[i::5]; the full group is layers 5 and 11.
    assert layout.group_layers[0] == (0, 6) and layout.group_layers[4] == (4, 10)
    assert layout.group_layers[5] == (5, 11)


def test_uneven_pattern_pads_the_last_group():
    # 2 full + 3 sliding (upstream's docstring case): (full.0, full.1), (sw.0, sw.2), (sw.1,)
    layout = hybrid_layout([None, None, 8, 8, 8])
    assert layout.group_layers == ((0, 1), (2, 4), (3,))
    assert layout.num_padding_layers == 1


def test_factory_picks_the_manager_by_group_count():
    one = make_kv_cache_manager(
        KVCacheConfig(num_gpu_blocks=9, block_size=BS, kv_cache_groups=(KVCacheGroupSpec(8),))
    )
    assert isinstance(one, KVCacheManager) and one.sliding_window == 8
    assert isinstance(make(9), V1KVCacheManager)
    with pytest.raises(ValueError, match="KV-cache groups given"):
        KVCacheManager(KVCacheConfig(num_gpu_blocks=9, kv_cache_groups=SLIDING_FULL))


@pytest.mark.parametrize(
    "groups",
    [
        (KVCacheGroupSpec(8), KVCacheGroupSpec(16), KVCacheGroupSpec(None)),  # two windows
        (KVCacheGroupSpec(8), KVCacheGroupSpec(8)),  # no full-attention group
        (KVCacheGroupSpec(8), KVCacheGroupSpec(None), KVCacheGroupSpec(8)),  # interleaved
    ],
)
def test_unsupported_group_sets_are_refused_as_upstream_asserts(groups):
    with pytest.raises(ValueError):
        make(9, groups)


# ------------------------------------------------------------------ exact block ids
def test_worked_example_exact_block_ids_per_group():
    """The module docstring of `hybrid_manager` (W=4, no caching)."""
    m = make(9, (KVCacheGroupSpec(4), KVCacheGroupSpec(None)))
    a = seq_of(1, (1, 8))
    assert m.allocate_slots(a, 8) == [1, 2, 3, 4]
    assert m.group_block_ids(1) == ([1, 2], [3, 4])
    assert free_ids(m) == [5, 6, 7, 8]
    a.num_computed_tokens = 8
    a.append_tokens(1)
    # Block 1 leaves the window (first useful block (8 - 4 + 1) // 4 = 1) before the step
    # takes one block per group from the head.
    assert m.allocate_slots(a, 1) == [5, 6]
    assert m.group_block_ids(1) == ([0, 2, 5], [3, 4, 6])
    assert free_ids(m) == [7, 8, 1]
    assert m.num_seq_blocks(1) == 5 and m.max_seq_footprint(a) == 3 + 3 - 1
    b = seq_of(2, (2, 8))
    assert m.allocate_slots(b, 8) is None  # 2 + 2 > 3, and nothing changed
    assert free_ids(m) == [7, 8, 1] and m.group_block_ids(2) == ([], [])
    # Group 0 held 2 then 3 - 1 = 2 blocks; group 1 held 2 then 3.
    assert m.group_peak_held_blocks() == [2, 3]
    m.free(a)
    assert free_ids(m) == [7, 8, 1, 5, 2, 6, 4, 3]
    assert m.group_num_held_blocks() == [0, 0] and m.group_peak_held_blocks() == [2, 3]


def test_hybrid_prefix_hit_pads_the_sliding_group_with_nulls():
    """Hand-worked (bs=4, W=8, group 0 sliding, group 1 full, caching, 10 blocks):

    A (12 tokens) takes g0 [1,2,3], g1 [4,5,6], all cached. Its decode at C=12 frees block 1
    (first useful block (12 - 8 + 1) // 4 = 1) and takes 7 (g0) and 8 (g1); C (4 tokens)
    then takes 9 and 1, evicting g0's cached h0. After A is freed, B with A's 12 tokens plus
    4 more hits 3 blocks: the full group's h0..h2 = [4, 5, 6]; the sliding group needs
    cdiv(8 - 1, 4) = 2 contiguous blocks, found at h1, h2 = [2, 3], so [NULL, 2, 3].
    """
    m = make(10, enable_prefix_caching=True)
    a = seq_of(1, (1, 12))
    assert m.allocate_slots(a, 12) == [1, 2, 3, 4, 5, 6]
    a.num_computed_tokens = 12
    a.append_tokens(1)
    assert m.allocate_slots(a, 1) == [7, 8]
    assert free_ids(m) == [9, 1]
    c = seq_of(3, (3, 4))
    assert m.allocate_slots(c, 4) == [9, 1]
    m.free(a)
    assert free_ids(m) == [7, 3, 2, 8, 6, 5, 4]
    b = seq_of(2, (1, 12), (2, 4))
    hit_ids, hit_tokens = m.get_computed_blocks(b)
    assert (hit_ids, hit_tokens) == ([0, 2, 3, 4, 5, 6], 12)
    # Needs 1 new + 2 evictable hits (g0) and 1 new + 3 evictable hits (g1) = 7 = free.
    assert m.allocate_slots(b, 4, hit_tokens, hit_ids) == [7, 8]
    assert m.group_block_ids(2) == ([0, 2, 3, 7], [4, 5, 6, 8])
    assert m.num_free_blocks == 0


def test_full_group_hit_is_truncated_to_the_sliding_hit():
    """bs=4, W=8 (2 contiguous blocks needed), 8 blocks, caching.

    A (12 tokens): g0 [1,2,3], g1 [4,5,6]; free [7]. free(A) -> [7, 3, 2, 1, 6, 5, 4].
    D (4 tokens) takes 7 (g0) and 3 (g1), evicting g0's h2. B with A's 12 tokens plus 4:
    the full group hits h0..h2 (3 blocks); the sliding group, within 12 tokens, misses h2
    and finds the run h1, h0 = [1, 2]: 8 tokens, so the full hit is cut to [4, 5].
    """
    m = make(8, enable_prefix_caching=True)
    a = seq_of(1, (1, 12))
    assert m.allocate_slots(a, 12) == [1, 2, 3, 4, 5, 6]
    m.free(a)
    assert free_ids(m) == [7, 3, 2, 1, 6, 5, 4]
    d = seq_of(4, (4, 4))
    assert m.allocate_slots(d, 4) == [7, 3]  # evicts g0's h2 (block 3)
    b = seq_of(2, (1, 12), (2, 4))
    # Full hit 3 blocks; sliding within 12 tokens: h2 missing, run h1, h0 = 2 blocks -> 8.
    assert m.get_computed_blocks(b) == ([1, 2, 4, 5], 8)


# ---------------------------------------------------------------------- invariants
def _check_invariants(m: HybridKVCacheManager) -> None:
    """Blocks across groups: every held block is in exactly one group, its refcount is the
    number of tables holding it (sharing only by prefix caching), free + used == pool."""
    holders: dict[int, int] = {}
    group_of: dict[int, int] = {}
    for group_id, manager in enumerate(m.coordinator.managers):
        for table in manager.req_to_blocks.values():
            ids = [b.block_id for b in table if not b.is_null]
            assert len(ids) == len(set(ids)), "a table repeats a block"
            for block_id in ids:
                assert group_of.setdefault(block_id, group_id) == group_id, "block in two groups"
                holders[block_id] = holders.get(block_id, 0) + 1
    assert m.group_num_held_blocks() == m.coordinator.num_held_blocks
    assert all(
        peak >= held
        for peak, held in zip(
            m.coordinator.peak_held_blocks, m.coordinator.num_held_blocks, strict=True
        )
    )
    refcounts = m.block_refcounts()
    assert {b: r for b, r in refcounts.items() if b != 0} == holders
    if not m.enable_caching:
        assert all(count == 1 for count in holders.values())
    stats = m.pool_stats()
    assert stats.num_free + stats.num_held == stats.num_total
    assert stats.num_held == len(holders) + 1  # + the null block
    assert set(free_ids(m)).isdisjoint(holders)


GROUP_SETS = [
    (KVCacheGroupSpec(8), KVCacheGroupSpec(None)),
    (KVCacheGroupSpec(None), KVCacheGroupSpec(6)),
    (KVCacheGroupSpec(13), KVCacheGroupSpec(13), KVCacheGroupSpec(None)),
]
#: Llama-4's shape (chunked-local groups, then full), and a chunk that is not a block multiple.
CHUNKED_SETS = [
    (
        KVCacheGroupSpec(attention_chunk_size=8),
        KVCacheGroupSpec(attention_chunk_size=8),
        KVCacheGroupSpec(None),
    ),
    (KVCacheGroupSpec(None), KVCacheGroupSpec(attention_chunk_size=6)),
]
#: (groups, pin): chunked-local groups are modelled from 0.11.0 on (0.11.0 keeps the last
#: cached block at a chunk boundary; 0.19.1 on do not).
LAYOUTS = [(groups, None) for groups in GROUP_SETS] + [
    (groups, pin) for groups in CHUNKED_SETS for pin in ("0.11.0", "0.20.0", "0.33.0")
]
OP_STRATEGY = st.tuples(
    st.sampled_from(["step", "step", "step", "preempt", "finish", "new"]),
    st.integers(0, 3),  # request slot
    st.integers(1, 24),  # chunk tokens / shared-prefix tokens
    st.sampled_from([0, 1, 1, 2]),  # shared-prefix key (0: none)
)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(OP_STRATEGY, min_size=5, max_size=60),
    num_gpu_blocks=st.integers(2, 24),
    layout=st.sampled_from(LAYOUTS),
    caching=st.booleans(),
)
def test_property_random_hybrid_schedules(ops, num_gpu_blocks, layout, caching):
    groups, pin = layout
    m = make(num_gpu_blocks, groups, enable_prefix_caching=caching, vllm_pin=pin)
    num_groups = len(groups)
    seqs: dict[int, Sequence] = {}
    running: set[int] = set()
    next_id = 0
    for kind, slot, num_tokens, prefix_key in ops:
        if kind == "new" or (slot not in seqs and kind == "step"):
            if slot in seqs:
                m.free(seqs[slot])
            next_id += 1
            prompt = [(prefix_key, num_tokens)] if prefix_key else []
            seqs[slot] = seq_of(next_id, *prompt, (1000 + next_id, 1 + (5 * num_tokens) % 40))
            running.discard(slot)
            continue
        seq = seqs.get(slot)
        if seq is None:
            continue
        if kind in ("preempt", "finish"):
            m.free(seq)
            running.discard(slot)
            seq.num_computed_tokens = 0
            if kind == "finish":
                del seqs[slot]
        else:
            hit_ids, hit_tokens = ([], 0) if slot in running else m.get_computed_blocks(seq)
            assert len(hit_ids) == num_groups * hit_tokens // BS
            num_new = min(num_tokens, seq.num_tokens - seq.num_computed_tokens - hit_tokens)
            free_before = m.num_free_blocks
            result = m.allocate_slots(seq, num_new, hit_tokens, hit_ids)
            event("prefix hit" if hit_ids else "no hit")
            event("step failed" if result is None else "step allocated")
            if result is None:
                assert m.num_free_blocks >= free_before  # only window frees happened
            else:
                running.add(slot)
                seq.num_computed_tokens += hit_tokens + num_new
                for table in m.group_block_ids(seq.seq_id):
                    assert len(table) == cdiv(seq.num_computed_tokens, BS)
                assert m.num_seq_blocks(seq.seq_id) <= m.max_seq_footprint(seq)
                if seq.num_computed_tokens == seq.num_tokens:
                    seq.append_tokens(1)
        _check_invariants(m)
    for seq in seqs.values():
        m.free(seq)
    _check_invariants(m)
    assert m.num_free_blocks == num_gpu_blocks - 1


def test_full_sequence_admission_count_sums_the_groups():
    """0.33.0's gate over two groups (bs=4, W=8, no hits, 8 tokens in flight): a 40-token
    prompt needs cdiv(40, 4) = 10 full-group blocks, and the sliding group is capped at
    cdiv(min(8 - 1 + 8, 40), 4) + 1 = 5: 15 in all."""
    m = make(32, vllm_pin="0.33.0")
    assert m.num_blocks_to_admit(seq_of(1, (1, 40)), [], 8) == 15


# ------------------------------------------------------------------------------ audit
def test_full_audit_accounts_for_blocks_across_groups():
    from sim.audit import AuditLevel
    from sim.audit.v1 import AuditedV1Manager
    from sim.audit.violations import ViolationKind

    m = make(9, (KVCacheGroupSpec(4), KVCacheGroupSpec(None)))
    audited = AuditedV1Manager(m, level=AuditLevel.FULL)
    a = seq_of(1, (1, 8))
    audited.allocate_slots(a, 8)
    assert audited.violations == []
    # A bug that drops a block from group 1's table without freeing it: the pool still holds
    # 4 blocks (+ null) but the groups' tables hold 2 + 1.
    m.coordinator.managers[1].req_to_blocks[1].pop()
    audited.get_computed_blocks(a)
    kinds = [v.kind for v in audited.violations]
    assert kinds == [ViolationKind.LEAKED_BLOCKS]
    assert "2 + 1 = 3" in audited.violations[0].message


# ------------------------------------------------------------------- decode fast path
def test_decode_touch_len_worked_example():
    """`HybridKVCacheManager.decode_touch_len`'s docstring: 12 (block 0 leaves the window)."""
    m = make(20)
    seq = seq_of(1, (1, 10))
    assert m.allocate_slots(seq, 10) is not None
    assert m.decode_touch_len(seq) == 12


def _structural_hybrid(m: HybridKVCacheManager, seq_ids) -> tuple:
    pool = m.block_pool
    return (
        m.pool_stats(),
        m.block_refcounts(),
        pool.free_block_queue.ids(),
        [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks],
        {h: list(ids) for h, ids in pool.cached_block_hash_to_block.items()},
        {s: m.group_block_ids(s) for s in seq_ids},
        [dict(manager.num_cached_block) for manager in m.coordinator.managers],
        {s: [list(h) for h in hashes] for s, hashes in m.req_to_block_hashes.items()},
        list(m.coordinator.num_held_blocks),
        list(m.coordinator.peak_held_blocks),
    )


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("caching", [False, True])
def test_hybrid_skipping_quiet_decodes_is_exact(monkeypatch, layout, caching):
    """tests/harness/fast_path_drivers.py's A/B replay (A called on every decode, B skipping the
    decodes its `decode_touch_len` declares quiet) over hybrid managers: identical pools,
    caches, per-group tables and counters, and every skipped decode was quiet on A."""
    from tests.harness.fast_path_drivers import run_v1
    from tests.harness.fast_path_pair import STRUCTURAL

    monkeypatch.setitem(STRUCTURAL, "v1-engine", _structural_hybrid)
    num_quiet = num_refused = 0
    for seed in range(4):
        config = KVCacheConfig(
            num_gpu_blocks=40,
            block_size=BS,
            enable_prefix_caching=caching,
            kv_cache_groups=layout[0],
            vllm_pin=layout[1],
        )
        pair = run_v1(config, seed, num_ops=800)
        num_quiet += pair.num_quiet
        num_refused += pair.num_refused
    assert num_quiet > 0 and num_refused > 0
