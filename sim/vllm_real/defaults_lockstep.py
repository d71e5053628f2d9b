"""`kvsim verify --defaults`: each release's real `EngineArgs(...).create_engine_config()`,
built on CPU over the grid of `sim.vllm_real.defaults_grid`, against
`sim.scenario.vllm_defaults`, field by field (a refusal counts as identical when vLLM refuses
for the reason kvsim names).

What is patched, so that vLLM's own code runs here unchanged otherwise:

* `vllm/__init__` is not run (`sim.vllm_real.loader`); V1: the one name the config code imports
  from it, `vllm.SamplingParams`, is set on the bare package.
* V1: the compiled modules (`vllm._C`, `vllm._C_stable_libtorch`, ...) are empty modules, so
  `vllm/platforms/cuda.py` imports; `current_platform` is a subclass of the release's
  `CudaPlatformBase` (everything CUDA's, `check_and_update_config` included) whose device
  queries answer for the catalog GPU: the name (`gpu_device_name`), the total memory
  (`device_total_memory_bytes`, the driver-visible figure), the compute capability
  (`CAPABILITY`), 8 devices, fully connected.
* 0.11.0 and 0.5.4: `cuda_device_count_stateless` returns 8 (a node with 8 GPUs; else they
  ask for Ray) and `get_cpu_memory` 2 TiB (host RAM, against which CacheConfig checks the swap
  space). 0.33.0: `config.vllm.HAS_TRITON` is True, as on a GPU install, which makes the V2
  model runner the default (it decides whether PP turns async scheduling off).
* 0.5.4: `device="cuda"` is passed (its "auto" would find no GPU); its config code runs on
  0.11.0's pinned transformers (4.56, `.vllm/0.11.0/_deps`), not the 4.4x it was released
  with; it has no usage context and no async scheduling, so those fields are kvsim's constants.
* The model: a `config.json` written from the catalog (`defaults_grid.hf_config`) into a
  temporary folder; V1: the real architecture names registered to a do-nothing module (no
  weights, no tokenizer, `skip_tokenizer_init`, HF offline).

Left out: ROCm / TPU / CPU platforms, Ray and multi-node (world size > 8), data parallelism,
and everything `sim.scenario.vllm_defaults` leaves out.
"""

from __future__ import annotations

import abc
import importlib.util
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
from sim.vllm_real.defaults_grid import (
    CAPABILITY,
    GRID_MODELS,
    DefaultsCase,
    flag_items,
    grid,
    hf_config,
)
from sim.vllm_real.loader import (
    DEPS_DIRNAME,
    VllmInstall,
    VllmNotAvailableError,
    import_vllm,
    load_vllm,
    resolve_root,
)
from sim.vllm_real.v1_sched_adapter import OFFLINE_ENV, QUIET_ENV, _stub_model_class

#: Host RAM of the node (CacheConfig checks swap space against it): 2 TiB, an 8-GPU server's.
HOST_MEMORY_BYTES = 2 * 2**40

#: What vLLM's own message says for each refusal kvsim predicts (both releases' wording).
REFUSAL_TEXT: dict[Refusal, str] = {
    Refusal.MAX_MODEL_LEN: "User-specified max_model_len",
    Refusal.BATCH_BELOW_SEQS: "must be greater than or equal to max_num_seqs",
    Refusal.BATCH_BELOW_MODEL_LEN: "is smaller than max_model_len",
    Refusal.HEADS_NOT_DIVISIBLE: "must be divisible by tensor parallel size",
    Refusal.ASYNC_WITH_PP: "Async scheduling is not supported with pipeline-parallel",
    Refusal.PP_UNSUPPORTED_ARCH: "Pipeline parallelism is only supported for the following",
    Refusal.LONG_PREFILL_ABOVE_MODEL_LEN: "cannot be greater than the max_model_len",
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


class _RealConfigs(abc.ABC):
    """One release's config code, loaded and patched; `resolve` builds one case's config."""

    def __init__(self, install: VllmInstall) -> None:
        for key, value in {**OFFLINE_ENV, **QUIET_ENV}.items():
            os.environ.setdefault(key, value)
        self.install = install
        self.tmp = Path(tempfile.mkdtemp(prefix="kvsim-defaults-"))

    def model_dir(self, model: ModelSpec) -> Path:
        folder = self.tmp / model.name
        if not folder.exists():
            folder.mkdir()
            (folder / "config.json").write_text(json.dumps(hf_config(model)))
        return folder

    @abc.abstractmethod
    def build(self, case: DefaultsCase, kwargs: dict[str, Any]) -> Any:
        """The release's own `EngineArgs(**kwargs).create_engine_config()` for `case`."""

    def resolve(self, case: DefaultsCase) -> dict[str, Any] | str:
        """The real resolved fields, or "refused: <type>: <message>" where vLLM raises."""
        kwargs = {k: v for k, v in flag_items(case.flags) if v is not None}
        kwargs.update(
            model=str(self.model_dir(get_model(case.model))),
            skip_tokenizer_init=True,
            tensor_parallel_size=case.tp,
            pipeline_parallel_size=case.pp,
        )
        try:
            config = self.build(case, kwargs)
        except (ValueError, NotImplementedError) as exc:  # pydantic's ValidationError included
            return f"refused: {type(exc).__name__}: {' '.join(str(exc).split())[:400]}"
        sched, cache = config.scheduler_config, config.cache_config
        return {
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "enable_prefix_caching": cache.enable_prefix_caching,
            # 0.33.0 dropped the `chunked_prefill_enabled` mirror; 0.5.4 has only it.
            "enable_chunked_prefill": (
                sched.chunked_prefill_enabled
                if hasattr(sched, "chunked_prefill_enabled")
                else sched.enable_chunked_prefill
            ),
            "gpu_memory_utilization": cache.gpu_memory_utilization,
            "block_size": cache.block_size,
            "max_model_len": config.model_config.max_model_len,
            # v0 has neither: kvsim's constants stand in (see the module docstring).
            "async_scheduling": bool(getattr(sched, "async_scheduling", False)),
            "long_prefill_token_threshold": getattr(sched, "long_prefill_token_threshold", 0),
            "sliding_window": cache.sliding_window,
            "executor": config.parallel_config.distributed_executor_backend,
        }


class _RealV1(_RealConfigs):
    """0.11.0 / 0.33.0: the V1 engine's config code on a faked CUDA platform."""

    def __init__(self, install: VllmInstall) -> None:
        super().__init__(install)
        os.environ.pop("VLLM_USE_V2_MODEL_RUNNER", None)
        for name in ("_C", "_C_stable_libtorch", "_moe_C", "_flashmla_C", "_rocm_C"):
            sys.modules.setdefault(f"vllm.{name}", types.ModuleType(f"vllm.{name}"))
        sampling = import_vllm("sampling_params", install)
        _patch(sys.modules["vllm"], "SamplingParams", sampling.SamplingParams)
        cuda = import_vllm("platforms.cuda", install)
        iface = import_vllm("platforms.interface", install)
        self.platform = _fake_platform_class(cuda.CudaPlatformBase, iface.DeviceCapability)()
        _patch(import_vllm("platforms", install), "_current_platform", self.platform)
        # Each release has some of these (0.11.0 the last two, 0.33.0 the first): patch what
        # the install has, by name, as the real adapters pick arguments by signature.
        for module, name, value in (
            ("config.vllm", "HAS_TRITON", True),
            ("config.parallel", "cuda_device_count_stateless", _eight),
            ("config.cache", "get_cpu_memory", _host_memory),
        ):
            if importlib.util.find_spec(f"vllm.{module}") is None:
                continue  # 0.11.0 has no config/vllm.py
            target = import_vllm(module, install)
            if hasattr(target, name):
                _patch(target, name, value)
        registry = import_vllm("model_executor.models.registry", install).ModelRegistry
        stub = _pp_stub_model_class()
        for arch in {hf_config(get_model(name))["architectures"][0] for name in GRID_MODELS}:
            registry.register_model(arch, stub)
        self.arg_utils = import_vllm("engine.arg_utils", install)
        self.usage = import_vllm("usage.usage_lib", install).UsageContext

    def build(self, case: DefaultsCase, kwargs: dict[str, Any]) -> Any:
        type(self.platform).configure(get_gpu(case.gpu))
        api = case.usage is UsageContext.API_SERVER
        usage = self.usage.OPENAI_API_SERVER if api else self.usage.LLM_CLASS
        return self.arg_utils.EngineArgs(**kwargs).create_engine_config(usage_context=usage)


class _RealV0(_RealConfigs):
    """0.5.4: the v0 engine's EngineArgs on device "cuda" (no platform layer to fake)."""

    def __init__(self, install: VllmInstall) -> None:
        super().__init__(install)
        if importlib.util.find_spec("transformers") is None:
            deps = resolve_root(vllm_version="0.11.0") / DEPS_DIRNAME
            if not (deps / "transformers").is_dir():
                raise VllmNotAvailableError(
                    f"vLLM 0.5.4's config code needs transformers; none in {deps}"
                )
            sys.path.append(str(deps))
        config = import_vllm("config", install)
        _patch(config, "cuda_device_count_stateless", _eight)
        _patch(config, "get_cpu_memory", _host_memory)
        self.arg_utils = import_vllm("engine.arg_utils", install)

    def build(self, case: DefaultsCase, kwargs: dict[str, Any]) -> Any:
        return self.arg_utils.EngineArgs(device="cuda", **kwargs).create_engine_config()


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


def same_outcome(kvsim: dict[str, Any] | str, real: dict[str, Any] | str) -> bool:
    """Equal fields, or both refused for the same reason (kvsim's kind found in vLLM's text)."""
    if isinstance(kvsim, str) and isinstance(real, str):
        text = " ".join(real.split())
        return REFUSAL_TEXT[Refusal[kvsim.removeprefix("refused: ")]] in text
    return kvsim == real


#: The releases whose config code is built here (4ac7713 has no install).
VERIFIABLE = ("0.5.4", "0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0")


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
            f"--defaults compares the releases {', '.join(VERIFIABLE)}; got vLLM {version}"
        )
    real = _RealV0(install) if install.version_tuple < (0, 10) else _RealV1(install)
    result = DefaultsResult(install.version)
    for case in grid(version, num_configs):
        mine, theirs = kvsim_side(version, case), real.resolve(case)
        result.compared += 1
        if same_outcome(mine, theirs):
            result.identical += 1
            result.refused += isinstance(mine, str)
            continue
        if isinstance(mine, dict) and isinstance(theirs, dict):
            diff = {k: (mine[k], theirs[k]) for k in mine if mine[k] != theirs.get(k)}
            result.divergences.append(f"  {case.label()}: (kvsim, vLLM) {diff}")
        else:
            result.divergences.append(f"  {case.label()}: kvsim {mine!r}, vLLM {theirs!r}")
    return result


def real_cudagraph_mode(
    version: str, model: str = "llama-3.1-8b", gpu: str = "a100-80gb-sxm"
) -> str:
    """The `compilation_config.cudagraph_mode` a V1 release's own config code resolves for a
    default `vllm serve` of `model` on `gpu` (one GPU): what `sim.latency.worker_form`'s form C
    assumes about decode steps. Example: "0.11.0" -> "FULL_AND_PIECEWISE" (0.11.0
    `vllm/config/__init__.py` L359-376)."""
    install = load_vllm(None, version)
    if install.version_tuple < (0, 10):
        raise InputError(f"vLLM {version}: the v0 engine has no cudagraph_mode")
    real = _RealV1(install)
    case = DefaultsCase(model, gpu, 1, 1, UsageContext.API_SERVER, UserFlags())
    kwargs = {"model": str(real.model_dir(get_model(model))), "skip_tokenizer_init": True}
    return str(real.build(case, kwargs).compilation_config.cudagraph_mode.name)
