"""The attention terms of a measured step: the decodes' call and the prefill chunks, per layer.

`sim.latency.measured.MeasuredStepTime` sums a step's terms; the two attention terms depend on
the step's contexts, not only on its counts, so they are priced here for every step, from the
model's KV geometry and one fitted GPU's attention coefficients (`sim/data/
steptime_coefficients.json`, `gpus.<name>.decode_attention` / `prefill_attention`; formulas in
`sim.latency.measured_terms`):

  decode_attention_s   per layer: one call for all decodes, floor + per-sequence cost + KV
                       bytes at a fitted fraction of bandwidth (sliding layers read their window)
  prefill_attention_s  per layer: one call floor + for each chunk, query traffic and 64x64 tile
                       FLOPs over (prior + chunk) keys

The KV geometry and the coefficients are folded into per-step constants once (`predict_s` is
hot), split so that the decode term's part that depends only on the decode count can be
cached with the other count-only terms (`decode_fixed_s`) and its KV reads added per step
(`decode_kv_s`).

Worked example (shipped coefficients of 2026-12): Llama-3.1-8B on an H100 SXM, 64 decodes at
4,096 context: 32 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes = 128 KiB of KV a token,
x 262,144 tokens = 34.4 GB read at 0.765 x 3.35 TB/s = 13.41 ms (`decode_kv_s`), + 32 call
floors of 13.4 us (`decode_fixed_s`; this GPU's per-sequence cost is fitted at 0): 13.83 ms.
"""

from __future__ import annotations

from typing import Any

from sim.catalog import ModelSpec, dtype_bytes
from sim.latency import measured_terms as terms
from sim.latency.batch import BatchShape


class AttentionKernels:
    """The decode and prefill attention seconds of a model's layers on one tensor-parallel
    rank, at `q_heads` and `kv_heads` heads a rank (`LayerKernels` computes both); `c_dec`
    and `c_pre` are one fitted GPU's attention coefficients, `peak_flops` and `bandwidth_Bps`
    the datasheet of the GPU the step runs on."""

    def __init__(
        self,
        model: ModelSpec,
        q_heads: int,
        kv_heads: int,
        kv_dtype: str | None,
        c_dec: dict[str, Any],
        c_pre: dict[str, Any],
        peak_flops: float,
        bandwidth_Bps: float,
    ) -> None:
        m, L = model, model.num_layers
        # KV bytes a decode reads per token of context, summed over the full and the sliding
        # layers.
        kv_tok = 2 * kv_heads * m.head_dim * dtype_bytes(kv_dtype or m.dtype)
        self.kv_read_full = float(kv_tok * m.num_full_layers)
        self.kv_read_slide = float(kv_tok * m.num_sliding_layers)
        #: the attention window of the sliding-window layers (None: none)
        self.window = m.sliding_window
        self.dec_floor_s: float = L * c_dec["call_floor_s"]
        self.dec_per_seq_s: float = L * c_dec["per_seq_s"]
        self.dec_s_per_byte: float = 1.0 / (c_dec["bandwidth_efficiency"] * bandwidth_Bps)
        # One prefill chunk, one layer: floor + q_tiles * k_tiles * tile_s + chunk * token_s,
        # the same as terms.prefill_attention_time_s on terms.prefill_attention_work.
        flops_per_tile = 4.0 * q_heads * m.head_dim * terms.ATTENTION_TILE**2
        self.pre_tile_s: float = flops_per_tile / (c_pre["compute_efficiency"] * peak_flops)
        q_bytes_per_token = 2.0 * q_heads * m.head_dim * terms.BF16_BYTES
        self.pre_token_s: float = q_bytes_per_token / (
            c_pre["query_bandwidth_efficiency"] * bandwidth_Bps
        )
        self.pre_floor_s: float = c_pre["call_floor_s"]
        self.pre_groups = tuple(
            (n, w) for n, w in ((m.num_full_layers, None), (m.num_sliding_layers, self.window)) if n
        )

    def decode_fixed_s(self, num_dec: int) -> float:
        """The decode term's call floors and per-sequence cost (no KV reads)."""
        return self.dec_floor_s + self.dec_per_seq_s * num_dec

    def decode_kv_s(self, batch: BatchShape) -> float:
        """The decode term's KV reads: every decode's context (a sliding layer's capped at its
        window) at the fitted fraction of bandwidth."""
        kv_bytes = self.kv_read_full * batch.decode_context_sum
        if self.kv_read_slide:
            assert self.window is not None
            kv_bytes += self.kv_read_slide * batch.decode_windowed_context_sum(self.window)
        return kv_bytes * self.dec_s_per_byte

    def decode_s(self, batch: BatchShape, num_dec: int) -> float:
        """`decode_attention_s` of a step with `num_dec` decodes."""
        return self.decode_fixed_s(num_dec) + self.decode_kv_s(batch)

    def prefill_s(self, chunks: tuple[tuple[int, int], ...]) -> float:
        """`prefill_attention_s` of a step's (prior, chunk) prefill chunks."""
        tile = terms.ATTENTION_TILE
        tile_s, token_s = self.pre_tile_s, self.pre_token_s
        total = 0.0
        for num_layers, window in self.pre_groups:
            per_layer = self.pre_floor_s
            for prior, chunk in chunks:
                keys = (prior if window is None or prior < window else window) + chunk
                per_layer += (-(-chunk // tile)) * (-(-keys // tile)) * tile_s + chunk * token_s
            total += num_layers * per_layer
        return total
