"""The decode fast path (`decode_touch_len` / `sync_decode`) changes nothing observable.

For every design, two identical managers run the same random workload: A is called on every
decode step; B skips the steps its own `decode_touch_len` declared quiet and calls
`sync_decode` before each real call. On each skipped step A's answer must be the quiet one
(v0: `can_append_slots == free >= 1` and `append_slots` changes nothing; V1 engine:
`allocate_slots` returns [] and changes nothing). After every real call on B, and at the
end, A and B must agree on pools, refcounts, tables, caches, evictors and the per-sequence
bookkeeping of the sequence just called.

The cases: fixed grids (`V0_CASES`, `V1_CASES`: prefix caching, sliding windows, swap and
fork), the same drawn by hypothesis (shrinkable), and v0 decodes that reserve lookahead
slots. The pair and its snapshots: tests/harness/fast_path_pair.py; the drivers (`run_v0`,
`run_v1`): tests/harness/fast_path_drivers.py. Whole replays with the shortcuts on and off:
tests/scheduler/test_decode_cohort.py.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.audit.auditor import AuditedV0Manager, AuditedV1Manager
from sim.kv.config import KVCacheConfig, make_manager
from sim.kv.types import (
    Sequence,
    SequenceGroup,
    SequenceStatus,
    TokenContent,
    cdiv,
)
from tests.harness.fast_path_drivers import run_v0, run_v1
from tests.harness.fast_path_pair import Pair

# ----------------------------------------------------------------------------- tests


def tight_pool(block_size: int, window: int | None, num_blocks: int, ring: bool = False) -> int:
    """A pool small enough that decodes sometimes find no free block; a window's small
    footprint needs a smaller pool: bs=4, W=4 -> 12 blocks (a v0-V1 ring of 1 block: 5)."""
    if window is None:
        return num_blocks
    if ring:
        return min(num_blocks, 5 * cdiv(window, block_size))
    return min(num_blocks, 4 * (cdiv(window, block_size) + 2))


V0_CASES = [
    # (design, block_size, sliding_window, prefix caching, swap allowed)
    *[(d, bs, None, False, True) for d in ("v0-v1", "v0-v2", "v0-fixed") for bs in (4, 16)],
    *[(d, bs, None, True, True) for d in ("v0-v1", "v0-v2", "v0-fixed") for bs in (4, 16)],
    *[("v0-v1", bs, w, False, False) for bs in (4, 16) for w in (4, 7, 24, 64)],
    *[("v0-v2", bs, w, False, False) for bs in (4, 16) for w in (4, 7, 24, 64)],
    *[("v0-fixed", bs, w, False, True) for bs in (4, 16) for w in (4, 7, 24, 64)],
]


@pytest.mark.parametrize(("design", "block_size", "window", "caching", "swap"), V0_CASES)
def test_v0_skipping_quiet_decodes_is_exact(design, block_size, window, caching, swap):
    num_quiet = num_refused = 0
    for seed in range(5):
        # A tight pool, so can_append_slots is sometimes False and preemption happens.
        num_gpu_blocks = tight_pool(
            block_size, window, 14 if block_size == 16 else 40, ring=design == "v0-v1"
        )
        config = KVCacheConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            num_cpu_blocks=num_gpu_blocks,
            sliding_window=window,
            enable_prefix_caching=caching,
            watermark=0.0,
        )
        pair = run_v0(design, config, seed, num_ops=1000, allow_swap=swap, allow_fork=swap)
        num_quiet += pair.num_quiet
        num_refused += pair.num_refused
    assert num_quiet > 0 and num_refused > 0


V1_CASES = [
    (bs, w, caching) for bs in (4, 16) for w in (None, 4, 7, 24, 64) for caching in (False, True)
]


@pytest.mark.parametrize(("block_size", "window", "caching"), V1_CASES)
def test_v1_engine_skipping_quiet_decodes_is_exact(block_size, window, caching):
    num_quiet = num_refused = 0
    for seed in range(5):
        num_gpu_blocks = tight_pool(block_size, window, 14 if block_size == 16 else 40) - 1
        config = KVCacheConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=block_size,
            sliding_window=window,
            enable_prefix_caching=caching,
        )
        pair = run_v1(config, seed, num_ops=1000)
        num_quiet += pair.num_quiet
        num_refused += pair.num_refused
    assert num_quiet > 0 and num_refused > 0


# ----------------------------------------------------------------------------- hypothesis


@st.composite
def v0_configs(draw) -> tuple[str, KVCacheConfig, bool, bool]:
    """A v0 design and cache the way `V0_CASES` combines them, drawn (so shrinkable), plus
    whether swap/fork and lookahead slots are allowed (v0-v1 refuses lookahead, as vLLM's
    BlockSpaceManagerV1 does; v0 refuses a sliding window with prefix caching)."""
    design = draw(st.sampled_from(["v0-v1", "v0-v2", "v0-fixed"]))
    block_size = draw(st.sampled_from([1, 2, 4, 16]))
    window = draw(st.one_of(st.none(), st.integers(1, 64)))
    caching = window is None and draw(st.booleans())
    swap = (window is None or design == "v0-fixed") and draw(st.booleans())
    lookahead = design != "v0-v1" and draw(st.booleans())
    num_gpu_blocks = draw(st.integers(4, 40))
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        num_cpu_blocks=num_gpu_blocks,
        sliding_window=window,
        enable_prefix_caching=caching,
        watermark=0.0,
    )
    return design, config, swap, lookahead


@settings(max_examples=50, deadline=None)
@given(case=v0_configs(), seed=st.integers(0, 2**16), num_ops=st.integers(1, 400))
def test_v0_skipping_quiet_decodes_is_exact_on_drawn_configs(case, seed, num_ops):
    design, config, swap, lookahead = case
    run_v0(design, config, seed, num_ops, allow_swap=swap, allow_fork=swap,
           allow_lookahead=lookahead)  # fmt: skip


@settings(max_examples=50, deadline=None)
@given(
    block_size=st.sampled_from([1, 2, 4, 16]),
    window=st.one_of(st.none(), st.integers(1, 64)),
    caching=st.booleans(),
    num_gpu_blocks=st.integers(4, 40),
    seed=st.integers(0, 2**16),
    num_ops=st.integers(1, 400),
)
def test_v1_engine_skipping_quiet_decodes_is_exact_on_drawn_configs(
    block_size, window, caching, num_gpu_blocks, seed, num_ops
):
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=block_size,
        sliding_window=window,
        enable_prefix_caching=caching,
    )
    run_v1(config, seed, num_ops)


@pytest.mark.parametrize(("design", "block_size", "window"), [
    ("v0-v2", 4, None), ("v0-v2", 16, 24), ("v0-fixed", 4, None), ("v0-fixed", 16, 24)
])  # fmt: skip
def test_v0_lookahead_slots_end_the_quiet_stretch(design, block_size, window):
    """With lookahead decodes mixed in, A and B still agree, and the mix did happen."""
    num_quiet = 0
    swap = window is None or design == "v0-fixed"  # v0-V2 forks after a drop are undefined
    for seed in range(5):
        config = KVCacheConfig(
            num_gpu_blocks=40, block_size=block_size, num_cpu_blocks=40, sliding_window=window
        )
        pair = run_v0(design, config, seed, 1000, allow_swap=swap, allow_fork=swap,
                      allow_lookahead=True)  # fmt: skip
        num_quiet += pair.num_quiet
    assert num_quiet > 0


# ----------------------------------------------------------------------------- quiet fraction


def plain_decode_quiet_fraction(
    design: str, config: KVCacheConfig, num_seqs: int, num_steps: int
) -> float:
    """Round-robin decode of `num_seqs` sequences in a roomy pool; the fraction skipped."""
    rng = random.Random(7)
    pair = Pair(design, config)
    seqs = []
    for seq_id in range(num_seqs):
        seq = Sequence.new(seq_id, rng.randint(1, 300))
        if design == "v1-engine":
            assert pair.a.allocate_slots(seq, seq.num_tokens) is not None
            assert pair.b.allocate_slots(seq, seq.num_tokens) is not None
        else:
            group = SequenceGroup(seq_id, [seq])
            pair.a.allocate(group)
            pair.b.allocate(group)
            seq.status = SequenceStatus.RUNNING
        pair.refresh(seq)
        seq.num_computed_tokens = seq.num_tokens
        seq.append_tokens(1)
        seqs.append(seq)
    v1 = design == "v1-engine"
    for _ in range(num_steps):
        for seq in seqs:
            pair.num_decodes += 1
            # A is called on every step; B only at touches.
            result_a = pair.a.allocate_slots(seq, 1) if v1 else pair.a.append_slots(seq)
            if pair.is_quiet(seq):
                pair.num_quiet += 1
                assert result_a == []
            else:
                pair.sync(seq)
                result_b = pair.b.allocate_slots(seq, 1) if v1 else pair.b.append_slots(seq)
                assert result_b == result_a
                pair.refresh(seq)
                pair.check([s.seq_id for s in seqs], seq.seq_id)
            seq.num_computed_tokens = seq.num_tokens
            seq.append_tokens(1)
    pair.finish_check(seqs)
    return pair.num_quiet / pair.num_decodes


@pytest.mark.parametrize("design", ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"])
@pytest.mark.parametrize(("window", "caching"), [(None, False), (None, True), (64, False)])
def test_plain_decode_is_mostly_quiet(design, window, caching):
    if design != "v1-engine" and window is not None and caching:
        pytest.skip("v0 forbids prefix caching with a sliding window")
    config = KVCacheConfig(
        num_gpu_blocks=400, block_size=16, sliding_window=window, enable_prefix_caching=caching
    )
    fraction = plain_decode_quiet_fraction(design, config, num_seqs=8, num_steps=200)
    # Touches: one per 16-token block (two with caching or a window); the rest is quiet.
    assert fraction > (0.8 if (window is None and not caching) else 0.75), fraction


def test_audited_managers_pass_the_capability_through():
    for design in ("v0-v1", "v0-v2", "v0-fixed"):
        inner = make_manager(design, KVCacheConfig(num_gpu_blocks=10))
        audited = AuditedV0Manager(inner)
        assert audited.decode_touch_len == inner.decode_touch_len
        assert audited.sync_decode == inner.sync_decode
    inner = make_manager("v1-engine", KVCacheConfig(num_gpu_blocks=10))
    audited = AuditedV1Manager(inner)
    assert audited.decode_touch_len == inner.decode_touch_len
    assert audited.num_calls == 0

    class WithoutCapability:
        """A manager without the optional methods (like a real-vLLM adapter)."""

    bare = AuditedV0Manager(WithoutCapability())
    assert getattr(bare, "decode_touch_len", None) is None
    assert getattr(bare, "sync_decode", None) is None


# ----------------------------------------------------------------------------- worked examples


def _v0_admit(manager, seq_id: int, prompt: int | TokenContent) -> Sequence:
    seq = Sequence.new(seq_id, prompt)
    manager.allocate(SequenceGroup(seq_id, [seq]))
    seq.status = SequenceStatus.RUNNING
    return seq


def _prefill_done(seq: Sequence) -> None:
    """The prompt is computed and the first token sampled."""
    seq.num_computed_tokens = seq.num_tokens
    seq.append_tokens(1)


def test_v0_v1_touch_points_bs16():
    m = make_manager("v0-v1", KVCacheConfig(num_gpu_blocks=20, block_size=16))
    seq = _v0_admit(m, 0, 20)
    assert m.decode_touch_len(seq) == 33  # 2 blocks: 21..32 quiet, block 3 at 33
    ring = make_manager("v0-v1", KVCacheConfig(num_gpu_blocks=20, block_size=16, sliding_window=24))
    seq = _v0_admit(ring, 0, 64)
    assert ring.get_block_table(seq) == [19, 18, 19, 18]
    assert ring.decode_touch_len(seq) == 65  # the ring still grows at 65 (reusing block 19)


def test_v0_v1_content_keyed_prompt_tail_is_never_skipped():
    """Regression: an identical prompt shares the first prompt's partial tail (keyed by the
    whole prompt's hash), so the next append of either copies on write."""
    m = make_manager(
        "v0-v1", KVCacheConfig(num_gpu_blocks=20, block_size=16, enable_prefix_caching=True)
    )
    a = _v0_admit(m, 0, TokenContent.unique(7, 20))
    assert m.decode_touch_len(a) == 20  # the tail is content-keyed: call every decode
    a.num_computed_tokens = 20
    a.append_tokens(1)
    b = _v0_admit(m, 1, TokenContent.unique(7, 20))
    assert m.get_block_table(b) == m.get_block_table(a)  # the tail is shared
    assert m.append_slots(a) != []  # copy on write: skipping this call would be wrong
    assert m.decode_touch_len(a) == 32  # now a private, counter-keyed tail: fills at 32


def test_v0_v2_window_drop_touch_bs16():
    m = make_manager("v0-v2", KVCacheConfig(num_gpu_blocks=100, block_size=16, sliding_window=64))
    other = _v0_admit(m, 9, 10)
    _prefill_done(other)
    seq = _v0_admit(m, 0, 200)
    assert m.decode_touch_len(seq) == 200  # the null block does not exist yet
    _prefill_done(seq)
    m.append_slots(other)  # other's first append creates the null block
    assert m.decode_touch_len(seq) == 201  # C=200: 200 // 16 - 6 = 6 indices to drop now
    m.append_slots(seq)  # the decode at 201
    assert m.decode_touch_len(seq) == 209  # 13 blocks, 6 null: both touches at 209
    for _ in range(5):  # 201 computed, then 202..205 are skipped
        seq.num_computed_tokens = seq.num_tokens
        seq.append_tokens(1)
    assert seq.num_tokens == 206
    m.sync_decode(seq)  # before the call at 206: tokens 0..204 written
    assert m.block_tables[0].num_full_slots == 205
    assert m.block_tables[0].blocks[12].num_tokens == 13


def test_v0_fixed_touch_points_bs16():
    m = make_manager("v0-fixed", KVCacheConfig(num_gpu_blocks=10, block_size=16, sliding_window=24))
    seq = _v0_admit(m, 0, 64)
    assert m.get_block_table(seq) == [0, 1, 2, 3]  # [null, 3 real]
    assert m.decode_touch_len(seq) == 65
    _prefill_done(seq)
    m.append_slots(seq)  # the decode at 65 adds a block
    assert m.decode_touch_len(seq) == 81


def test_v0_v2_prefix_caching_fill_touch_bs16():
    m = make_manager(
        "v0-v2", KVCacheConfig(num_gpu_blocks=20, block_size=16, enable_prefix_caching=True)
    )
    seq = _v0_admit(m, 0, 20)
    assert m.decode_touch_len(seq) == 32  # block 1 fills (promotion) before block 2 is needed


def test_v1_engine_touch_points_bs16():
    m = make_manager(
        "v1-engine", KVCacheConfig(num_gpu_blocks=20, block_size=16, sliding_window=24)
    )
    seq = Sequence.new(0, 112)
    assert m.allocate_slots(seq, 112) is not None
    assert m.decode_touch_len(seq) == 112  # the decode at 113 frees blocks 0..4: call it
    _prefill_done(seq)
    assert m.allocate_slots(seq, 1) is not None  # frees blocks 0..4, adds block 7
    assert m.decode_touch_len(seq) == 120  # block 5 leaves the window at C = 119
    for _ in range(5):  # 113 computed, then the decodes at 114..117 are skipped
        seq.num_computed_tokens += 1
        seq.append_tokens(1)
    assert (seq.num_tokens, seq.num_computed_tokens) == (118, 117)
    m.sync_decode(seq)  # before the call at 118
    assert (m._req_to_skip_tokens[0], m._req_to_max_need_tokens[0]) == (116, 117)
    m.sync_decode(seq)  # idempotent
    assert (m._req_to_skip_tokens[0], m._req_to_max_need_tokens[0]) == (116, 117)
    caching = make_manager(
        "v1-engine", KVCacheConfig(num_gpu_blocks=20, block_size=16, enable_prefix_caching=True)
    )
    seq = Sequence.new(0, 20)
    assert caching.allocate_slots(seq, 20) is not None
    assert caching.decode_touch_len(seq) == 32  # block 1 fills and is cached at 32
