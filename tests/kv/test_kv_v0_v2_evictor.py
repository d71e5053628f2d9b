"""The v0 V2 LRU evictor (a heap) picks exactly the victim of the upstream full scan.

The oracle below is a literal transcription of vLLM 0.5.4 `vllm/core/evictor_v2.py:L78-121`
(an OrderedDict scanned on every `evict`). The same random operations drive both, with few
distinct timestamps (many ties, not monotone) and few prefix lengths (more ties), ids re-added
after eviction or removal, and `add` over an id already present; after every operation the
victims, contents and order must agree.
"""

from __future__ import annotations

import random
from collections import OrderedDict

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from sim.kv.v0_v2.evictor import LRUEvictor


class _UpstreamMeta:
    def __init__(self, content_hash: int, num_hashed_tokens: int, last_accessed: float):
        self.content_hash = content_hash
        self.num_hashed_tokens = num_hashed_tokens
        self.last_accessed = last_accessed


class UpstreamLRUEvictor:
    """vLLM 0.5.4 `evictor_v2.LRUEvictor`, transcribed: the full scan on every eviction."""

    def __init__(self) -> None:
        self.free_table: OrderedDict[int, _UpstreamMeta] = OrderedDict()

    def __contains__(self, block_id: int) -> bool:
        return block_id in self.free_table

    def evict(self) -> tuple[int, int]:
        if len(self.free_table) == 0:
            raise ValueError("No usable cache memory left")
        evicted_block = next(iter(self.free_table.values()))
        evicted_block_id = next(iter(self.free_table.keys()))
        for _id, block in self.free_table.items():
            if evicted_block.last_accessed > block.last_accessed or (
                evicted_block.last_accessed == block.last_accessed
                and evicted_block.num_hashed_tokens < block.num_hashed_tokens
            ):
                evicted_block = block
                evicted_block_id = _id
        self.free_table.pop(evicted_block_id)
        return evicted_block_id, evicted_block.content_hash

    def add(self, block_id: int, content_hash: int, num_hashed_tokens: int, last_accessed: float):
        self.free_table[block_id] = _UpstreamMeta(content_hash, num_hashed_tokens, last_accessed)

    def update(self, block_id: int, last_accessed: float):
        self.free_table[block_id].last_accessed = last_accessed

    def remove(self, block_id: int):
        if block_id not in self.free_table:
            raise ValueError("Attempting to remove block that's not in the evictor")
        self.free_table.pop(block_id)

    @property
    def num_blocks(self) -> int:
        return len(self.free_table)


NUM_IDS = 12
TIMES = [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0]  # few values: ties everywhere; drawn in any order
PREFIX_LENGTHS = [0, 16, 32, 48]


def assert_same(ev: LRUEvictor, oracle: UpstreamLRUEvictor) -> None:
    assert ev.block_ids() == list(oracle.free_table)
    assert ev.num_blocks == oracle.num_blocks
    assert all((i in ev) == (i in oracle) for i in range(NUM_IDS + 1))
    # Lazy deletion stays bounded: stale items <= 2 x live + 64.
    assert ev.num_heap_items <= 3 * ev.num_blocks + 64


class EvictorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ev = LRUEvictor()
        self.oracle = UpstreamLRUEvictor()

    @rule(
        block_id=st.integers(0, NUM_IDS - 1),
        content_hash=st.integers(0, 3),
        num_hashed_tokens=st.sampled_from(PREFIX_LENGTHS),
        last_accessed=st.sampled_from(TIMES),
    )
    def add(self, block_id, content_hash, num_hashed_tokens, last_accessed):
        # An id already present is replaced in its slot (the allocator never does this; the
        # upstream table allows it, so the model must too).
        self.ev.add(block_id, content_hash, num_hashed_tokens, last_accessed)
        self.oracle.add(block_id, content_hash, num_hashed_tokens, last_accessed)

    @precondition(lambda self: self.oracle.num_blocks > 0)
    @rule(data=st.data(), last_accessed=st.sampled_from(TIMES))
    def update(self, data, last_accessed):
        block_id = data.draw(st.sampled_from(list(self.oracle.free_table)))
        self.ev.update(block_id, last_accessed)
        self.oracle.update(block_id, last_accessed)

    @precondition(lambda self: self.oracle.num_blocks > 0)
    @rule(data=st.data())
    def remove(self, data):
        block_id = data.draw(st.sampled_from(list(self.oracle.free_table)))
        self.ev.remove(block_id)
        self.oracle.remove(block_id)

    @rule()
    def evict(self):
        if self.oracle.num_blocks == 0:
            for evictor in (self.ev, self.oracle):
                try:
                    evictor.evict()
                except ValueError as e:
                    assert str(e) == "No usable cache memory left"
                else:
                    raise AssertionError("evict on an empty evictor must raise")
            return
        assert self.ev.evict() == self.oracle.evict()

    @rule(block_id=st.integers(0, NUM_IDS - 1))
    def remove_absent_raises_like_upstream(self, block_id):
        if block_id in self.oracle:
            return
        try:
            self.ev.remove(block_id)
        except ValueError as e:
            assert str(e) == "Attempting to remove block that's not in the evictor"
        else:
            raise AssertionError("remove of an absent id must raise")

    @invariant()
    def same_contents(self):
        assert_same(self.ev, self.oracle)


TestEvictorMatchesUpstreamScan = EvictorMachine.TestCase
TestEvictorMatchesUpstreamScan.settings = settings(max_examples=300, stateful_step_count=60)


def test_long_random_sequences_match_upstream_scan_through_heap_rebuilds():
    # Long enough that stale items pile up past the floor and the heap is rebuilt many times
    # (the hypothesis machine's short runs rarely get there).
    rng = random.Random(7)
    ev, oracle = LRUEvictor(), UpstreamLRUEvictor()
    rebuilds = 0
    for _ in range(20_000):
        op = rng.random()
        before = ev.num_heap_items
        if op < 0.3 or oracle.num_blocks == 0:
            args = (rng.randrange(200), rng.randrange(5), rng.choice(PREFIX_LENGTHS))
            t = rng.choice(TIMES) + rng.randrange(3)
            ev.add(*args, t)
            oracle.add(*args, t)
        elif op < 0.7:
            block_id = rng.choice(list(oracle.free_table))
            t = rng.choice(TIMES) + rng.randrange(3)
            ev.update(block_id, t)
            oracle.update(block_id, t)
        elif op < 0.85:
            block_id = rng.choice(list(oracle.free_table))
            ev.remove(block_id)
            oracle.remove(block_id)
        else:
            assert ev.evict() == oracle.evict()
        rebuilds += ev.num_heap_items < before - 1  # more than one item left at once
        assert ev.block_ids() == list(oracle.free_table)
        assert ev.num_heap_items <= 3 * ev.num_blocks + 64
    assert rebuilds > 10
    while oracle.num_blocks:
        assert ev.evict() == oracle.evict()
    assert ev.num_blocks == 0


def test_evictor_is_not_quadratic_on_a_large_pool():
    # The bug: each eviction scanned the whole table (n(n+1)/2 entries visited to drain n
    # blocks), which made prefix-caching runs on real traces quadratic. Now an eviction pops
    # heap items: drain n blocks = n items when nothing is stale, and never more items than
    # were ever pushed (one per add or update).
    n = 5000
    ev = LRUEvictor()
    for i in range(n):
        ev.add(i, i, 16 * (i % 7), float(i % 3))  # ties on time and on prefix length
    victims = [ev.evict()[0] for _ in range(n)]
    assert ev.items_examined == n
    # Same order as the scan: time ascending, prefix length descending, then insertion order.
    assert victims == sorted(range(n), key=lambda i: (i % 3, -16 * (i % 7), i))

    ev = LRUEvictor()
    for i in range(n):
        ev.add(i, i, 16, 0.0)
    for i in range(n):
        ev.update(i, float(n - i))  # every entry leaves a stale item behind
    victims = [ev.evict()[0] for _ in range(n)]
    assert victims == list(range(n))[::-1]
    assert ev.items_examined <= 2 * n  # pushes: n adds + n updates; the scan: ~n * n / 2


def test_update_keeps_the_slot_and_the_tie_break_position():
    # `update` does not move the entry (0.5.4; #7193 later moved it to the end): after
    # updating 1 to the time 0 still has, 1 is still *after* 0 and 0 wins the full tie.
    ev = LRUEvictor()
    ev.add(0, 100, 16, 5.0)
    ev.add(1, 101, 16, 1.0)
    ev.update(1, 5.0)
    assert ev.block_ids() == [0, 1]
    assert ev.evict() == (0, 100)
    # Re-adding an id evicted earlier puts it at the end of the table and of the tie-break.
    ev.add(0, 102, 16, 5.0)
    assert ev.block_ids() == [1, 0]
    assert ev.evict() == (1, 101)
