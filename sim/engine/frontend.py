"""The API server in front of the engine core: one event loop that takes requests in and
streams tokens out, as `vllm serve` runs it, seen from a `vllm bench serve` client.

vLLM's V1 engine runs the engine core (scheduler and GPU steps) in its own process; the API
server process does everything between the client and the core on one asyncio event loop
(0.33.0 `vllm/entrypoints/openai/api_server.py` serving the request; `vllm/v1/engine/
async_llm.py` `AsyncLLM.add_request` -> `InputProcessor` tokenizes and validates it, then
`EngineCoreClient` sends it over ZMQ; `AsyncLLM._run_output_handler` takes each batch of
`EngineCoreOutputs` back, `OutputProcessor.process_outputs` detokenizes it per request, and each
request's stream writes its SSE chunk). Every piece of that work waits its turn on the loop, so
under load it queues: a burst of prompts waits behind its own tokenization, and tokens stream
out behind the prompts still coming in. The engine core never waits for the API server (its
output queue is unbounded), so the loop changes only *when a request reaches the scheduler* and
*when the client sees each token*.

`ApiServer` is that loop as one first-come-first-served server with four costs, plus one
delay that holds no loop:

- `request_s` per request (HTTP parsing, validation, the hand-off to the core) and
  `prompt_token_s` per prompt token (tokenization), before the request reaches the engine core;
- `output_batch_s` per batch of outputs the core returns (one per engine step), and
  `output_token_s` per token in it (detokenization, the SSE chunk, the socket write), before the
  client sees those tokens;
- `hand_off_s`, a fixed latency between the loop's input work and the scheduler that occupies
  no shared loop (the client's and server's HTTP stacks, the ZMQ hop, the core's wake-up): what
  a lone request waits that no per-item cost explains.

Example: request_s 20 ms, prompt_token_s 5 us, hand_off_s 10 ms, output costs 0; two
1,000-token prompts sent at 0 reach the scheduler at 35 ms and 60 ms (the second waits for the
first's 25 ms of loop work, not for its hand-off).

What this leaves out: the client's own event loop (aiohttp reading the streams), several API
servers (`--api-server-count`), chat templates, and V0's in-process frontend: one model for
every release, its costs fitted (`VLLM_API_SERVER`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field

import simpy

from sim.scheduler import Request

_Process = Generator[simpy.Event, object, None]


@dataclass(frozen=True, slots=True)
class ApiServer:
    """The API server's costs in seconds (see the module docstring); all zero: no frontend."""

    request_s: float = 0.0
    prompt_token_s: float = 0.0
    output_batch_s: float = 0.0
    output_token_s: float = 0.0
    hand_off_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("request_s", "prompt_token_s", "output_batch_s", "output_token_s",
                     "hand_off_s"):  # fmt: skip
            value = getattr(self, name)
            if not value >= 0.0:  # also NaN
                raise ValueError(f"ApiServer.{name} must be >= 0, got {value}")

    def input_s(self, prompt_tokens: int) -> float:
        """Loop time to take in one request of `prompt_tokens` (example: 20 ms + 1,000 x 5 us
        = 25 ms)."""
        return self.request_s + self.prompt_token_s * prompt_tokens

    def output_s(self, num_tokens: int) -> float:
        """Loop time to stream one engine step's `num_tokens` tokens."""
        return self.output_batch_s + self.output_token_s * num_tokens


@dataclass(slots=True)
class FrontendLoop:
    """`ApiServer` on the simulated clock: a single server shared by inputs and outputs.

    `admit(request)` runs the request's input work and then `deliver_to_engine(request)`;
    `stream(requests)` takes the tokens `requests` sampled at this instant (their last entries
    of `token_times_s`) and rewrites those times to when the client sees them, then calls
    `on_delivered(request)` for each request whose every token the client has.
    """

    env: simpy.Environment
    costs: ApiServer
    deliver_to_engine: Callable[[Request], None]
    on_delivered: Callable[[Request], None]
    _loop: simpy.Resource = field(init=False)
    #: Request id -> how many of its tokens were handed to the loop / reached the client.
    _taken: dict[int, int] = field(default_factory=dict)
    _delivered: dict[int, int] = field(default_factory=dict)
    #: Requests still in the input queue (not yet at the engine core).
    num_pending_inputs: int = 0

    def __post_init__(self) -> None:
        self._loop = simpy.Resource(self.env, capacity=1)

    def admit(self, request: Request) -> None:
        costs = self.costs
        if costs.request_s == costs.prompt_token_s == costs.hand_off_s == 0.0:
            self.deliver_to_engine(request)  # free input work: at once, in the caller's turn
            return
        self.num_pending_inputs += 1
        self.env.process(self._input(request))

    def _input(self, request: Request) -> _Process:
        with self._loop.request() as turn:
            yield turn
            yield self.env.timeout(self.costs.input_s(request.prompt_tokens))
        if self.costs.hand_off_s > 0:
            yield self.env.timeout(self.costs.hand_off_s)
        self.num_pending_inputs -= 1
        self.deliver_to_engine(request)

    def stream(self, requests: Iterable[Request]) -> None:
        """Queue the new tokens of `requests` (sampled now) as one output batch."""
        batch: list[tuple[Request, int, int]] = []
        for request in requests:
            times = request.token_times_s
            if times is None:
                continue
            start = self._taken.get(request.request_id, 0)
            if len(times) > start:
                batch.append((request, start, len(times)))
                self._taken[request.request_id] = len(times)
        if not batch:
            return
        if self.costs.output_batch_s == self.costs.output_token_s == 0.0:
            self._delivered_now(batch)  # free output work: the client sees the sample times
        else:
            self.env.process(self._output(batch))

    def _output(self, batch: list[tuple[Request, int, int]]) -> _Process:
        num_tokens = sum(end - start for _, start, end in batch)
        with self._loop.request() as turn:
            yield turn
            yield self.env.timeout(self.costs.output_s(num_tokens))
        now = self.env.now
        for request, start, end in batch:
            times = request.token_times_s
            assert times is not None
            for i in range(start, end):
                times[i] = now
        self._delivered_now(batch)

    def _delivered_now(self, batch: list[tuple[Request, int, int]]) -> None:
        for request, _, end in batch:
            times = request.token_times_s
            assert times is not None
            self._delivered[request.request_id] = end
            if request.state.is_terminal and end == len(times):
                self.on_delivered(request)

    def owes_tokens(self, request: Request) -> bool:
        """Whether some of `request`'s tokens have not been streamed to the client yet."""
        times = request.token_times_s
        return times is not None and self._delivered.get(request.request_id, 0) < len(times)


#: The shipped costs of vLLM's V1 API server. `prompt_token_s` from vllm PR #10635
#: (https://github.com/vllm-project/vllm/pull/10635, 2024-11-25: tokenizing a 256K-token prompt
#: "can take a few hundred milliseconds"; 300 ms / 256,000 tokens = 1.2 us a token); the rest
#: FITTED on the fit half of the public serving measurements
#: (`python benchmarks/serving_accuracy.py --fit-frontend`; the held-out half is the test,
#: docs/accuracy.md).
VLLM_API_SERVER = ApiServer(
    request_s=0.002, prompt_token_s=1.2e-6, output_batch_s=0.0, output_token_s=75e-6,
    hand_off_s=0.025,
)  # fmt: skip
