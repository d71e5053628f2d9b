"""A linear step-time model: a fixed cost plus costs per token, sequence and context token.

    t = fixed_s + per_prefill_token_s * prefill tokens + per_decode_seq_s * decode seqs
        + per_context_token_s * (decode contexts + prefill prior contexts)

This is the first-order shape of every roofline: weights read once (fixed), linear-layer
compute per token (prefill tokens; decode tokens are folded into per_decode_seq_s), and KV
bytes read per cached token (context). It is DistServe's `a + b * tokens` without the
quadratic term, plus Vidur's observation that decode attention scales with total context.
Coefficients come from the user, or from a fit of measured steps.

Example: fixed 5 ms, 2e-5 s per prefill token, 1e-4 s per decode seq, 4e-8 s per context
token; 64 decodes at 4096 context -> 5 + 6.4 + 10.5 = 21.9 ms.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.latency.band import StepTimeBand
from sim.latency.batch import BatchShape


@dataclass(frozen=True, slots=True)
class LinearStepTime:
    fixed_s: float
    per_prefill_token_s: float = 0.0
    per_decode_seq_s: float = 0.0
    per_context_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("fixed_s", "per_prefill_token_s", "per_decode_seq_s", "per_context_token_s"):
            value = getattr(self, name)
            if not value >= 0.0:
                raise ValueError(f"{name} must be >= 0, got {value}")

    def band(self) -> StepTimeBand:
        """No band: the coefficients are the user's, and kvsim has nothing to check them with."""
        return StepTimeBand(
            1.0, 1.0, extrapolated=True, source="linear: user coefficients, no validation data"
        )

    def predict_s(self, batch: BatchShape) -> float:
        return (
            self.fixed_s
            + self.per_prefill_token_s * batch.num_prefill_tokens
            + self.per_decode_seq_s * batch.num_decode_seqs
            + self.per_context_token_s * batch.total_context_tokens
        )
