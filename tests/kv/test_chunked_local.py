"""Chunked-local attention groups (Llama-4's RoPE layers) in the V1-engine model: the docstring
examples of `sim.kv.v1_engine.chunked_local` worked by hand, the release differences, and the
refusals. The lockstep against each release's real manager is in tests/vllm_real."""

from __future__ import annotations

import pytest

from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
from sim.kv.types import BlockHash, Segment, Sequence, TokenContent
from sim.kv.v1_engine import HybridKVCacheManager
from sim.kv.v1_engine.block_pool import BlockPool
from sim.kv.v1_engine.chunked_local import ChunkedLocalAttentionManager

BS = 4
CHUNKED_FULL = (KVCacheGroupSpec(attention_chunk_size=8), KVCacheGroupSpec(None))


def make(num_gpu_blocks: int, pin: str | None = "0.33.0", **kwargs) -> HybridKVCacheManager:
    config = KVCacheConfig(
        num_gpu_blocks=num_gpu_blocks,
        block_size=BS,
        kv_cache_groups=CHUNKED_FULL,
        vllm_pin=pin,
        **kwargs,
    )
    manager = make_manager("v1-engine", config)
    assert isinstance(manager, HybridKVCacheManager)
    return manager


def seq_of(seq_id: int, key: int, num_tokens: int) -> Sequence:
    content = TokenContent.from_segments([Segment(key, num_tokens)])
    return Sequence(seq_id, content, content.num_tokens)


def chunked(num_blocks: int = 20, chunk: int = 8) -> ChunkedLocalAttentionManager:
    return ChunkedLocalAttentionManager(BlockPool(num_blocks, True), BS, chunk)


def test_skipped_tokens_are_the_chunks_before_the_current_one():
    m = chunked()
    assert [m.num_skipped_tokens(c) for c in (0, 7, 8, 13, 16)] == [0, 0, 8, 8, 16]


def test_admission_cap_has_no_plus_one_and_stops_at_max_model_len():
    m = ChunkedLocalAttentionManager(BlockPool(4, False), 16, 8192)
    assert m.admission_cap_blocks(8192, 131_072) == 1024  # cdiv(8192 + 8192, 16)
    assert m.admission_cap_blocks(8192, 4000) == 250  # cdiv(4000, 16)
    assert chunked().admission_cap_blocks(2, None) == 3  # cdiv(8 + 2, 4)


def test_free_walks_back_from_the_chunk_start_on_0_19_1_and_later():
    m = chunked()
    m.keeps_last_cached_block = False
    m.allocate_new_blocks(1, 16)  # 4 blocks: ids 1..4
    m.remove_skipped_blocks(1, 7)  # chunk 0 still read: nothing freed
    assert [b.block_id for b in m.req_to_blocks[1]] == [1, 2, 3, 4]
    m.remove_skipped_blocks(1, 13)  # chunk starts at 8: blocks 0 and 1 go
    assert [b.block_id for b in m.req_to_blocks[1]] == [0, 0, 3, 4]
    assert m.num_leading_null_blocks(1) == 2
    m.remove_skipped_blocks(1, 100)  # past the table: capped at its length
    assert [b.block_id for b in m.req_to_blocks[1]] == [0, 0, 0, 0]


def test_0_11_0_keeps_the_last_cached_block_at_a_chunk_boundary():
    m = chunked()  # keeps_last_cached_block defaults to 0.11.0's rule
    m.allocate_new_blocks(1, 12)
    m.num_cached_block[1] = 2  # blocks 0 and 1 cached (8 tokens computed)
    m.remove_skipped_blocks(1, 8)  # first useful 2, capped at 2 - 1 = 1: block 0 only
    assert [b.block_id for b in m.req_to_blocks[1]] == [0, 2, 3]
    with pytest.raises(ValueError, match="only 3 blocks"):
        m.num_cached_block[1] = 0  # nothing cached: the rule is off, nothing caps it
        m.remove_skipped_blocks(1, 16)


def test_cache_hit_nulls_the_chunks_before_max_length():
    m = chunked()
    hashes = [BlockHash(h) for h in (11, 12, 13, 14)]
    m.allocate_new_blocks(1, 16)
    m.num_cached_block[1] = 0
    m.cache_blocks(1, hashes, 16)
    null = m.block_pool.null_block
    hit = m.find_longest_cache_hit(hashes, 15)  # chunk of position 15 starts at 8: block 2
    assert hit[:2] == [null, null] and [b.block_id for b in hit[2:]] == [3]
    assert m.find_longest_cache_hit(hashes, 16) == [null] * 4  # nothing in the window
    assert m.find_longest_cache_hit([BlockHash(99)] * 4, 15) == [null, null]  # a miss


def test_freeing_decode_len_is_the_first_decode_that_frees():
    m = chunked()
    assert m.freeing_decode_len(0) == 9  # the decode at C=8 frees blocks 0 and 1
    assert m.freeing_decode_len(2) == 17
    odd = chunked(chunk=6)
    assert odd.freeing_decode_len(0) == 7  # C=6: block 6 // 4 = 1 > 0 nulls


def test_hybrid_running_request_frees_its_previous_chunk():
    m = make(12)
    seq = seq_of(1, 7, 9)
    assert m.allocate_slots(seq, 9) is not None
    seq.num_computed_tokens = 9
    assert m.group_block_ids(1) == ([1, 2, 3], [4, 5, 6])
    seq.append_tokens(1)
    assert m.allocate_slots(seq, 1) == []  # C=9: chunk 1 starts at 8; 10 slots fit in 3
    assert m.group_block_ids(1) == ([0, 0, 3], [4, 5, 6])


@pytest.mark.parametrize(
    "groups",
    [
        (KVCacheGroupSpec(attention_chunk_size=8), KVCacheGroupSpec(8), KVCacheGroupSpec(None)),
        (
            KVCacheGroupSpec(attention_chunk_size=8),
            KVCacheGroupSpec(attention_chunk_size=16),
            KVCacheGroupSpec(None),
        ),
    ],
    ids=["chunked+sliding+full", "two-chunk-sizes"],
)
def test_more_than_one_other_type_is_refused_as_upstream_asserts(groups):
    config = KVCacheConfig(
        num_gpu_blocks=9, block_size=BS, kv_cache_groups=groups, vllm_pin="0.33.0"
    )
    with pytest.raises(ValueError, match="exactly one sliding window or one chunk size"):
        make_manager("v1-engine", config)


def test_chunked_local_is_refused_on_4ac7713():
    with pytest.raises(ValueError, match="from vLLM 0.11.0 on"):
        make(9, pin=None)


def test_a_group_is_sliding_or_chunked_not_both():
    with pytest.raises(ValueError, match="not both"):
        KVCacheGroupSpec(sliding_window=8, attention_chunk_size=8)
    with pytest.raises(ValueError, match="attention_chunk_size must be positive"):
        KVCacheGroupSpec(attention_chunk_size=0)
