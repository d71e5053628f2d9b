"""`sim.vllm_bench.server_log`: the KV pool and release a vllm serve startup log states."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sim.errors import InputError
from sim.vllm_bench.server_log import read_server_log

#: Lines shaped as vLLM prints them (written for this test; two engine-core ranks).
V1_LOG = """\
(APIServer pid=1) INFO 09-03 00:35:55 [api_server.py:1805] vLLM API server version 0.10.1.1
(EngineCore_0 pid=2) INFO 09-03 00:36:27 [core.py:74] Initializing a V1 LLM engine (v0.10.1.1) with config: model='m'
(Worker TP0 pid=3) INFO 09-03 00:40:53 [gpu_worker.py:276] Available KV cache memory: 12.02 GiB
(EngineCore_0 pid=2) INFO 09-03 00:40:55 [kv_cache_utils.py:849] GPU KV cache size: 450,208 tokens
(EngineCore_0 pid=2) INFO 09-03 00:40:55 [kv_cache_utils.py:849] GPU KV cache size: 450,192 tokens
"""
V0_LOG = "INFO 08-05 10:00:00 gpu_executor.py:102] # GPU blocks: 5961, # CPU blocks: 2048\n"


def test_v1_pool_is_the_smallest_rank_and_blocks_follow_the_groups(tmp_path):
    path = tmp_path / "serve.log"
    path.write_text(V1_LOG)
    log = read_server_log(path)
    assert (log.kv_cache_tokens, log.gpu_blocks, log.vllm_version) == (450_192, None, "0.10.1.1")
    assert log.pool_blocks(16) == 28_137
    assert log.pool_blocks(16, num_kv_groups=2) == 56_274


def test_v0_pool_is_its_gpu_blocks(tmp_path):
    path = tmp_path / "v0.log"
    path.write_text(V0_LOG)
    log = read_server_log(path)
    assert (log.gpu_blocks, log.pool_blocks(16), log.vllm_version) == (5961, 5961, None)


def test_a_log_without_a_pool_or_a_fifo_is_bad_input(tmp_path):
    path = tmp_path / "cut.log"
    path.write_text("INFO starting\n")
    with pytest.raises(InputError, match="cut.log: no 'GPU KV cache size"):
        read_server_log(path)
    with pytest.raises(InputError, match="no such file"):
        read_server_log(tmp_path / "missing.log")
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="pipe.log"):
        read_server_log(Path(fifo))


def test_from_0_25_1_the_tokens_are_concurrency_times_max_model_len(tmp_path):
    """A 20,108-block hybrid pool (1,025 blocks per 8,192-token request) logged on 0.25.1."""
    path = tmp_path / "serve.log"
    path.write_text("INFO [kv_cache_utils.py:2146] GPU KV cache size: 160,707 tokens\n")
    log = read_server_log(path)
    blocks = log.pool_blocks(16, 2, from_concurrency=True, blocks_per_request=1025,
                             max_model_len=8192)  # fmt: skip
    assert blocks == 20_108
    with pytest.raises(ValueError, match="blocks_per_request"):
        log.pool_blocks(16, 2, from_concurrency=True)
