"""Two managers of one design side by side, A called on every decode and B on the fast path,
and the snapshots that must agree between them (tests/scheduler/test_decode_fast_path.py).

`STRUCTURAL[design](m, seq_ids)` is the pool, refcounts, tables, caches and evictors of a
manager; `DETAIL[design](m, seq_id)` the per-sequence bookkeeping of one sequence.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from sim.kv.config import KVCacheConfig, make_manager
from sim.kv.protocol import DecodeFastPath
from sim.kv.types import NoFreeBlocksError, Segment, Sequence, TokenContent

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


def same_outcome(pair: Pair, method: str, *args):
    """Call `method` on A then B: equal results, or the same error type from both."""
    try:
        result_a = getattr(pair.a, method)(*args)
    except (NoFreeBlocksError, ValueError) as exc:
        with pytest.raises(type(exc)):
            getattr(pair.b, method)(*args)
        return exc
    assert getattr(pair.b, method)(*args) == result_a
    return result_a
