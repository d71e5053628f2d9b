"""The token-count terms of a measured step: the layers' GEMMs, elementwise ops and all-reduces.

`sim.latency.measured.MeasuredStepTime` sums a step's terms; the four of them that depend on
nothing but how many tokens (and sampled sequences) the step runs are priced here, on one
tensor-parallel rank, from the fitted coefficients of one GPU (formulas in
`sim.latency.measured_terms`):

  gemm_s      per layer: QKV, O, gate+up, down projections on T tokens (MoE: router + two
              grouped GEMMs over the touched experts, as vLLM's fused-MoE kernel:
              `sim.latency.moe`)
  non_gemm_s  per layer: 2 RMSNorms, RoPE, SiLU-and-mul, 2 residual adds (MoE: and top-k,
              align, moe_sum); per step: embedding gather and final norm
  allreduce_s tp > 1: two per layer of T * hidden * 2 bytes, priced by the backend the
              release's vLLM picks for that size (`sim.latency.allreduce`)
  lm_head_s   the logits GEMM on the sampled tokens (one per decode, one per chunk)

A replay repeats the same token counts many times, so each count is computed once and cached.

Worked example (shipped coefficients of 2026-12): Llama-3.1-8B on an H100 SXM at 64 tokens,
gemm_s = 5.70 ms. Its 32 layers x 4 projections move 14.2 GB (bf16 weights, activations in
and out: 4.31 ms at the fitted 0.986 memory efficiency of 3.35 TB/s) and do 0.89 TFLOP (1.17 ms
at 0.774 of 989 TFLOP/s); blended GEMM by GEMM (p = 1.23) they take 5.01 ms, plus 128 launch
floors of 5.4 us = 0.69 ms. lm_head_s = 0.38 ms (a 4096 x 128256 GEMM on 64 tokens).
"""

from __future__ import annotations

import math
from typing import Any

from sim.catalog import GpuSpec, ModelSpec
from sim.latency import measured_terms as terms
from sim.latency.allreduce import AllReduceCost, Link
from sim.latency.interconnect import HOST_STAGED_ALGBW_GBPS, host_staged_allreduce
from sim.latency.moe import FusedMoe
from sim.latency.quantized import BodyGemmFormats, GemmFormat

#: Bytes per token of one elementwise kind, and its calls per layer (or per step).
ElementwiseCalls = tuple[tuple[str, int, float], ...]


def fitted_allreduce_cost(
    c: dict[str, Any],
    gpu: GpuSpec,
    tp: int,
    *,
    p2p: bool,
    release: str | None,
    host_staged_algbw_GBps: float = HOST_STAGED_ALGBW_GBPS,
) -> AllReduceCost | None:
    """The all-reduce pricing of a step at `tp` (None at tp 1), from one fitted GPU's `c` (and,
    without peer access, NCCL through host memory at `host_staged_algbw_GBps` at TP 2,
    `sim.latency.interconnect`).

    NCCL's fit is taken at the nearest fitted TP size (log distance, the smaller on a tie) and
    its bandwidth scaled by `gpu`'s interconnect over the fitted GPU's. Example: an L4 (PCIe,
    64 GB/s) at tp 2 takes the A100's tp-2 fit (600 GB/s NVLink, 158.04 GB/s algbw) at
    64 / 600 of its bandwidth: 16.86 GB/s.
    """
    if tp <= 1:
        return None
    fitted = c["allreduce"]
    key = min(sorted(fitted), key=lambda k: (abs(math.log(int(k) / tp)), int(k)))
    scale = gpu.interconnect_GBps / c["datasheet"]["interconnect_GBps"]
    nccl = {
        "latency_s": fitted[key]["latency_s"],
        "algbw_GBps": fitted[key]["algbw_GBps"] * scale,
    }
    return AllReduceCost(
        tp=tp,
        link=Link.of(gpu.name, p2p=p2p),
        release=release,
        nccl=nccl,
        host_staged=host_staged_allreduce(tp, host_staged_algbw_GBps),
        interconnect_GBps=gpu.interconnect_GBps,
    )


class LayerKernels:
    """The GEMM, elementwise and all-reduce seconds of a model's layers at a token count.

    `c` is one fitted GPU's coefficients (`sim/data/steptime_coefficients.json`, `gpus.<name>`);
    `peak_flops` and `bandwidth_Bps` are the datasheet of the GPU the step runs on.
    """

    def __init__(
        self,
        model: ModelSpec,
        tp: int,
        formats: BodyGemmFormats,
        peak_flops: float,
        bandwidth_Bps: float,
        c: dict[str, Any],
        allreduce_cost: AllReduceCost | None,
    ) -> None:
        m, h = model, model.hidden_size
        self.num_layers = m.num_layers
        self.q_heads = max(1, m.num_attention_heads // tp)
        self.kv_heads = max(1, m.num_kv_heads // tp)
        inter = m.intermediate_size // tp
        self._formats = formats
        self._peak, self._bw = peak_flops, bandwidth_Bps
        self._gemm_c: dict[str, float] = c["gemm"]
        self._ew: dict[str, Any] = c["elementwise"]
        self._hidden, self._num_experts = h, m.num_experts
        self._attn_shapes = (
            (h, (self.q_heads + 2 * self.kv_heads) * m.head_dim),
            (self.q_heads * m.head_dim, h),
        )
        self._mlp_shapes = ((h, 2 * inter), (inter, h))
        self._lm_shape = (h, m.vocab_size // tp)
        mlp = formats.mlp
        #: the experts as vLLM's fused-MoE kernel runs them; None for a dense MLP
        self._moe = (
            FusedMoe(
                m.num_experts,
                m.num_experts_per_token,
                h,
                inter,
                mlp.weight_bytes,
                mlp.peak_flops,
                bandwidth_Bps,
                self._gemm_c,
                self._ew,
            )
            if m.is_moe
            else None
        )
        self._ew_per_layer, self._ew_per_step = self._elementwise_calls(m, inter)
        self._allreduce_cost = allreduce_cost
        self._num_allreduce = 2 * self.num_layers if allreduce_cost is not None else 0
        self._body_cache: dict[int, tuple[float, float, float]] = {}
        self._lm_cache: dict[int, float] = {}

    def _elementwise_calls(
        self, m: ModelSpec, inter: int
    ) -> tuple[ElementwiseCalls, ElementwiseCalls]:
        """(per layer, per step): each elementwise kind's calls and bytes per token."""
        args = (m.hidden_size, self.q_heads, self.kv_heads, m.head_dim, inter)
        per_layer = (
            ("norm", 2, terms.elementwise_bytes("norm", 1, *args)),
            ("rope", 1, terms.elementwise_bytes("rope", 1, *args)),
            # one SiLU-and-mul call over all T x k routed rows (MoE: `sim.latency.moe`)
            (
                "activation",
                1,
                m.num_experts_per_token * terms.elementwise_bytes("activation", 1, *args),
            ),
            ("residual_add", 2, terms.elementwise_bytes("residual_add", 1, *args)),
        )
        per_step = (
            ("embedding", 1, terms.elementwise_bytes("embedding", 1, *args)),
            ("norm", 1, terms.elementwise_bytes("norm", 1, *args)),
        )
        return per_layer, per_step

    def gemm_s(self, tokens: float, k: int, n: int, fmt: GemmFormat | None = None) -> float:
        """One GEMM; `fmt` None: 16-bit weights at the model dtype's peak (lm_head, router)."""
        if fmt is None:
            flops, nbytes = terms.gemm_flops_bytes(tokens, k, n)
            peak = self._peak
        else:
            flops, nbytes = terms.gemm_flops_bytes(tokens, k, n, fmt.weight_bytes)
            peak = fmt.peak_flops
        time_s: float = terms.gemm_time_s(flops, nbytes, peak, self._bw, self._gemm_c)
        return time_s

    def body(self, num_tokens: int) -> tuple[float, float, float]:
        """(GEMM, non-GEMM, all-reduce) seconds of all layers for `num_tokens` tokens."""
        cached = self._body_cache.get(num_tokens)
        if cached is not None:
            return cached
        t = float(num_tokens)
        attn, mlp = self._formats.attention, self._formats.mlp
        gemm = sum(self.gemm_s(t, k, n, attn) for k, n in self._attn_shapes)
        ew = self._ew
        routing = 0.0
        if self._moe is not None:
            # vLLM's fused MoE: two grouped GEMMs a layer over the touched experts, not one
            # GEMM per expert (`sim.latency.moe`), and top-k + align + moe_sum around them
            gemm += self.gemm_s(t, self._hidden, self._num_experts)  # router
            gemm += self._moe.experts_s(t)
            routing = self._moe.routing_s(t)
        else:
            gemm += sum(self.gemm_s(t, k, n, mlp) for k, n in self._mlp_shapes)
        non_gemm = self.num_layers * (
            routing
            + sum(
                calls * terms.elementwise_time_s(per_tok * t, self._bw, ew[kind])
                for kind, calls, per_tok in self._ew_per_layer
            )
        ) + sum(
            calls * terms.elementwise_time_s(per_tok * t, self._bw, ew[kind])
            for kind, calls, per_tok in self._ew_per_step
        )
        allreduce = 0.0
        if self._allreduce_cost is not None:
            allreduce = self._num_allreduce * self._allreduce_cost.time_s(
                t * self._hidden * terms.BF16_BYTES
            )
        result = (self.num_layers * gemm, non_gemm, allreduce)
        self._body_cache[num_tokens] = result
        return result

    def lm_head(self, num_sampled: int) -> float:
        """The logits GEMM on `num_sampled` tokens (16-bit weights)."""
        cached = self._lm_cache.get(num_sampled)
        if cached is None:
            cached = self.gemm_s(float(num_sampled), *self._lm_shape)
            self._lm_cache[num_sampled] = cached
        return cached
