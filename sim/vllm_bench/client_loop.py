"""The `vllm bench serve` client's own event loop: when it stamps each streamed chunk.

What the client does (read in 0.11.0, 0.19.1 and 0.33.0, `vllm/benchmarks/serve.py` and
`vllm/benchmarks/lib/endpoint_request_func.py`): ONE Python process, one asyncio loop.

- No gate on intake at `--request-rate inf`: `get_request` (serve.py L333-340 @0.19.1) sleeps
  only for a positive delay, so the loop creating the tasks (L815-866 @0.19.1, L1062-1116
  @0.33.0) never yields and every request's task exists before any runs; the session's
  `aiohttp.TCPConnector(limit=max_concurrency or 0, limit_per_host=...)` (L642-651 @0.19.1,
  L491-500 @0.11.0, L856-873 @0.33.0) is unlimited without `--max-concurrency` (aiohttp: "0
  means no limit", https://docs.aiohttp.org/en/stable/client_reference.html, TCPConnector);
  each task stamps its start `st = time.perf_counter()` before `session.post`
  (endpoint_request_func.py L191 @0.19.1, L154 @0.11.0, L248 @0.33.0), so whatever the client
  spends sending counts in that request's TTFT, and the server sees all requests at once.
- Per chunk, on the one loop: `response.content.iter_any()` hands over the bytes read so far,
  `StreamedResponseHandler.add_chunk` decodes and splits them into SSE messages, and for each
  message `json.loads`, then `time.perf_counter()` is the token's time (completions:
  L200-225 @0.19.1, L164-189 @0.11.0, L257-292 @0.33.0; chat at 0.11.0, 0.19.1 and 0.33.0 stamps
  just before `json.loads`). TTFT is the first such stamp minus `st`, each ITL the gap between
  stamps. A chunk the loop reaches late is stamped late; nothing the client does slows the
  server's engine (the server's SSE writes buffer; its outputs merge while a stream waits).

`ClientLoop` is that loop as one first-come-first-served server with one cost, `chunk_s` per
SSE message (one message per distinct time the API server delivered a request's tokens,
`sim.engine.frontend`): a message delivered at t is stamped when the loop has processed it,
max(t, loop free) + chunk_s, and every token it carries takes that stamp. It post-processes a
finished simulation's token times (the server never waits for the client), so it moves TTFT,
TPOT, ITL, E2EL and the duration, never the engine's batch.

Example: chunk_s 100 us; requests 0 and 1 each get a token at 0 s: stamped at 0.1 ms and
0.2 ms; request 0's next token, delivered at 0.15 ms, waits for the loop: stamped at 0.3 ms.

PRE-REGISTERED (committed before any run with chunk_s > 0, 2026-12-05): no public figure of
the vLLM client's whole per-message cost was found (sources searched: vLLM issues #39963,
#7935; aiperf issue #1424, ~1-4 ms for 32 HTTP starts of an aiohttp client, i.e. 31-125 us per
request start; TensorRT-LLM PR #15042, `splitlines` + `json.loads` per relayed SSE chunk ~5%
of a core at ~15k chunks/s, i.e. ~3 us: a part of the work, in another program). So no value
is fitted or shipped: `VLLM_BENCH_CLIENT` stays free (0) and nothing replays through this
model by default. The sensitivity analysis (`benchmarks/client_loop_sensitivity.py`) replays
every point at chunk_s in {0, 10, 25, 50, 100} us (the lower end: the parse alone, ~3 us,
rounded up for the read and the handler; the upper: a client saturating at 10k messages/s)
and reports the fit and held-out medians per metric group and per source; its result is
reported, not used to choose a value.

What this leaves out: the client's send cost (building and writing each request: at rate inf
~31-125 us a request by aiperf #1424's figure, 16-63 ms over 500 requests, and it would delay
the server's intake, which a post-process cannot), several messages of one stream read in one
`iter_any` (cheaper per message than charged here), the usage and `[DONE]` messages that
carry no token, tqdm's update per finished request, and the OS's socket buffering.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ClientLoop:
    """The benchmark client's loop cost in seconds per SSE message; 0: stamps as delivered."""

    chunk_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.chunk_s >= 0.0:  # also NaN
            raise ValueError(f"ClientLoop.chunk_s must be >= 0, got {self.chunk_s}")

    @property
    def free(self) -> bool:
        return self.chunk_s == 0.0


#: The shipped client: free (see PRE-REGISTERED in the module docstring: no sourced value).
VLLM_BENCH_CLIENT = ClientLoop()


def _messages(token_times_s: Mapping[int, Sequence[float]]) -> list[tuple[float, int, int, int]]:
    """(delivered at, request id, first token, end token) per SSE message: each run of equal
    times of one request is one message."""
    out = []
    for rid, times in token_times_s.items():
        start = 0
        for i in range(1, len(times) + 1):
            if i == len(times) or times[i] != times[start]:
                out.append((times[start], rid, start, i))
                start = i
    return out


def client_stamped(
    token_times_s: Mapping[int, Sequence[float]], loop: ClientLoop
) -> dict[int, list[float]]:
    """The times the client stamps each token (see the module docstring): the messages in
    delivery order (ties: by request id, then position), each `loop.chunk_s` on one FIFO loop."""
    stamped = {rid: list(times) for rid, times in token_times_s.items()}
    if loop.free:
        return stamped
    messages = _messages(token_times_s)
    heapq.heapify(messages)
    free_s = float("-inf")
    while messages:
        at_s, rid, start, end = heapq.heappop(messages)
        free_s = max(at_s, free_s) + loop.chunk_s
        stamped[rid][start:end] = [free_s] * (end - start)
    return stamped
