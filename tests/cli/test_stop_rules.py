"""The length stop rules of both engines (`maybe_stop_sequence` for v0, `check_stop` for V1)
and the bulk free of a v0 block-manager-v2 table run, each checked token by token."""

from __future__ import annotations

import pytest

from sim.engine.replica import request_of
from sim.kv.v0_v2.cpu_gpu import CpuGpuBlockAllocator
from sim.scheduler.v0.scheduler import maybe_stop_sequence
from sim.scheduler.v1.scheduler import check_stop
from sim.workload.request import RequestSpec


def _grown(num_prompt: int, max_tokens: int, num_tokens: int):
    request = request_of(RequestSpec(0, 0.0, num_prompt, max_tokens))
    request.seq.append_tokens(num_tokens - num_prompt)
    return request


def _first_stop(rule, max_model_len: int) -> tuple[int, str]:
    for num_tokens in range(101, 200):
        reason = rule(_grown(100, 8, num_tokens), max_model_len)
        if reason is not None:
            return num_tokens, reason
    raise AssertionError("never stopped")


@pytest.mark.parametrize("rule", [maybe_stop_sequence, check_stop])
def test_stop_at_max_tokens(rule):
    assert _first_stop(rule, 1000) == (108, "length: generated max_tokens")


def test_v0_stops_past_max_model_len_and_v1_at_it():
    assert _first_stop(maybe_stop_sequence, 105) == (106, "length: reached max_model_len")
    assert _first_stop(check_stop, 105) == (105, "length: reached max_model_len")


def test_free_run_stops_at_the_first_foreign_id():
    allocator = CpuGpuBlockAllocator(10, 4, 16, False)
    gpu = allocator.gpu
    blocks = [gpu.allocate_mutable_block(None) for _ in range(2)]
    cpu_block = allocator.cpu.allocate_mutable_block(None)
    freed_ids = [b.block_id for b in blocks]
    assert gpu.count_free_blocks() == 8
    assert gpu.free_run([*blocks, cpu_block], 0) == 2
    assert gpu.count_free_blocks() == 10
    assert gpu.free_block_ids()[:2] == freed_ids[::-1]  # each pushed on the front in turn
    assert all(b.block_id is None for b in blocks) and cpu_block.block_id is not None
