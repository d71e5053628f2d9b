"""What the real V1-engine code needs built from a kvsim config, release by release: vLLM's
`KVCacheConfig` for a kvsim `KVCacheConfig` (`real_kv_cache_config`, one layer per group),
the Mamba cache mode it runs (`real_mamba_cache_mode`), the block hash (`sha256_fn`), and the
keyword arguments a release's signatures take (`request_extra_kwargs`, `accepted_kwargs`).
Shared by the manager adapter (`v1_adapter`) and the scheduler adapter (`v1_sched_adapter`).
"""

from __future__ import annotations

import inspect
from typing import Any

from sim.errors import InputError
from sim.kv.config import KVCacheConfig, KVCacheGroupSpec
from sim.vllm_real.loader import VllmInstall, import_vllm


def real_kv_cache_config(
    iface: Any,
    block_size: int,
    num_blocks: int,
    groups: tuple[KVCacheGroupSpec, ...],
    max_model_len: int | None = None,
    mamba_cache_mode: str = "none",
    mamba_prefill_checkpoint_blocks: int = 0,
    prefix_cache_retention_interval: int | None = None,
):
    """vLLM's own `KVCacheConfig` for a pool of `num_blocks`: one group per entry of `groups`
    (full attention, a sliding window, chunked-local attention, a Mamba state of one fp16
    value, full attention with sinks, R-SWA, or a circular buffer), one layer of one KV head of size 1 each, as vLLM's unit tests build it: the block
    managers read only the specs' block sizes, windows and chunk sizes, never the layer
    shapes. A Mamba group's block size is `max_model_len`, as vLLM sets it with caching off
    (`sim.kv.v1_engine.mamba`); in `mamba_cache_mode` "align" or "all" (prefix caching on) it
    is `block_size`, as `HybridAttentionMambaModelConfig` sets it
    (`model_executor/models/config.py:L244-291 @0.19.1`). `iface` is
    `vllm.v1.kv_cache_interface`. `mamba_prefill_checkpoint_blocks` (0.33.0 "align"): 1
    gives each Mamba spec a prefill checkpoint block, with the alignment of a Mamba2 layer
    (1) for an even pool and of a FlashInfer GDN layer (the block size) for an odd one
    (`sim.kv.v1_engine.mamba_checkpoint`: neither decides with one block size);
    `prefix_cache_retention_interval` (0.33.0) goes to the config when not None.
    """
    import torch

    # By keyword: from 0.33.0 on the spec fields after block_size are keyword-only.
    shape = {"block_size": block_size, "num_kv_heads": 1, "head_size": 1, "dtype": torch.float16}

    def spec_for(group: KVCacheGroupSpec) -> Any:
        if group.mamba and mamba_cache_mode != "none":
            checkpoint = {}
            if mamba_prefill_checkpoint_blocks:
                checkpoint = {
                    "num_prefill_checkpoint_blocks": mamba_prefill_checkpoint_blocks,
                    "prefill_checkpoint_alignment": block_size if num_blocks % 2 else 1,
                }
            return iface.MambaSpec(
                block_size=block_size,
                shapes=((1,),),
                dtypes=(torch.float16,),
                mamba_cache_mode=mamba_cache_mode,
                **checkpoint,
            )
        if group.mamba:
            if max_model_len is None:
                raise InputError("max_model_len: a Mamba group's block size is max_model_len")
            # 0.33.0's `mamba_cache_mode` defaults to "none"; 0.11.0 has no such field.
            return iface.MambaSpec(
                block_size=max_model_len, shapes=((1,),), dtypes=(torch.float16,)
            )
        if group.sink_len is not None:  # 0.19.1 on
            return iface.SinkFullAttentionSpec(**shape, sink_len=group.sink_len)
        if group.rswa_window is not None:  # 0.25.1 on
            return iface.RSWASpec(**shape, rswa_window=group.rswa_window)
        if group.circular_buffer:  # 0.33.0: the ring's capacity is its block size
            return iface.CircularBufferSpec(**shape)
        if group.attention_chunk_size is not None:
            return iface.ChunkedLocalAttentionSpec(
                **shape, attention_chunk_size=group.attention_chunk_size
            )
        if group.sliding_window is None:
            return iface.FullAttentionSpec(**shape)
        return iface.SlidingWindowSpec(**shape, sliding_window=group.sliding_window)

    retention = {}
    if prefix_cache_retention_interval is not None:
        retention = {"prefix_cache_retention_interval": prefix_cache_retention_interval}
    return iface.KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            iface.KVCacheGroupSpec([f"layer.{i}"], spec_for(group))
            for i, group in enumerate(groups)
        ],
        **retention,
    )


def real_mamba_cache_mode(config: KVCacheConfig) -> str:
    """The `mamba_cache_mode` vLLM runs `config`'s Mamba groups in: "none" with caching off,
    else the config's ("align" when unset)."""
    if not (config.has_mamba_group and config.enable_prefix_caching):
        return "none"
    return config.mamba_cache_mode or "align"


def sha256_fn(install: VllmInstall) -> Any:
    """vLLM's pickle-then-sha256 block hash: `vllm.utils.sha256` (0.10/0.11), moved to
    `vllm.utils.hashing` by 0.19.1."""
    hashing = install.root / "vllm" / "utils" / "hashing.py"
    if hashing.is_file():
        return import_vllm("utils.hashing", install).sha256
    return import_vllm("utils", install).sha256


def request_extra_kwargs(install: VllmInstall) -> dict[str, Any]:
    """`Request(...)` arguments that only some versions take (`eos_token_id`, dropped after
    0.11.0)."""
    request_cls = import_vllm("v1.request", install).Request
    params = inspect.signature(request_cls.__init__).parameters
    return {"eos_token_id": None} if "eos_token_id" in params else {}


def accepted_kwargs(fn: Any, candidates: dict[str, Any]) -> dict[str, Any]:
    """The `candidates` that `fn` takes as keywords: vLLM's signatures grew release by release
    (0.19.1's `get_num_blocks_to_allocate` has no `apply_admission_cap`). None values are
    left out, so the release's own default applies."""
    params = inspect.signature(fn).parameters
    return {k: v for k, v in candidates.items() if k in params and v is not None}
