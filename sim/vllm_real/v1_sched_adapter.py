"""vLLM's real V1 `Scheduler` (`vllm/v1/core/sched/scheduler.py`, 0.10+) driven on CPU, no model.

The scheduler is built the way vLLM's own unit tests build one, without a GPU, a tokenizer or
the network:

* a `VllmConfig` from a small `config.json` written to a temporary folder (the model class is
  a registered stub, so vLLM's registry inspects it in this process instead of importing a
  real model in a subprocess; `skip_tokenizer_init`; HF offline variables set first);
* a `KVCacheConfig` of one group, `FullAttentionSpec` or `SlidingWindowSpec`, 1 head of size 1
  (page size does not matter to the scheduler), `num_blocks` including the null block;
* a fake model-runner output per step: one sampled token for each scheduled request whose
  tokens are now all computed, nothing for a partial prefill (the runner discards those).

Requests get `SamplingParams(max_tokens=output_len, ignore_eos=True)`, so a request finishes
at its output length (or at `max_model_len`). Token ids are kvsim's `TokenContent.token_ids`
for the same prompt, and generated tokens come from the request's own content stream
(`-(id + 1)`, as kvsim's `sample_token`), so prefix-cache hits match kvsim's content keys.

Example (bs 16, 20 blocks, budget 64, one 100-token prompt, 2 output tokens): step 0
schedules {"0": 64}, step 1 {"0": 36} and samples token 1, step 2 {"0": 1} samples token 2
and finishes it; free blocks 19 -> 15 -> 12 -> 12 -> 19.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from sim.kv.config import KVCacheConfig
from sim.kv.types import TokenContent
from sim.scheduler.config import SchedulerConfig
from sim.vllm_real.loader import VllmInstall, import_vllm, load_vllm
from sim.vllm_real.sched_case import RequestSpec, SchedCase, StepRecord
from sim.vllm_real.sched_case import case_configs as case_configs
from sim.vllm_real.v1_real_config import (
    accepted_kwargs,
    real_kv_cache_config,
    real_mamba_cache_mode,
    request_extra_kwargs,
    sha256_fn,
)

#: The stub architecture named in the local config.json (registered in vLLM's registry).
STUB_ARCH = "KvsimStubForCausalLM"
#: Nothing here may reach the network (transformers reads the local config.json only).
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
#: transformers warns about config keys vLLM passes; the comparison has nothing to say about them.
QUIET_ENV = {"TRANSFORMERS_VERBOSITY": "error"}


class RealVllmRaised(Exception):
    """vLLM's own code raised (the real engine would die here): its class name and message."""

    def __init__(self, upstream_type: str, message: str, phase: str) -> None:
        super().__init__(f"{upstream_type} in {phase}: {message}")
        self.upstream_type = upstream_type
        self.phase = phase


def guard_real_call(install_root: Path, phase: str, fn: Any, *args: Any) -> Any:
    """`fn(*args)`; what vLLM's own code (under `install_root / "vllm"`) raised becomes
    `RealVllmRaised` (a finding), what was raised elsewhere (an adapter) propagates as a bug."""
    try:
        return fn(*args)
    except Exception as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
        where = Path(tb.tb_frame.f_code.co_filename) if tb is not None else None
        # (heapq is C code: a TypeError out of it is raised in vLLM's request_queue.py.)
        if where is None or not where.is_relative_to(install_root / "vllm"):
            raise
        raise RealVllmRaised(type(exc).__name__, str(exc), phase) from exc


def _stub_model_class() -> type:
    """A do-nothing module that satisfies vLLM's text-generation interface checks."""
    import torch

    class KvsimStubForCausalLM(torch.nn.Module):
        def __init__(self, *, vllm_config: Any = None, prefix: str = "") -> None:
            super().__init__()

        def get_input_embeddings(self, input_ids: Any) -> None:
            return None

        def embed_input_ids(self, input_ids: Any) -> None:  # the 0.33.0 name of the above
            return None

        def forward(self, input_ids: Any, positions: Any) -> None:
            return None

        def compute_logits(self, hidden_states: Any) -> None:
            return None

    return KvsimStubForCausalLM


def _write_model_dir(folder: Path, max_model_len: int) -> None:
    """A tiny llama-shaped config.json: all that `ModelConfig` reads (no weights, no tokenizer)."""
    config = {
        "architectures": [STUB_ARCH],
        "model_type": "llama",
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "num_hidden_layers": 1,
        "vocab_size": 32000,
        "max_position_embeddings": max(max_model_len, 128),
        "rms_norm_eps": 1e-5,
        "dtype": "float16",
    }
    (folder / "config.json").write_text(json.dumps(config))


def _register_stub_model(install: VllmInstall) -> None:
    registry = import_vllm("model_executor.models.registry", install)
    if STUB_ARCH not in registry.ModelRegistry.get_supported_archs():
        registry.ModelRegistry.register_model(STUB_ARCH, _stub_model_class())


def _real_vllm_config(
    install: VllmInstall, sched: SchedulerConfig, kv: KVCacheConfig, model_dir: Path | None
) -> Any:
    """vLLM's own `VllmConfig` for kvsim's resolved configs (CPU device, the stub model)."""
    cfg = import_vllm("config", install)
    with tempfile.TemporaryDirectory(prefix="kvsim-vllm-model-") as tmp:
        folder = model_dir or Path(tmp)
        _write_model_dir(folder, sched.max_model_len)
        model_config = cfg.ModelConfig(
            model=str(folder),
            tokenizer=str(folder),
            skip_tokenizer_init=True,
            dtype="float16",
            seed=0,
            max_model_len=sched.max_model_len,
        )
    # 0.33.0: SchedulerConfig needs `is_encoder_decoder`; CacheConfig has no `swap_space`
    # (each passed where the release's signature has it).
    # Async scheduling is set either way (0.33.0's default would turn it on): on, it doubles
    # `max_in_flight_tokens` (the sliding-window admission cap) and picks `AsyncScheduler`.
    scheduler_config = cfg.SchedulerConfig(
        max_num_seqs=sched.max_num_seqs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        max_model_len=sched.max_model_len,
        enable_chunked_prefill=sched.enable_chunked_prefill,
        long_prefill_token_threshold=sched.long_prefill_token_threshold,
        policy=sched.policy.value,
        async_scheduling=sched.async_scheduling,
        **accepted_kwargs(cfg.SchedulerConfig, {"is_encoder_decoder": False}),
    )
    cache_config = cfg.CacheConfig(
        block_size=kv.block_size,
        gpu_memory_utilization=0.9,
        cache_dtype="auto",
        enable_prefix_caching=kv.enable_prefix_caching,
        **accepted_kwargs(cfg.CacheConfig, {"swap_space": 0}),
    )
    vllm_config = cfg.VllmConfig(
        device_config=cfg.DeviceConfig(device="cpu"),
        model_config=model_config,
        scheduler_config=scheduler_config,
        cache_config=cache_config,
    )
    cache_config.num_gpu_blocks = kv.num_gpu_blocks
    if kv.has_mamba_group and kv.enable_prefix_caching:
        # What `MambaModelConfig.verify_and_update_config` sets for a hybrid with caching on
        # (`model_executor/models/config.py:L436-451 @0.19.1`); the stub model is no hybrid.
        cache_config.mamba_cache_mode = real_mamba_cache_mode(kv)
    return vllm_config


def _request_block_hasher(install: VllmInstall, block_size: int) -> Any:
    """vLLM's block hasher for requests (the none-hash set once, as the engine does at startup)."""
    kcu = import_vllm("v1.core.kv_cache_utils", install)
    sha256 = sha256_fn(install)
    if not hasattr(kcu, "NONE_HASH"):
        kcu.init_none_hash(sha256)
    return kcu.get_request_block_hasher(block_size, sha256)


def _real_scheduler(install: VllmInstall, vllm_config: Any, kv: KVCacheConfig) -> Any:
    """vLLM's `Scheduler` over a one-group KV cache of kvsim's pool (the null block included)."""
    iface = import_vllm("v1.kv_cache_interface", install)
    sched_mod = import_vllm("v1.core.sched.scheduler", install)
    scheduler_cls = sched_mod.Scheduler
    if vllm_config.scheduler_config.async_scheduling:
        scheduler_cls = import_vllm("v1.core.sched.async_scheduler", install).AsyncScheduler
    structured = import_vllm("v1.structured_output", install)
    kv_cache_config = real_kv_cache_config(
        iface,
        kv.block_size,
        kv.num_gpu_blocks,
        kv.group_specs,
        kv.max_model_len,
        mamba_cache_mode=real_mamba_cache_mode(kv),
        mamba_prefill_checkpoint_blocks=kv.mamba_prefill_checkpoint_blocks,
        prefix_cache_retention_interval=kv.prefix_cache_retention_interval,
    )
    # Several groups: the lcm of their block sizes (a Mamba group's is max_model_len), as the
    # engine core resolves it with caching off (`resolve_kv_cache_block_sizes`,
    # `vllm/v1/core/kv_cache_utils.py:L816-873 (0.33.0)`).
    block_size = math.lcm(*(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups))
    return scheduler_cls(
        vllm_config=vllm_config,
        kv_cache_config=kv_cache_config,
        structured_output_manager=structured.StructuredOutputManager(vllm_config),
        log_stats=False,
        # 0.33.0 takes the scheduler's block size explicitly (the engine passes the
        # KV-cache groups' common block size; hashing uses the same by default).
        **accepted_kwargs(
            sched_mod.Scheduler, {"block_size": block_size, "hash_block_size": block_size}
        ),
    )


class RealV1Scheduler:
    """vLLM's real V1 Scheduler over one `SchedCase`, stepped with a fake model runner."""

    def __init__(
        self,
        case: SchedCase,
        *,
        install: VllmInstall | None = None,
        vllm_version: str = "0.11.0",
        model_dir: Path | None = None,
    ) -> None:
        for key, value in {**OFFLINE_ENV, **QUIET_ENV}.items():
            os.environ.setdefault(key, value)
        self.install = install or load_vllm(vllm_version=vllm_version)
        self.case = case
        sched, kv = case_configs(case)
        if self.install.version_tuple < (0, 33):
            # The latest pin's sliding-window retention default (`with_serve_retention`): a
            # release without the setting runs dense, as its `vllm serve` does.
            kv = replace(kv, prefix_cache_retention_interval=None)
        _register_stub_model(self.install)
        self.vllm_config = _real_vllm_config(self.install, sched, kv, model_dir)
        self._req_mod = import_vllm("v1.request", self.install)
        self._sp_mod = import_vllm("sampling_params", self.install)
        self._outputs = import_vllm("v1.outputs", self.install)
        self._hasher = _request_block_hasher(self.install, kv.block_size)
        self.real = _real_scheduler(self.install, self.vllm_config, kv)
        # Preemptions are the only `free` calls inside `schedule()`: record them in order.
        self._freed_in_schedule: list[str] | None = None
        manager = self.real.kv_cache_manager
        real_free = manager.free

        def recording_free(request: Any) -> None:
            if self._freed_in_schedule is not None:
                self._freed_in_schedule.append(request.request_id)
            real_free(request)

        manager.free = recording_free
        self._contents: dict[str, TokenContent] = {}

    @property
    def num_free_blocks(self) -> int:
        return self.real.kv_cache_manager.block_pool.get_num_free_blocks()

    def add_request(self, spec: RequestSpec) -> None:
        content = spec.content()
        request = self._req_mod.Request(
            request_id=str(spec.request_id),
            prompt_token_ids=content.token_ids(),
            sampling_params=self._sp_mod.SamplingParams(
                max_tokens=spec.output_len, ignore_eos=True
            ),
            pooling_params=None,
            arrival_time=spec.arrival_s,
            priority=spec.priority,
            block_hasher=self._hasher,
            **request_extra_kwargs(self.install),
        )
        self._contents[request.request_id] = content
        self._guard("add_request", self.real.add_request, request)

    def step(self) -> StepRecord:
        """One `schedule()` + fake model run + `update_from_output()`."""
        record = StepRecord()
        self._freed_in_schedule = []
        try:
            output = self._guard("schedule", self.real.schedule)
        finally:
            record.preempted = [int(r) for r in self._freed_in_schedule]
            self._freed_in_schedule = None
        record.scheduled = [(int(r), n) for r, n in output.num_scheduled_tokens.items()]
        record.free_after_schedule = self.num_free_blocks
        runner_output = self._fake_runner_output(output)
        engine_outputs = self._guard(
            "update_from_output", self.real.update_from_output, output, runner_output
        )
        for outs in engine_outputs.values():
            for out in outs.outputs:
                if out.finish_reason is not None:
                    record.finished.append(int(out.request_id))
        record.free_after_update = self.num_free_blocks
        return record

    def _fake_runner_output(self, output: Any) -> Any:
        """One token for each scheduled request whose tokens are all computed (after schedule)."""
        req_ids = list(output.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = self.real.requests[req_id]
            if request.num_computed_tokens >= request.num_tokens:
                content = self._contents[req_id]
                content.append_output(-(int(req_id) + 1), 1)
                n = content.num_tokens
                sampled.append(content.token_ids(n - 1, n))
            else:
                sampled.append([])
        return self._outputs.ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            logprobs=None,
            prompt_logprobs_dict={},
            pooler_output=[],
        )

    def has_unfinished(self) -> bool:
        return self.real.get_num_unfinished_requests() > 0

    def _guard(self, phase: str, fn: Any, *args: Any) -> Any:
        return guard_real_call(self.install.root, phase, fn, *args)
