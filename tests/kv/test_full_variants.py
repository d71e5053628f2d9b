"""Full attention's variants in the V1-engine model (`sim.kv.v1_engine.full_variants`): the
docstring examples worked by hand (sink blocks taken at construction, the R-SWA gap, the
circular buffer's one block), invariants under random steps, and the refusals. The lockstep
against the real managers is tests/vllm_real/test_full_variants_lockstep.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import Segment, Sequence, TokenContent, cdiv
from sim.kv.v1_engine import HybridKVCacheManager
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.full_variants import RSWAManager

FULL = KVCacheGroupSpec()
SINK8 = KVCacheGroupSpec(sink_len=8)
RSWA8 = KVCacheGroupSpec(rswa_window=8)
RING = KVCacheGroupSpec(circular_buffer=True)


def make(
    num_gpu_blocks: int,
    groups: tuple[KVCacheGroupSpec, ...],
    pin: str | None = "0.33.0",
    block_size: int = 4,
    **kwargs,
) -> HybridKVCacheManager:
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        kv_cache_groups=groups,
        vllm_pin=pin,
        **kwargs,
    )
    manager = make_manager("v1-engine", config)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def seq_of(seq_id: int, num_tokens: int, prompt_len: int | None = None) -> Sequence:
    content = TokenContent.from_segments([Segment(seq_id, num_tokens)])
    return Sequence(seq_id, content, prompt_len or content.num_tokens)


def decode_to(m: HybridKVCacheManager, seq: Sequence, length: int) -> list[list[int] | None]:
    """One-token steps until the sequence holds `length` tokens; each step's answer."""
    answers = []
    while seq.num_tokens < length:
        seq.num_computed_tokens = seq.num_tokens
        seq.append_tokens(1)
        answers.append(m.allocate_slots(seq, 1))
    seq.num_computed_tokens = seq.num_tokens
    return answers


# ---------------------------------------------------------------------------------- sink
def test_sink_docstring_example_blocks_taken_at_construction():
    m = make(10, (FULL, SINK8), pin="0.20.0")
    assert m.num_free_blocks == 7  # blocks 1, 2 taken: 3..9 free
    assert m.num_reserved_blocks == 3  # the null block and the two sink blocks
    a = seq_of(1, 6)
    assert m.allocate_slots(a, 6) == [3, 4, 5, 6]
    assert m.group_block_ids(1) == ([3, 4], [5, 6])
    m.free(a)
    assert m.num_free_blocks == 7  # the sink blocks never come back
    assert m.pool_stats().is_conserved


def test_sink_groups_each_take_their_own_blocks_in_group_order():
    m = make(20, (KVCacheGroupSpec(sink_len=4), FULL, SINK8), pin="0.19.1")
    sinks = [getattr(mgr, "sink_blocks", []) for mgr in m.coordinator.managers]
    assert [[b.block_id for b in s] for s in sinks] == [[1], [], [2, 3]]
    assert m.num_free_blocks == 20 - 1 - 3


def test_sink_too_large_for_the_pool_is_refused():
    with pytest.raises(ValueError, match="cannot reserve 2 blocks: only 1 free"):
        make(2, (FULL, SINK8), pin="0.20.0")


# ---------------------------------------------------------------------------------- R-SWA
def test_rswa_docstring_example_frees_the_gap():
    m = make(20, (FULL, RSWA8))
    a = seq_of(1, 6)
    assert m.allocate_slots(a, 6) == [1, 2, 3, 4]
    decode_to(m, a, 17)  # C=16 at the last step: window start max(6, 8) = 8 -> [2, 2)
    # Each 4-token boundary gives each group a block: full 5, 7, 9; R-SWA 6, 8, 10.
    assert m.group_block_ids(1)[1] == [3, 4, 6, 8, 10]
    decode_to(m, a, 21)  # the step at C=20: max(6, 12) = 12 -> block 2 freed
    # 0.33.0 puts the freed (uncached) block 6 at the queue's head: the full group takes it.
    assert m.group_block_ids(1) == ([1, 2, 5, 7, 9, 6], [3, 4, 0, 8, 10, 11])
    decode_to(m, a, 25)  # C=24: [2, 4) -> block 3 freed, the walk stops at block 2
    assert m.group_block_ids(1) == ([1, 2, 5, 7, 9, 6, 8], [3, 4, 0, 0, 10, 11, 12])
    assert m.num_seq_blocks(1) == 7 + 5  # full 7, R-SWA 7 less 2 nulls
    assert m.max_seq_footprint(a) == m.num_seq_blocks(1)


def test_rswa_manager_alone_matches_the_docstring_numbers():
    r = RSWAManager(BlockPool(12, False), 4, 8)
    r.allocate_new_blocks(1, 28)  # 7 blocks: 1..7
    r.remove_skipped_blocks(1, 24)  # without the prompt length: full attention's no-op
    assert r.num_null_blocks(1) == 0
    r.remove_skipped_blocks(1, 24, 6)
    assert [b.block_id for b in r.req_to_blocks[1]] == [1, 2, 0, 0, 5, 6, 7]
    assert r.num_freed_blocks_of(1, 24) == 2
    assert r.next_freeing_decode_len(1) == (4 + 1) * 4 + 8 + 1  # C=28 frees block 4
    assert r.admission_cap_blocks(64, 128) is None  # counted as full attention


@settings(max_examples=60, deadline=None)
@given(
    prompt=st.integers(1, 40),
    window=st.integers(1, 24),
    block_size=st.sampled_from([1, 2, 4, 8]),
    decodes=st.integers(0, 60),
)
def test_rswa_keeps_the_prompt_and_the_window_and_nothing_between(
    prompt, window, block_size, decodes
):
    """After every step: each prompt block and each block from the window's start on is a
    real block; every block wholly between them is null; the pool holds exactly the tables'
    real blocks (plus the null block)."""
    m = make(400, (KVCacheGroupSpec(rswa_window=window), FULL), block_size=block_size)
    a = seq_of(1, prompt)
    assert m.allocate_slots(a, prompt) is not None
    a.num_computed_tokens = prompt
    for _ in range(decodes):
        a.append_tokens(1)
        assert m.allocate_slots(a, 1) is not None
        c = a.num_computed_tokens  # what remove_skipped_blocks saw
        a.num_computed_tokens = a.num_tokens
        table = m.group_block_ids(1)[0]
        first_gap = cdiv(prompt, block_size)
        last_gap = min(max(prompt, c - window) // block_size, len(table))
        for index, block_id in enumerate(table):
            in_gap = first_gap <= index < last_gap
            assert (block_id == 0) == in_gap, (index, table, c)
    held = m.num_seq_blocks(1)
    assert m.block_pool.num_held_blocks == 1 + held
    assert m.max_seq_footprint(a) == held


# -------------------------------------------------------------------------- circular buffer
def test_circular_buffer_docstring_one_block_for_life():
    m = make(20, (FULL, RING))
    a = seq_of(1, 6)
    assert m.allocate_slots(a, 6) == [1, 2, 3]
    assert decode_to(m, a, 14) == [[], [], [4], [], [], [], [5], []]
    assert m.group_block_ids(1) == ([1, 2, 4, 5], [3])
    assert m.num_blocks_to_admit(seq_of(2, 40), [], 64) == 10 + 1
    assert m.num_blocks_to_admit(a, [], 64) == 0
    m.free(a)
    assert m.block_pool.num_held_blocks == 1


@settings(max_examples=40, deadline=None)
@given(steps=st.lists(st.integers(1, 30), min_size=1, max_size=15))
def test_every_live_request_holds_exactly_one_ring_block(steps):
    m = make(200, (RING, FULL, RSWA8))
    seqs: dict[int, Sequence] = {}
    for step_index, n in enumerate(steps):
        key = step_index % 3
        seq = seqs.setdefault(key, seq_of(key + 1, 100, prompt_len=20))
        n = min(n, seq.num_tokens - seq.num_computed_tokens)
        if n <= 0:
            m.free(seq)
            seqs.pop(key)
            continue
        if m.allocate_slots(seq, n) is not None:
            seq.num_computed_tokens += n
        for live in seqs.values():
            ring = m.group_block_ids(live.seq_id)[0]
            assert len(ring) == (1 if live.num_computed_tokens else 0)
            assert 0 not in ring


# --------------------------------------------------------------------------------- refusals
@pytest.mark.parametrize(
    ("groups", "pin", "message"),
    [
        ((FULL, SINK8), "0.11.0", "vLLM 0.11.0 has no 'sink 8' group"),
        ((FULL, SINK8), "0.25.1", "cannot start a model with a 'sink 8' group"),
        ((FULL, SINK8), "0.33.0", "SinkFullAttentionManager raises TypeError"),
        ((FULL, RSWA8), "0.20.0", "has no 'rswa 8' group .*from vLLM 0.25.1 on"),
        ((FULL, RING), "0.26.0", "has no 'circular buffer' group .*0.33.0 only"),
        ((RING,), "0.33.0", "'circular buffer' layers alone"),
    ],
    ids=["sink-0.11", "sink-0.25", "sink-0.33", "rswa-0.20", "ring-0.26", "ring-alone"],
)
def test_refusals_name_the_type_and_the_release(groups, pin, message):
    with pytest.raises(ValueError, match=f"kv_cache_groups: .*{message}"):
        make(20, groups, pin=pin)


def test_refusals_of_caching_and_bad_specs():
    # Caching over a sink or R-SWA group beside a third type (`variant_caching`).
    with pytest.raises(ValueError, match="enable_prefix_caching: .*beside a third attention"):
        make(20, (FULL, RSWA8, KVCacheGroupSpec(8)), enable_prefix_caching=True)
    with pytest.raises(ValueError, match="sink_len must be a positive multiple"):
        make(20, (FULL, KVCacheGroupSpec(sink_len=6)), pin="0.20.0")
    with pytest.raises(ValueError, match="a KV-cache group is one of"):
        KVCacheGroupSpec(rswa_window=8, circular_buffer=True)
    with pytest.raises(ValueError, match="rswa_window must be positive"):
        KVCacheGroupSpec(rswa_window=0)
