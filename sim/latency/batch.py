"""The batch composition of one engine step: what every step-time model consumes.

Example: two decodes at contexts 100 and 4000, plus one prefill chunk of 512 tokens after 1024
already-computed tokens:

    BatchShape(decode_context_tokens=(100, 4000), prefill_chunks=((1024, 512),))
    num_decode_seqs = 2, num_prefill_tokens = 512, num_tokens = 514,
    total_context_tokens = 100 + 4000 + 1024 = 5124   (KV read before this step's tokens)
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BatchShape:
    """One step's work. Decode context lengths exclude the token being decoded."""

    decode_context_tokens: tuple[int, ...]  # context length of each decode seq
    prefill_chunks: tuple[tuple[int, int], ...]  # (prior context tokens, chunk tokens) per prefill

    @property
    def num_decode_seqs(self) -> int:
        return len(self.decode_context_tokens)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(chunk for _, chunk in self.prefill_chunks)

    @property
    def num_tokens(self) -> int:
        """Tokens whose forward pass runs this step: one per decode plus every chunk token."""
        return self.num_decode_seqs + self.num_prefill_tokens

    @property
    def total_context_tokens(self) -> int:
        """KV tokens already cached that this step reads: decode contexts + prefill priors."""
        return sum(self.decode_context_tokens) + sum(prior for prior, _ in self.prefill_chunks)
