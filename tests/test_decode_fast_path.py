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
slots. Whole replays with the shortcuts on and off: tests/test_decode_cohort.py.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.audit.auditor import AuditedV0Manager, AuditedV1Manager
from sim.kv.config import KVCacheConfig, make_manager
from sim.kv.protocol import DecodeFastPath
from sim.kv.types import (
    AllocStatus,
    NoFreeBlocksError,
    Segment,
    Sequence,
    SequenceGroup,
    SequenceStatus,
    TokenContent,
    cdiv,
)

# ----------------------------------------------------------------------------- snapshots


def _common(m) -> tuple:
    return (m.pool_stats(), m.block_refcounts())


def structural_v0_v1(m, seq_ids) -> tuple:
    gpu = m.gpu_allocator
    tables = {s: m.seq_block_ids(s) for s in seq_ids}
    if m.enable_caching:
        blocks = [
            (b.block_id, b.block_hash, b.ref_count, b.num_hashed_tokens) for b in gpu.blocks()
        ]
        pool = (blocks, list(gpu.evictor.hash_to_block), sorted(gpu.hash_to_block))
    else:
        pool = (gpu.free_block_ids(), m.cpu_allocator.free_block_ids())
    return (_common(m), tables, pool)


def structural_v0_v2(m, seq_ids) -> tuple:
    gpu = m.block_allocator.gpu
    tables = {
        s: [(b.block_id, b.content_hash, b.is_null) for b in m.block_tables[s].blocks]
        for s in seq_ids
        if s in m.block_tables
    }
    pool = [gpu.free_block_ids(), m.block_allocator.cpu.free_block_ids(), m.null_block_id]
    if m.enable_caching:
        pool += [gpu.evictor.block_ids(), dict(gpu._cached_blocks)]
    return (_common(m), tables, pool, m.get_num_free_cpu_blocks())


def detail_v0_v2(m, seq_id) -> tuple | None:
    table = m.block_tables.get(seq_id)
    if table is None:
        return None
    blocks = [(b.num_tokens, b.num_tokens_total) for b in table.blocks if not b.is_null]
    return (table.num_full_slots, table.has_decoded, table.max_lookahead_slots, blocks)


def structural_v1(m, seq_ids) -> tuple:
    pool = m.block_pool
    blocks = [(b.block_id, b.ref_cnt, b.block_hash) for b in pool.blocks]
    cached = {h: list(ids) for h, ids in pool.cached_block_hash_to_block.items()}
    stm = m.single_type_manager
    tables = {s: m.seq_block_ids(s) for s in seq_ids}
    hashes = {s: list(h) for s, h in m.req_to_block_hashes.items()}
    return (
        _common(m),
        pool.free_block_queue.ids(),
        blocks,
        cached,
        tables,
        dict(stm.num_cached_block),
        hashes,
    )


def detail_v1(m, seq_id) -> tuple:
    return (m._req_to_skip_tokens.get(seq_id), m._req_to_max_need_tokens.get(seq_id))


STRUCTURAL: dict[str, Callable] = {
    "v0-v1": structural_v0_v1,
    "v0-v2": structural_v0_v2,
    "v0-fixed": structural_v0_v2,
    "v1-engine": structural_v1,
}
DETAIL: dict[str, Callable] = {
    "v0-v1": lambda m, s: None,
    "v0-v2": detail_v0_v2,
    "v0-fixed": detail_v0_v2,
    "v1-engine": detail_v1,
}

# ----------------------------------------------------------------------------- workload


def make_prompt(rng: random.Random, seq_id: int, max_len: int, caching: bool) -> TokenContent:
    """Unique prompts; with caching, shared prefixes and whole identical prompts too."""
    num_tokens = rng.randint(1, max_len)
    if not caching or rng.random() < 0.3:
        return TokenContent.unique(1000 + seq_id, num_tokens)
    prefix_key = rng.randint(0, 2)
    if rng.random() < 0.4:
        # An identical prompt: same key, same length as others drawn with this seed.
        return TokenContent.unique(prefix_key, 5 + 7 * prefix_key)
    num_prefix = rng.randint(1, num_tokens)
    return TokenContent.from_segments(
        [Segment(prefix_key, num_prefix), Segment(1000 + seq_id, num_tokens - num_prefix)]
    )


@dataclass
class Pair:
    """Two managers of one design: A (every call) and B (fast path)."""

    design: str
    config: KVCacheConfig
    a: object = None
    b: object = None
    touch_len: dict[int, int | None] = field(default_factory=dict)
    num_decodes: int = 0
    num_quiet: int = 0
    #: Decodes refused for lack of blocks (v0 can_append_slots False, V1 None): pool pressure.
    num_refused: int = 0

    def __post_init__(self) -> None:
        self.a = make_manager(self.design, self.config)
        self.b = make_manager(self.design, self.config)
        assert isinstance(self.b, DecodeFastPath)

    def check(self, live_ids, seq_id: int | None = None) -> None:
        structural = STRUCTURAL[self.design]
        assert structural(self.a, live_ids) == structural(self.b, live_ids)
        if seq_id is not None:
            detail = DETAIL[self.design]
            assert detail(self.a, seq_id) == detail(self.b, seq_id)

    def refresh(self, seq: Sequence) -> None:
        self.touch_len[seq.seq_id] = self.b.decode_touch_len(seq)

    def is_quiet(self, seq: Sequence) -> bool:
        touch_len = self.touch_len.get(seq.seq_id)
        return touch_len is not None and seq.num_tokens < touch_len

    def sync(self, seq: Sequence) -> None:
        self.b.sync_decode(seq)

    def finish_check(self, live: list[Sequence]) -> None:
        for seq in live:
            self.sync(seq)
        ids = [s.seq_id for s in live]
        self.check(ids)
        for s in ids:
            assert DETAIL[self.design](self.a, s) == DETAIL[self.design](self.b, s)


def _same_outcome(pair: Pair, method: str, *args):
    """Call `method` on A then B: equal results, or the same error type from both."""
    try:
        result_a = getattr(pair.a, method)(*args)
    except (NoFreeBlocksError, ValueError) as exc:
        with pytest.raises(type(exc)):
            getattr(pair.b, method)(*args)
        return exc
    assert getattr(pair.b, method)(*args) == result_a
    return result_a


# ----------------------------------------------------------------------------- v0 driver


def run_v0(
    design: str,
    config: KVCacheConfig,
    seed: int,
    num_ops: int,
    allow_swap: bool,
    allow_fork: bool,
    allow_lookahead: bool = False,
) -> Pair:
    """`allow_lookahead`: some decodes reserve 1 or 3 lookahead slots (speculative decoding);
    after one, the manager must never declare that sequence's decodes quiet again."""
    rng = random.Random(seed)
    pair = Pair(design, config)
    a, b = pair.a, pair.b
    groups: dict[int, SequenceGroup] = {}
    waiting: list[Sequence] = []
    running: list[Sequence] = []
    swapped: list[Sequence] = []
    next_id = 0
    max_prompt = 6 * config.block_size

    def live() -> list[int]:
        return [s.seq_id for s in running + swapped]

    def drop(seq: Sequence) -> None:
        """Free a running/swapped seq (finish or recompute preemption)."""
        pair.sync(seq)
        a.free(seq)
        b.free(seq)
        pair.touch_len.pop(seq.seq_id, None)
        for queue in (running, swapped):
            if seq in queue:
                queue.remove(seq)

    def preempt(victim: Sequence) -> None:
        pair.num_refused += 1
        drop(victim)
        victim.status = SequenceStatus.WAITING
        victim.num_computed_tokens = 0
        waiting.append(victim)

    def advance(seq: Sequence) -> None:
        seq.num_computed_tokens = seq.num_tokens
        seq.append_tokens(1)

    def decode_with_lookahead(seq: Sequence, num_lookahead: int) -> None:
        """A decode that reserves lookahead slots: always a real call, on A and B alike."""
        group = groups[seq.seq_id]
        pair.num_decodes += 1
        pair.sync(seq)
        ok = a.can_append_slots(group, num_lookahead)
        assert b.can_append_slots(group, num_lookahead) == ok
        if not ok:
            preempt(rng.choice(running))
            return
        outcome = _same_outcome(pair, "append_slots", seq, num_lookahead)
        if isinstance(outcome, Exception):
            a.recover_leaked_blocks()
            b.recover_leaked_blocks()
            drop(seq)
            return
        pair.refresh(seq)
        assert pair.touch_len[seq.seq_id] is None  # lookahead used: never quiet again
        pair.check(live(), seq.seq_id)
        advance(seq)

    def decode(seq: Sequence, after_swap_in: bool = False) -> None:
        if allow_lookahead and not after_swap_in and rng.random() < 0.2:
            decode_with_lookahead(seq, rng.choice([1, 3]))
            return
        group = groups[seq.seq_id]
        quiet = pair.is_quiet(seq)
        pair.num_decodes += 1
        free_a = a.get_num_free_gpu_blocks()
        ok = True if after_swap_in else a.can_append_slots(group)
        if quiet:
            pair.num_quiet += 1
            assert b.get_num_free_gpu_blocks() == free_a
            assert after_swap_in or ok == (free_a >= 1)
            if ok:
                ids = live()
                before = (
                    STRUCTURAL[design](a, ids),
                    [DETAIL[design](a, s) for s in ids if s != seq.seq_id],
                )
                assert a.append_slots(seq) == []
                after = (
                    STRUCTURAL[design](a, ids),
                    [DETAIL[design](a, s) for s in ids if s != seq.seq_id],
                )
                assert after == before
        else:
            pair.sync(seq)
            if not after_swap_in:
                assert b.can_append_slots(group) == ok
            if ok:
                outcome = _same_outcome(pair, "append_slots", seq)
                if isinstance(outcome, Exception):
                    a.recover_leaked_blocks()
                    b.recover_leaked_blocks()
                    drop(seq)
                    return
                pair.refresh(seq)
                pair.check(live(), seq.seq_id)
        if ok:
            advance(seq)
        else:
            preempt(rng.choice(running))

    for _ in range(num_ops):
        op = rng.random()
        if op < 0.12 and len(running) + len(swapped) < 6:
            if waiting and rng.random() < 0.5:
                seq = waiting.pop(0)
            else:
                content = make_prompt(rng, next_id, max_prompt, config.enable_prefix_caching)
                seq = Sequence.new(next_id, content)
                groups[next_id] = SequenceGroup(next_id, [seq])
                next_id += 1
            group = groups[seq.seq_id]
            status = a.can_allocate(group)
            assert b.can_allocate(group) is status
            if status is not AllocStatus.OK:
                if status is AllocStatus.LATER:
                    waiting.append(seq)
                continue
            outcome = _same_outcome(pair, "allocate", group)
            if isinstance(outcome, Exception):
                assert a.recover_leaked_blocks() == b.recover_leaked_blocks()
                pair.check(live())
                continue
            seq.status = SequenceStatus.RUNNING
            running.append(seq)
            pair.refresh(seq)
            pair.check(live(), seq.seq_id)
            advance(seq)  # the prefill computes the prompt and samples a token
        elif op < 0.16 and running:
            drop(rng.choice(running))  # finished
            pair.check(live())
        elif op < 0.19 and allow_swap and running:
            seq = rng.choice(running)
            group = groups[seq.seq_id]
            ok = a.can_swap_out(group)
            assert b.can_swap_out(group) == ok
            if ok:
                pair.sync(seq)
                running.remove(seq)
                outcome = _same_outcome(pair, "swap_out", group)
                if isinstance(outcome, Exception):
                    pair.check(live())  # a faithful swap undercount, alike in A and B
                    continue
                seq.status = SequenceStatus.SWAPPED
                swapped.append(seq)
                pair.touch_len[seq.seq_id] = None
                pair.check(live(), seq.seq_id)
        elif op < 0.21 and allow_fork and running and len(running) + len(swapped) < 6:
            # A fork shares every block: the next decode of either sequence copies on write.
            parent = rng.choice(running)
            pair.sync(parent)
            child = parent.fork(next_id)
            groups[next_id] = SequenceGroup(next_id, [child])
            next_id += 1
            a.fork(parent, child)
            b.fork(parent, child)
            running.append(child)
            for seq in (parent, child):
                pair.refresh(seq)
                touch_len = pair.touch_len[seq.seq_id]
                # After lookahead slots a sequence is never quiet again (None).
                assert touch_len == seq.num_tokens or (allow_lookahead and touch_len is None)
            pair.check(live(), child.seq_id)
        elif op < 0.24 and swapped:
            seq = swapped[0]
            group = groups[seq.seq_id]
            status = a.can_swap_in(group)
            assert b.can_swap_in(group) is status
            if status is AllocStatus.OK:
                swapped.remove(seq)
                outcome = _same_outcome(pair, "swap_in", group)
                if isinstance(outcome, Exception):
                    # v0-V2's prefix-caching swap-in undercount: both fail alike; the
                    # half-swapped seq is abandoned (the real engine has crashed).
                    pair.check(live())
                    continue
                seq.status = SequenceStatus.RUNNING
                running.append(seq)
                pair.refresh(seq)
                pair.check(live(), seq.seq_id)
                decode(seq, after_swap_in=True)  # v0 appends right after a swap-in
        elif running:
            decode(rng.choice(running))
    pair.finish_check(running + swapped)
    return pair


# ----------------------------------------------------------------------------- V1 driver


def run_v1(config: KVCacheConfig, seed: int, num_ops: int) -> Pair:
    rng = random.Random(seed)
    pair = Pair("v1-engine", config)
    a, b = pair.a, pair.b
    waiting: list[Sequence] = []
    running: list[Sequence] = []
    next_id = 0
    max_prompt = 6 * config.block_size

    def live() -> list[int]:
        return [s.seq_id for s in running]

    def drop(seq: Sequence) -> None:
        pair.sync(seq)
        a.free(seq)
        b.free(seq)
        pair.touch_len.pop(seq.seq_id, None)
        running.remove(seq)

    def after_step(seq: Sequence, num_new: int) -> None:
        seq.num_computed_tokens += num_new
        if seq.num_computed_tokens == seq.num_tokens:
            seq.append_tokens(1)

    def step(seq: Sequence) -> None:
        num_left = seq.num_tokens - seq.num_computed_tokens
        is_decode = num_left == 1
        num_new = 1 if is_decode else rng.randint(1, num_left)
        if is_decode:
            pair.num_decodes += 1
        if is_decode and pair.is_quiet(seq):
            pair.num_quiet += 1
            ids = live()
            before = STRUCTURAL["v1-engine"](a, ids)
            assert a.allocate_slots(seq, 1) == []
            assert STRUCTURAL["v1-engine"](a, ids) == before
            after_step(seq, 1)
            return
        pair.sync(seq)
        result = _same_outcome(pair, "allocate_slots", seq, num_new)
        assert not isinstance(result, Exception)
        if result is None:
            pair.num_refused += 1
            pair.check(live(), seq.seq_id)
            victim = rng.choice(running)
            drop(victim)
            victim.num_computed_tokens = 0
            victim.status = SequenceStatus.PREEMPTED
            waiting.append(victim)
            return
        pair.refresh(seq)
        pair.check(live(), seq.seq_id)
        after_step(seq, num_new)

    for _ in range(num_ops):
        op = rng.random()
        if op < 0.12 and len(running) < 6:
            if waiting and rng.random() < 0.5:
                seq = waiting.pop(0)
            else:
                content = make_prompt(rng, next_id, max_prompt, config.enable_prefix_caching)
                seq = Sequence.new(next_id, content)
                next_id += 1
            hits = a.get_computed_blocks(seq)
            assert b.get_computed_blocks(seq) == hits
            hit_ids, num_hit = hits
            num_left = seq.num_tokens - num_hit
            num_new = num_left if rng.random() < 0.5 else rng.randint(1, num_left)
            result = a.allocate_slots(seq, num_new, num_hit, hit_ids)
            assert b.allocate_slots(seq, num_new, num_hit, list(hit_ids)) == result
            if result is None:
                waiting.append(seq)
                continue
            seq.status = SequenceStatus.RUNNING
            running.append(seq)
            pair.refresh(seq)
            pair.check(live(), seq.seq_id)
            seq.num_computed_tokens = num_hit
            after_step(seq, num_new)
        elif op < 0.16 and running:
            drop(rng.choice(running))
            pair.check(live())
        elif running:
            step(rng.choice(running))
    pair.finish_check(running)
    return pair


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
