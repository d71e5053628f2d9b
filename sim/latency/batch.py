"""The batch composition of one engine step: what every step-time model consumes.

Example: two decodes at contexts 100 and 4000, plus one prefill chunk of 512 tokens after 1024
already-computed tokens:

    BatchShape(decode_context_tokens=(100, 4000), prefill_chunks=((1024, 512),))
    num_decode_seqs = 2, num_prefill_tokens = 512, num_tokens = 514,
    total_context_tokens = 100 + 4000 + 1024 = 5124   (KV read before this step's tokens)
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)  # not frozen: built per step/call, 3x cheaper
class DecodeBulk:
    """The members of a cohort as one step's decodes see them: a count and context sums.

    `windowed_context_tokens` is sum(min(context, window)) for the attention window the cohort
    was built for (None: no window, then it equals `context_tokens`).

    Example: members at contexts 100, 3000 and 5000 with window 4096 give
    DecodeBulk(3, 8100, 4096, 100 + 3000 + 4096 = 7196).
    """

    num_seqs: int
    context_tokens: int
    window: int | None
    windowed_context_tokens: int


@dataclass(slots=True)  # not frozen: built per step/call, 3x cheaper
class BatchShape:
    """One step's work. Decode context lengths exclude the token being decoded.

    Decodes come as a list of contexts (`decode_context_tokens`) and, for a scheduler that
    keeps its steady decodes in a cohort (`sim.scheduler.fast.cohort`), as `bulk`: a count and sums
    that stand for many more. Models read decodes only through the properties below, so both
    forms give the same step time.
    """

    decode_context_tokens: tuple[int, ...]  # context length of each decode seq
    prefill_chunks: tuple[tuple[int, int], ...]  # (prior context tokens, chunk tokens) per prefill
    bulk: DecodeBulk | None = None
    #: Decodes, listed and bulk (computed once: every model and the step record read it).
    num_decode_seqs: int = field(init=False)
    #: Sum of the decode contexts, listed and bulk.
    decode_context_sum: int = field(init=False)

    def __post_init__(self) -> None:
        bulk = self.bulk
        self.num_decode_seqs = len(self.decode_context_tokens)
        self.decode_context_sum = sum(self.decode_context_tokens)
        if bulk is not None:
            self.num_decode_seqs += bulk.num_seqs
            self.decode_context_sum += bulk.context_tokens

    def decode_windowed_context_sum(self, window: int) -> int:
        """Sum of min(context, window) over the decodes: what a sliding-window layer reads.

        Example: contexts (100, 5000), window 4096 -> 100 + 4096 = 4196.
        """
        listed = self.decode_context_tokens
        total = sum(c if c < window else window for c in listed) if listed else 0
        bulk = self.bulk
        if bulk is not None and bulk.num_seqs:
            if bulk.window != window:
                raise ValueError(
                    f"the decode bulk was summed for window {bulk.window}, not {window}"
                )
            total += bulk.windowed_context_tokens
        return total

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
        return self.decode_context_sum + sum(prior for prior, _ in self.prefill_chunks)
