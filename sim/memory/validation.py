"""kvsim's derived KV pool against real vLLM startup logs: load, split, fit, compare.

The logs live in `sim/data/vllm_startup_logs.yaml` (facts with their source URLs). Each entry
records its side of the split (`split: fit | held_out`): the `fit` half is the only one the
fitted constants in `sim.memory.terms` may come from, the `held_out` half is only measured. A
new entry takes `sim.data.split.assign_split`'s side when it is appended; the sides are read,
never recomputed, so adding a log moves no other (the YAML header states the rule and the old
sorted-id parity sides the first 25 entries keep). `benchmarks/memory_accuracy.py` prints the
comparison; `--fit` reruns `fit_non_torch_gib` and `fit_activation`.

The quantity compared is the KV pool in bytes on one rank, as vLLM sized it:

- `kv_cache_tokens` or `num_gpu_blocks` when logged (what the scheduler gets; for a hybrid
  model vLLM reports blocks // groups * block_size tokens, which is the same bytes per token),
- else `kv_cache_gib` ("Available KV cache memory"),
- else total x utilization minus the three terms vLLM printed (one entry whose last line is cut).

Error = (predicted - observed) / observed. Example: observed 51.38 GiB, predicted 51.90 GiB:
+1.0%.
"""

from __future__ import annotations

import enum
import re
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sim.catalog import GpuSpec, ModelSpec, dtype_bytes, get_gpu, get_model
from sim.data.split import load_split_entries
from sim.memory.derive import MemoryBudget
from sim.memory.sampler_release import release_of, sampler_paths
from sim.memory.terms import (
    FITTED_SAMPLER_PATHS,
    GIB,
    ActivationFit,
    SamplerPath,
    VllmEngine,
    forward_activation_bytes,
    sampler_logits_bytes,
    visible_memory,
    weight_bytes,
)
from sim.scenario.configs import derive_budget


class Split(enum.Enum):
    FIT = "fit"
    HELD_OUT = "held_out"


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Logged(_Closed):
    """What vLLM printed (GiB as printed, counts exact)."""

    num_gpu_blocks: int | None = Field(default=None, gt=0)
    kv_cache_tokens: int | None = Field(default=None, gt=0)
    kv_cache_gib: float | None = Field(default=None, gt=0)
    total_gpu_memory_gib: float | None = Field(default=None, gt=0)
    weights_gib: float | None = Field(default=None, gt=0)
    non_torch_gib: float | None = Field(default=None, ge=0)
    activation_gib: float | None = Field(default=None, ge=0)
    #: "Estimated CUDA graph memory: X GiB total" (0.19+). Only printed through 0.19.x (the
    #: pool is not reduced by it), so it is kept as a check of `sim.memory.cudagraph`, never
    #: subtracted from the observed pool.
    cudagraph_estimate_gib: float | None = Field(default=None, gt=0)


class StartupLog(_Closed):
    """One engine start: launch configuration and what vLLM logged (see the YAML header)."""

    id: str
    #: The side of the split the entry records (`sim.data.split.assign_split` for a new one).
    split: Split
    source: str
    #: How the source may be used (entries from GitHub threads predate the field: facts only).
    license: str = ""
    vllm_version: str
    engine: Literal["v0", "v1"]
    model: str | dict[str, Any]
    model_dtype: str
    gpu: str | dict[str, Any]
    tp: int = Field(ge=1)
    gpu_memory_utilization: float = Field(gt=0, le=1)
    max_model_len: int = Field(ge=1)
    max_num_seqs: int = Field(ge=1)
    max_num_batched_tokens: int = Field(ge=1)
    block_size: int = Field(default=16, ge=1)
    #: "flashinfer" where the log says "Using FlashInfer for top-p & top-k sampling", "pytorch"
    #: where it says it fell back to PyTorch; None when the thread does not show (kvsim assumes
    #: PyTorch then, as it does by default).
    sampler: Literal["flashinfer", "pytorch"] | None = None
    #: Launch features kvsim does not model (e.g. "lora"): shown, never fitted on.
    unmodelled: list[str] = []
    assumed: list[str] = []
    logged: Logged
    notes: str = ""

    @property
    def model_spec(self) -> ModelSpec:
        return get_model(self.model)

    @property
    def gpu_spec(self) -> GpuSpec:
        return get_gpu(self.gpu)

    @property
    def engine_kind(self) -> VllmEngine:
        return VllmEngine(self.engine)

    @property
    def release(self) -> tuple[int, int]:
        """(major, minor) from vllm_version: "0.6.5.dev (...)" -> (0, 6)."""
        match = re.match(r"\s*(\d+)\.(\d+)", self.vllm_version)
        if match is None:
            raise ValueError(f"{self.id}: vllm_version {self.vllm_version!r} names no release")
        return int(match.group(1)), int(match.group(2))

    @property
    def sampler_paths(self) -> tuple[SamplerPath, ...]:
        """The sampler paths the log's release profiled (`sim.memory.sampler_release`)."""
        flashinfer = None if self.sampler is None else self.sampler == "flashinfer"
        rows = min(self.max_num_batched_tokens, self.max_num_seqs)
        return sampler_paths(self.engine_kind, release_of(self.vllm_version), rows, flashinfer)


DATA_FILE = "vllm_startup_logs.yaml"


def load_logs(path: Path | None = None) -> list[StartupLog]:
    """Every log (`path`: another file of the same form; default the shipped one), sorted by
    id, each on the side of the split it records. A missing or invalid `split` is an
    `InputError` naming the file, the entry and the field."""
    raws = load_split_entries(DATA_FILE, "logs", path)
    entries = [StartupLog.model_validate(raw) for raw in raws]
    return sorted(entries, key=lambda e: e.id)


def observed_pool_bytes(log: StartupLog) -> int:
    """The pool vLLM sized, in bytes on one rank (see the module docstring for the order)."""
    model, lg = log.model_spec, log.logged
    per_token = model.kv_bytes_per_token_per_layer(None, log.tp) * model.num_layers
    if lg.kv_cache_tokens is not None:
        return lg.kv_cache_tokens * per_token
    if lg.num_gpu_blocks is not None:
        return lg.num_gpu_blocks * log.block_size * per_token
    if lg.kv_cache_gib is not None:
        return int(lg.kv_cache_gib * GIB)
    terms = (lg.total_gpu_memory_gib, lg.weights_gib, lg.non_torch_gib, lg.activation_gib)
    if any(t is None for t in terms):
        raise ValueError(f"{log.id}: logged has no pool size and not all three terms")
    total, weights, non_torch, activation = (float(t) for t in terms if t is not None)
    return int((total * log.gpu_memory_utilization - weights - non_torch - activation) * GIB)


def predicted_pool_bytes(log: StartupLog) -> int:
    """kvsim's derived pool (before flooring to blocks) with the shipped constants."""
    return predicted_budget(log).available_kv_bytes


def predicted_budget(log: StartupLog) -> MemoryBudget:
    """kvsim's whole memory budget (every term) for the log's launch settings, derived as a
    scenario's is (`sim.scenario.configs.derive_budget`; the logs' KV dtype is the model's)."""
    return derive_budget(
        log.model_spec,
        log.gpu_spec,
        log.engine_kind,
        tp=log.tp,
        block_size=log.block_size,
        gpu_memory_utilization=log.gpu_memory_utilization,
        kv_dtype=None,
        weight_dtype=log.model_dtype,
        max_num_batched_tokens=log.max_num_batched_tokens,
        max_num_seqs=log.max_num_seqs,
        flashinfer_sampler=None if log.sampler is None else log.sampler == "flashinfer",
        vllm_release=log.vllm_version,
    )


def legacy_pool_bytes(log: StartupLog) -> int:
    """The pool kvsim derived before this change (commit c1e37a6 `sim/memory/derive.py`).

    Datasheet memory (`memory_gb` GiB), weights in the model dtype whatever the checkpoint,
    no non-torch term, activation = T x b x (2h + 3 I k / tp) + max_num_seqs x V x 4.
    """
    model, gpu = log.model_spec, log.gpu_spec
    b = dtype_bytes(model.dtype)
    mlp_width = 3 * model.intermediate_size * model.num_experts_per_token // log.tp
    activation = log.max_num_batched_tokens * b * (2 * model.hidden_size + mlp_width)
    activation += log.max_num_seqs * model.vocab_size * 4
    weights = model.total_params * b // log.tp
    return int(gpu.memory_bytes * log.gpu_memory_utilization) - weights - activation


def relative_error(predicted: int, observed: int) -> float:
    return (predicted - observed) / observed


@dataclass(frozen=True, slots=True)
class Comparison:
    """One log against kvsim, before and after (GiB, errors as fractions)."""

    log: StartupLog
    split: Split
    observed_gib: float
    before_gib: float
    after_gib: float

    @property
    def before_error(self) -> float:
        return (self.before_gib - self.observed_gib) / self.observed_gib

    @property
    def after_error(self) -> float:
        return (self.after_gib - self.observed_gib) / self.observed_gib


def compare_all() -> list[Comparison]:
    rows = []
    for log in load_logs():
        rows.append(
            Comparison(
                log=log,
                split=log.split,
                observed_gib=observed_pool_bytes(log) / GIB,
                before_gib=legacy_pool_bytes(log) / GIB,
                after_gib=predicted_pool_bytes(log) / GIB,
            )
        )
    return rows


@dataclass(frozen=True, slots=True)
class Summary:
    count: int
    median_abs_error: float
    worst_abs_error: float


#: The release that split the profile into weights / activation / non-torch (vLLM PR #10511
#: landed in 0.6.5; 0.6.4 printed the single-line breakdown). Older logs are reported apart.
PROFILED_RELEASE = (0, 6)


def summarize(errors: list[float]) -> Summary:
    absolute = [abs(e) for e in errors]
    return Summary(len(absolute), statistics.median(absolute), max(absolute))


# -- fitting (the fit half only) -------------------------------------------------------------


#: A (engine, TP class) cell needs this many fit logs to stand on its own.
MIN_LOGS_PER_CELL = 2


def fit_non_torch_gib() -> dict[tuple[VllmEngine, bool], float]:
    """Median logged non-torch GiB per (engine, TP > 1) over the fit half, 0.01 GiB steps.

    A cell with fewer than MIN_LOGS_PER_CELL fit logs takes the median of its TP class over
    both engines instead (NCCL and the CUDA context are the same libraries under both; one
    log alone is a release, not an engine). Example: v0 at TP >= 2 has one fit log (3.58 GiB,
    a 0.6.5 development build), V1 has 0.55 and 0.54: the cell gets median(3.58, 0.55, 0.54).
    """
    cells: dict[tuple[VllmEngine, bool], list[float]] = {}
    for log in load_logs():
        if log.split is Split.FIT and log.logged.non_torch_gib is not None:
            key = (log.engine_kind, log.tp > 1)
            cells.setdefault(key, []).append(log.logged.non_torch_gib)
    out = {}
    for engine in VllmEngine:
        for multi in (False, True):
            values = cells.get((engine, multi), [])
            if len(values) < MIN_LOGS_PER_CELL:
                values = [v for (_, m), vs in cells.items() if m == multi for v in vs] or [0.0]
            out[(engine, multi)] = round(statistics.median(values), 2)
    return out


#: Grids the activation fit searches (deterministic; ties go to the first, smallest values).
HIDDEN_FACTOR_GRID = [round(0.5 + 0.05 * i, 2) for i in range(51)]  # 0.50 .. 3.00
SAMPLER_COPIES_GRID = [round(0.25 * i, 2) for i in range(61)]  # 0 .. 15


def fit_activation(non_torch_gib: dict[tuple[VllmEngine, bool], float]) -> ActivationFit:
    """Activation constants fitted on the fit half, each on the term vLLM printed.

    A fit log that prints its activation peak is fitted on it (relative error of
    max(a * forward, c[path] * logits)); one that does not is fitted on its pool
    (pool = visible total x utilization - weights - non-torch - activation), so that the
    non-torch choice cannot leak into the activation constants where vLLM separated them.
    For each hidden factor a on its grid, each sampler path's copies c is chosen on its own
    grid (paths share only a); the a with the lowest total relative error wins. Logs with
    unmodelled features (LoRA, KV connectors) are left out.
    """
    rows: list[tuple[SamplerPath, float, float, float | None, float]] = []
    for log in load_logs():
        if log.split is not Split.FIT or log.unmodelled:
            continue
        if len(log.sampler_paths) != 1 or log.sampler_paths[0] not in FITTED_SAMPLER_PATHS:
            continue  # a derived path (Triton, 0.19.1+) or two paths: nothing to attribute
        path = log.sampler_paths[0]
        model = log.model_spec
        forward = forward_activation_bytes(model, log.max_num_batched_tokens, log.tp)
        logits = sampler_logits_bytes(model, log.max_num_batched_tokens, log.max_num_seqs)
        if log.logged.activation_gib is not None:
            rows.append((path, forward, logits, None, log.logged.activation_gib * GIB))
            continue
        total, _ = visible_memory(log.gpu_spec)
        base: float = int(total * log.gpu_memory_utilization) - weight_bytes(
            model, log.model_dtype, log.tp, log.gpu_spec.compute_capability
        )
        base -= non_torch_gib[(log.engine_kind, log.tp > 1)] * GIB
        rows.append((path, forward, logits, base, observed_pool_bytes(log)))

    def path_error(a: float, path: SamplerPath, c: float) -> float:
        error = 0.0
        for p, fwd, lgt, base, target in rows:
            if p is path:
                activation = max(a * fwd, c * lgt)
                predicted = activation if base is None else base - activation
                error += abs((predicted - target) / target)
        return error

    best: tuple[float, float, dict[SamplerPath, float]] | None = None
    for a in HIDDEN_FACTOR_GRID:
        copies, total_error = {}, 0.0
        for path in FITTED_SAMPLER_PATHS:
            error, c = min(
                ((path_error(a, path, c), c) for c in SAMPLER_COPIES_GRID), key=lambda t: t[0]
            )
            copies[path], total_error = c, total_error + error
        if best is None or total_error < best[0] - 1e-12:
            best = (total_error, a, copies)
    assert best is not None
    return ActivationFit(hidden_factor=best[1], sampler_copies=best[2])
