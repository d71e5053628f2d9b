"""A catalog model's KV-cache groups and pool computed by a real vLLM release's own functions,
for the lockstep check of `sim.memory.hybrid_pool` (tests/vllm_real/test_hybrid_pool_lockstep.py).

Run in a fresh interpreter per release (``python -c "from sim.vllm_real.pool_layout import
main; main()" VERSION``): it loads the release (`sim.vllm_real.loader`), and for each case
prints one JSON line with what the release computes:

* the Mamba state shapes (`MambaStateShapeCalculator`) and dtypes (`MambaStateDtypeCalculator`);
* the unified block size and padded Mamba page, by the release's own unification:
  0.11.0 / 0.19.1 `HybridAttentionMambaModelConfig.verify_and_update_config`, from 0.20.0
  `Platform._align_hybrid_block_size`;
* the layer specs as the release's spec classes (`FullAttentionSpec`, `SlidingWindowSpec`,
  `ChunkedLocalAttentionSpec`, `MambaSpec`), grouped by its `get_kv_cache_groups`, with the
  hybrid manager disabled where the release's `VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE`
  default says so;
* `num_blocks` from `get_kv_cache_config_from_groups`, the concurrency from
  `get_max_concurrency_for_kv_cache_config`, and the "GPU KV cache size" tokens as the release
  logs them (0.11.0 in `get_kv_cache_config_from_groups`, 0.19.1 / 0.20.0
  `_report_kv_cache_config`, captured from its logger) or computes them for the log
  (`get_kv_cache_capacity`, 0.25.1 on).

What stands in for the server, and so is not checked: the model class (a stand-in returns the
calculator's shapes from the catalog's config numbers), the attention backend (one whose
smallest kernel block is 16, `MultipleOf(16)`, as FlashAttention's), `MambaModelConfig`'s
mode and CUDA-graph settings (mode "none" is set directly), and the config objects
(namespaces with the fields these functions read).
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import sys
from types import SimpleNamespace
from typing import Any

from sim.catalog import ModelSpec, get_model
from sim.vllm_real.loader import load_vllm

#: The token budget (`max_num_batched_tokens`, and `max_in_flight_tokens` from 0.26.0: a
#: synchronous engine) the windowed groups' per-request charge is sized with.
TOKEN_BUDGET = 8192
#: (model, block_size, max_model_len, tp, available bytes) checked on every release.
CASES: tuple[tuple[str, int, int, int, int], ...] = (
    ("qwen3-next-80b-a3b", 16, 8192, 1, 40 * 2**30),
    ("qwen3-next-80b-a3b", 64, 8192, 2, 40 * 2**30),
    ("nemotron-h-8b", 16, 8192, 1, 30 * 2**30),
    ("nemotron-h-8b", 32, 4096, 2, 30 * 2**30),
    ("llama-4-scout-17b-16e", 16, 65536, 4, 50 * 2**30),
    ("gemma-3-27b", 16, 32768, 1, 20 * 2**30),
    ("gpt-oss-20b", 16, 131072, 1, 60 * 2**30),
)


def _vllm(module: str) -> Any:
    return importlib.import_module(f"vllm.{module}")


def _state(model: ModelSpec, tp: int) -> tuple[Any, Any]:
    """(shapes, dtypes) of one Mamba layer from the release's calculators."""
    import torch

    mu = _vllm("model_executor.layers.mamba.mamba_utils")
    state = model.mamba_state
    assert state is not None
    if state.kind == "mamba2":
        assert state.num_heads and state.head_dim
        shapes = mu.MambaStateShapeCalculator.mamba2_state_shape(
            tp_world_size=tp,
            intermediate_size=state.num_heads * state.head_dim,
            n_groups=state.n_groups,
            num_heads=state.num_heads,
            head_dim=state.head_dim,
            state_size=state.state_size,
            conv_kernel=state.conv_kernel,
        )
        dtypes = mu.MambaStateDtypeCalculator.mamba2_state_dtype(torch.bfloat16, "auto", "auto")
    else:
        shapes = mu.MambaStateShapeCalculator.gated_delta_net_state_shape(
            tp,
            state.num_k_heads,
            state.num_v_heads,
            state.head_k_dim,
            state.head_v_dim,
            state.conv_kernel,
        )
        # (0.11.0 has no SSM-dtype argument; later releases default it to "auto")
        dtypes = mu.MambaStateDtypeCalculator.gated_delta_net_state_dtype(torch.bfloat16, "auto")
    return shapes, dtypes


def _unify(model: ModelSpec, block_size: int, mml: int, tp: int) -> Any:
    """The cache config after the release's own page-size unification."""
    import torch

    shapes, dtypes = _state(model, tp)
    fake_model = SimpleNamespace(
        get_mamba_state_shape_from_config=lambda vc: shapes,
        get_mamba_state_dtype_from_config=lambda vc: dtypes,
    )
    registry = SimpleNamespace(resolve_model_cls=lambda arch, model_config=None: (fake_model, arch))
    cache = SimpleNamespace(
        cache_dtype="auto", block_size=block_size, mamba_page_size_padded=None,
        mamba_block_size=None, mamba_cache_mode="none", enable_prefix_caching=False,
        calculate_kv_scales=False, mamba_cache_dtype="auto", mamba_ssm_cache_dtype="auto",
        user_specified_block_size=True, kv_cache_dtype_skip_layers=None,
        user_specified_mamba_block_size=False,
    )  # fmt: skip
    heads = max(1, model.num_kv_heads // tp)
    model_config = SimpleNamespace(
        dtype=torch.bfloat16, architecture="StandIn", max_model_len=mml, use_mla=False,
        get_num_kv_heads=lambda pc: heads, get_head_size=lambda: model.head_dim,
        is_hybrid=True, model=model.name,
    )  # fmt: skip
    vllm_config = SimpleNamespace(
        cache_config=cache, model_config=model_config,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp),
        attention_config=SimpleNamespace(backend=None),
    )  # fmt: skip
    platform = _vllm("platforms.interface").Platform
    if not hasattr(platform, "_align_hybrid_block_size"):  # 0.11.0, 0.19.1: in the model config
        cfg = _vllm("model_executor.models.config")
        cfg.ModelRegistry = registry
        cfg.MambaModelConfig.verify_and_update_config = classmethod(lambda cls, vc: None)
        cfg.HybridAttentionMambaModelConfig.verify_and_update_config(vllm_config)
        return cache
    _vllm("model_executor.models").ModelRegistry = registry
    backend = _backend()

    class StandInPlatform(platform):  # type: ignore[misc, valid-type]
        @classmethod
        def _find_non_ssm_backends(cls, vc: Any) -> list[Any]:
            return [backend]

    StandInPlatform._align_hybrid_block_size(vllm_config, backend)
    return cache


def _backend() -> Any:
    """An attention backend whose smallest kernel block is 16 (FlashAttention's)."""
    multiple_of = _vllm("v1.attention.backend").MultipleOf

    class StandInBackend:
        @staticmethod
        def get_supported_kernel_block_sizes() -> list[Any]:
            return [multiple_of(16)]

        @staticmethod
        def customize_spec(spec: Any) -> Any:
            return spec

        @staticmethod
        def get_name() -> str:
            return "STAND_IN"

    return StandInBackend


def _specs(model: ModelSpec, cache: Any, mml: int, tp: int) -> dict[str, Any]:
    """Each layer's spec, built with the release's classes."""
    import torch

    kci = _vllm("v1.kv_cache_interface")
    attention = {
        "block_size": cache.block_size,
        "num_kv_heads": max(1, model.num_kv_heads // tp),
        "head_size": model.head_dim,
        "dtype": torch.bfloat16,
    }
    specs: dict[str, Any] = {}
    for index, kind in enumerate(model.layer_kinds):
        name = f"model.layers.{index}"
        if kind == "full":
            specs[name] = kci.FullAttentionSpec(**attention)
        elif kind == "sliding":
            specs[name] = kci.SlidingWindowSpec(**attention, sliding_window=model.sliding_window)
        elif kind == "chunked":
            specs[name] = kci.ChunkedLocalAttentionSpec(
                **attention, attention_chunk_size=model.attention_chunk_size
            )
        elif kind == "mamba":
            shapes, dtypes = _state(model, tp)
            specs[name] = kci.MambaSpec(
                shapes=shapes, dtypes=dtypes, block_size=mml,
                page_size_padded=cache.mamba_page_size_padded,
            )  # fmt: skip
    return specs


def real_pool(name: str, block_size: int, mml: int, tp: int, available: int) -> dict[str, Any]:
    """What the release computes for one case (module docstring), as plain values."""
    model = get_model(name)
    cache = SimpleNamespace(block_size=block_size, mamba_page_size_padded=None)
    if model.mamba_state is not None:
        cache = _unify(model, block_size, mml, tp)
    specs = _specs(model, cache, mml, tp)
    envs = _vllm("envs")
    chunked = model.attention_chunk_size is not None
    disable = chunked and not envs.VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
    vllm_config = _grouping_config(disable, mml, TOKEN_BUDGET)
    utils = _vllm("v1.core.kv_cache_utils")
    # 0.33.0 moved the planning into its own module.
    planning = (
        utils if hasattr(utils, "get_kv_cache_groups") else _vllm("v1.core.kv_cache_planning")
    )
    groups = planning.get_kv_cache_groups(vllm_config, specs)
    from_groups = planning.get_kv_cache_config_from_groups
    logged = _LogCapture(utils.__name__)
    if "kv_cache_specs" in inspect.signature(from_groups).parameters:  # 0.11.0 logs in here
        config = from_groups(vllm_config, groups, specs, available)
    else:
        config = from_groups(vllm_config, groups, available)
    if hasattr(utils, "get_kv_cache_capacity"):  # 0.25.1 on: from the concurrency
        tokens = utils.get_kv_cache_capacity(vllm_config, config)[0]
    else:
        if hasattr(utils, "_report_kv_cache_config"):  # 0.19.1, 0.20.0
            utils._report_kv_cache_config(vllm_config, config)
        tokens = logged.tokens()
    return {
        "block_size": cache.block_size,
        "mamba_page_size_padded": cache.mamba_page_size_padded,
        "groups": [
            [_kind(g.kv_cache_spec), [int(n.split(".")[2]) for n in g.layer_names]] for g in groups
        ],
        "page_bytes": sorted({g.kv_cache_spec.page_size_bytes for g in groups}),
        "num_blocks": config.num_blocks,
        "logged_tokens": tokens,
        "concurrency": utils.get_max_concurrency_for_kv_cache_config(vllm_config, config),
    }


class _LogCapture(logging.Handler):
    """The "GPU KV cache size: N tokens" line a release logs through `logger_name`."""

    def __init__(self, logger_name: str) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []
        logger = logging.getLogger(logger_name)
        logger.setLevel(logging.INFO)
        logger.addHandler(self)

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def tokens(self) -> int:
        (line,) = [m for m in self.messages if m.startswith("GPU KV cache size:")]
        return int(line.split(":")[1].split()[0].replace(",", ""))


def _kind(spec: Any) -> str:
    """'full', 'sliding W', 'chunked A' or 'mamba', from the spec's class."""
    cls = type(spec).__name__
    if cls == "SlidingWindowSpec":
        return f"sliding {spec.sliding_window}"
    if cls == "ChunkedLocalAttentionSpec":
        return f"chunked {spec.attention_chunk_size}"
    return "mamba" if cls == "MambaSpec" else "full"


def _layout() -> Any:
    """0.33.0's resolved KV-cache layout: FlashAttention's NHD (LBNHC, layer-outermost)."""
    return _vllm("config.cache")._layout_from_name("NHD")


def _grouping_config(disable_hybrid: bool, mml: int, token_budget: int) -> Any:
    """The fields `get_kv_cache_groups` and the pool sizing read."""
    return SimpleNamespace(
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=disable_hybrid,
            max_num_batched_tokens=token_budget, max_model_len=mml,
        ),
        cache_config=SimpleNamespace(
            num_gpu_blocks_override=None, kv_cache_memory_bytes=None,
            prefix_cache_retention_interval=None, mamba_cache_mode="none",
            get_resolved_kv_cache_layout=_layout,
        ),
        parallel_config=SimpleNamespace(
            decode_context_parallel_size=1, prefill_context_parallel_size=1,
            tensor_parallel_size=1, pipeline_parallel_size=1,
        ),
        model_config=SimpleNamespace(max_model_len=mml),
        attention_config=SimpleNamespace(hisparse_config=None),
        kv_transfer_config=None,
        speculative_config=None,
        max_in_flight_tokens=token_budget,
    )  # fmt: skip


def main() -> None:
    """Print one JSON line per case for the release named on the command line."""
    load_vllm(vllm_version=sys.argv[1])
    for name, block_size, mml, tp, available in CASES:
        result = real_pool(name, block_size, mml, tp, available)
        print(json.dumps({"case": [name, block_size, mml, tp, available], **result}))
