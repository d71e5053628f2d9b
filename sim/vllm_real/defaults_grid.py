"""The deployments `kvsim verify --defaults` compares, and each model's config.json.

The grid crosses six catalog models (full attention, all-sliding Mistral, interleaved
Gemma-2, Qwen2 with its window off, MoE Mixtral, a 4K-context Llama-2), seven GPUs (A100 40
and 80 GB, H100, H200, B200 >= 160 GiB, L4, L40S), both usage contexts and the flags that
change defaults; TP x PP (1-8 x 1-2, at most one 8-GPU node) cycles over them. Pure data: no
torch, no vLLM.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from sim.catalog import ModelSpec
from sim.kv.pins import VllmPin
from sim.scenario.vllm_defaults import ABSENT_FLAGS, RELEASES, UsageContext, UserFlags
from sim.scenario.vllm_defaults.common import hf_architecture

#: Compute capability per catalog GPU (NVIDIA's CUDA GPUs table).
CAPABILITY: dict[str, tuple[int, int]] = {
    "a100-40gb-sxm": (8, 0),
    "a100-80gb-sxm": (8, 0),
    "a100-80gb-pcie": (8, 0),
    "h100-sxm": (9, 0),
    "h100-pcie": (9, 0),
    "h200": (9, 0),
    "l4": (8, 9),
    "l40s": (8, 9),
    "b200": (10, 0),
}
GRID_MODELS = (
    "llama-3.1-8b",
    "mistral-7b-v0.1",
    "gemma-2-9b",
    "qwen2.5-7b",
    "mixtral-8x7b-v0.1",
    "llama-2-70b",
)
GRID_GPUS = ("a100-40gb-sxm", "a100-80gb-sxm", "h100-sxm", "h200", "b200", "l4", "l40s")
#: TP x PP up to one 8-GPU node (16 GPUs would need Ray across nodes: left out).
GRID_PARALLEL = ((1, 1), (2, 1), (4, 1), (8, 1), (1, 2), (2, 2), (4, 2))
#: The flags that change defaults (one at a time, plus a few pairs).
GRID_FLAGS: tuple[UserFlags, ...] = (
    UserFlags(),
    UserFlags(enable_chunked_prefill=False),
    UserFlags(enable_prefix_caching=False),
    UserFlags(max_num_seqs=64),
    UserFlags(max_num_seqs=2048),
    UserFlags(max_num_batched_tokens=4096),
    UserFlags(max_num_batched_tokens=100),
    UserFlags(max_model_len=4096),
    UserFlags(max_model_len=1024, enable_chunked_prefill=False),
    UserFlags(gpu_memory_utilization=0.8, block_size=32),
    UserFlags(async_scheduling=True),
    UserFlags(async_scheduling=False),
    UserFlags(disable_sliding_window=True),
    UserFlags(performance_mode="throughput"),
    UserFlags(max_model_len=200000),
    UserFlags(max_num_seqs=4096, max_num_batched_tokens=2048),
    UserFlags(enable_chunked_prefill=False, max_num_batched_tokens=8192),
    UserFlags(long_prefill_token_threshold=512),
    UserFlags(long_prefill_token_threshold=16384),  # above Llama-2's and Gemma-2's lengths
)


@dataclass(frozen=True, slots=True)
class DefaultsCase:
    model: str
    gpu: str
    tp: int
    pp: int
    usage: UsageContext
    flags: UserFlags

    def label(self) -> str:
        set_flags = {k: v for k, v in flag_items(self.flags) if v is not None and v is not False}
        if self.flags.enable_chunked_prefill is False:
            set_flags["enable_chunked_prefill"] = False
        return f"{self.model} on {self.gpu} TP{self.tp} PP{self.pp} {self.usage.value} {set_flags}"


def flag_items(flags: UserFlags) -> list[tuple[str, Any]]:
    return [(name, getattr(flags, name)) for name in UserFlags.__slots__]


def grid(version: str, num_configs: int | None = None) -> list[DefaultsCase]:
    """The deployments compared: models x GPUs x usage x flags, parallelism cycled; every
    `step`-th one when `num_configs` asks for fewer (the cut keeps every dimension varied)."""
    absent = ABSENT_FLAGS.get(RELEASES[version], ())
    flags = [f for f in GRID_FLAGS if all(getattr(f, name) is None for name in absent)]
    if RELEASES[version] is VllmPin.V0_5_4:  # v0 has no usage context: one of them is enough
        usages: tuple[UsageContext, ...] = (UsageContext.API_SERVER,)
    else:
        usages = tuple(UsageContext)
    combos = list(itertools.product(GRID_MODELS, GRID_GPUS, usages, flags))
    if num_configs is not None and num_configs < len(combos):
        step = len(combos) / num_configs
        combos = [combos[int(i * step)] for i in range(num_configs)]
    # Parallelism cycles over the kept combinations, so every (TP, PP) meets every model.
    return [
        DefaultsCase(m, g, *GRID_PARALLEL[i % len(GRID_PARALLEL)], u, f)
        for i, (m, g, u, f) in enumerate(combos)
    ]


def hf_config(model: ModelSpec) -> dict[str, Any]:
    """The model's config.json, from the catalog geometry, under its real architecture."""
    arch, model_type = hf_architecture(model)
    extra: dict[str, Any] = {}
    if model_type == "mistral":
        extra = {"sliding_window": model.sliding_window}
    elif model_type == "mixtral":
        extra = {
            "num_local_experts": model.num_experts,
            "num_experts_per_tok": model.num_experts_per_token,
            "sliding_window": None,
        }
    elif model_type == "qwen2":
        extra = {"use_sliding_window": False, "sliding_window": None}
    elif model_type == "gemma2":
        extra = {"sliding_window": model.sliding_window, "query_pre_attn_scalar": 256}
    elif model.sliding_window is not None:
        raise ValueError(f"no config.json family for windowed model {model.name!r}")
    return {
        "architectures": [arch],
        "model_type": model_type,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_kv_heads,
        "head_dim": model.head_dim,
        "num_hidden_layers": model.num_layers,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": model.max_position_embeddings,
        "tie_word_embeddings": model.tie_word_embeddings,
        "rms_norm_eps": 1e-5,
        "torch_dtype": model.dtype,
        **extra,
    }
