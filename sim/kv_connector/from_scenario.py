"""The scenario's `cache.cpu_offload_gib` (and friends) as an `OffloadingConfig`.

vLLM 0.11.0 sizes the CPU tier in blocks (`num_cpu_blocks` in `kv_connector_extra_config`,
`vllm/v1/kv_offload/cpu.py:L25-29`); kvsim takes GiB of host memory per GPU and divides by one
offloaded block's bytes on one GPU. Example: Llama-3.1-8B bf16, bs 16 (2 MiB a block),
`cpu_offload_gib: 64` -> 32,768 CPU blocks.
"""

from __future__ import annotations

from sim.catalog import ModelSpec, get_gpu
from sim.kv.config import Design, KVCacheConfig
from sim.kv_connector.link import host_link
from sim.kv_connector.offloading import OffloadingConfig
from sim.memory.derive import block_bytes
from sim.scenario.schema import Scenario, ScenarioError


def offloading_config(
    scenario: Scenario, model: ModelSpec | None, kv: KVCacheConfig, inputs: dict
) -> OffloadingConfig | None:
    """None when `cache.cpu_offload_gib` is 0 (the default); bad combinations are a
    `ScenarioError` naming the field."""
    cache = scenario.cache
    if cache.cpu_offload_gib == 0:
        return None
    field = "cache.cpu_offload_gib"
    if scenario.scheduler.design is not Design.V1_ENGINE:
        raise ScenarioError(f"{field}: CPU offloading is a V1-engine connector (design v1-engine)")
    if model is None:
        raise ScenarioError(f"{field}: needs a model (the KV bytes of a block)")
    if kv.sliding_window is not None or kv.kv_cache_groups:
        raise ScenarioError(f"{field}: kvsim models offloading for one full-attention KV group")
    offloaded = cache.cpu_offload_block_size or kv.block_size
    if offloaded % kv.block_size:
        raise ScenarioError(
            f"cache.cpu_offload_block_size: {offloaded} is not a multiple of block_size "
            f"{kv.block_size}"
        )
    kv_dtype = None if cache.kv_cache_dtype == "auto" else cache.kv_cache_dtype
    gpu_block_bytes = block_bytes(
        model,
        block_size=kv.block_size,
        kv_dtype=kv_dtype,
        tp=scenario.hardware.tensor_parallel_size,
    )
    factor = offloaded // kv.block_size
    num_cpu_blocks = int(cache.cpu_offload_gib * 2**30 // (gpu_block_bytes * factor))
    if num_cpu_blocks < 1:
        raise ScenarioError(f"{field}: {cache.cpu_offload_gib} GiB holds no offloaded block")
    link = host_link(get_gpu(scenario.hardware.gpu).name)
    inputs["kv_offload"] = {
        "num_cpu_blocks": num_cpu_blocks,
        "offloaded_block_size": offloaded,
        "gpu_block_bytes": gpu_block_bytes,
        "link": link.name,
        "link_GBps": link.bandwidth_GBps,
        "link_efficiency": link.efficiency,
        "link_latency_s": link.latency_s,
    }
    return OffloadingConfig(num_cpu_blocks, gpu_block_bytes, link, offloaded)
