"""0.33.0 behaviours found by running kvsim in lockstep with the real vLLM 0.33.0
(`kvsim verify --vllm-version 0.33.0`, `tests/vllm_real/test_vllm_v033_lockstep.py`), on every pin.

* A step that starts with one request does not apply `long_prefill_token_threshold` (0.33.0
  `sched/scheduler.py:L754-762`): `V1ReleasePolicies.lone_request_ignores_threshold`.
* A sliding-window group of W = 1 caches no block (0.33.0's `reachable_block_mask` keeps the
  `cdiv(W - 1, bs) = 0` blocks a hit needs): `VllmPin.caches_only_reachable_window_blocks`.
"""

from __future__ import annotations

import pytest

from sim.audit import AuditLevel, audited
from sim.kv import Design, KVCacheConfig, make_manager
from sim.kv.types import Segment, Sequence, SequenceStatus, TokenContent
from sim.kv.v1_engine import KVCacheManager
from sim.scheduler import Request, SchedulerConfig, V1Scheduler
from sim.scheduler.fast.v1 import with_decode_shortcuts

BS = 16
OLD = ["4ac7713", "0.11.0"]
ALL = [*OLD, "0.33.0"]


def _scheduler(pin: str) -> V1Scheduler:
    kv = KVCacheConfig(num_gpu_blocks=40, block_size=BS, vllm_pin=pin)
    manager = audited(make_manager(Design.V1_ENGINE, kv), level=AuditLevel.FULL)
    config = SchedulerConfig(
        max_model_len=2048,
        max_num_batched_tokens=24,
        enable_chunked_prefill=True,
        long_prefill_token_threshold=12,
    )
    return with_decode_shortcuts(V1Scheduler(config, manager))


def _request(request_id: int, prompt_tokens: int) -> Request:
    return Request.new(request_id, 0.0, TokenContent.unique(1000 + request_id, prompt_tokens), 4, 0)


def _scheduled(scheduler: V1Scheduler) -> list[tuple[int, int]]:
    plan = scheduler.schedule(0.0)
    return sorted((w.request.request_id, w.num_tokens) for w in plan.all_scheduled())


@pytest.mark.parametrize("pin", ALL)
def test_lone_request_ignores_long_prefill_threshold(pin):
    """Threshold 12, budget 24, one 20-token prompt: capped at 12 before 0.33.0, whole on it
    (the scheduler lockstep's first 0.33.0 divergence, minimised)."""
    scheduler = _scheduler(pin)
    scheduler.add_request(_request(0, 20))
    assert _scheduled(scheduler) == ([(0, 12)] if pin in OLD else [(0, 20)])


@pytest.mark.parametrize("pin", ALL)
def test_threshold_still_caps_with_two_requests(pin):
    """Two 20-token prompts: every pin caps each first chunk at 12 (12 + 12 = the budget)."""
    scheduler = _scheduler(pin)
    scheduler.add_request(_request(0, 20))
    scheduler.add_request(_request(1, 20))
    assert _scheduled(scheduler) == [(0, 12), (1, 12)]


def _window_one(pin: str) -> tuple[KVCacheManager, Sequence]:
    config = KVCacheConfig(
        num_gpu_blocks=16,
        block_size=BS,
        sliding_window=1,
        enable_prefix_caching=True,
        vllm_pin=pin,
    )
    manager = KVCacheManager(config)
    content = TokenContent.from_segments([Segment(5, 26)])
    return manager, Sequence(1, content, content.num_tokens)


@pytest.mark.parametrize("pin", ALL)
def test_window_of_one_token_caches_no_block_on_0_33(pin):
    """26 tokens with W = 1: block 1 is full. Before 0.33.0 it is cached; on 0.33.0 it is not,
    so once it leaves the window it is freed to the head of the free queue and reused first
    (the manager lockstep's 0.33.0 divergence: kvsim gave block 3, vLLM block 1)."""
    manager, seq = _window_one(pin)
    manager.get_computed_blocks(seq)
    assert manager.allocate_slots(seq, 26) == [1, 2]
    cached = [b.block_id for b in manager.block_pool.blocks if b.block_hash is not None]
    assert cached == ([1] if pin in OLD else [])
    seq.status = SequenceStatus.RUNNING
    seq.num_computed_tokens = 26
    seq.append_tokens(4)
    # 30 tokens, 3 looked ahead: block 1 (tokens 0-15) leaves the window, a third block is new.
    new = manager.allocate_slots(seq, 4, num_lookahead_tokens=3)
    assert new == ([3] if pin in OLD else [1])
    assert manager.num_free_blocks == 13
