"""Roofline step time (it explains; `measured` is the default): max(compute, memory) per group.

Per step, from the batch composition (decode contexts c_i; prefill chunks of p_j tokens after
c_j cached tokens; T = #decodes + sum p_j tokens; S = #decodes + #chunks sampled tokens), on one
tensor-parallel rank (heads, weights and FLOPs divided by tp):

  linear group (all decoder linear layers + lm_head)
      bytes = weight bytes of the body + lm_head          (read once per step)
      FLOPs = 2 * T * body params + 2 * S * lm_head params (logits only for sampled tokens)
  attention group (layers L = full + sliding; window W caps the context of sliding layers)
      bytes = kv_tok * (L_full * sum ctx + L_slide * sum min(ctx, W))   KV read
            + kv_tok * L * T                                            KV written
        where kv_tok = 2 * Hkv/tp * D * kv_bytes, ctx over decode contexts and prefill priors
      FLOPs = 4 * Hq/tp * D * (query, key) pairs per layer, summed over layers:
              decode c_i + 1 pairs; a chunk p after c: p * (c + (p + 1) / 2) (causal)
  all-reduce group (tp > 1): 2 per layer of T * hidden * act_bytes, ring cost
      2 * (tp-1)/tp * bytes / (eta_network * interconnect / 2) + latency per all-reduce
  t = sum over groups of max(FLOPs / (eta_compute * peak), bytes / (eta_memory * BW)) + overhead

MoE: attention weights are read always; of E experts, a step touches E * (1 - (1 - k/E)^T)
in expectation (uniform routing), and each token computes k experts.

Defaults (set them per scenario; fit them from calibrate/ profiles): eta_memory 0.85 (FlashInfer
decode reaches 82-88% of HBM bandwidth at 4-8k context; a device copy ~90%), eta_compute 0.7
(a bf16 8192^3 matmul reaches 78-81% of the H200's datasheet peak on random data, real layer
shapes less), eta_attention 0.5 for prefill attention FLOPs, eta_network 0.7, 10 us per
all-reduce, 0.3 ms fixed per-step overhead (scheduler, input preparation, sampling, launches).

Worked example: Llama-3.1-8B bf16, 64 decodes at 4096 context, H100 SXM (3.35 TB/s, 989 TFLOP/s):

    weights   7,504,658,432 params x 2 B                  = 15.01 GB
    KV read   64 x 4096 tok x 32 layers x 2x8x128x2 B     = 34.36 GB (+ 8.4 MB written)
    linear    max(0.96 TFLOP / (0.7 x 989T), 15.01 GB / (0.85 x 3.35 TB/s)) = 5.27 ms
    attention max(0.14 TFLOP / (0.5 x 989T), 34.37 GB / (0.85 x 3.35 TB/s)) = 12.07 ms
    + 0.3 ms overhead                                                       = 17.64 ms
    (at full bandwidth and no overhead: 4.48 + 10.26 = 14.74 ms; on an H200: 10.3 ms)
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.catalog import GpuSpec, ModelSpec, dtype_bytes
from sim.latency.band import StepTimeBand
from sim.latency.batch import BatchShape

#: The roofline's error band. Not validated by kvsim: read off the public comparison in the
#: "Numbers" issue (kvsim issue 12, from Vidur's A100/H100 profiles and vLLM serving runs):
#: large GEMMs match within ~8%, but whole steps and requests come out 20-40% too fast, i.e.
#: measured = predicted / (1 - 0.2..0.4) = 1.25-1.67x predicted. A roofline is a lower bound
#: (every term at or below a datasheet ceiling), so the low end is 1.0; the high end takes the
#: 40% case: 1 / 0.6 = 1.67. Short prefills (2-3x) and the ShareGPT run (1.9x) fall outside.
ROOFLINE_BAND = StepTimeBand(
    low_factor=1.0,
    high_factor=round(1 / 0.6, 2),
    extrapolated=True,
    source="roofline: unvalidated; public comparison says whole steps run 20-40% too fast",
)


@dataclass(frozen=True, slots=True)
class Efficiencies:
    """Fractions of the datasheet ceilings a real engine reaches, and fixed costs."""

    compute: float = 0.7
    memory: float = 0.85
    attention_compute: float = 0.5
    network: float = 0.7
    allreduce_latency_s: float = 10e-6
    overhead_s: float = 0.3e-3

    def __post_init__(self) -> None:
        for name in ("compute", "memory", "attention_compute", "network"):
            value = getattr(self, name)
            if not 0.0 < value <= 1.0:
                raise ValueError(f"efficiency {name} must be in (0, 1], got {value}")
        if self.allreduce_latency_s < 0 or self.overhead_s < 0:
            raise ValueError("allreduce_latency_s and overhead_s must be >= 0")


@dataclass(slots=True)  # not frozen: built per step/call, 3x cheaper
class RooflineBreakdown:
    """The per-group terms of one prediction, in seconds (for reports and tests)."""

    linear_s: float
    attention_s: float
    allreduce_s: float
    overhead_s: float
    linear_flops: float
    linear_bytes: float
    attention_flops: float
    attention_bytes: float

    @property
    def total_s(self) -> float:
        return self.linear_s + self.attention_s + self.allreduce_s + self.overhead_s


class RooflineStepTime:
    """Roofline step time of one model on one GPU type at a tensor-parallel size."""

    __slots__ = (
        "model",
        "gpu",
        "tp",
        "efficiencies",
        "_inv_flops",
        "_inv_attn_flops",
        "_inv_bw",
        "_dense_weight_bytes",
        "_expert_bytes",
        "_num_experts",
        "_expert_frac",
        "_body_flops_per_token",
        "_lm_flops_per_token",
        "_kv_read_full",
        "_kv_read_slide",
        "_kv_write",
        "_window",
        "_attn_flops_full",
        "_attn_flops_slide",
        "_ar_bytes_per_token",
        "_ar_s_per_byte",
        "_ar_fixed_s",
        "_overhead_s",
    )

    def __init__(
        self,
        model: ModelSpec,
        gpu: GpuSpec,
        *,
        tp: int = 1,
        efficiencies: Efficiencies | None = None,
        weight_dtype: str | None = None,
        kv_dtype: str | None = None,
        compute_dtype: str | None = None,
    ) -> None:
        eff = efficiencies or Efficiencies()
        self.model, self.gpu, self.tp, self.efficiencies = model, gpu, tp, eff
        if tp <= 0:
            raise ValueError(f"tp must be positive, got {tp}")
        peak = gpu.peak_flops(compute_dtype or model.dtype)
        self._inv_flops = 1.0 / (eff.compute * peak)
        self._inv_attn_flops = 1.0 / (eff.attention_compute * peak)
        self._inv_bw = 1.0 / (eff.memory * gpu.bandwidth_Bps)
        wb = dtype_bytes(weight_dtype or model.dtype)
        L = model.num_layers
        # Weights: everything but the experts is read every step; experts as touched.
        dense_params = L * model.attention_params_per_layer + model.lm_head_params
        if model.is_moe:
            dense_params += L * model.hidden_size * model.num_experts  # router
        self._dense_weight_bytes = dense_params * wb / tp
        self._expert_bytes = L * model.expert_params * wb / tp  # one expert in every layer
        self._num_experts = model.num_experts
        self._expert_frac = model.num_experts_per_token / model.num_experts
        active_body = L * (
            model.attention_params_per_layer + model.num_experts_per_token * model.expert_params
        )
        self._body_flops_per_token = 2.0 * active_body / tp
        self._lm_flops_per_token = 2.0 * model.lm_head_params / tp
        # Attention: bytes of K and V per token per layer on this rank.
        kv_tok = model.kv_bytes_per_token_per_layer(kv_dtype, tp)
        self._kv_read_full = float(kv_tok * model.num_full_layers)
        self._kv_read_slide = float(kv_tok * model.num_sliding_layers)
        self._kv_write = float(kv_tok * L)
        self._window = model.sliding_window
        q_heads = model.num_attention_heads // tp if model.num_attention_heads >= tp else 1
        flops_per_pair = 4.0 * q_heads * model.head_dim  # QK^T and PV, 2 FLOPs per MAC each
        self._attn_flops_full = flops_per_pair * model.num_full_layers
        self._attn_flops_slide = flops_per_pair * model.num_sliding_layers
        # All-reduce after attention and after the MLP in every layer (Megatron-style TP).
        num_allreduce = 2 * L if tp > 1 else 0
        self._ar_bytes_per_token = float(num_allreduce * model.hidden_size * wb)
        per_direction_Bps = eff.network * gpu.interconnect_GBps * 1e9 / 2.0
        self._ar_s_per_byte = 2.0 * (tp - 1) / tp / per_direction_Bps if tp > 1 else 0.0
        self._ar_fixed_s = num_allreduce * eff.allreduce_latency_s
        self._overhead_s = eff.overhead_s

    def breakdown(self, batch: BatchShape) -> RooflineBreakdown:
        return RooflineBreakdown(*self._terms(batch))

    def _terms(self, batch: BatchShape) -> tuple[float, ...]:
        """The fields of `RooflineBreakdown`, in order (a tuple: `predict_s` runs every step)."""
        chunks = batch.prefill_chunks
        num_dec = batch.num_decode_seqs
        num_prefill = 0
        prior_sum = 0
        pairs_full = 0.0
        for prior, chunk in chunks:
            num_prefill += chunk
            prior_sum += prior
            pairs_full += chunk * (prior + (chunk + 1) * 0.5)
        num_tokens = num_dec + num_prefill
        if num_tokens == 0:
            return (0.0, 0.0, 0.0, self._overhead_s, 0.0, 0.0, 0.0, 0.0)
        dec_sum = batch.decode_context_sum
        ctx_full = dec_sum + prior_sum
        pairs_full += dec_sum + num_dec
        kv_bytes = self._kv_read_full * ctx_full + self._kv_write * num_tokens
        attn_flops = self._attn_flops_full * pairs_full
        window = self._window
        if window is not None:
            ctx_win = batch.decode_windowed_context_sum(window)
            pairs_win = float(ctx_win + num_dec)
            for prior, chunk in chunks:
                ctx_win += prior if prior < window else window
                pairs_win += chunk * min(prior + (chunk + 1) * 0.5, window)
            kv_bytes += self._kv_read_slide * ctx_win
            attn_flops += self._attn_flops_slide * pairs_win
        lin_flops = self._body_flops_per_token * num_tokens + self._lm_flops_per_token * (
            num_dec + len(chunks)
        )
        lin_bytes = self._dense_weight_bytes
        if self._num_experts > 1:
            touched = self._num_experts * (1.0 - (1.0 - self._expert_frac) ** num_tokens)
            lin_bytes += self._expert_bytes * touched
        else:
            lin_bytes += self._expert_bytes
        linear_s = max(lin_flops * self._inv_flops, lin_bytes * self._inv_bw)
        attention_s = max(attn_flops * self._inv_attn_flops, kv_bytes * self._inv_bw)
        allreduce_s = 0.0
        if self._ar_fixed_s:
            allreduce_s = self._ar_fixed_s + self._ar_bytes_per_token * num_tokens * (
                self._ar_s_per_byte
            )
        return (
            linear_s,
            attention_s,
            allreduce_s,
            self._overhead_s,
            lin_flops,
            lin_bytes,
            attn_flops,
            kv_bytes,
        )

    @property
    def decode_window(self) -> int | None:
        """The attention window of the sliding-window layers (decode context sums cap at it)."""
        return self._window

    def band(self) -> StepTimeBand:
        """`ROOFLINE_BAND`: the same for every model and GPU (no validation data to narrow it)."""
        return ROOFLINE_BAND

    def predict_s(self, batch: BatchShape) -> float:
        linear_s, attention_s, allreduce_s, overhead_s = self._terms(batch)[:4]
        return linear_s + attention_s + allreduce_s + overhead_s  # == breakdown().total_s
