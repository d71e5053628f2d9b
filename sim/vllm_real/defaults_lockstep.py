"""`kvsim verify --defaults`: each V1 release's real `EngineArgs(...).create_engine_config()`,
built on CPU over a grid of deployments, against `sim.scenario.vllm_defaults` field by field.

What is patched, so that vLLM's own code runs here unchanged otherwise:

* `vllm/__init__` is not run (`sim.vllm_real.loader`); the one name the config code imports
  from it, `vllm.SamplingParams`, is set on the bare package.
* The compiled modules (`vllm._C`, `vllm._C_stable_libtorch`, ...) are empty modules, so
  `vllm/platforms/cuda.py` imports.
* `current_platform` is a subclass of the release's `CudaPlatformBase` (everything CUDA's,
  `check_and_update_config` included) whose device queries answer for the catalog GPU: the name
  (`gpu_device_name`), the total memory (`device_total_memory_bytes`: the driver-visible figure),
  the compute capability (`CAPABILITY`), 8 devices, fully connected.
* 0.11.0: `config.parallel.cuda_device_count_stateless` returns 8 (a node with 8 GPUs; else
  it asks for Ray) and `config.cache.get_cpu_memory` 2 TiB (the node's host RAM, against
  which CacheConfig checks the swap space). 0.33.0: `config.vllm.HAS_TRITON` is True, as on a GPU install, which makes
  the V2 model runner the default (it decides whether PP turns async scheduling off).
* The model: a `config.json` written from the catalog (`_hf_config`) into a temporary folder,
  the real architecture name registered to a do-nothing module (no weights, no tokenizer,
  `skip_tokenizer_init`, HF offline).

Left out: ROCm / TPU / CPU platforms, Ray, data parallelism, and everything
`vllm_defaults` leaves out. The v0 pin (0.5.4) is not built here.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sim.catalog import GpuSpec, ModelSpec, get_gpu, get_model
from sim.errors import InputError
from sim.scenario.vllm_defaults import (
    DefaultsError,
    Refusal,
    UsageContext,
    UserFlags,
    device_total_memory_bytes,
    gpu_device_name,
    resolve_defaults,
)
from sim.vllm_real.loader import VllmInstall, import_vllm, load_vllm
from sim.vllm_real.v1_sched_adapter import OFFLINE_ENV, QUIET_ENV, _stub_model_class

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
#: Host RAM of the node (0.11.0 checks swap space against it): 2 TiB, as on an 8-GPU server.
HOST_MEMORY_BYTES = 2 * 2**40
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
)


#: What vLLM's own message says for each refusal kvsim predicts (both releases' wording).
REFUSAL_TEXT: dict[Refusal, str] = {
    Refusal.MAX_MODEL_LEN: "User-specified max_model_len",
    Refusal.BATCH_BELOW_SEQS: "must be greater than or equal to max_num_seqs",
    Refusal.BATCH_BELOW_MODEL_LEN: "is smaller than max_model_len",
    Refusal.HEADS_NOT_DIVISIBLE: "must be divisible by tensor parallel size",
    Refusal.ASYNC_WITH_PP: "Async scheduling is not supported with pipeline-parallel",
}


@dataclass(frozen=True, slots=True)
class DefaultsCase:
    model: str
    gpu: str
    tp: int
    pp: int
    usage: UsageContext
    flags: UserFlags

    def label(self) -> str:
        set_flags = {k: v for k, v in _flag_items(self.flags) if v is not None and v is not False}
        if self.flags.enable_chunked_prefill is False:
            set_flags["enable_chunked_prefill"] = False
        return f"{self.model} on {self.gpu} TP{self.tp} PP{self.pp} {self.usage.value} {set_flags}"


def _flag_items(flags: UserFlags) -> list[tuple[str, Any]]:
    return [(name, getattr(flags, name)) for name in UserFlags.__slots__]


def grid(version: str, num_configs: int | None = None) -> list[DefaultsCase]:
    """The deployments compared: models x GPUs x usage x flags, parallelism cycled; every
    `step`-th one when `num_configs` asks for fewer (the cut keeps every dimension varied)."""
    flags = [f for f in GRID_FLAGS if version == "0.33.0" or f.performance_mode is None]
    combos = list(itertools.product(GRID_MODELS, GRID_GPUS, UsageContext, flags))
    if num_configs is not None and num_configs < len(combos):
        step = len(combos) / num_configs
        combos = [combos[int(i * step)] for i in range(num_configs)]
    # Parallelism cycles over the kept combinations, so every (TP, PP) meets every model.
    return [
        DefaultsCase(m, g, *GRID_PARALLEL[i % len(GRID_PARALLEL)], u, f)
        for i, (m, g, u, f) in enumerate(combos)
    ]


def _hf_config(model: ModelSpec) -> dict[str, Any]:
    """The model's config.json, from the catalog geometry, under its real architecture."""
    name = model.name
    arch, model_type = "LlamaForCausalLM", "llama"
    extra: dict[str, Any] = {}
    if name.startswith("mistral"):
        arch, model_type = "MistralForCausalLM", "mistral"
        extra = {"sliding_window": model.sliding_window}
    elif name.startswith("mixtral"):
        arch, model_type = "MixtralForCausalLM", "mixtral"
        extra = {
            "num_local_experts": model.num_experts,
            "num_experts_per_tok": model.num_experts_per_token,
            "sliding_window": None,
        }
    elif name.startswith("qwen2"):
        arch, model_type = "Qwen2ForCausalLM", "qwen2"
        extra = {"use_sliding_window": False, "sliding_window": None}
    elif name.startswith("gemma-2"):
        arch, model_type = "Gemma2ForCausalLM", "gemma2"
        extra = {"sliding_window": model.sliding_window, "query_pre_attn_scalar": 256}
    elif model.sliding_window is not None:
        raise ValueError(f"no config.json family for windowed model {name!r}")
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


def _patch(module: types.ModuleType, name: str, value: Any) -> None:
    """Replace one of vLLM's module globals for this process (see the module docstring)."""
    if not hasattr(module, name) and name != "SamplingParams":
        raise AttributeError(f"{module.__name__} has no {name}: the patch no longer applies")
    setattr(module, name, value)


def _eight() -> int:
    """GPUs on the node (`cuda_device_count_stateless`)."""
    return 8


def _host_memory() -> int:
    return HOST_MEMORY_BYTES


class _Real:
    """One release's config code, loaded and patched (see the module docstring)."""

    def __init__(self, install: VllmInstall) -> None:
        for key, value in {**OFFLINE_ENV, **QUIET_ENV}.items():
            os.environ.setdefault(key, value)
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        self.install = install
        for name in ("_C", "_C_stable_libtorch", "_moe_C", "_flashmla_C", "_rocm_C"):
            sys.modules.setdefault(f"vllm.{name}", types.ModuleType(f"vllm.{name}"))
        sampling = import_vllm("sampling_params", install)
        _patch(sys.modules["vllm"], "SamplingParams", sampling.SamplingParams)
        cuda = import_vllm("platforms.cuda", install)
        iface = import_vllm("platforms.interface", install)
        self.platform = _fake_platform_class(cuda.CudaPlatformBase, iface.DeviceCapability)()
        _patch(import_vllm("platforms", install), "_current_platform", self.platform)
        if install.version_tuple >= (0, 33):
            _patch(import_vllm("config.vllm", install), "HAS_TRITON", True)
        else:
            _patch(import_vllm("config.parallel", install), "cuda_device_count_stateless", _eight)
            # CacheConfig refuses swap space (4 GiB x TP) above 70% of host RAM: a GPU node's.
            _patch(import_vllm("config.cache", install), "get_cpu_memory", _host_memory)
        registry = import_vllm("model_executor.models.registry", install).ModelRegistry
        stub = _pp_stub_model_class()
        for arch in (
            "LlamaForCausalLM",
            "MistralForCausalLM",
            "MixtralForCausalLM",
            "Qwen2ForCausalLM",
            "Gemma2ForCausalLM",
        ):
            registry.register_model(arch, stub)
        self.arg_utils = import_vllm("engine.arg_utils", install)
        self.usage = import_vllm("usage.usage_lib", install).UsageContext
        self.tmp = Path(tempfile.mkdtemp(prefix="kvsim-defaults-"))

    def model_dir(self, model: ModelSpec) -> Path:
        folder = self.tmp / model.name
        if not folder.exists():
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(_hf_config(model)))
        return folder

    def resolve(self, case: DefaultsCase) -> dict[str, Any] | str:
        """The real resolved fields, or "refused: <type>" where vLLM raises."""
        model, gpu = get_model(case.model), get_gpu(case.gpu)
        type(self.platform).configure(gpu)
        kwargs = {k: v for k, v in _flag_items(case.flags) if v is not None}
        usage = (
            self.usage.OPENAI_API_SERVER
            if case.usage is UsageContext.API_SERVER
            else self.usage.LLM_CLASS
        )
        try:
            args = self.arg_utils.EngineArgs(
                model=str(self.model_dir(model)),
                skip_tokenizer_init=True,
                tensor_parallel_size=case.tp,
                pipeline_parallel_size=case.pp,
                **kwargs,
            )
            config = args.create_engine_config(usage_context=usage)
        except (ValueError, NotImplementedError) as exc:  # pydantic's ValidationError included
            return f"refused: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        sched, cache = config.scheduler_config, config.cache_config
        chunked = getattr(sched, "chunked_prefill_enabled", sched.enable_chunked_prefill)
        return {
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "enable_prefix_caching": cache.enable_prefix_caching,
            "enable_chunked_prefill": chunked,
            "gpu_memory_utilization": cache.gpu_memory_utilization,
            "block_size": cache.block_size,
            "max_model_len": config.model_config.max_model_len,
            "async_scheduling": bool(sched.async_scheduling),
            "long_prefill_token_threshold": sched.long_prefill_token_threshold,
            "sliding_window": cache.sliding_window,
            "executor": config.parallel_config.distributed_executor_backend,
        }


def _pp_stub_model_class() -> type:
    """The scheduler lockstep's do-nothing model, declaring pipeline-parallel support as the
    real Llama / Mistral / Mixtral / Qwen2 / Gemma2 classes do (`SupportsPP`)."""
    base = _stub_model_class()

    class KvsimStubPPForCausalLM(base):  # type: ignore[misc, valid-type]
        supports_pp = True

        def make_empty_intermediate_tensors(self, *args: Any, **kwargs: Any) -> None:
            return None

        def forward(self, input_ids: Any, positions: Any, intermediate_tensors: Any = None) -> None:
            return None

    return KvsimStubPPForCausalLM


def _fake_platform_class(base: type, capability: type) -> type:
    """`base` (the release's CudaPlatformBase) answering device queries for one catalog GPU."""

    class KvsimFakeCuda(base):
        gpu_name = ""
        total_memory = 0
        compute_capability = (9, 0)

        @classmethod
        def configure(cls, gpu: GpuSpec) -> None:
            cls.gpu_name = gpu_device_name(gpu)
            cls.total_memory = device_total_memory_bytes(gpu)
            cls.compute_capability = CAPABILITY[gpu.name]

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> Any:
            return capability(*cls.compute_capability)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return cls.gpu_name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return cls.total_memory

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return 8

    return KvsimFakeCuda


def kvsim_side(version: str, case: DefaultsCase) -> dict[str, Any] | str:
    try:
        resolved = resolve_defaults(
            version,
            get_model(case.model),
            get_gpu(case.gpu),
            tp=case.tp,
            pp=case.pp,
            usage=case.usage,
            flags=case.flags,
        )
    except DefaultsError as exc:
        return f"refused: {exc.refusal.name}"
    return resolved.values()


@dataclass(slots=True)
class DefaultsResult:
    version: str
    compared: int = 0
    identical: int = 0
    refused: int = 0
    divergences: list[str] = field(default_factory=list)

    @property
    def all_identical(self) -> bool:
        return self.compared > 0 and self.identical == self.compared

    def summary(self) -> str:
        head = (
            f"defaults vs vLLM {self.version}: {self.identical} of {self.compared} "
            f"configurations identical ({self.refused} refused by both)"
        )
        return "\n".join([head, *self.divergences[:10]])


def _same(kvsim: dict[str, Any] | str, real: dict[str, Any] | str) -> bool:
    """Equal fields, or both refused for the same reason (kvsim's kind found in vLLM's text)."""
    if isinstance(kvsim, str) and isinstance(real, str):
        text = " ".join(real.split())
        return REFUSAL_TEXT[Refusal[kvsim.removeprefix("refused: ")]] in text
    return kvsim == real


#: The V1 releases whose config code is built here (the v0 pin's needs an older transformers).
VERIFIABLE = ("0.11.0", "0.33.0")


def verify_defaults(
    version: str | None,
    num_configs: int | None = None,
    vllm_root: str | Path | None = None,
) -> DefaultsResult:
    """Compare every field over `grid(version, num_configs)` (all of it for None); each
    divergence names the deployment and the fields that differ."""
    install = load_vllm(vllm_root, None if vllm_root else version)
    version = ".".join(str(p) for p in install.version_tuple[:3])
    if version not in VERIFIABLE:
        raise InputError(
            f"--defaults compares the V1 releases {', '.join(VERIFIABLE)}; got vLLM {version}"
        )
    real = _Real(install)
    result = DefaultsResult(install.version)
    for case in grid(version, num_configs):
        mine, theirs = kvsim_side(version, case), real.resolve(case)
        result.compared += 1
        if _same(mine, theirs):
            result.identical += 1
            result.refused += isinstance(mine, str)
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            diff = {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs.get(k)}
            result.divergences.append(f"  {case.label()}: (kvsim, vLLM) {diff}")
        else:
            result.divergences.append(f"  {case.label()}: kvsim {mine!r}, vLLM {theirs!r}")
    return result
