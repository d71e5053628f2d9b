"""The engine's arrivals: requests enter at their trace times, through the router, to a replica.

`EngineArrivals` is the part of `sim.engine.engine.Engine` that moves requests in and out of the
replicas, apart from their steps: the open-loop arrival process (`_arrivals`), routing
(`_route`, with the KV-event index brought up to the arrival's time), the V1 frontend's
max_model_len check (`_arrive`), waking an idle replica, writing a request's row when it ends
(`_on_terminal`), and closed-loop session turns (`sim.engine.sessions`): when a turn ends,
`_turns_ended` schedules the session's next turn, arriving its think time later
(`_next_turn`), or accounts the session's later turns as never arrived. The engine's state is
set up by `Engine.__init__` (declared here); the step loop is `sim.engine.step_loop`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from sim.engine.client import ClientCap
from sim.engine.frontend import FrontendLoop
from sim.engine.replica import Clock, EngineConfig, Replica, SimProcess, request_of
from sim.engine.sessions import SessionTurns
from sim.output.records import RequestRows
from sim.routing import CacheIndex, ReplicaView, RoutingPolicy
from sim.scheduler import Request, RequestState
from sim.workload.request import RequestSpec


class EngineArrivals:
    """Arrivals, routing and session turns of `sim.engine.engine.Engine` (see the module docstring)."""

    config: EngineConfig
    env: Clock
    replicas: list[Replica]
    progress: Callable[[int, int], None] | None
    num_specs: int
    _specs: Iterator[RequestSpec]
    _next_spec: RequestSpec | None
    _turns: SessionTurns | None
    _turns_not_arrived: list[RequestSpec]
    _rows: RequestRows
    _policy: RoutingPolicy
    _cache_index: CacheIndex | None
    _views: list[ReplicaView]
    _stop: str | None
    _num_terminal: int
    _arrivals_done: bool
    _open_loop_done: bool
    #: `vllm bench serve --max-concurrency` (`sim.engine.client`); None: open loop.
    client: ClientCap | None
    #: Request id -> its tokens' sample times, when the engine records them; else None. With
    #: a frontend, the times the client sees them (`sim.engine.frontend`).
    token_times_s: dict[int, list[float]] | None
    #: The API server between the client and the engine core; None: requests reach the
    #: scheduler when sent, and tokens the client when sampled.
    frontend: FrontendLoop | None

    def _route(self, request: Request) -> Replica:
        if self._cache_index is not None:
            self._cache_index.advance(self.env.now)
        return self.replicas[self._policy.choose(request, self._views)]

    def _arrivals(self) -> SimProcess:
        for spec in self._specs:
            self._next_spec = spec
            delay = spec.arrival_s - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            client = self.client
            while client is not None and client.full and self._stop is None:
                yield client.wait(self.env)
            if self._stop is not None:
                break
            self._next_spec = None
            if client is None:
                request = request_of(spec)
            else:  # sent when a slot freed: it arrives now, after waiting since it was due
                client.sent(spec.request_id, spec.arrival_s, self.env.now)
                request = request_of(spec, self.env.now)
            self._send(request)
        self._open_loop_done = True
        self._check_arrivals_done()

    def _send(self, request: Request) -> None:
        """The client sent `request`: it arrives now, or after the API server's intake (its
        arrival time stays the send time, which vLLM's client times from). Its row is ordered
        by the send: with several API servers requests may reach the core out of that order."""
        self._rows.arrived(request.request_id)
        if self.frontend is None:
            self._arrive(request)
        else:
            self.frontend.admit(request)

    def _through_frontend(self, request: Request) -> None:
        """`FrontendLoop.deliver_to_engine`: the API server handed `request` to the core."""
        self._arrive(request)
        self._check_arrivals_done()

    def _arrive(self, request: Request) -> None:
        if self.token_times_s is not None:
            request.token_times_s = []
        replica = self._route(request)
        request.replica = replica.index
        if (
            replica.scheduler.engine == "v1"
            and request.prompt_tokens > self.config.scheduler.max_model_len
        ):
            # The V1 frontend rejects the prompt before it reaches the scheduler.
            request.finish(
                RequestState.IGNORED,
                f"prompt ({request.prompt_tokens} tokens) is longer than max_model_len "
                f"({self.config.scheduler.max_model_len})",
                self.env.now,
            )
            self._on_terminal((request,))
            self._turns_ended((request,))
            return
        replica.outstanding += 1
        replica.scheduler.add_request(request)
        self._wake(replica)

    def _check_arrivals_done(self) -> None:
        """Once the open-loop arrivals are over and no session turn can still arrive, idle
        replicas may end."""
        if self._arrivals_done or not self._open_loop_done:
            return
        if self.frontend is not None and self.frontend.num_pending_inputs:
            return
        if self._turns is not None and self._turns.num_pending:
            return
        self._arrivals_done = True
        for replica in self.replicas:
            self._wake(replica)

    def _turns_ended(self, requests: Iterable[Request]) -> None:
        """Session hook: schedule the next turn of each finished request, or end its session."""
        if self._turns is None:
            return
        for request in requests:
            end = self._turns.after(request)
            if end.next_turn is not None:
                self.env.process(self._next_turn(end.next_turn, end.at_s))
            for spec in end.cancelled:
                never = request_of(spec)  # at its planned (lower-bound) arrival
                never.finish(
                    RequestState.ABORTED,
                    f"never arrived: its session ended at turn {request.turn} "
                    f"(request {request.request_id}, {request.state.value})",
                    self.env.now,
                )
                self._rows.arrived(spec.request_id)
                self._on_terminal((never,))
        self._check_arrivals_done()

    def _next_turn(self, spec: RequestSpec, at_s: float) -> SimProcess:
        yield self.env.timeout(at_s - self.env.now)
        assert self._turns is not None
        self._turns.arrived()
        if self._stop is None:
            self._send(request_of(spec, self.env.now))
        else:  # it never arrives (recorded at the end of the run)
            self._turns_not_arrived.append(spec)
        self._check_arrivals_done()

    def _wake(self, replica: Replica) -> None:
        if replica.wakeup is not None and not replica.wakeup.triggered:
            replica.wakeup.succeed()

    def _on_terminal(self, requests: Iterable[Request]) -> None:
        """`requests` reached their terminal state: their rows are written (in id order)."""
        count = 0
        for request in requests:
            self._rows.terminal(request)
            count += 1
            if self.token_times_s is not None and request.token_times_s is not None:
                self.token_times_s[request.request_id] = request.token_times_s
            if self.frontend is not None and request.state is not RequestState.FINISHED:
                self.frontend.ended(request)  # no final output of a step will carry its tokens
            if self.client is not None and not (
                self.frontend is not None and self.frontend.owes_tokens(request)
            ):  # with a frontend, a slot frees when the client has the last token
                self.client.done(request.request_id)
        self._num_terminal += count
        if self.progress is not None and count:
            self.progress(self._num_terminal, self.num_specs)
