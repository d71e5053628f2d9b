"""One MoE layer's experts as vLLM's fused-MoE kernel runs them: two grouped GEMMs per layer.

vLLM does not loop over experts. `fused_experts_impl` (vLLM 0.33.0
`vllm/model_executor/layers/fused_moe/fused_moe.py`, lines 1664-1868; 0.11.0 the same in
chunks of `VLLM_FUSED_MOE_CHUNK_SIZE`, 32,768 tokens) runs, once per layer and for every token of the step together:

1. `fused_topk` (the router's softmax and top-k; the router GEMM itself is a plain linear layer);
2. `moe_align_block_size` (`_prepare_expert_assignment`): the T x k (token, expert) pairs sorted
   by expert, each expert's rows padded up to a multiple of the kernel's BLOCK_SIZE_M;
3. one `fused_moe_kernel` launch for gate+up (w13: K = hidden, N = 2 x intermediate): each
   program multiplies one BLOCK_SIZE_M tile of one expert's sorted rows by that expert's
   weights, so every expert the step routes a token to has its weights read, and no other;
4. SiLU-and-mul over the T x k routed rows;
5. one `fused_moe_kernel` launch for down (w2: K = intermediate, N = hidden);
6. `moe_sum`: the k routed outputs of each token added, weighted.

So a step's expert GEMMs cost two grouped GEMMs per layer, each one kernel launch:

    touched  = E x (1 - (1 - k/E)^T)               experts hit by at least one of T tokens
                                                   (expected, routing uniform and independent)
    rows     = T x k + touched x (BLOCK_M - 1) / 2 routed rows after the per-expert padding
    flops    = 2 x rows x K x N
    bytes    = touched x K x N x weight_bytes + 2 x (T x k x K + T x k x N)
    t        = launch_floor + blend(flops / (eff_c x peak), bytes / (eff_m x bandwidth))

with the dense GEMM coefficients of the fitted GPU (`sim.latency.measured_terms.gemm_time_s`).
BLOCK_SIZE_M is vLLM's default bf16 config (0.11.0 `fused_moe.py` `get_default_config`, lines
905-918: 16 while the tokens are at most E, 64 above), the config an A100 runs Qwen3-30B-A3B with
(no tuned `E=128,N=768` file for it in 0.11.0 or 0.33.0). The padding is the mean round-up when an
expert's rows spread over several blocks; where they are concentrated the real round-up differs
(1,024 tokens, 128 experts, top-8: about 30 padded rows an expert against 31.5 charged), and it
only adds compute.

What it replaces: the measured model used to charge each touched expert as its own small GEMM
with its own launch floor (a prefill of 2,048 tokens on Qwen3-30B-A3B: 128 experts x 2 GEMMs x 48
layers = 12,288 launch floors, 64 ms of a 184 ms step, and each 128-row GEMM at the blend's
worst, the ridge point), which is not what the kernel does.

Checked against public kernel times (`python benchmarks/moe_kernel_accuracy.py`,
`sim/data/fused_moe_kernel_times.yaml`): vLLM PR #19049's `benchmark_moe.py` run of
Qwen3-30B-A3B's experts on one A100 PCIe 40GB with the default config, batch 1-96; two terms of
the kernel's own (`FIXED_S`, `MEMORY_EFFICIENCY_RATIO`) are fitted on half of those batch sizes
and miss the other half by 1.1% median. Three more sources, held out (A100 SXM E=64 top-6, H100
Mixtral TP 2, H200 E=128 top-8; up to 4,096 tokens): 6.4% median |error| over 45 timings, 9.0%
over the 14 of 256 tokens and more, where the per-expert charge missed by 82%. The worst misses
are at batch 1 on the other configs (-38% and -60%: their fixed costs are not the fitted one's)
and at 3,072-4,096 tokens on the H200 (-13%, -18%: compute-bound there, the dense fit's
efficiency is too high for the Triton kernel).

Worked example (A100 80GB SXM: 312 TFLOP/s, 2,039 GB/s; the a100 fit's GEMM coefficients 0.741 /
0.837 / p = 1.343 / 5.18 us floor), Qwen3-30B-A3B (E = 128, k = 8, hidden 2048, intermediate
768), one decode token: touched = 8, rows = 8 + 8 x 7.5 = 68; the gate+up GEMM reads 8 x 2048 x
1536 x 2 B = 50.3 MB at 1.085 x 0.837 = 0.909 of 2,039 GB/s, 27.2 us (blended with its 1.9 us of
compute, 27.7 us), + 5.18 us = 32.9 us; the down GEMM 19.1 us; with the 39 us fixed, 91.0 us a
layer. At 2,048 tokens: touched = 128.0, rows = 16,384 + 128 x 31.5 = 20,416, gate+up 888 us,
down 462 us, 1,389 us a layer, where the per-expert charge came to about 2.6 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sim.latency import measured_terms as terms

#: Fitted on the even-indexed batch sizes (1, 4, 16, 32, 64) of vLLM PR #19049's A100 kernel
#: times (`python benchmarks/moe_kernel_accuracy.py --fit`; the odd ones, held out, are missed by
#: 1.1% median, 1.9% at most): a fixed 39 us a layer on top of the launch floors, where the
#: default config's few, small tiles leave the GPU part-idle (batch 1: 8 experts, 8 x 48 programs
#: for gate+up), and the grouped GEMM's weight stream at 1.085 x the dense fit's memory efficiency
#: (a whole expert's weights in one pass, 0.91 of the A100's bandwidth; capped at 1). Measured on
#: one GPU and one config: elsewhere an extrapolation (a MoE model's band is the extrapolated one).
FIXED_S = 39e-6
MEMORY_EFFICIENCY_RATIO = 1.085

#: BLOCK_SIZE_M of vLLM's default bf16 fused-MoE config (0.11.0 `get_default_config`): while
#: the step's tokens are at most the experts (`M <= E`) and above.
BLOCK_M_SMALL = 16
BLOCK_M_LARGE = 64


def experts_touched(tokens: float, num_experts: int, top_k: int) -> float:
    """Expected experts that at least one of `tokens` tokens is routed to (uniform routing).

    Each token picks k of E experts, so an expert is missed by one token with probability
    1 - k/E and by all T with (1 - k/E)^T. Example: E = 128, k = 8, T = 64 tokens:
    128 x (1 - (120/128)^64) = 128 x (1 - 0.0161) = 125.9.
    """
    touched: float = num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return touched


def block_size_m(tokens: float, num_experts: int) -> int:
    """The default config's BLOCK_SIZE_M for a step of `tokens` tokens (see the module doc)."""
    return BLOCK_M_SMALL if tokens <= num_experts else BLOCK_M_LARGE


def routed_rows(tokens: float, num_experts: int, top_k: int) -> float:
    """Rows the grouped GEMM computes: T x k routed pairs plus the mean per-expert padding.

    Example: T = 2048, E = 128, k = 8 (BLOCK_M 64): 16,384 + 128.0 x 31.5 = 20,416.
    """
    touched = experts_touched(tokens, num_experts, top_k)
    return tokens * top_k + touched * (block_size_m(tokens, num_experts) - 1) / 2.0


@dataclass(frozen=True, slots=True)
class FusedMoe:
    """One rank's MoE layer: E experts of (hidden x 2 inter, inter x hidden), top-k routing.

    `weight_bytes` and `peak_flops` are the experts' format (`sim.latency.quantized`);
    `gemm` and `elementwise` the fitted GPU's dense GEMM and elementwise coefficients
    (`sim/data/steptime_coefficients.json`), `bandwidth_Bps` its datasheet bandwidth.
    """

    num_experts: int
    top_k: int
    hidden: int
    inter: int
    weight_bytes: float
    peak_flops: float
    bandwidth_Bps: float
    gemm: terms.Coefficients
    elementwise: Mapping[str, terms.Coefficients]
    #: the fused kernel's own terms (fitted: see `FIXED_S`)
    fixed_s: float = FIXED_S
    memory_efficiency_ratio: float = MEMORY_EFFICIENCY_RATIO

    def grouped_gemm_s(self, tokens: float, k: int, n: int) -> float:
        """One `fused_moe_kernel` launch over all touched experts (a [K x N] weight each)."""
        e, top_k = self.num_experts, self.top_k
        touched = experts_touched(tokens, e, top_k)
        flops = 2.0 * routed_rows(tokens, e, top_k) * k * n
        activations = terms.BF16_BYTES * tokens * top_k * (k + n)
        nbytes = touched * k * n * self.weight_bytes + activations
        c = self.gemm
        grouped = {
            **c,
            "memory_efficiency": min(1.0, c["memory_efficiency"] * self.memory_efficiency_ratio),
        }
        time_s: float = terms.gemm_time_s(
            flops, nbytes, self.peak_flops, self.bandwidth_Bps, grouped
        )
        return time_s

    def experts_s(self, tokens: float) -> float:
        """The layer's two grouped GEMMs, gate+up (w13) then down (w2), and the fixed cost."""
        h, i = self.hidden, self.inter
        return (
            self.fixed_s + self.grouped_gemm_s(tokens, h, 2 * i) + self.grouped_gemm_s(tokens, i, h)
        )

    def routing_s(self, tokens: float) -> float:
        """The small kernels around the GEMMs: top-k, moe_align_block_size, moe_sum.

        Charged as elementwise kernels (`elementwise`: the fitted GPU's coefficients): top-k
        reads the router's T x E logits and writes T x k ids and weights; align, a launch floor
        (its bytes are a few ids a token); moe_sum reads the T x k routed outputs and writes T
        rows, as a residual add does. Example (T = 1, E = 128, k = 8, hidden 2048): 2 x (128 +
        16) = 288 B and 2 x 9 x 2048 = 36,864 B, so about three launch floors.
        """
        e, k, ew, bw = self.num_experts, self.top_k, self.elementwise, self.bandwidth_Bps
        topk_bytes = terms.BF16_BYTES * tokens * (e + 2 * k)
        sum_bytes = terms.BF16_BYTES * tokens * (k + 1) * self.hidden
        time_s: float = (
            terms.elementwise_time_s(topk_bytes, bw, ew["activation"])
            + ew["activation"]["launch_floor_s"]
            + terms.elementwise_time_s(sum_bytes, bw, ew["residual_add"])
        )
        return time_s

    def activation_s(self, tokens: float) -> float:
        """SiLU-and-mul over the T x k routed rows: read 2 x inter, write inter (bf16)."""
        nbytes = terms.BF16_BYTES * 3 * self.inter * tokens * self.top_k
        time_s: float = terms.elementwise_time_s(
            nbytes, self.bandwidth_Bps, self.elementwise["activation"]
        )
        return time_s

    def fused_experts_s(self, tokens: float) -> float:
        """What vLLM's `benchmark_moe.py` times for one layer: routing, both GEMMs, activation."""
        return self.routing_s(tokens) + self.experts_s(tokens) + self.activation_s(tokens)
