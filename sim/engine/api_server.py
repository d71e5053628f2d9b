"""The API server's costs (`ApiServer`) and the shipped values for vLLM's (`VLLM_API_SERVER`).

What each piece of the API server's event-loop work takes, in seconds: taking a request in
(parsing, the chat template, tokenization), the output handler's work per engine step and per
token, each SSE chunk, and the hand-off to the engine core. `sim.engine.frontend` runs the loop
that charges them on the simulated clock; its module docstring says what each cost stands for
in vLLM's code. Kept apart from that loop so that what carries or searches the costs (a
benchmark's settings, `sim.vllm_bench.metrics.BenchSettings.frontend`; the fit,
`benchmarks/serving_accuracy.py --fit-frontend`) holds plain numbers, not the loop.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ApiServer:
    """The API server's costs in seconds (each described in `sim.engine.frontend`'s module
    docstring); all zero: no frontend."""

    request_s: float = 0.0
    prompt_token_s: float = 0.0
    output_batch_s: float = 0.0
    output_token_s: float = 0.0
    hand_off_s: float = 0.0
    output_chunk_s: float = 0.0
    chat_template_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("request_s", "prompt_token_s", "output_batch_s", "output_token_s",
                     "hand_off_s", "output_chunk_s", "chat_template_s"):  # fmt: skip
            value = getattr(self, name)
            if not value >= 0.0:  # also NaN
                raise ValueError(f"ApiServer.{name} must be >= 0, got {value}")

    def input_s(self, prompt_tokens: int) -> float:
        """Loop time to take in one request of `prompt_tokens` (example: 20 ms + 7 ms chat
        template + 1,000 x 5 us = 32 ms)."""
        return self.request_s + self.chat_template_s + self.prompt_token_s * prompt_tokens

    def output_s(self, num_tokens: int) -> float:
        """Loop time for the output handler to process one engine step's `num_tokens` tokens
        (example: 100 us + 64 x 5 us = 420 us)."""
        return self.output_batch_s + self.output_token_s * num_tokens

    def lone_stream_s(self, num_tokens: int) -> float:
        """From sample to client for `num_tokens` tokens of a lone request's step, on an idle
        loop: the handler's work, then its one chunk (example: 20 us + 40 us = 60 us)."""
        return self.output_s(num_tokens) + self.output_chunk_s

    @property
    def streams_free(self) -> bool:
        """Whether streaming costs nothing (the client sees each token when it is sampled)."""
        return self.output_batch_s == self.output_token_s == self.output_chunk_s == 0.0


#: The shipped costs of vLLM's V1 API server. `prompt_token_s` from vllm PR #10635
#: (https://github.com/vllm-project/vllm/pull/10635, 2024-11-25: tokenizing a 256K-token prompt
#: "can take a few hundred milliseconds"; 300 ms / 256,000 tokens = 1.2 us a token); the rest
#: FITTED on the fit half of the public serving measurements
#: (`python benchmarks/serving_accuracy.py --fit-frontend`; the held-out half is the test,
#: docs/accuracy.md), last on 2026-12-05 under its objective of every fit point's
#: |ln(predicted / measured)| (`frontend_score`): the first pass from these costs changed
#: nothing (fit half 0.1245 on 22 points, no API server 0.1895; 0.1654 on 28 points; 0.1610
#: with the chat template's parse, rerun: no move; 0.1965 on 32 points with cssnoeasy's runs,
#: not refitted, still a local optimum by the slow test). `output_token_s`'s next grid value,
#: 40 us, would exceed the streaming bound with 40 us chunks (vllm PR #12287, `FRONTEND_GRIDS`).
VLLM_API_SERVER = ApiServer(
    request_s=0.002, prompt_token_s=1.2e-6, output_batch_s=0.0, output_token_s=20e-6,
    hand_off_s=0.025, output_chunk_s=40e-6,
)  # fmt: skip
