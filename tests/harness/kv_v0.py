"""Shared helpers for the v0 V2 / corrected-design tests."""

from __future__ import annotations

from collections import Counter

from sim.kv.types import Sequence, SequenceGroup, SequenceStatus, TokenContent


def group(seq_id: int, prompt: int | TokenContent, num_seqs: int = 1) -> SequenceGroup:
    seqs = [Sequence.new(seq_id, prompt)]
    for i in range(1, num_seqs):
        seqs.append(seqs[0].fork(seq_id + i))
    return SequenceGroup(seq_id, seqs)


def run(g: SequenceGroup) -> SequenceGroup:
    for s in g.seqs:
        s.status = SequenceStatus.RUNNING
    return g


def decode(manager, seq: Sequence, num_tokens: int = 1, num_lookahead_slots: int = 0):
    """One engine step for `seq`: all its tokens are computed, then `num_tokens` more arrive."""
    seq.num_computed_tokens = seq.num_tokens
    seq.append_tokens(num_tokens)
    return manager.append_slots(seq, num_lookahead_slots)


def used(manager) -> int:
    return manager.num_total_gpu_blocks - manager.get_num_free_gpu_blocks()


def expected_refcounts(manager) -> dict[int, int]:
    """Refcounts implied by the tables, the null block and the recorded leaks."""
    counts: Counter[int] = Counter()
    for table in manager.block_tables.values():
        if table.is_on_gpu():
            counts.update(b.block_id for b in table.blocks if not b.is_null)
    if manager.null_block_id is not None:
        counts[manager.null_block_id] += 1
    counts.update(b.block_id for b in manager.block_allocator.gpu.leaked_blocks)
    return dict(counts)


def admit(manager, g: SequenceGroup) -> SequenceGroup:
    """Allocate a WAITING group, then mark it RUNNING (the scheduler's order)."""
    manager.allocate(g)
    return run(g)
