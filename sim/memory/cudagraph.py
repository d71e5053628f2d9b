"""CUDA-graph memory that vLLM 0.20.0+ subtracts from the KV budget before sizing the pool.

Through 0.19.x the graphs are captured after the pool is sized and do not shrink it
(`VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` defaults to "0": 0.19.1 `vllm/envs.py:L1654-1656`).
From the pinned 0.20.0 wheel on it defaults to "1" (0.20.0 `envs.py:L1721-1726`, whose comment
says "as of v0.21.0"; kvsim follows the pinned code; 0.25.1 L1931, 0.26.0 L1986, 0.33.0 L2219
also "1"), and `determine_available_memory` (0.20.0 `vllm/v1/worker/gpu_worker.py:L376-425`)
subtracts `model_runner.profile_cudagraph_memory()` whenever `cudagraph_mode` is not NONE.
What that estimate is (0.20.0 `vllm/v1/worker/gpu_model_runner.py:L5949-6045`; 0.25.1
L6498-6640, 0.33.0 L6268-6410 keep the arithmetic):

- for each capture mode (PIECEWISE first, then FULL; `vllm/v1/cudagraph_dispatcher.py:
  L325-349`), capture its two largest graphs into a throwaway pool and read the driver's free
  memory around each: `first` = the first capture's drop, `per_graph` = the second's, at
  least 1 MiB;
- estimate = max(first over modes) + sum over modes of per_graph x (graphs - 1): FULL and
  PIECEWISE share one pool at runtime, so only the larger first capture counts.

Which graphs exist (`capture_sizes`, `graph_counts`): by default `cudagraph_mode` is
FULL_AND_PIECEWISE (0.20.0 `config/vllm.py:L228, L248`: levels O2 / O3, O2 the default at
L336), which captures a PIECEWISE graph per capture size and a FULL (decode) graph per size up
to max_num_seqs x decode query length (`cudagraph_dispatcher.py:L188-230`); `--enforce-eager`
sets the mode to NONE and the sizes to [] (`config/vllm.py:L895-901, L1088-1093`), so there is
nothing to subtract.

What the first capture holds is the warm-up and capture of the largest graph: the graph
pool's intermediate buffers at that size, the caching allocator's segments the warm-up
reserves (the pool was emptied just before, L5983), and the driver's own graph objects; the
later captures reuse that pool, so the second capture is mostly per-graph driver memory. Both
are measured on the GPU, so kvsim takes them as two constants fitted on public startup logs
(`sim/data/vllm_cudagraph_estimates.yaml`, the fit half; `fit_cudagraph`). Left out: how the
first capture grows with the model and the largest size (the public threads rarely name the
model's geometry), hybrid / speculative-decoding models' smaller graphs, LoRA graph cases,
0.33.0's speculative decode tiers, encoder graphs, ROCm (no estimate there).

How it relates to the real capture: "Graph capturing finished in N secs, took X GiB" (and,
from 0.20.0, "CUDA graph pool memory: A GiB (actual), E GiB (estimated)", `gpu_worker.py:
L592-606`) measures `capture_model` after the KV pool exists, every graph into one shared
pool. That is a different quantity: it has no throwaway first capture's warm-up segments, and
later graphs reuse what earlier ones freed in the pool instead of each adding the second
capture's cost (the root cause a reporter of vLLM issue #45178 gives for estimates far above
the real pool; PR #51590 reports the opposite, estimates below it, on MI355X). Only E shrinks
the pool, so kvsim models E, not A, and the older "took X GiB" lines are not used as data.

Worked example (`cudagraph_estimate_bytes(release=(0, 20), max_num_seqs=256,
max_num_batched_tokens=8192)`, the fitted CUDAGRAPH_FIT):

    capture sizes = [1, 2, 4] + 8..248 step 8 + 256..512 step 16       = 51 sizes
    PIECEWISE graphs = 51; FULL graphs = sizes <= 256                 = 35
    estimate = 0.33 GiB + 2.3 MiB x ((51 - 1) + (35 - 1))
             = 354,334,801 B + 2,411,724 B x 84 = 556,919,617 B (0.52 GiB)
"""

from __future__ import annotations

import enum
import hashlib
import statistics
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

GIB = 2**30
MIB = 2**20

#: The release whose `VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS` default is on (envs.py).
ESTIMATING_RELEASE = (0, 20)
#: The first pinned release that has the profiler at all (0.19.1 `gpu_worker.py:L376-425`;
#: 0.11.0 has neither it nor the variable). Releases between the two pins are not told apart.
PROFILER_RELEASE = (0, 19)


class CaptureMode(enum.Enum):
    """`compilation_config.cudagraph_mode` values kvsim distinguishes."""

    NONE = "none"
    PIECEWISE = "piecewise"
    FULL_AND_PIECEWISE = "full_and_piecewise"


def estimates_cudagraphs(release: tuple[int, int] | None, env_override: bool | None) -> bool:
    """Whether the release subtracts the estimate: the env variable if set, else its default.

    Example: (0, 19) -> False; (0, 20) -> True; (0, 20) with the variable set to 0 -> False;
    (0, 19) with it set to 1 -> True; (0, 11) with it set to 1 -> False (no profiler there);
    None (kvsim's V1 default, read as 0.11) -> False.
    """
    if release is None or release < PROFILER_RELEASE:
        return False
    if env_override is not None:
        return env_override
    return release >= ESTIMATING_RELEASE


def capture_sizes(
    release: tuple[int, int],
    max_num_seqs: int,
    max_num_batched_tokens: int,
    *,
    num_speculative_tokens: int = 0,
    compute_capability: tuple[int, int] | None = None,
) -> list[int]:
    """The default `cudagraph_capture_sizes` (0.20.0 `config/vllm.py:L1463-1524`).

    max size = min(max_num_seqs x decode query len x 2, 512), then at most the token budget;
    sizes 1, 2, 4, multiples of 8 below 256, multiples of 16 from 256. 0.25.1 (`config/
    vllm.py:L1766-1772`, 0.26.0 L1836-1842) adds the token budget when it is within the max;
    0.33.0 (L2460-2600) also adds max_num_seqs and raises 512 to 1024 on compute capability
    10.x (its speculative decode tiers are not modelled). Example: 256 sequences, 8192
    tokens -> 51 sizes, largest 512; 4 sequences -> [1, 2, 4, 8]; a 100-token budget -> ...,
    88, 96 under 0.20.0, ..., 96, 100 from 0.25.1.
    """
    query_len = 1 + num_speculative_tokens
    ceiling = 512
    if release >= (0, 33) and compute_capability is not None and compute_capability[0] == 10:
        ceiling = 1024
    largest = min(max_num_seqs * query_len * 2, ceiling, max_num_batched_tokens)
    sizes = {s for s in (1, 2, 4) if s <= largest}
    sizes |= set(range(8, min(largest + 1, 256), 8)) | set(range(256, largest + 1, 16))
    if release >= (0, 25) and max_num_batched_tokens <= largest:
        sizes.add(max_num_batched_tokens)
    if release >= (0, 33) and query_len == 1 and max_num_seqs <= largest:
        sizes.add(max_num_seqs)
    return sorted(sizes)


def graph_counts(
    mode: CaptureMode, sizes: list[int], max_num_seqs: int, num_speculative_tokens: int = 0
) -> tuple[int, int]:
    """(PIECEWISE graphs, FULL graphs) the dispatcher captures (`cudagraph_dispatcher.py:
    L188-230`): a mixed PIECEWISE graph per size, and under FULL_AND_PIECEWISE a FULL decode
    graph per size from the decode query length up to max_num_seqs x that length.
    Example: FULL_AND_PIECEWISE, the 51 default sizes, 256 sequences -> (51, 35).
    """
    if mode is CaptureMode.NONE or not sizes:
        return 0, 0
    if mode is CaptureMode.PIECEWISE:
        return len(sizes), 0
    query_len = 1 + num_speculative_tokens
    full = [s for s in sizes if query_len <= s <= max_num_seqs * query_len]
    return len(sizes), len(full)


@dataclass(frozen=True)
class CudagraphFit:
    """estimate = first_capture_gib + per_graph_mib x (graphs beyond each mode's first)."""

    first_capture_gib: float
    per_graph_mib: float


#: Fitted on the fit half of sim/data/vllm_cudagraph_estimates.yaml by `fit_cudagraph`
#: (`python benchmarks/memory_accuracy.py --cudagraphs`); tests/memory/test_cudagraph.py
#: fails when they drift from what the data give.
CUDAGRAPH_FIT = CudagraphFit(first_capture_gib=0.33, per_graph_mib=2.3)


def estimate_from_counts(piecewise: int, full: int, fit: CudagraphFit = CUDAGRAPH_FIT) -> int:
    """Bytes for these graph counts (0.20.0 `gpu_model_runner.py:L6003-6045`): one first
    capture (the larger of the modes' overlays the other) plus the per-graph cost of the rest.
    Example: (51, 35) -> 0.33 GiB + 84 x 2.3 MiB = 556,919,617 B."""
    if piecewise + full == 0:
        return 0
    extra = max(piecewise - 1, 0) + max(full - 1, 0)
    return int(fit.first_capture_gib * GIB) + int(fit.per_graph_mib * MIB) * extra


def cudagraph_estimate_bytes(
    *,
    release: tuple[int, int] | None,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    enforce_eager: bool = False,
    env_override: bool | None = None,
    compute_capability: tuple[int, int] | None = None,
    fit: CudagraphFit = CUDAGRAPH_FIT,
) -> int:
    """What the release subtracts from the KV budget for CUDA graphs (0 when it does not).

    `env_override`: VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS as set (None: the default).
    See the module docstring for the worked example (0.52 GiB at 256 sequences, 8192 tokens).
    """
    if enforce_eager or release is None or not estimates_cudagraphs(release, env_override):
        return 0  # --enforce-eager: cudagraph_mode NONE, nothing profiled (L380-385)
    sizes = capture_sizes(
        release, max_num_seqs, max_num_batched_tokens, compute_capability=compute_capability
    )
    piecewise, full = graph_counts(CaptureMode.FULL_AND_PIECEWISE, sizes, max_num_seqs)
    return estimate_from_counts(piecewise, full, fit)


# -- the public data: load, split, fit --------------------------------------------------------


class CudagraphLog(BaseModel):
    """One engine start that printed vLLM's estimate (see the YAML header for the fields)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str
    source: str
    license: str
    vllm_version: str
    model: str
    gpu: str
    tp: int = Field(ge=1)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    equivalent_utilization: float | None = Field(default=None, gt=0, le=1)
    piecewise_graphs: int = Field(ge=0)
    piecewise_largest: int | None = None
    full_graphs: int = Field(ge=0)
    full_largest: int | None = None
    estimated_gib: float = Field(gt=0)
    unmodelled: list[str] = []
    split: Literal["fit", "held_out"]
    notes: str = ""


def split_rule(entry_id: str) -> Literal["fit", "held_out"]:
    """The split an entry gets when it is added, by its id alone (so adding entries never
    moves another): sha256(id) even -> fit, odd -> held out. Each entry records it."""
    digest = int(hashlib.sha256(entry_id.encode()).hexdigest(), 16)
    return "fit" if digest % 2 == 0 else "held_out"


def load_cudagraph_logs() -> list[CudagraphLog]:
    """Every entry of sim/data/vllm_cudagraph_estimates.yaml, sorted by id."""
    text = resources.files("sim.data").joinpath("vllm_cudagraph_estimates.yaml").read_text()
    entries = [CudagraphLog.model_validate(raw) for raw in yaml.safe_load(text)["logs"]]
    if len({e.id for e in entries}) != len(entries):
        raise ValueError("vllm_cudagraph_estimates.yaml: duplicate ids")
    return sorted(entries, key=lambda e: e.id)


def predicted_gib(log: CudagraphLog, fit: CudagraphFit = CUDAGRAPH_FIT) -> float:
    """kvsim's estimate for the graph counts the log printed (GiB)."""
    return estimate_from_counts(log.piecewise_graphs, log.full_graphs, fit) / GIB


def relative_errors(
    split: str, fit: CudagraphFit = CUDAGRAPH_FIT, *, modelled_only: bool = False
) -> list[tuple[CudagraphLog, float]]:
    """(log, (predicted - logged) / logged) for one split's entries; `modelled_only` keeps
    the entries without `unmodelled` features (the ones the fit may use)."""
    return [
        (log, (predicted_gib(log, fit) - log.estimated_gib) / log.estimated_gib)
        for log in load_cudagraph_logs()
        if log.split == split and not (modelled_only and log.unmodelled)
    ]


#: Grids the fit searches (deterministic; ties go to the smallest values).
FIRST_CAPTURE_GRID = [round(0.01 * i, 2) for i in range(101)]  # 0 .. 1 GiB
PER_GRAPH_GRID = [round(0.1 * i, 1) for i in range(101)]  # 0 .. 10 MiB


def fit_cudagraph(logs: list[CudagraphLog] | None = None) -> CudagraphFit:
    """The two constants minimising the summed |relative error| over the fit half's entries
    without unmodelled features (hybrid or speculative models' graphs hold other things).
    `logs`: the entries to fit from (default: the YAML's)."""
    logs = load_cudagraph_logs() if logs is None else logs
    rows = [log for log in logs if log.split == "fit" and not log.unmodelled]
    best: tuple[float, CudagraphFit] | None = None
    for first in FIRST_CAPTURE_GRID:
        for per_graph in PER_GRAPH_GRID:
            fit = CudagraphFit(first, per_graph)
            error = sum(abs(predicted_gib(r, fit) / r.estimated_gib - 1) for r in rows)
            if best is None or error < best[0] - 1e-12:
                best = (error, fit)
    assert best is not None
    return best[1]


def median_abs_error(
    split: str, fit: CudagraphFit = CUDAGRAPH_FIT, *, modelled_only: bool = False
) -> float:
    errors = relative_errors(split, fit, modelled_only=modelled_only)
    return statistics.median(abs(e) for _, e in errors)
