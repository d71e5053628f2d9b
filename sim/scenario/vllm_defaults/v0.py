"""vLLM 0.5.4's v0-engine defaults (engine/arg_utils.py, config.py)."""

from __future__ import annotations

from sim.scenario.vllm_defaults.common import (
    DefaultsError,
    Deployment,
    Origin,
    Refusal,
    ResolvedDefaults,
    Setting,
    UserFlags,
    check_batch,
    check_heads,
    hf_architecture,
    max_model_len_setting,
    pick,
    replace_flags,
)

#: 0.5.4 config.py L32-47 `_PP_SUPPORTED_MODELS`: the architectures its v0 engine can split
#: into pipeline stages (checked at L280-284).
PP_ARCHITECTURES = frozenset(
    {
        "AquilaModel",
        "AquilaForCausalLM",
        "DeepseekV2ForCausalLM",
        "InternLMForCausalLM",
        "LlamaForCausalLM",
        "LLaMAForCausalLM",
        "MistralForCausalLM",
        "Phi3ForCausalLM",
        "GPT2LMHeadModel",
        "MixtralForCausalLM",
        "NemotronForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen2MoeForCausalLM",
        "QWenLMHeadModel",
    }
)


def resolve_v054(dep: Deployment, flags: UserFlags) -> ResolvedDefaults:
    """vLLM 0.5.4's v0 engine: fixed EngineArgs defaults, no GPU or usage-context tables.

    Gemma-2's interleaved window is unsupported there: sliding is disabled and max_model_len
    capped at the window (config.py L163-171), 8192 -> 4096."""
    model = dep.model
    if model is not None and model.layer_pattern == "alternating":
        flags = replace_flags(flags, disable_sliding_window=True)
    mml = max_model_len_setting(dep, flags, "0.5.4 config.py L1459-1574")
    window = None if flags.disable_sliding_window or model is None else model.sliding_window
    prefix = pick(flags.enable_prefix_caching, False, "0.5.4 engine/arg_utils.py L56")
    # arg_utils.py L746-773: on by default above 32K tokens on CUDA, without a sliding window
    # or prefix caching (spec decode, LoRA, prompt adapters, Mamba layers: not modelled).
    auto_chunk = mml.value > 32768 and window is None and not prefix.value
    chunked = pick(flags.enable_chunked_prefill, auto_chunk, "0.5.4 engine/arg_utils.py L746-773")
    # config.py L804-818: 512 with chunked prefill, else max(max_model_len, 2048).
    mnbt = 512 if chunked.value else max(mml.value, 2048)
    if flags.max_num_batched_tokens is not None:
        mnbt = flags.max_num_batched_tokens
    mns = 256 if flags.max_num_seqs is None else flags.max_num_seqs
    check_batch(mnbt, mns, mml.value, chunked.value, "0.5.4 config.py L834-848")
    # EngineConfig.__post_init__ (config.py L1641) checks the parallel layout last.
    check_heads(dep, "0.5.4 config.py L272")
    arch = hf_architecture(model)[0]
    if dep.pp > 1 and arch not in PP_ARCHITECTURES:
        raise DefaultsError(
            f"vLLM 0.5.4 has no pipeline parallelism for {arch} (config.py L280-284)",
            Refusal.PP_UNSUPPORTED_ARCH,
        )
    return ResolvedDefaults(
        release="0.5.4",
        max_num_seqs=pick(flags.max_num_seqs, 256, "0.5.4 engine/arg_utils.py L63"),
        max_num_batched_tokens=pick(flags.max_num_batched_tokens, mnbt, "0.5.4 config.py L804-818"),
        enable_prefix_caching=prefix,
        enable_chunked_prefill=chunked,
        gpu_memory_utilization=pick(
            flags.gpu_memory_utilization, 0.9, "0.5.4 engine/arg_utils.py L61"
        ),
        block_size=pick(flags.block_size, 16, "0.5.4 engine/arg_utils.py L55"),
        max_model_len=mml,
        async_scheduling=Setting(False, Origin.RELEASE, "v0 has no async scheduling"),
        long_prefill_token_threshold=Setting(0, Origin.RELEASE, "v0 has no such setting"),
        sliding_window=Setting(window, Origin.RELEASE, "0.5.4 config.py L307-314"),
        # config.py L706-728: "mp" when the world fits the node's GPUs (Ray not installed);
        # one GPU has no distributed backend (None: the single-GPU executor).
        executor=Setting(
            None if dep.tp * dep.pp == 1 else "mp", Origin.RELEASE, "0.5.4 config.py L706-728"
        ),
    )


#: Pin -> the release whose rules it follows.
