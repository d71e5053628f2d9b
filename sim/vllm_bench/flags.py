"""Every option of `vllm serve` (pinned releases 0.11.0, 0.19.1, 0.20.0, 0.25.1, 0.26.0 and
0.33.0), by what kvsim does with it.

The options themselves, as each release's argparse defines them (option strings, `dest`, the
number of values, the `--no-` / `--disable-` forms), are `sim/data/vllm_serve_flags/<v>.json`,
written from the release's real parser by `scripts/vllm_serve_flags.py` (0.33.0
`vllm/entrypoints/common/cli_args.py` `make_arg_parser` + `vllm/engine/arg_utils.py`
`EngineArgs.add_cli_args`; 0.11.0 to 0.26.0 `vllm/entrypoints/openai/cli_args.py`). Here each
`dest` is in exactly one class (`tests/vllm_bench/test_flags.py` reads the releases' sources by
AST and checks that every option they register is classified):

* `MODELLED`: maps to a scenario field (`sim.vllm_bench.importer`);
* `NO_EFFECT`: changes nothing kvsim simulates (ports, TLS, logging, API keys, chat templates,
  tool parsers, where weights are downloaded from, ...): accepted, not recorded;
* `SPECULATIVE`: speculative decoding, refused for now (kvsim does not model draft tokens);
* `UNMODELLED`: changes scheduling, memory or speed in a way kvsim does not model: refused,
  naming the option, unless `--allow-unmodelled` lists it (then the scenario's description
  records it).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import Enum
from functools import cache
from importlib import resources

from sim.errors import InputError

#: The releases whose option tables kvsim carries.
RELEASES = ("0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0")


def nearest_release(version: str) -> str:
    """The release kvsim pins that stands in for `version`: the newest of `RELEASES` whose
    major.minor is at or below its; the oldest, 0.11.0, for anything older or unparsed.
    Example: '0.19.0' -> '0.19.1', '0.24.2' -> '0.20.0', '0.10.1.1 (printed)' -> '0.11.0'."""

    def major_minor(text: str) -> tuple[int, int] | None:
        match = re.match(r"\s*v?(\d+)\.(\d+)", text)
        return None if match is None else (int(match.group(1)), int(match.group(2)))

    measured = major_minor(version)
    pins = sorted((major_minor(pin) or (0, 0), pin) for pin in RELEASES)
    at_or_below = [pin for key, pin in pins if measured is not None and key <= measured]
    return at_or_below[-1] if at_or_below else pins[0][1]


class FlagClass(Enum):
    MODELLED = "modelled"
    NO_EFFECT = "no effect"
    SPECULATIVE = "speculative decoding"
    UNMODELLED = "unmodelled"


# fmt: off
MODELLED = frozenset([
    "model", "tensor_parallel_size", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "enable_chunked_prefill", "enable_prefix_caching", "gpu_memory_utilization", "block_size",
    "kv_cache_dtype", "swap_space", "num_gpu_blocks_override", "scheduling_policy",
    "long_prefill_token_threshold", "async_scheduling", "dtype", "quantization",
    "api_server_count", "stream_interval",
    "mamba_cache_mode",
])

NO_EFFECT = frozenset([
    "aggregate_engine_logging", "allow_credentials", "allowed_headers",
    "allowed_local_media_path", "allowed_media_domains", "allowed_methods", "allowed_origins",
    "anthropic_disabled_thinking_effort", "api_key", "chat_template",
    "chat_template_content_format", "code_revision", "cohere_format",
    "cohere_is_reasoning_model", "collect_detailed_traces", "config_format",
    "cpu_distributed_timeout_seconds", "cudagraph_metrics", "custom_histogram_buckets",
    "data_parallel_supervisor_port", "default_chat_template_kwargs",
    "disable_access_log_for_endpoints", "disable_fastapi_docs", "disable_log_requests",
    "disable_log_stats", "disable_uvicorn_access_log", "distributed_timeout_seconds",
    "download_dir", "dp_supervisor_probe_failure_threshold", "dp_supervisor_probe_interval_s",
    "dp_supervisor_probe_timeout_s", "enable_auto_tool_choice",
    "enable_flash_late_interaction", "enable_force_include_usage",
    "enable_layerwise_nvtx_tracing", "enable_log_deltas", "enable_log_outputs",
    "enable_log_requests", "enable_logging_iteration_details", "enable_mfu_metrics",
    "enable_offline_docs", "enable_per_request_metrics", "enable_prompt_tokens_details",
    "enable_request_id_headers", "enable_server_load_tracking", "enable_ssl_refresh",
    "enable_tokenizer_info_endpoint", "exclude_tools_when_tool_choice_none",
    "fail_on_environ_validation", "fingerprint_mode", "fingerprint_value", "generation_config",
    "h11_max_header_count", "h11_max_incomplete_event_size", "headless", "hf_config_path",
    "hf_token", "host", "ignore_patterns", "jit_monitor_verbose", "kv_cache_metrics",
    "kv_cache_metrics_sample", "load_format", "log_config_file", "log_error_stack",
    "log_level", "logging_config", "logprobs_mode", "max_log_len", "max_logprobs",
    "max_parallel_loading_workers", "middleware", "model_loader_extra_config",
    "otlp_traces_endpoint", "override_generation_config", "port", "pt_load_map_location",
    "ray_workers_use_nsight", "reasoning_effort_map", "reasoning_parser",
    "reasoning_parser_plugin", "response_role", "return_tokens_as_token_ids", "revision",
    "root_path", "safetensors_load_strategy", "safetensors_prefetch_block_size",
    "safetensors_prefetch_num_threads", "seed", "served_model_name",
    "show_hidden_metrics_for_version", "shutdown_timeout",
    "sse_keep_alive_interval", "ssl_ca_certs", "ssl_cert_reqs", "ssl_certfile", "ssl_ciphers",
    "ssl_keyfile", "tokenizer", "tokenizer_mode", "tokenizer_revision", "tool_call_parser",
    "tool_parser_plugin", "tool_server", "tool_strict_level", "trust_remote_code",
    "trust_request_chat_template", "trust_request_mm_kwargs", "uds", "use_tqdm_on_load",
    "uvicorn_log_level",
])

SPECULATIVE = frozenset([
    "speculative_config", "spec_method", "spec_model", "spec_tokens",
])

UNMODELLED = frozenset([
    # The API servers kvsim models (`sim.engine.frontend`) tokenize the prompts and
    # detokenize the outputs: one that skips that work is not what it simulates.
    "skip_tokenizer_init",
    "additional_config", "all2all_backend", "allow_deprecated_quantization",
    "attention_backend", "attention_config", "aux_output_config", "calculate_kv_scales",
    "compilation_config", "config", "convert", "cp_kv_cache_interleave_size", "cpu_offload_gb",
    "cpu_offload_params", "cuda_graph_sizes", "cudagraph_capture_sizes",
    "data_parallel_address", "data_parallel_backend", "data_parallel_external_lb",
    "data_parallel_hybrid_lb", "data_parallel_multi_port_external_lb", "data_parallel_rank",
    "data_parallel_rpc_port", "data_parallel_size", "data_parallel_size_local",
    "data_parallel_start_rank", "dbo_decode_token_threshold", "dbo_prefill_token_threshold",
    "dcp_comm_backend", "dcp_kv_cache_interleave_size", "dcp_q_replicate",
    "decode_context_parallel_size", "default_mm_loras", "device_ids", "diffusion_config",
    "disable_cascade_attn", "disable_chunked_mm_input", "disable_custom_all_reduce",
    "disable_frontend_multiprocessing", "disable_hybrid_kv_cache_manager",
    "disable_mm_preprocessor_cache", "disable_nccl_for_dp_synchronization",
    "disable_sliding_window", "distributed_executor_backend", "dp_sync_interval",
    "ec_manager_config", "ec_transfer_config", "elastic_ep_max_dp_size",
    "enable_batch_sharded_sampling",
    "enable_bf16x3_router_gemm",  # 0.26.0: an experimental SM100 MoE router GEMM (kernel speed)
    "enable_cumem_allocator", "enable_dbo",
    "enable_elastic_ep", "enable_ep_weight_filter", "enable_eplb", "enable_expert_parallel",
    "enable_fault_tolerance", "enable_flashinfer_autotune", "enable_hc_sp", "enable_lora",
    "enable_lora_bias", "enable_mamba_cache_stochastic_rounding",
    "enable_mamba_shared_prefix_checkpoint", "enable_mixed_moe_lora_format",
    "enable_mm_embeds", "enable_moe_shared_loras", "enable_multimodal_encoder_data_parallel",
    "enable_nccl_comm_suspend", "enable_prompt_embeds", "enable_return_routed_experts",
    "enable_scale_out", "enable_shm_tensor_arena", "enable_sleep_mode",
    "enable_tower_connector_lora", "enable_trace_replay", "enforce_eager", "engram_config",
    "eplb_config", "eplb_log_balancedness", "eplb_step_interval", "eplb_window_size",
    "expert_placement_strategy", "fault_tolerance_config", "fully_sharded_loras",
    "gdn_prefill_backend", "grpc", "grpc_port", "guided_decoding_backend",
    "guided_decoding_disable_additional_properties", "guided_decoding_disable_any_whitespace",
    "guided_decoding_disable_fallback", "hf_overrides", "interleave_mm_strings",
    "io_processor_plugin", "ir_op_priority", "jit_monitor_mode", "kda_decode_backend",
    "kda_prefill_backend", "kernel_config", "kv_cache_dtype_skip_layers",
    "kv_cache_memory_bytes", "kv_events_config", "kv_offloading_backend", "kv_offloading_size",
    "kv_sharing_fast_prefill", "kv_transfer_config", "language_model_only",
    "limit_mm_per_prompt", "linear_backend", "logits_processor_pattern", "logits_processors",
    "long_prefill_token_threshold_adaptive", "lora_dtype", "lora_extra_vocab_size",
    "lora_modules", "lora_target_modules", "mamba_backend", "mamba_block_size",
    "mamba_cache_dtype", "mamba_cache_philox_rounds",
    "mamba_ssm_cache_dtype", "mamba_ssu_algorithm", "master_addr", "master_port",
    "max_cpu_loras", "max_cudagraph_capture_size", "max_long_partial_prefills",
    "max_lora_cls_labels", "max_lora_rank", "max_loras", "max_num_active_seqs",
    "max_num_partial_prefills", "max_num_queued_reqs", "max_num_queued_tokens",
    "max_num_scheduled_tokens", "media_io_kwargs", "mm_device_do_normalize",
    "mm_encoder_attn_backend", "mm_encoder_attn_dtype", "mm_encoder_fp8_scale_path",
    "mm_encoder_fp8_scale_save_margin", "mm_encoder_fp8_scale_save_path", "mm_encoder_only",
    "mm_encoder_tp_mode", "mm_hasher_algorithm", "mm_ipc_gpu_memory_gb",
    "mm_processor_cache_gb", "mm_processor_cache_type", "mm_processor_device",
    "mm_processor_kwargs", "mm_shm_cache_max_object_size_mb", "mm_tensor_ipc",
    "model_class_overrides", "model_impl", "moe_backend", "monokernel", "nnodes", "node_rank",
    "num_lookahead_slots", "num_redundant_experts", "numa_bind", "numa_bind_cpus",
    "numa_bind_nodes", "offload_backend", "offload_group_size", "offload_num_in_group",
    "offload_params", "offload_prefetch_step", "optimization_level",
    "override_attention_dtype", "override_pooler_config", "per_request_spec_decode_metrics",
    "performance_mode", "pipeline_parallel_size", "pooler_config",
    "prefill_context_parallel_size", "prefill_schedule_interval",
    "prefix_cache_retention_interval", "prefix_caching_hash_algo", "prefix_match_unit",
    "profiler_config", "quantization_config", "reasoning_config", "renderer_num_workers",
    "replayssm_buffer_len", "return_sampling_mask", "rope_scaling", "rope_theta", "runner",
    "scheduler_cls", "scheduler_reserve_full_isl", "skip_mm_profiling", "sleep_mode_backend",
    "sleep_mode_offload_cudagraph", "sleep_preserve_parameter_names",
    "sparse_indexer_topk_backend", "specialize_active_lora",
    "structured_outputs_config", "swa_bounded_replay", "task", "tokens_only", "ubatch_size",
    "use_fp64_gumbel", "use_replayssm", "video_pruning_method", "video_pruning_rate",
    "watchdog_config", "watermark", "watermark_config", "weight_transfer_config", "worker_cls",
    "worker_extension_cls",
])
# fmt: on

_CLASSES = (
    (MODELLED, FlagClass.MODELLED),
    (NO_EFFECT, FlagClass.NO_EFFECT),
    (SPECULATIVE, FlagClass.SPECULATIVE),
    (UNMODELLED, FlagClass.UNMODELLED),
)


def flag_class(dest: str) -> FlagClass | None:
    """The class of one option's `dest`; None for one no release table knows."""
    for names, kind in _CLASSES:
        if dest in names:
            return kind
    return None


@dataclass(frozen=True, slots=True)
class ServeOption:
    """One option of a release's `vllm serve` parser (a row of its JSON table).

    kind: `value` (takes `nargs` values: None = one, "?" = zero or one, "+" = one or more),
    `bool` (no value; `negative` lists the forms that set it False: `--no-x`, `--disable-x`),
    `store_true` (no value, sets True) or `append` (one value, repeatable).
    """

    dest: str
    options: tuple[str, ...]
    kind: str
    nargs: str | int | None = None
    negative: tuple[str, ...] = ()


@cache
def serve_options(version: str) -> tuple[ServeOption, ...]:
    """The options of `vllm serve` at `version` (one of `RELEASES`)."""
    if version not in RELEASES:
        raise InputError(
            f"--vllm-version {version}: kvsim has the `vllm serve` options of "
            f"{', '.join(RELEASES)} only"
        )
    text = resources.files("sim.data").joinpath(f"vllm_serve_flags/{version}.json").read_text()
    rows = json.loads(text)["flags"]
    return tuple(
        ServeOption(
            dest=row["dest"],
            options=tuple(row["options"]),
            kind=row["kind"],
            nargs=row.get("nargs"),
            negative=tuple(row.get("negative", ())),
        )
        for row in rows
    )
