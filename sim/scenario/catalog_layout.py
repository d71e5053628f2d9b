"""A scenario's KV-cache groups from its catalog model's per-layer types, as its release
builds them (`sim.memory.hybrid_pool`).

A V1-engine scenario whose `model` lists its layer types (`layer_pattern: per_layer`: Gemma-3,
gpt-oss, Llama-4, Qwen3-Next, Nemotron-H) and gives no `cache.kv_cache_groups` gets the pinned
release's groups, its unified block size (a Mamba hybrid's attention block is raised to hold
a state: Qwen3-Next 544 tokens) and, with `num_gpu_blocks: derive`, the release's block count
from the memory the model's weights leave (`num_blocks = available // page // group_size`).
Explicit `cache.kv_cache_groups` win. Refused, one line each (exit 2): a v0 design (vLLM 0.5.4
serves none of these models), `cache.sliding_window` over per-layer types, a release whose
groups kvsim does not model for the model (`hybrid_pool.layer_specs`). `derive` counts each
layer's weights by its type (`sim.catalog_params`: Mamba and Gated-DeltaNet mixers, MoE
experts, Gemma-3's and Llama-4's vision towers).

Example: `model: qwen3-next-80b-a3b`, `vllm_version: "0.33.0"`, `block_size: 16`,
`num_gpu_blocks: 3000` -> groups [mamba, mamba, mamba, full] of 12 layers each, block size
544, the 3,000 blocks shared (scenarios/qwen3_next_v1.yaml).
"""

from __future__ import annotations

from dataclasses import replace

from sim.catalog import ModelSpec
from sim.kv.config import Design
from sim.kv.pins import resolve_pin
from sim.memory.derive import MemoryBudget
from sim.memory.hybrid_pool import HybridPool, hybrid_pool
from sim.scenario.configs import kv_dtype_of
from sim.scenario.release_defaults import applied
from sim.scenario.schema import Scenario, ScenarioError


def uses_catalog_layout(scenario: Scenario, model: ModelSpec | None) -> bool:
    """Whether the scenario's groups come from its model's per-layer types; refuses the
    combinations kvsim does not model (module docstring)."""
    if model is None or model.layer_pattern != "per_layer" or scenario.cache.kv_cache_groups:
        return False
    design = scenario.scheduler.design
    if design is not Design.V1_ENGINE:
        raise ScenarioError(
            f"model: {model.name!r} has per-layer types, which kvsim models on the V1 engine "
            f"only (vLLM 0.5.4's v0 engine does not serve it); use scheduler.design: v1-engine"
        )
    if scenario.cache.sliding_window not in ("model", None):
        raise ScenarioError(
            f"cache.sliding_window: {model.name!r} sets each layer's type; drop "
            "cache.sliding_window, or give cache.kv_cache_groups"
        )
    return True


def catalog_pool(scenario: Scenario, model: ModelSpec, max_model_len: int) -> HybridPool:
    """The release's pool for the scenario's model and launch settings."""
    pin = resolve_pin(scenario.scheduler.design, scenario.scheduler.resolved_vllm_version)
    try:
        return hybrid_pool(
            model,
            pin,
            block_size=applied(scenario.cache.block_size, "cache.block_size"),
            max_model_len=max_model_len,
            kv_dtype=kv_dtype_of(scenario.cache),
            tp=scenario.hardware.tensor_parallel_size,
        )
    except ValueError as exc:
        raise ScenarioError(f"model: {exc}") from None


def pool_num_blocks(pool: HybridPool, model: ModelSpec, budget: MemoryBudget) -> MemoryBudget:
    """`budget` (the memory left for KV cache, every term kept) re-cut into the release's
    hybrid blocks: ``available // page // group_size``, each block spanning `group_size`
    layers. Example: Nemotron-H-8B on 0.33.0 (page 528 x 4,096 B = 2,162,688 B, 7 groups of 4
    layers): 50 GiB left -> 53,687,091,200 // 2,162,688 // 4 = 6,206 blocks."""
    num_blocks = pool.num_blocks(budget.available_kv_bytes)
    if num_blocks <= 0:
        raise ScenarioError(
            f"cache.num_gpu_blocks: no memory left for KV-cache blocks of {pool.block_bytes} B"
        )
    return replace(
        budget,
        num_gpu_blocks=num_blocks,
        block_size=pool.block_size,
        block_bytes=pool.block_bytes,
        num_layers_per_block=pool.group_size,
        num_kv_groups=pool.layout.num_groups,
    )


def group_rows(pool: HybridPool) -> list[dict]:
    """The run's `inputs["kv_cache_groups"]`: each group's type and layer count."""
    return [
        {
            "group_id": group_id,
            "sliding_window": group.sliding_window,
            "attention_chunk_size": group.attention_chunk_size,
            "mamba": group.mamba,
            "num_layers": len(layers),
        }
        for group_id, (group, layers) in enumerate(
            zip(pool.groups, pool.layout.group_layers, strict=True)
        )
    ]
