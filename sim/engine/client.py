"""A benchmark client in front of the engine: at most N requests in flight, and what each
request's tokens were timed at.

`vllm bench serve --max-concurrency N` (0.33.0 `vllm/benchmarks/serve.py` `benchmark`,
L1001-1017) sends each request at its scheduled time but through an `asyncio.Semaphore(N)`:
a request whose time has come waits until one of the N in flight finishes, and the waiters go
in order. `ClientCap` is that semaphore on the simulated clock: the engine's arrival process
waits on `wait()` while `full`, a request is sent (it *arrives*, its `arrival_s` is then) when
a slot is free, and a terminal request frees its slot. `queue_s` keeps each request's wait
(vLLM's `client_queue_time`).

`token_times_s` (when the engine records them) maps a request id to the times its output
tokens were sampled, one per token (`sim.scheduler.lifecycle.sample_token`), which a
streaming client sees as its chunks: TTFT is the first minus the arrival, the inter-token
latencies (ITL) are the differences. The decode fast path and cohort produce tokens without
visiting the request, so an engine recording token times runs without them (they change no
result: `tests/scheduler/fast/`).

Example: cap 2, three requests all due at 0, each taking 1 s: requests 0 and 1 arrive at 0,
request 2 at 1 (when request 0 or 1 finishes), with `queue_s[2] == 1.0`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy


@dataclass(slots=True)
class ClientCap:
    """At most `max_concurrency` requests in flight (see the module docstring)."""

    max_concurrency: int
    in_flight: set[int] = field(default_factory=set)
    queue_s: dict[int, float] = field(default_factory=dict)
    _freed: simpy.Event | None = None

    def __post_init__(self) -> None:
        if self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {self.max_concurrency}")

    @property
    def full(self) -> bool:
        return len(self.in_flight) >= self.max_concurrency

    def wait(self, env: simpy.Environment) -> simpy.Event:
        """The event of the next freed slot."""
        if self._freed is None or self._freed.triggered:
            self._freed = env.event()
        return self._freed

    def sent(self, request_id: int, due_s: float, now_s: float) -> None:
        self.in_flight.add(request_id)
        self.queue_s[request_id] = now_s - due_s

    def done(self, request_id: int) -> None:
        if request_id in self.in_flight:
            self.in_flight.remove(request_id)
            if self._freed is not None and not self._freed.triggered:
                self._freed.succeed()
