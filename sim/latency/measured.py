"""Measured-efficiency step time (the default): each kernel of a step at fitted efficiencies.

The roofline (`sim.latency.roofline`) says what a step would cost at fixed fractions of the
datasheet; this model says what real kernels cost, with every coefficient fitted on public GPU
measurements (Vidur's per-operator profiles of A100 and H100, MIT licence; values, provenance
and validation errors in `sim/data/steptime_coefficients.json`, refit by
`scripts/fit_steptime.py`). The terms, each a named entry of `breakdown()`, summed per step on
one tensor-parallel rank (formulas in `sim.latency.measured_terms`; the four that depend only
on the token count, gemm_s, lm_head_s, non_gemm_s and allreduce_s, are priced per count in
`sim.latency.measured_layers`, the two attention terms per step in
`sim.latency.measured_attention`):

  gemm_s               per layer: QKV, O, gate+up, down projections on T tokens
                       (MoE: router + two grouped GEMMs over the touched experts, as
                       vLLM's fused-MoE kernel: `sim.latency.moe`), launch floor + smooth
                       compute/memory blend
  lm_head_s            the logits GEMM on the sampled tokens (one per decode, one per chunk)
  non_gemm_s           per layer: 2 RMSNorms, RoPE, SiLU-and-mul, 2 residual adds (MoE: and
                       top-k, align, moe_sum); per step: embedding gather and final norm
  decode_attention_s   per layer: one call for all decodes, floor + per-sequence cost + KV
                       bytes at a fitted fraction of bandwidth (sliding layers read their window)
  prefill_attention_s  per layer: one call floor + for each chunk, query traffic and 64x64 tile
                       FLOPs over (prior + chunk) keys
  allreduce_s          tp > 1: two per layer of T * hidden * 2 bytes, latency + bytes/bandwidth
                       of the backend the release's vLLM picks for that size (custom
                       all-reduce, FlashInfer, symmetric memory or NCCL: `sim.latency.allreduce`;
                       NCCL through host memory where the GPUs lack peer access, `p2p=False`:
                       `sim.latency.interconnect`)
  launch_s             one CUDA-graph launch per step (the per-kernel floors are in the terms)
  engine_overhead_s    CPU work per step, fixed + per sequence, by engine generation (v0/v1)

A GPU outside the fitted data (A100 80GB SXM, H100 SXM) takes the efficiencies and floors of
the nearest fitted GPU (by datasheet FLOP/s and bandwidth) applied to its own datasheet, the
all-reduce bandwidth scaled by its interconnect ratio; such a GPU, and an MoE model (the fused-MoE
kernel's own terms rest on one A100 config, `sim.latency.moe`), are flagged `extrapolated` and get
the wider op-level band (`op_band`). With the shipped coefficients, `band` widens the op-level
band to contain the end-to-end band of the public serving points (`sim.latency.serving_band`).

Worked example (shipped coefficients of 2026-12; `breakdown()` gives the current ones):
Llama-3.1-8B on an H100 SXM, 64 decodes at 4,096 context, V1 engine = 24.7 ms:

    gemm_s               5.70 ms  (15 GB of weights at the fitted 0.99 memory efficiency,
                                   blended with 0.96 TFLOP of compute, + 128 launch floors)
    decode_attention_s  13.83 ms  (34.4 GB of KV / (0.765 x 3.35 TB/s) = 13.41 ms
                                   + 32 call floors of 13.4 us)
    lm_head_s 0.38, non_gemm_s 0.53, launch_s 0.09,
    engine_overhead_s    4.20 ms  (V1: 0.607 ms + 64 x 0.021 ms from Vidur, + 2.25 ms of
                                   the model runner, `measured_terms.V1_WORKER_STEP_S`)
The roofline says 17.6 ms for the same step.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from importlib import resources
from typing import Any

from sim.catalog import GpuSpec, ModelSpec
from sim.latency import measured_terms as terms
from sim.latency import serving_band, worker_form
from sim.latency.band import StepTimeBand
from sim.latency.batch import BatchShape
from sim.latency.interconnect import HOST_STAGED_ALGBW_GBPS
from sim.latency.measured_attention import AttentionKernels
from sim.latency.measured_layers import LayerKernels, fitted_allreduce_cost
from sim.latency.quantized import body_gemm_formats
from sim.latency.worker_form import SHIPPED_WORKER_FORM, GpuFloors, WorkerForm

#: The terms of `breakdown()`, in the order `_terms` returns them.
TERM_NAMES = (
    "gemm_s",
    "lm_head_s",
    "non_gemm_s",
    "decode_attention_s",
    "prefill_attention_s",
    "allreduce_s",
    "launch_s",
    "engine_overhead_s",
)
ENGINE_GENERATIONS = ("v0", "v1")


@functools.cache
def shipped_coefficients() -> dict[str, Any]:
    """The fitted coefficients shipped in `sim/data/steptime_coefficients.json`."""
    text = resources.files("sim.data").joinpath("steptime_coefficients.json").read_text()
    coefficients: dict[str, Any] = json.loads(text)
    return coefficients


def nearest_fitted_gpu(gpu: GpuSpec, fitted: dict[str, dict[str, Any]]) -> str:
    """The fitted GPU closest in log datasheet FLOP/s and bandwidth (itself when fitted).

    Example: an H200 (989 TFLOP/s, 4.8 TB/s) is nearer the H100 SXM (989, 3.35) than the
    A100 (312, 2.04): distance |ln 4.8/3.35| = 0.36 against |ln 989/312| + |ln 4.8/2.04| = 2.0.
    """
    if gpu.name in fitted:
        return gpu.name

    def distance(name: str) -> float:
        sheet = fitted[name]["datasheet"]
        return abs(math.log(gpu.bf16_tflops / sheet["bf16_tflops"])) + abs(
            math.log(gpu.hbm_bandwidth_GBps / sheet["hbm_bandwidth_GBps"])
        )

    return min(sorted(fitted), key=distance)


def _left_to_right(values: tuple[float, ...]) -> float:
    """Their sum added left to right, as `predict_s` adds them (3.12's `sum` compensates)."""
    total = 0.0
    for value in values:
        total += value
    return total


@dataclass(frozen=True, slots=True)
class _ShapeTerms:
    """The parts of a step's terms that depend only on its counts (seconds).

    `gemm_lm_non_gemm_s` is gemm_s + lm_head_s + non_gemm_s added in that order (the first
    additions of `_terms` left to right); `decode_attention_fixed_s` is the decode attention's
    call floors and per-sequence cost, to which a step adds its KV bytes' time.

    Example (Llama-3.1-8B, H100, 64 decodes; the module docstring): decode_attention_fixed_s
    is 32 x 13.4 us + 64 x the per-sequence cost; the 13.41 ms of KV reads are added per step.
    """

    gemm_lm_non_gemm_s: float
    decode_attention_fixed_s: float
    allreduce_s: float
    engine_overhead_s: float


class MeasuredStepTime:
    """Step time of one model on one GPU at a TP size, from fitted kernel efficiencies."""

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        *,
        tp: int = 1,
        engine: str = "v1",
        kv_dtype: str | None = None,
        coefficients: dict[str, Any] | None = None,
        p2p: bool = True,
        release: str | None = None,
        weight_dtype: str | None = None,
        worker: WorkerForm = SHIPPED_WORKER_FORM,
        gpu_floors: GpuFloors | None = None,
        host_staged_algbw_GBps: float = HOST_STAGED_ALGBW_GBPS,
    ) -> None:
        if tp <= 0:
            raise ValueError(f"tp must be positive, got {tp}")
        if engine not in ENGINE_GENERATIONS:
            raise ValueError(f"engine must be one of {ENGINE_GENERATIONS}, got {engine!r}")
        co = coefficients or shipped_coefficients()
        #: the shipped coefficients: the band is widened to the end-to-end one
        #: (`sim.latency.serving_band`); a file of the user's own keeps its `band`
        self._shipped = co is shipped_coefficients()
        self.model, self.gpu, self.tp, self.engine = model, gpu, tp, engine
        #: what `_rebuilt` (the `with_*` methods) builds the model again from
        self._options: dict[str, Any] = dict(
            tp=tp, engine=engine, kv_dtype=kv_dtype, coefficients=co, p2p=p2p, release=release,
            weight_dtype=weight_dtype, host_staged_algbw_GBps=host_staged_algbw_GBps,
        )  # fmt: skip
        self.fitted_gpu = nearest_fitted_gpu(gpu, co["gpus"])
        #: False: the GPUs lack peer access and all-reduce goes through host memory
        #: (`sim.latency.interconnect`), a term no fit has seen
        self.p2p = p2p
        #: the vLLM release whose all-reduce dispatch is charged (`sim.latency.allreduce`);
        #: None or an unmirrored release: NCCL's fit for every message
        self.release = release
        #: the decoder GEMMs' weight bytes and tensor-core rate (`sim.latency.quantized`)
        self.gemm_formats = body_gemm_formats(model, gpu, weight_dtype)
        self.extrapolated = (
            self.fitted_gpu != gpu.name
            or model.is_moe
            or (tp > 1 and not p2p)
            or self.gemm_formats.quantized
        )
        c = co["gpus"][self.fitted_gpu]
        #: None while a fit is being validated (the band comes from that validation)
        self._band = co.get("band", {}).get(self.band_key)
        self._peak = gpu.peak_flops(model.dtype)
        self._bw = gpu.bandwidth_Bps
        self._L = model.num_layers
        #: None at tp 1; otherwise charges each message by the backend vLLM picks for it
        self.allreduce_cost = fitted_allreduce_cost(
            c, gpu, tp, p2p=p2p, release=release, host_staged_algbw_GBps=host_staged_algbw_GBps
        )
        #: gemm_s, non_gemm_s, allreduce_s and lm_head_s by token count (cached)
        self._kernels = LayerKernels(
            model, tp, self.gemm_formats, self._peak, self._bw, c, self.allreduce_cost
        )
        self._setup_engine(co["engine"][engine], worker, gpu_floors)
        #: decode_attention_s and prefill_attention_s, per step
        self._attention = AttentionKernels(
            model, self._kernels.q_heads, self._kernels.kv_heads, kv_dtype,
            c["decode_attention"], c["prefill_attention"], self._peak, self._bw,
        )  # fmt: skip
        #: `_ShapeTerms` by decodes (decode-only steps) and by (decodes, tokens, sequences)
        self._decode_shapes: dict[int, _ShapeTerms] = {}
        self._mixed_shapes: dict[tuple[int, int, int], _ShapeTerms] = {}

    def with_worker_form(
        self, worker: WorkerForm, gpu_floors: GpuFloors | None = None
    ) -> MeasuredStepTime:
        """The same model, GPU, coefficients and options under another worker form (and
        recording into `gpu_floors`): what benchmarks/worker_forms.py replays each form with."""
        return self._rebuilt(worker=worker, gpu_floors=gpu_floors)

    def with_coefficients(self, coefficients: dict[str, Any]) -> MeasuredStepTime:
        """The same model, GPU, options and worker form with other coefficients: what
        `kvsim calibrate --from-bench` replays each candidate scaling with."""
        return self._rebuilt(coefficients=coefficients)

    def with_host_staged_algbw(self, tp2_algbw_GBps: float) -> MeasuredStepTime:
        """The same model with the all-reduce through host memory (no peer access,
        `sim.latency.interconnect`) at another TP-2 bandwidth: what
        benchmarks/serving_accuracy.py `fit_host_staged_algbw` replays each candidate with."""
        return self._rebuilt(host_staged_algbw_GBps=tp2_algbw_GBps)

    def _rebuilt(self, **changes: Any) -> MeasuredStepTime:
        """This model built again from its own arguments, `changes` replacing some of them."""
        kept = {**self._options, "worker": self._worker, "gpu_floors": self._gpu_floors}
        return MeasuredStepTime(self.model, self.gpu, **{**kept, **changes})

    def _setup_engine(
        self, eng: dict[str, Any], worker: WorkerForm, gpu_floors: GpuFloors | None
    ) -> None:
        """The engine's CPU work per step and the launch term's form, from `eng` (`self.engine`'s
        coefficients) and `worker` (V1's worker form; a v0 engine has none); `gpu_floors`
        records every priced step's GPU time (None: nothing is recorded)."""
        self._gpu_floors, self._worker = gpu_floors, worker
        #: V1: plus the model runner's per-step CPU work (`terms.V1_WORKER_STEP_S`; a
        #: coefficients file may carry its own, `worker_step_s`, as calibrate's scaling does,
        #: and a worker form its own again)
        v1 = self.engine == "v1"
        worker_s = 0.0
        if v1:
            own_s = worker.worker_step_s
            worker_s = eng.get("worker_step_s", terms.V1_WORKER_STEP_S) if own_s is None else own_s
        self._overhead_fixed_s: float = eng["fixed_s"] + worker_s
        self._overhead_per_seq_s: float = eng["per_seq_s"]
        self._launch_s: float = eng["graph_launch_s"]
        #: V1: the worker form (`sim.latency.worker_form`) and its per-layer launch CPU, L x c
        self._form = worker.form if v1 else worker_form.WorkerCpuForm.FIXED
        self._layer_launch_total_s = self._L * (worker.layer_launch_s if v1 else 0.0)
        #: whether `predict_s` prices each step's launch through `_launch_term_s` (else the
        #: graph launch alone, the same float, without the call)
        self._launch_per_step = bool(self._layer_launch_total_s) or self._gpu_floors is not None

    # -- the interface ------------------------------------------------------------------------
    def _terms(self, batch: BatchShape) -> tuple[float, ...]:
        num_dec = batch.num_decode_seqs
        chunks = batch.prefill_chunks
        num_tokens = num_dec + sum(chunk for _, chunk in chunks)
        if num_tokens == 0:
            return (0.0,) * 7 + (self._overhead_fixed_s,)
        gemm, non_gemm, allreduce = self._kernels.body(num_tokens)
        num_seqs = num_dec + len(chunks)
        gpu = (
            gemm,
            self._kernels.lm_head(num_seqs),
            non_gemm,
            self._attention.decode_s(batch, num_dec) if num_dec else 0.0,
            self._attention.prefill_s(chunks) if chunks else 0.0,
            allreduce,
        )
        return (
            *gpu,
            self._launch_term_s(_left_to_right(gpu), bool(chunks)),
            self._overhead_fixed_s + self._overhead_per_seq_s * num_seqs,
        )

    def _launch_term_s(self, gpu_s: float, has_prefill_chunk: bool) -> float:
        """`launch_s`: the CUDA-graph launch, plus under a per-layer worker form the layers'
        launch CPU the GPU's `gpu_s` does not hide (`sim.latency.worker_form`). Example (form
        B, 28 layers x 100 us, 1.99 ms of GPU): graph launch + 0.81 ms. Records `gpu_s` in
        the model's `GpuFloors`, if it has one."""
        if self._gpu_floors is not None:
            self._gpu_floors.record(self._L, gpu_s, has_prefill_chunk)
        if self._layer_launch_total_s and worker_form.launches_per_layer(
            self._form, has_prefill_chunk
        ):
            return self._launch_s + worker_form.exposed_launch_s(self._layer_launch_total_s, gpu_s)
        return self._launch_s

    def predict_s(self, batch: BatchShape) -> float:
        """The terms of `_terms(batch)` added left to right, the same float, faster.

        Every term but the attentions' KV and prefill parts depends only on the step's counts
        (decodes, tokens, sequences), so it is computed once per counts (`_ShapeTerms`): a
        replay repeats a few thousand of them. The additions keep the left-to-right order of
        `_terms` (floating-point addition is not associative; Python 3.11's `sum` adds left to
        right), and a term that is 0.0 is skipped (x + 0.0 == x). tests/latency/test_measured_steptime.py
        checks `==` on drawn shapes.
        """
        num_dec = batch.num_decode_seqs
        chunks = batch.prefill_chunks
        if chunks:
            num_tokens = num_dec
            for _, chunk in chunks:
                num_tokens += chunk
            key = (num_dec, num_tokens, num_dec + len(chunks))
            shape = self._mixed_shapes.get(key)
            if shape is None:
                shape = self._mixed_shapes[key] = self._shape_terms(*key)
        elif num_dec:
            shape = self._decode_shapes.get(num_dec)
            if shape is None:
                shape = self._decode_shapes[num_dec] = self._shape_terms(num_dec, num_dec, num_dec)
        else:
            return self._overhead_fixed_s
        total = shape.gemm_lm_non_gemm_s
        if num_dec:
            total += shape.decode_attention_fixed_s + self._attention.decode_kv_s(batch)
        if chunks:
            total += self._attention.prefill_s(chunks)
        if shape.allreduce_s:
            total += shape.allreduce_s
        if self._launch_per_step:  # a per-layer form, or a model recording its GPU floors
            return total + self._launch_term_s(total, bool(chunks)) + shape.engine_overhead_s
        return total + self._launch_s + shape.engine_overhead_s

    def _shape_terms(self, num_dec: int, num_tokens: int, num_seqs: int) -> _ShapeTerms:
        """The terms that depend only on the counts, each as `_terms` computes it."""
        gemm, non_gemm, allreduce = self._kernels.body(num_tokens)
        return _ShapeTerms(
            gemm_lm_non_gemm_s=gemm + self._kernels.lm_head(num_seqs) + non_gemm,
            decode_attention_fixed_s=self._attention.decode_fixed_s(num_dec),
            allreduce_s=allreduce,
            engine_overhead_s=self._overhead_fixed_s + self._overhead_per_seq_s * num_seqs,
        )

    def engine_overhead_s(self, batch: BatchShape) -> float:
        """The `engine_overhead_s` term alone (`_terms`' last): the engine's CPU work of the
        step, which async scheduling overlaps with the GPU (`sim.latency.overlap`). Example
        (V1, 64 decodes): 0.607 ms + 2.25 ms + 64 x 0.021 ms = 4.20 ms."""
        num_seqs = batch.num_decode_seqs + len(batch.prefill_chunks)
        if num_seqs == 0:
            return self._overhead_fixed_s
        return self._overhead_fixed_s + self._overhead_per_seq_s * num_seqs

    def breakdown(self, batch: BatchShape) -> dict[str, float]:
        """Seconds per term (`TERM_NAMES`); the values sum to `predict_s(batch)`."""
        return dict(zip(TERM_NAMES, self._terms(batch), strict=True))

    def band(self) -> StepTimeBand:
        """The band predictions carry: with the shipped coefficients, the op-level band
        (`op_band`) widened to contain the end-to-end band of the public serving points
        (`sim.latency.serving_band`, `sim/data/serving_band.json`); with a coefficients file of
        the user's own, that file's band as it is."""
        op = self.op_band()
        if not self.band_widened:
            return op
        return serving_band.widened(op, serving_band.shipped_serving_band())

    @property
    def band_key(self) -> str:
        """Which entry of the coefficients' `band` this setup reads: its fitted GPU's, or
        "extrapolated"."""
        return "extrapolated" if self.extrapolated else self.fitted_gpu

    @property
    def band_widened(self) -> bool:
        """Whether `band` widens the op band: the shipped coefficients (which carry one)."""
        return self._shipped and self._band is not None

    def op_band(self) -> StepTimeBand:
        """Validation band of the per-operator fit: the fitted GPU's, or the wider cross-GPU
        one when extrapolated (`band` in the coefficients)."""
        source = f"measured fit on {self.fitted_gpu} (sim/data/steptime_coefficients.json)"
        if self.extrapolated:
            why = (
                "fused-MoE kernel terms fitted on one A100 config"
                if self.model.is_moe
                else "all-reduce without GPU peer access (hardware.p2p: false)"
                if not self.p2p and self.tp > 1
                else "quantized weights (kernels fitted on bf16)"
                if self.gemm_formats.quantized and self.fitted_gpu == self.gpu.name
                else "GPU not in the fit"
            )
            source += f"; extrapolated to {self.gpu.name}: {why}"
        if self._band is None:
            return StepTimeBand(1.0, 1.0, self.extrapolated, "coefficients without a band")
        return StepTimeBand(
            self._band["low_factor"], self._band["high_factor"], self.extrapolated, source
        )

    @property
    def decode_window(self) -> int | None:
        """The attention window of the sliding-window layers (decode context sums cap at it)."""
        return self._attention.window
