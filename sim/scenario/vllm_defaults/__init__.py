"""The engine settings each pinned vLLM release resolves for a model, GPU, parallelism and entry
point, with each value's origin: set by the user, or this release's default.

A `vllm serve` user passes a few flags; the release derives the rest from the model's config,
the GPU (memory and name), TP x PP and the usage context (the OpenAI API server or the `LLM`
class). This module restates those rules per pin, so a scenario can start from what the real
server would run; `sim.scenario.release_defaults` fills a scenario's unset fields from it.
`sim/vllm_real/defaults_lockstep.py` builds each installed release's real
`EngineArgs(...).create_engine_config()` (0.5.4, 0.11.0, 0.33.0) over a grid of deployments
and compares every field with this (`kvsim verify --defaults --vllm-version V`): identical
over 588 / 1344 / 1428 deployments; the 2026-bug pins 0.19.1, 0.20.0, 0.25.1 and 0.26.0 over
1,596 each.

Layout: `common` (inputs, results, the rules every release shares), `v1` (0.11.0, 0.33.0),
`v0` (0.5.4); `resolve_defaults` picks by pin.

Worked examples (Llama-3.1-8B, max_position_embeddings 131072, TP 1, API server):

    0.33.0  H100 (79.19 GiB, >= 70, not "a100")  -> 1024 seqs, 8192 tokens, async on, util 0.92
    0.33.0  A100 80GB ("a100" in the name)       ->  256 seqs, 2048 tokens
    0.33.0  B200 (~178 GiB >= 160)               -> 1024 seqs, 16384 tokens (both contexts)
    0.11.0  H100                                 -> 1024 seqs, 8192 tokens, async off, util 0.9;
            chunked prefill on even if the user turns it off (arg_utils.py L1547-1548)
    0.5.4   any CUDA GPU (v0, no usage context)  ->  256 seqs, chunked prefill on because
            max_model_len 131072 > 32K, so max_num_batched_tokens 512; prefix caching off

The GPU's memory is what the driver reports (`sim.memory.terms.visible_memory`: measured where
the catalog has it, else memory_gb x 79.19/80), since vLLM asks the device. Pin 4ac7713 (~0.10)
has no install here: `RELEASES` maps it to 0.11.0's rules, as kvsim's scheduler pins do
(`sim/scheduler/v1/release.py`), unverified against its own arg_utils.py.

Left out (the defaults of configurations kvsim does not simulate): pooling and
encoder-decoder models, multimodal models, MLA and Mamba block sizes, speculative decoding,
LoRA, KV transfer / events, data parallelism, TPU / CPU / ROCm platform tables, GB10's
capability check (not in the catalog), rope-scaling factors (the catalog has none),
`max_model_len="auto"` / -1, 0.11.0's `max_num_partial_prefills` (its threshold rule), Ray and
multi-node executors, and `VLLM_ALLOW_LONG_MAX_MODEL_LEN`. The block size is what the config
resolves, 16 (no catalog model is MLA or Mamba); 0.33.0's executor may raise it once the model
is loaded, for the attention backend it picked (`Platform.update_block_size_for_backend`,
platforms/interface.py L750-781: e.g. FlashAttention-4 kernels for head size 256 on newer
GPUs), which no CPU build can show and is not modelled.
"""

from sim.catalog import GpuSpec, ModelSpec
from sim.errors import InputError
from sim.kv.pins import VllmPin
from sim.scenario.vllm_defaults.common import (
    DefaultsError,
    Deployment,
    Origin,
    Refusal,
    ResolvedDefaults,
    Setting,
    UsageContext,
    UserFlags,
    device_total_memory_bytes,
    gpu_device_name,
)
from sim.scenario.vllm_defaults.v0 import resolve_v054
from sim.scenario.vllm_defaults.v1 import resolve_v011, resolve_v033

__all__ = [
    "ABSENT_FLAGS",
    "RELEASES",
    "DefaultsError",
    "Origin",
    "Refusal",
    "ResolvedDefaults",
    "Setting",
    "UsageContext",
    "UserFlags",
    "device_total_memory_bytes",
    "gpu_device_name",
    "resolve_defaults",
]

#: A pin's name -> the release whose defaulting code it follows.
RELEASES: dict[str, VllmPin] = {
    VllmPin.V0_5_4.value: VllmPin.V0_5_4,
    VllmPin.V0_5_4_PR_7380.value: VllmPin.V0_5_4,  # a block-table fix; same arg_utils.py
    VllmPin.C4AC7713.value: VllmPin.V0_11_0,
    VllmPin.V0_11_0.value: VllmPin.V0_11_0,
    # The 2026-bug pins (issue #23) follow 0.33.0's code with three release differences (no
    # >= 160 GiB batch tier before 0.33.0, gpu_memory_utilization 0.9 on 0.19.1, the
    # long-prefill threshold bound only on 0.33.0); each compared with its own
    # `create_engine_config` by the defaults lockstep: 1,596 of 1,596 deployments identical.
    VllmPin.V0_19_1.value: VllmPin.V0_33_0,
    VllmPin.V0_20_0.value: VllmPin.V0_33_0,
    VllmPin.V0_25_1.value: VllmPin.V0_33_0,
    VllmPin.V0_26_0.value: VllmPin.V0_33_0,
    VllmPin.V0_33_0.value: VllmPin.V0_33_0,
}

#: Flags a release's EngineArgs does not have (refused, rather than silently dropped).
ABSENT_FLAGS: dict[VllmPin, tuple[str, ...]] = {
    VllmPin.V0_5_4: ("async_scheduling", "long_prefill_token_threshold", "performance_mode"),
    VllmPin.V0_11_0: ("performance_mode",),
}


def resolve_defaults(
    release: str,
    model: ModelSpec | None,
    gpu: GpuSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    usage: UsageContext = UsageContext.API_SERVER,
    flags: UserFlags | None = None,
) -> ResolvedDefaults:
    """The settings `release` resolves; raises DefaultsError where it would refuse to start."""
    if release not in RELEASES:
        raise InputError(f"no defaults table for vLLM {release!r}; known: {sorted(RELEASES)}")
    if tp < 1 or pp < 1:
        raise InputError(f"tensor/pipeline parallel sizes must be >= 1, got {tp}/{pp}")
    dep = Deployment(model, gpu, tp, pp, usage)
    flags = flags or UserFlags()
    if flags.performance_mode not in (None, "balanced", "interactivity", "throughput"):
        raise InputError(f"unknown performance_mode {flags.performance_mode!r}")
    rules = RELEASES[release]
    for name in ABSENT_FLAGS.get(rules, ()):
        if getattr(flags, name) is not None:
            raise InputError(f"vLLM {release} has no --{name.replace('_', '-')}")
    if rules is VllmPin.V0_33_0:
        return resolve_v033(dep, flags, release)
    if rules is VllmPin.V0_11_0:
        return resolve_v011(dep, flags, release)
    return resolve_v054(dep, flags)
