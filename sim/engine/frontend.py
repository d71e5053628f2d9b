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

`ApiServer` is that loop as one first-come-first-served server with five costs, plus one
delay that holds no loop:

- `request_s` per request (HTTP parsing, validation, the hand-off to the core) and
  `prompt_token_s` per prompt token (tokenization), before the request reaches the engine core;
- `output_batch_s` per batch of outputs the core returns (one per engine step) and
  `output_token_s` per token in it: the output handler (`AsyncLLM._run_output_handler`,
  0.33.0 `async_llm.py:L876-916`) detokenizing the step and putting each request's output in
  its `RequestOutputCollector`;
- `output_chunk_s` per SSE chunk: each request's stream task taking its collector's output and
  writing one chunk. A task waiting for the loop has not taken its output yet, so the handler's
  next outputs *merge* into it (`RequestOutputCollector.put`, 0.33.0
  `output_processor.py:L53-83`: "RequestOutputs are merged if the producer gets ahead of the
  consumer"): under load a chunk carries several tokens, and the loop's chunk work per second
  stops growing with the token rate, as the real server's does;
- `chat_template_s` per chat request in its first turn: the chat template's parse on pin
  0.11.0 (`sim.engine.chat_template`, sourced, set per run; 0 for completions);
- `hand_off_s`, a fixed latency between the loop's input work and the scheduler that occupies
  no shared loop (the client's and server's HTTP stacks, the ZMQ hop, the core's wake-up): what
  a lone request waits that no per-item cost explains.

`vllm serve --api-server-count N` runs N such loops (processes); requests take them in turn
(round-robin, kvsim's stand-in for the kernel spreading connections over the processes) and
each engine step's outputs go back to the loop that sent the request. `--stream-interval K`
(0.19.1 onward, `output_processor.py:L379-391 @0.33.0`) holds a request's tokens until K
accumulate (its first and last go at once).

A request's intake takes two turns on the loop (its handler parses it, awaits, then
tokenizes it), and the output handler one turn per `OUTPUT_PROC_CHUNK_SIZE` requests of a step:
whatever became ready in between runs first, as on asyncio's FIFO ready queue. Releases 0.11.0
to 0.20.0 tokenize through a batcher instead (`sim.engine.microbatch`, `tokenizer`): off the
loop, in batches, and the handler resumes in a turn of its own.

Example: request_s 20 ms, prompt_token_s 5 us, hand_off_s 10 ms, output costs 0; two
1,000-token prompts sent at 0 are parsed at 0-20 and 20-40 ms and tokenized at 40-45 and
45-50 ms, so they reach the scheduler at 55 ms and 60 ms (waiting for the loop, not for each
other's hand-off). Streaming: output_chunk_s 100 us, 64
requests decoding in 10 ms steps: 6.4 ms of chunks a step, every token out 6.4 ms after it is
sampled at most; at 2.5 ms steps the chunks cannot keep up, so each waiting chunk absorbs the
next step's token and the loop settles at one chunk per request per 6.4 ms (~2.6 tokens each).

What this leaves out: the client's own event loop (aiohttp reading the streams), the kernel's
real connection spreading, chat-template work but 0.11.0's parse, V0's in-process frontend and
0.25.1's per-prompt executor tokenization: one set of costs for every release, fitted.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Generator, Iterable
from dataclasses import dataclass, field

import simpy

from sim.engine.microbatch import MicrobatchTokenizer, TokenizerBatcher
from sim.scheduler import Request

_Process = Generator[simpy.Event, object, None]

#: Requests the output handler processes per turn on the loop (`VLLM_V1_OUTPUT_PROC_CHUNK_SIZE`,
#: default 128 in 0.11.0 through 0.33.0 `vllm/envs.py`).
OUTPUT_PROC_CHUNK_SIZE = 128


@dataclass(frozen=True, slots=True)
class ApiServer:
    """The API server's costs in seconds (see the module docstring); all zero: no frontend."""

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


@dataclass(slots=True)
class _Chunk:
    """One request's SSE chunk waiting for its turn on the loop: tokens [start, end)."""

    request: Request
    start: int
    end: int
    started: bool = False


@dataclass(slots=True)
class FrontendLoop:
    """`ApiServer` on the simulated clock: `num_servers` API servers, each one FIFO loop shared
    by its requests' inputs and outputs.

    `admit(request)` assigns the request an API server (round-robin, in arrival order), runs
    its input work and then `deliver_to_engine(request)`; `stream(requests)` takes the tokens
    `requests` sampled at this instant (their last entries of `token_times_s`) and rewrites
    those times to when the client sees them, then calls `on_delivered(request)` for each
    terminal request whose every token the client has. `stream_interval` > 1 holds a request's
    tokens until that many accumulate (its first and last tokens go at once).
    """

    env: simpy.Environment
    costs: ApiServer
    deliver_to_engine: Callable[[Request], None]
    on_delivered: Callable[[Request], None]
    num_servers: int = 1
    stream_interval: int = 1
    #: The release's tokenizer batcher (`sim.engine.microbatch`, 0.11.0-0.20.0): prompts are
    #: tokenized off the loop in batches; None: on the loop, each in its handler's turn.
    tokenizer: MicrobatchTokenizer | None = None
    _loops: list[simpy.Resource] = field(init=False)
    _batchers: list[TokenizerBatcher] = field(init=False)
    #: Request id -> its API server (index into `_loops`).
    _server_of: dict[int, int] = field(default_factory=dict)
    _next_server: int = 0
    #: Request id -> tokens the output handler has taken / emitted / the client has.
    _taken: dict[int, int] = field(default_factory=dict)
    _emitted: dict[int, int] = field(default_factory=dict)
    _delivered: dict[int, int] = field(default_factory=dict)
    #: Request id -> its chunk still waiting for the loop (the producer got ahead: new tokens
    #: merge into it, as `RequestOutputCollector.put` merges deltas).
    _waiting_chunk: dict[int, _Chunk] = field(default_factory=dict)
    #: Request id -> output-handler jobs queued with its tokens / tokens the handler processed.
    _handling: dict[int, int] = field(default_factory=dict)
    _handled: dict[int, int] = field(default_factory=dict)
    #: Per API server, the engine steps' outputs its handler has still to process.
    _outputs: list[deque[list[tuple[Request, int]]]] = field(init=False)
    #: Requests still in the input queue (not yet at the engine core).
    num_pending_inputs: int = 0

    def __post_init__(self) -> None:
        if self.num_servers < 1:
            raise ValueError(f"FrontendLoop.num_servers must be >= 1, got {self.num_servers}")
        if self.stream_interval < 1:
            raise ValueError(
                f"FrontendLoop.stream_interval must be >= 1, got {self.stream_interval}"
            )
        self._loops = [simpy.Resource(self.env, capacity=1) for _ in range(self.num_servers)]
        self._outputs = [deque() for _ in range(self.num_servers)]
        tokenizer, token_s = self.tokenizer, self.costs.prompt_token_s
        self._batchers = (
            []
            if tokenizer is None
            else [TokenizerBatcher(self.env, loop, tokenizer, token_s) for loop in self._loops]
        )

    def admit(self, request: Request) -> None:
        self._server_of[request.request_id] = self._next_server
        self._next_server = (self._next_server + 1) % self.num_servers
        costs = self.costs
        free = not any((costs.request_s, costs.chat_template_s, costs.prompt_token_s,
                        costs.hand_off_s))  # fmt: skip
        if free and not self._batchers:
            self.deliver_to_engine(request)  # free input work: at once, in the caller's turn
            return
        self.num_pending_inputs += 1
        self.env.process(self._input(request))

    def _loop_of(self, request: Request) -> simpy.Resource:
        return self._loops[self._server_of.get(request.request_id, 0)]

    def _input(self, request: Request) -> _Process:
        """The request's handler: parse it and apply its chat template (one turn on the loop),
        then tokenize it (a second turn: the handler awaits between them, so whatever became
        ready meanwhile, such as the output handler, runs first; with a batcher, off the loop,
        and the handler resumes in a turn of its own once its batch is done), then the hand-off."""
        loop = self._loop_of(request)
        tokenize_s = 0.0 if self._batchers else self.costs.prompt_token_s * request.prompt_tokens
        for cost_s in (self.costs.request_s + self.costs.chat_template_s, tokenize_s):
            if cost_s > 0:
                with loop.request() as turn:
                    yield turn
                    yield self.env.timeout(cost_s)
        if self._batchers:
            server = self._server_of.get(request.request_id, 0)
            yield self._batchers[server].submit(request.prompt_tokens)
            with loop.request() as turn:
                yield turn
        if self.costs.hand_off_s > 0:
            yield self.env.timeout(self.costs.hand_off_s)
        self.num_pending_inputs -= 1
        self.deliver_to_engine(request)

    def stream(self, requests: Iterable[Request]) -> None:
        """Queue the new tokens of `requests` (sampled now): one output-handler job per API
        server, then one chunk per request with tokens to send."""
        batches: dict[int, list[tuple[Request, int]]] = {}
        for request in requests:
            times = request.token_times_s
            rid = request.request_id
            if rid not in self._server_of:
                continue  # every token of it already reached the client (`_forget`)
            if times is None or len(times) <= self._taken.get(rid, 0):
                continue
            self._taken[rid] = len(times)
            server = self._server_of.get(rid, 0)
            batches.setdefault(server, []).append((request, len(times)))
        for server in sorted(batches):
            batch = batches[server]
            if self.costs.streams_free:
                self._emit_free(batch)
                continue
            for request, _ in batch:
                rid = request.request_id
                self._handling[rid] = self._handling.get(rid, 0) + 1
            self._outputs[server].append(batch)
            if len(self._outputs[server]) == 1:  # the handler was idle: it wakes
                self.env.process(self._output_handler(server))

    def _output_handler(self, server: int) -> _Process:
        """`AsyncLLM._run_output_handler`'s task, one per API server (0.33.0
        `async_llm.py:L876-916`). Once it has the loop it takes the engine's outputs one step
        at a time, `OUTPUT_PROC_CHUNK_SIZE` requests a slice, and gives the loop up only
        between slices of one step (`await asyncio.sleep(0)`) or when no output is waiting:
        a step's outputs that are already queued (`outputs_queue.get()` on a non-empty queue)
        follow at once. So when the handler falls behind, the stream tasks it woke have not
        run by the time the next step's outputs reach their collectors, and those merge."""
        queue, loop, costs = self._outputs[server], self._loops[server], self.costs
        at = 0  # the next slice of queue[0]
        while queue:
            with loop.request() as turn:
                yield turn
                while queue:
                    batch = queue[0]
                    part = batch[at : at + OUTPUT_PROC_CHUNK_SIZE]
                    num_tokens = sum(end - self._handled.get(r.request_id, 0) for r, end in part)
                    batch_s = costs.output_batch_s if at == 0 else 0.0
                    yield self.env.timeout(batch_s + costs.output_token_s * num_tokens)
                    self._put_outputs(server, part)
                    at += OUTPUT_PROC_CHUNK_SIZE
                    if at < len(batch):
                        break  # `asyncio.sleep(0)`: the stream tasks woken so far run first
                    queue.popleft()
                    at = 0

    def _put_outputs(self, server: int, part: list[tuple[Request, int]]) -> None:
        """Each request's output into its collector (a chunk of its own, or merged into the
        waiting one); the stream tasks of new chunks wait for the loop."""
        new_chunks: list[_Chunk] = []
        for request, end in part:
            rid = request.request_id
            self._handling[rid] -= 1
            self._handled[rid] = end
            emit = self._to_emit(request, end)
            if emit is not None:
                self._put(request, emit, new_chunks)
        if new_chunks:
            self.env.process(self._send(server, new_chunks))

    def _put(self, request: Request, end: int, new_chunks: list[_Chunk]) -> None:
        """`RequestOutputCollector.put`: tokens up to `end` join the request's waiting chunk,
        or start a chunk of their own (appended to `new_chunks`)."""
        chunk = self._waiting_chunk.get(request.request_id)
        if chunk is not None:
            chunk.end = end  # the consumer has not run yet: deltas merge
        else:
            start = self._emitted.get(request.request_id, 0)
            chunk = _Chunk(request, start, end)
            self._waiting_chunk[request.request_id] = chunk
            new_chunks.append(chunk)
        self._emitted[request.request_id] = end

    def _to_emit(self, request: Request, end: int) -> int | None:
        """The token count `request`'s output carries once its tokens up to `end` are
        processed, or None while `stream_interval` holds them (vLLM 0.33.0
        `output_processor.py:L379-391`: the first token, the last, or `stream_interval`
        tokens since the last sent)."""
        times = request.token_times_s
        assert times is not None
        sent = self._emitted.get(request.request_id, 0)
        if end <= sent:
            return None
        last = request.state.is_terminal and end == len(times)
        if sent == 0 or last or end - sent >= self.stream_interval:
            return end
        return None

    def _send(self, server: int, chunks: list[_Chunk]) -> _Process:
        """The stream tasks the handler woke, in order: each takes its collector's output and
        writes one SSE chunk. They are ready together and the loop is FIFO, so nothing runs
        between them: one turn on the loop serves them all."""
        with self._loops[server].request() as turn:
            yield turn
            for chunk in chunks:
                del self._waiting_chunk[chunk.request.request_id]  # `get()`: later puts are new
                if self.costs.output_chunk_s > 0:
                    yield self.env.timeout(self.costs.output_chunk_s)
                self._delivered_now(chunk.request, chunk.start, chunk.end)

    def _emit_free(self, batch: list[tuple[Request, int]]) -> None:
        for request, end in batch:
            emit = self._to_emit(request, end)
            if emit is not None:
                self._emitted[request.request_id] = emit
                start = self._delivered.get(request.request_id, 0)
                # Interval 1: the client sees each token at its sample time (now), unrounded.
                self._delivered_now(request, start, emit, stamp=self.stream_interval > 1)

    def ended(self, request: Request) -> None:
        """`request` ended without a final output (aborted or failed): the tokens
        `stream_interval` holds go out now, as its last output (tokens its last step sampled,
        if any, follow with that step's outputs). A request whose tokens still wait for the
        loop when the run itself ends keeps them: nothing runs after the end."""
        rid = request.request_id
        taken = self._taken.get(rid, 0)
        if self._handling.get(rid, 0) or self._emitted.get(rid, 0) >= taken:
            return  # a queued handler job emits it (it is terminal), or nothing is held
        if self.costs.streams_free:
            self._emitted[rid] = taken  # unlike `_emit_free`, held tokens go whatever the interval
            self._delivered_now(request, self._delivered.get(rid, 0), taken)
        else:
            new_chunks: list[_Chunk] = []
            self._put(request, taken, new_chunks)
            if new_chunks:
                self.env.process(self._send(self._server_of.get(rid, 0), new_chunks))

    def _delivered_now(self, request: Request, start: int, end: int, stamp: bool = True) -> None:
        times = request.token_times_s
        assert times is not None
        if stamp:
            now = self.env.now
            for i in range(start, end):
                times[i] = now
        self._delivered[request.request_id] = end
        if request.state.is_terminal and end == len(times):
            self._forget(request.request_id)
            self.on_delivered(request)

    def _forget(self, request_id: int) -> None:
        """The client has every token of the request: drop its bookkeeping but the count
        delivered (`delivered_tokens`), so a long benchmark keeps one entry per finished
        request instead of six."""
        if self._handling.get(request_id, 0):
            return  # a queued handler job still counts on the entries (`_put_outputs`)
        for table in (self._server_of, self._taken, self._emitted, self._handling,
                      self._handled):  # fmt: skip
            table.pop(request_id, None)

    def delivered_tokens(self, request_id: int) -> int:
        """How many of the request's tokens the client has."""
        return self._delivered.get(request_id, 0)

    def owes_tokens(self, request: Request) -> bool:
        """Whether some of `request`'s tokens have not been streamed to the client yet."""
        times = request.token_times_s
        return times is not None and self._delivered.get(request.request_id, 0) < len(times)


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
