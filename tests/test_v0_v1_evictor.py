"""`sim.kv.v0_v1_evictor.LRUEvictor` picks the victim of upstream's literal scan, every time.

The oracle below transcribes vLLM 0.5.4 `vllm/core/evictor_v1.py:L53-96`
(@fc93e5614374688bddc432279244ba7fbf8169c2): an insertion-ordered table scanned from the front.
"""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import assume, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    invariant,
    precondition,
    rule,
)

from sim.kv.v0_v1_alloc import Device, PhysicalBlock
from sim.kv.v0_v1_evictor import LRUEvictor


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
TIMES = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0])
NUM_TOKENS = st.sampled_from([0, 16, 32, 48])
BLOCK_HASHES = st.integers(0, 11)


class EvictorMachine(RuleBasedStateMachine):
    """Same operations on both evictors; victims and tables must match after each."""

    outside = Bundle("outside")  # blocks not in the evictor (never added, removed, evicted)

    def __init__(self) -> None:
        super().__init__()
        self.evictor = LRUEvictor()
        self.oracle = UpstreamScanEvictor()
        self.num_blocks_made = 0

    @rule(target=outside, last_accessed=TIMES, num_hashed_tokens=NUM_TOKENS)
    def make_block(self, last_accessed: float, num_hashed_tokens: int) -> PhysicalBlock:
        block_id = self.num_blocks_made
        self.num_blocks_made += 1
        return PhysicalBlock(
            Device.GPU, block_id, None, num_hashed_tokens, last_accessed=last_accessed
        )

    @rule(
        block=consumes(outside),
        block_hash=BLOCK_HASHES,
        last_accessed=TIMES,
        num_hashed_tokens=NUM_TOKENS,
    )
    def add(
        self, block: PhysicalBlock, block_hash: int, last_accessed: float, num_hashed_tokens: int
    ) -> None:
        # A block comes back with new fields, as an evicted block re-keyed by the allocator
        # does; a hash can return on another block.
        assume(block_hash not in self.oracle.free_table)
        block.block_hash = block_hash
        block.last_accessed = last_accessed
        block.num_hashed_tokens = num_hashed_tokens
        self.evictor.add(block)
        self.oracle.add(block)

    @precondition(lambda self: len(self.oracle.free_table) > 0)
    @rule(target=outside, data=st.data())
    def remove(self, data: st.DataObject) -> PhysicalBlock:
        block_hash = data.draw(st.sampled_from(list(self.oracle.free_table)))
        removed = self.evictor.remove(block_hash)
        assert removed is self.oracle.remove(block_hash)
        return removed

    @precondition(lambda self: len(self.oracle.free_table) > 0)
    @rule(target=outside)
    def evict(self) -> PhysicalBlock:
        expected = self.oracle.evict()
        victim = self.evictor.evict()
        assert victim is expected
        assert victim.computed is False
        return victim

    @precondition(lambda self: len(self.oracle.free_table) > 0)
    @rule(data=st.data(), last_accessed=TIMES)
    def retime_an_entry(self, data: st.DataObject, last_accessed: float) -> None:
        """`access_all_blocks_in_seq` stamping a block that sits in the evictor."""
        block = data.draw(st.sampled_from(list(self.oracle.free_table.values())))
        block.last_accessed = last_accessed
        self.evictor.on_last_accessed_changed(block)

    @rule(block=outside, last_accessed=TIMES)
    def retime_an_outsider(self, block: PhysicalBlock, last_accessed: float) -> None:
        block.last_accessed = last_accessed
        self.evictor.on_last_accessed_changed(block)

    @invariant()
    def same_table(self) -> None:
        assert list(self.evictor.hash_to_block.items()) == list(self.oracle.free_table.items())
        assert len(self.evictor) == len(self.oracle.free_table)


TestEvictorMatchesUpstreamScan = EvictorMachine.TestCase
TestEvictorMatchesUpstreamScan.settings = settings(max_examples=300, stateful_step_count=60)
