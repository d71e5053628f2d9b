"""`sim.kv.v0_v1.evictor.LRUEvictor` picks the victim of upstream's literal scan, every time.

The oracle below transcribes `LRUEvictor` of `vllm/core/evictor_v1.py:L53-99 (0.5.4)`: an
insertion-ordered table scanned from the front.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.config import KVCacheConfig
from sim.kv.types import NoFreeBlocksError, Segment, Sequence, SequenceGroup, TokenContent
from sim.kv.v0_v1.alloc import CachedBlockAllocator, Device, PhysicalBlock
from sim.kv.v0_v1.evictor import LRUEvictor
from sim.kv.v0_v1.manager import BlockSpaceManagerV1

_T = TypeVar("_T")


class UpstreamScanEvictor:
    """The upstream scan, literally: reads each block's fields at eviction time."""

    def __init__(self) -> None:
        self.free_table: OrderedDict[int, PhysicalBlock] = OrderedDict()

    def add(self, block: PhysicalBlock) -> None:
        assert block.block_hash is not None
        self.free_table[block.block_hash] = block

    def remove(self, block_hash: int) -> PhysicalBlock:
        return self.free_table.pop(block_hash)

    def evict(self) -> PhysicalBlock:
        evicted_block = next(iter(self.free_table.values()))
        for block in self.free_table.values():
            if evicted_block.last_accessed < block.last_accessed:
                break
            if evicted_block.num_hashed_tokens < block.num_hashed_tokens:
                evicted_block = block
        assert evicted_block.block_hash is not None
        self.free_table.pop(evicted_block.block_hash)
        return evicted_block


# Few values, so that ties in time and in tokens are the common case; times in any order.
TIMES = st.sampled_from([-1.0, 0.0, 1.0, 2.0])
NUM_TOKENS = st.sampled_from([0, 16, 32])
NUM_HASHES = 6
NUM_BLOCKS = 8
#: An operation and its choices; a choice is an index taken modulo the current options, so
#: every operation applies (no rejected examples).
OPERATIONS = st.one_of(
    st.tuples(st.just("add"), st.integers(0, 7), st.integers(0, 7), TIMES, NUM_TOKENS),
    st.tuples(st.just("remove"), st.integers(0, 7)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("retime_entry"), st.integers(0, 7), TIMES),
    st.tuples(st.just("retime_outsider"), st.integers(0, 7), TIMES),
)


def pick(options: list[_T], index: int) -> _T:
    return options[index % len(options)]


@settings(max_examples=400)
@given(st.lists(OPERATIONS, max_size=80))
def test_evictor_matches_the_upstream_scan(operations: list[tuple[object, ...]]) -> None:
    """Add (a hash can return on another block, with new fields, as an evicted block re-keyed
    by the allocator does), remove, evict, and stamp a new `last_accessed` on a block inside
    or outside the evictor (`access_all_blocks_in_seq`): same victim, same table, each time."""
    evictor, oracle = LRUEvictor(), UpstreamScanEvictor()
    outside = [PhysicalBlock(Device.GPU, i, None, 0) for i in range(NUM_BLOCKS)]
    for operation in operations:
        kind, choices = str(operation[0]), operation[1:]
        if kind == "add" and outside and len(oracle.free_table) < NUM_HASHES:
            block_index, hash_index, last_accessed, num_hashed_tokens = choices
            assert isinstance(block_index, int) and isinstance(hash_index, int)
            assert isinstance(last_accessed, float) and isinstance(num_hashed_tokens, int)
            block = outside.pop(block_index % len(outside))
            unused = [h for h in range(NUM_HASHES) if h not in oracle.free_table]
            block.block_hash = pick(unused, hash_index)
            block.last_accessed = last_accessed
            block.num_hashed_tokens = num_hashed_tokens
            evictor.add(block)
            oracle.add(block)
        elif kind == "remove" and oracle.free_table:
            (hash_index,) = choices
            assert isinstance(hash_index, int)
            block_hash = pick(list(oracle.free_table), hash_index)
            removed = evictor.remove(block_hash)
            assert removed is oracle.remove(block_hash)
            outside.append(removed)
        elif kind == "evict" and oracle.free_table:
            expected = oracle.evict()
            victim = evictor.evict()
            assert victim is expected
            assert victim.computed is False
            outside.append(victim)
        elif kind.startswith("retime"):
            index, last_accessed = choices
            assert isinstance(index, int) and isinstance(last_accessed, float)
            blocks = list(oracle.free_table.values()) if kind == "retime_entry" else outside
            if blocks:
                block = pick(blocks, index)
                block.last_accessed = last_accessed
                evictor.on_last_accessed_changed(block)
        assert list(evictor.hash_to_block.items()) == list(oracle.free_table.items())
        assert len(evictor) == len(oracle.free_table)
    while oracle.free_table:  # drain: the remaining order matches too
        assert evictor.evict() is oracle.evict()
    with pytest.raises(NoFreeBlocksError, match="No usable cache memory left"):
        evictor.evict()


def test_evictor_is_not_quadratic_when_all_blocks_share_a_timestamp():
    """Regression: a Mooncake replay on v0-v1 with prefix caching did not finish in 120 s.

    kvsim's scheduler never stamps access times, so every entry ties at -1 and upstream's scan
    read all of them on each eviction (n^2 / 2 entries to empty n). Now each eviction reads
    one run, and the victims still come in upstream's order: most tokens first, ties in
    insertion order.
    """
    evictor = LRUEvictor()
    blocks = [PhysicalBlock(Device.GPU, i, 100 + i, 16 * (i % 7)) for i in range(2000)]
    for block in blocks:
        evictor.add(block)
    victims = [evictor.evict() for _ in blocks]
    assert evictor.num_runs_visited == len(blocks)
    expected = sorted(blocks, key=lambda b: (-b.num_hashed_tokens, b.block_id))
    assert [v.block_id for v in victims] == [b.block_id for b in expected]


def test_evictor_reads_two_runs_when_times_ascend():
    """Blocks freed in time order (the LRU case upstream's scan is written for): the second
    run's later time stops each scan."""
    evictor = LRUEvictor()
    for i in range(1000):
        evictor.add(PhysicalBlock(Device.GPU, i, i, 16, last_accessed=float(i // 10)))
    victims = [evictor.evict().block_id for _ in range(1000)]
    assert victims == list(range(1000))  # equal tokens: the front entry of the oldest run
    assert evictor.num_runs_visited == 2 * 1000 - 10  # the last run has no successor


def test_docstring_example_reads_three_runs():
    """The module docstring's worked example: A(5, 16) B(1, 32) C(1, 48) D(3, 64) E(9, 64)."""
    evictor, oracle = LRUEvictor(), UpstreamScanEvictor()
    fields = [(5.0, 16), (1.0, 32), (1.0, 48), (3.0, 64), (9.0, 64)]
    for block_id, (last_accessed, num_hashed_tokens) in enumerate(fields):
        block = PhysicalBlock(
            Device.GPU, block_id, block_id, num_hashed_tokens, last_accessed=last_accessed
        )
        evictor.add(block)
        oracle.add(block)
    victim = evictor.evict()
    assert victim is oracle.evict() and victim.block_id == 2  # C
    assert evictor.num_runs_visited == 3


def test_removed_entry_whose_hash_returns_is_not_taken_for_the_new_one():
    """A removed entry's heap item stays behind; when its hash comes back on another block
    with fewer tokens, the old item (more tokens) must not stand for the new entry."""
    evictor = LRUEvictor()
    x = PhysicalBlock(Device.GPU, 0, 1, 48, last_accessed=1.0)
    y = PhysicalBlock(Device.GPU, 1, 2, 16, last_accessed=1.0)
    z = PhysicalBlock(Device.GPU, 2, 1, 0, last_accessed=1.0)
    evictor.add(x)
    evictor.add(y)
    assert evictor.remove(1) is x
    evictor.add(z)
    assert evictor.evict() is y  # upstream: y (16 tokens) beats z (0)
    assert evictor.evict() is z


def test_access_to_a_block_in_the_evictor_changes_the_victim_as_upstream():
    """The multi-seq allocate quirk leaves b's table naming blocks that sit in the evictor;
    `access_all_blocks_in_seq(b)` restamps them in place, which reorders upstream's scan."""
    m = BlockSpaceManagerV1(KVCacheConfig(num_gpu_blocks=6, enable_prefix_caching=True))
    a, b = Sequence.new(1, 32), Sequence.new(2, 32)
    m.allocate(SequenceGroup(1, [a, b]))  # blocks 0 (16 tokens), 1 (32): one ref for both
    m.access_all_blocks_in_seq(a, 1.0)
    m.free(a)  # blocks 0 and 1 enter the evictor at t=1; b still names them
    c = Sequence.new(3, TokenContent.from_segments([Segment(11, 64)]))
    m.allocate(SequenceGroup(3, [c]))  # blocks 2..5, 16..64 tokens
    m.access_all_blocks_in_seq(c, 2.0)
    m.free(c)
    gpu = m.gpu_allocator
    assert isinstance(gpu, CachedBlockAllocator)
    # Entries t=1 then t=2: the scan stops at t=2, victim block 1 (32 tokens).
    m.access_all_blocks_in_seq(b, 3.0)
    # Entries t=3 then t=2: no stop, victim the 64-token block 5.
    oracle = UpstreamScanEvictor()
    for block in gpu.evictor.hash_to_block.values():
        oracle.add(block)
    expected = oracle.evict()
    d = Sequence.new(4, TokenContent.from_segments([Segment(13, 16)]))
    m.allocate(SequenceGroup(4, [d]))  # the pool is all created: evicts
    assert m.get_block_table(d) == [expected.block_id] == [5]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_long_runs_churned_by_revivals_match_upstream_and_stay_small(seed: int):
    """Blocks revived (removed) and freed again (re-added) many times inside long runs: the
    stale heap items are dropped (memory stays proportional to the entries), and the
    victims still match the upstream scan."""
    rng = random.Random(seed)
    evictor, oracle = LRUEvictor(), UpstreamScanEvictor()
    blocks = [PhysicalBlock(Device.GPU, i, i, 0) for i in range(60)]
    outside = list(blocks)
    for _ in range(3000):
        roll = rng.random()
        if roll < 0.5 and outside:
            block = outside.pop(rng.randrange(len(outside)))
            block.last_accessed = -1.0 if rng.random() < 0.9 else 0.0
            block.num_hashed_tokens = rng.choice([0, 16, 32, 48])
            evictor.add(block)
            oracle.add(block)
        elif roll < 0.9 and oracle.free_table:
            block_hash = rng.choice(list(oracle.free_table))
            outside.append(evictor.remove(block_hash))
            oracle.remove(block_hash)
        elif oracle.free_table:
            victim = evictor.evict()
            assert victim is oracle.evict()
            outside.append(victim)
        assert list(evictor.hash_to_block.items()) == list(oracle.free_table.items())
        run = evictor._head
        while run is not None:
            assert len(run.heap) <= 2 * run.num_entries + 16
            run = run.next
