"""How many KV-cache blocks fit on a GPU (`derive`), the memory terms vLLM subtracts (`terms`), host
memory for a CPU tier (`host`), and the derivation held against real vLLM startup logs
(`validation`).

`sim.memory` is public: it re-exports `derive`, e.g. ``sim.memory.derive_num_gpu_blocks(model, gpu)``.
"""

from sim.memory.derive import (
    ActivationSource,
    BlockCountSource,
    KvLayout,
    MemoryBudget,
    block_bytes,
    derive_num_gpu_blocks,
    given_num_gpu_blocks,
    hybrid_layout_of,
    is_hybrid_model,
    num_kv_groups,
    num_layers_per_block,
)

__all__ = [
    "ActivationSource",
    "BlockCountSource",
    "KvLayout",
    "MemoryBudget",
    "block_bytes",
    "derive_num_gpu_blocks",
    "given_num_gpu_blocks",
    "hybrid_layout_of",
    "is_hybrid_model",
    "num_kv_groups",
    "num_layers_per_block",
]
