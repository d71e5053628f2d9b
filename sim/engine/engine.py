"""The co-located engine: replicas behind a router, in simulated time (SimPy).

An arrival process feeds requests at their trace times to a router; one process per replica
runs the step loop of `sim.engine.step_loop` (shared with the disaggregated engine), whose
`StepHooks` this engine implements::

    plan = scheduler.schedule(now)               # pure
    dt   = step_time.predict_s(batch of plan)    # pure
    yield env.timeout(dt)                        # or, when no event is due first, no yield
    scheduler.update(plan, now + dt)              # tokens appended, finished requests freed

Most steps end before anything else can happen: no arrival, no other replica's step is due
first. Such a step moves the clock itself (`Clock.advance_to`) instead of yielding a SimPy
timeout, which would only come back to the same process at the same time (unless
`yield_every_step`).

An idle replica waits on an event that the next arrival triggers, instead of spinning. A replica
whose queue cannot make progress (nothing running, nothing admissible, no arrival to come)
aborts what is left with the reason, so every request ends in exactly one terminal state, and
records a `no_progress` violation that diagnoses the stuck queue (`sim.audit.liveness`).

A closed-loop session turn (`sim.engine.sessions`) arrives when the turn before it has finished,
plus its think time: the hook `_turns_ended` schedules it, or ends the session. The arrivals,
routing and turns are `sim.engine.arrivals.EngineArrivals`; this module is the engine's answers
to the step loop's hooks, its records and the run.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Sequence
from itertools import chain

import simpy

from sim.audit import ViolationPolicy
from sim.audit.liveness import Stall, diagnose
from sim.engine.api_server import ApiServer
from sim.engine.arrivals import EngineArrivals
from sim.engine.client import ClientCap
from sim.engine.frontend import FrontendLoop
from sim.engine.microbatch import MicrobatchTokenizer
from sim.engine.replica import (  # re-exported: the engine's parts live in sim.engine.replica
    Clock as Clock,
)
from sim.engine.replica import EngineConfig as EngineConfig
from sim.engine.replica import Replica as Replica
from sim.engine.replica import RunRecords as RunRecords
from sim.engine.replica import batch_shape as batch_shape
from sim.engine.replica import in_arrival_order as in_arrival_order
from sim.engine.replica import is_lazy_in_arrival_order, request_of
from sim.engine.sessions import SessionTurns
from sim.engine.step_loop import ReplicaStepLoop
from sim.kv_events import attach_streams
from sim.latency.batch import BatchShape
from sim.latency.protocol import StepTimeModel, decode_window_of
from sim.output import records as records_module
from sim.output.records import (
    REQUEST_DTYPE,
    STEP_DTYPE,
    ColumnarTable,
    RequestRows,
    TableSinks,
    memory_sinks,
)
from sim.output.records import (
    STEP_COLUMNS as STEP_COLUMNS,  # re-exported: the steps table's columns
)
from sim.output.stats import RunStats
from sim.routing import CacheIndex, ReplicaView, make_policy
from sim.scheduler import Request, RequestState, StepPlan
from sim.workload.request import RequestSpec


class Engine(EngineArrivals):
    """Replays `specs` through `config.num_replicas` replicas with `step_time`.

    The tables go to `sinks` (in memory by default; `sim.files.tables.FileSink` streams them to
    files), `chunk_rows` rows at a time (default `sim.output.records.DEFAULT_CHUNK_ROWS`). A request's row is made when it reaches its terminal
    state, and the engine then holds it no more: memory follows the requests in flight, not
    the trace.
    """

    def __init__(
        self,
        config: EngineConfig,
        specs: Iterable[RequestSpec],
        step_time: StepTimeModel,
        progress: Callable[[int, int], None] | None = None,
        sinks: TableSinks | None = None,
        chunk_rows: int | None = None,
        *,
        yield_every_step: bool = False,
        max_concurrency: int | None = None,
        record_token_times: bool = False,
        frontend: ApiServer | None = None,
        tokenizer: MicrobatchTokenizer | None = None,
    ) -> None:
        """`yield_every_step`: the plain loop, one SimPy timeout per step (the reference the
        tests compare the clock-advancing loop with; the tables are identical).
        `max_concurrency`: a benchmark client's cap on requests in flight, and
        `record_token_times`: keep every output token's time in `token_times_s`
        (`sim.engine.client`; neither changes a table otherwise). `frontend`: the API
        server's costs (`sim.engine.frontend`; needs `record_token_times`), which delay each
        request's arrival at the scheduler and each token's time; `tokenizer`: its release's
        tokenizer batcher (`sim.engine.microbatch`; only with `frontend`)."""
        self.config = config
        self.client = None if max_concurrency is None else ClientCap(max_concurrency)
        self.token_times_s = {} if record_token_times else None
        self.env = Clock()
        self.frontend = None
        if frontend is not None:
            if not record_token_times:
                raise ValueError("a frontend needs record_token_times (it times tokens)")
            self.frontend = FrontendLoop(
                self.env, frontend, self._through_frontend, self._tokens_delivered,
                num_servers=config.api_server_count, stream_interval=config.stream_interval,
                tokenizer=tokenizer,
            )  # fmt: skip
        self.yield_every_step = yield_every_step
        ids_ascending = self._take_specs(specs)
        #: Closed-loop turns that came due after the run stopped (they never arrived).
        self._turns_not_arrived: list[RequestSpec] = []
        #: The spec taken from `_specs` whose arrival time has not come (it has not arrived).
        self._next_spec: RequestSpec | None = None
        self.step_time = step_time
        self.progress = progress
        self.sinks = sinks or memory_sinks()
        self._open_tables(chunk_rows or records_module.DEFAULT_CHUNK_ROWS, ids_ascending)
        self._current_step = 0
        window = decode_window_of(step_time)
        self.replicas = [
            Replica(i, config, self._clock, window) for i in range(config.num_replicas)
        ]
        self._arrivals_done = False
        self._connect_router()
        self._stop: str | None = None
        self._num_terminal = 0
        self._open_loop_done = False

    def _take_specs(self, specs: Iterable[RequestSpec]) -> bool:
        """Take the requests in arrival order (`self._specs`, `self.num_specs`) and, for a
        closed-loop workload, its session turns (`self._turns`): only each session's first
        turn is open loop, the others arrive when the turn before them ends. Returns whether
        the request rows can be written in id order as they end (False with sessions: a turn
        arrives after requests with larger ids, so the rows are sorted at the end)."""
        self._specs, self.num_specs, ids_ascending = in_arrival_order(specs)
        #: Closed-loop session turns (`sim.engine.sessions`); None for open-loop workloads. A
        #: lazy source (a multi-million-request synthetic load) has none and stays lazy.
        self._turns: SessionTurns | None = None
        if not is_lazy_in_arrival_order(specs):
            ordered = list(self._specs)
            self._turns = SessionTurns.of(ordered)
            if self._turns is not None:
                if self.client is not None:
                    raise ValueError("max_concurrency is for open-loop workloads, not sessions")
                ordered = self._turns.open_loop
                # A closed-loop turn arrives when its session says, after requests with
                # larger ids: its row waits, and the rows are sorted at the end.
                ids_ascending = False
            self._specs = iter(ordered)
        return ids_ascending

    def _open_tables(self, chunk_rows: int, ids_ascending: bool) -> None:
        """The run's request and step tables, written to `self.sinks` `chunk_rows` rows at a
        time, with the running statistics fed from every chunk (`self.records`), so the
        summary needs no second pass over tables that may be on disk."""
        config = self.config
        stats = RunStats(config.kv.num_gpu_blocks, spill_to_file=self.sinks.spill_to_file)
        requests = ColumnarTable(REQUEST_DTYPE, self.sinks.requests, chunk_rows)
        steps = ColumnarTable(STEP_DTYPE, self.sinks.steps, chunk_rows)
        requests.listeners.append(stats.on_requests)
        steps.listeners.append(stats.on_steps)
        self.records = RunRecords(requests, steps, stats, num_gpu_blocks=config.kv.num_gpu_blocks)
        self._rows = RequestRows(requests, ids_ascending)

    def _connect_router(self) -> None:
        """The router's policy and what it sees of the replicas: each V1 pool's KV events feed
        the router's cache index (a prefix-aware router) and/or a recording stream
        (`engine.kv_events`), and a view of each replica reads both."""
        config = self.config
        self._policy = make_policy(config.router, config.kv.block_size, config.router_load_weight)
        # KV events: each V1 pool feeds the router's index and/or a recording stream.
        self._cache_index = (
            CacheIndex(
                config.num_replicas, config.router_staleness_s, self._now, config.kv.block_size
            )
            if config.router.reads_kv_events
            else None
        )
        self._event_streams = attach_streams(
            self.replicas,
            config.kv.block_size,
            self._now,
            self._cache_index.feeds if self._cache_index is not None else None,
            config.kv_events,
            spill=self.sinks.spill_to_file,  # tables to files: events spill too
        )
        self._views = [ReplicaView(r, self._cache_index) for r in self.replicas]

    def _now(self) -> float:
        return self.env.now

    def _clock(self) -> tuple[float, int]:
        return (self.env.now, self._current_step)

    # ------------------------------------------------------------------ processes
    def idle(self, replica: Replica) -> simpy.Event:
        """What an idle replica waits for: the next arrival, or the next KV transfer's
        completion if one is in flight (whichever comes first)."""
        transfer_s = replica.next_kv_transfer_s()
        replica.wakeup = self.env.event()
        if transfer_s is None:
            return replica.wakeup
        return replica.wakeup | self.env.timeout(max(0.0, transfer_s - self.env.now))

    # ------------------------------------------------------------------ step-loop hooks
    # `sim.engine.step_loop.StepHooks`: what this engine decides for its replicas' loops.
    def stopped(self) -> bool:
        return self._stop is not None

    def stop(self, reason: str) -> None:
        self._stop = reason

    def begin_step(self, replica: Replica) -> None:
        self._current_step = replica.num_steps

    def ended(self, replica: Replica, requests: Sequence[Request]) -> None:
        self._on_terminal(requests)
        self._turns_ended(requests)

    def stepped(self, replica: Replica, finished: Sequence[Request]) -> None:
        """Nothing follows a step here (a finished request's next turn came with `ended`)."""

    def may_get_work(self, replica: Replica) -> bool:
        """An arrival still to come, or a KV transfer in flight that lets a parked request (or
        freed blocks) make progress."""
        return not self._arrivals_done or replica.next_kv_transfer_s() is not None

    def retire(self, replica: Replica) -> None:
        """Nothing waits on a co-located replica's end."""

    def stall(self, replica: Replica) -> None:
        self._no_progress(replica, Stall.STALLED)
        self._abort(
            replica.scheduler.unfinished(),
            "stalled: nothing running and no waiting request can be admitted "
            f"({replica.pool_stats().num_free} free blocks)",
        )

    def livelock(self, replica: Replica, num_empty_steps: int) -> None:
        self._no_progress(replica, Stall.LIVELOCK, num_empty_steps)
        self._abort(
            replica.scheduler.unfinished(),
            "livelock: steps keep preempting without running anything",
        )

    def stop_in(self, replica: Replica, plan: StepPlan) -> str | None:
        """Why the run ends in this scheduler call (a fatal engine error, a stop policy)."""
        if plan.fatal_error is not None:
            self.records.fatal_error = plan.fatal_error
            return f"fatal engine error: {plan.fatal_error}"
        policy = self.config.violation_policy
        if policy is ViolationPolicy.STOP_ANY and replica.manager.violations:
            first = replica.manager.violations[0]
            return f"stopped at the first violation ({first.kind.value}): {first.message}"
        if policy is ViolationPolicy.STOP and replica.manager.first_raised is not None:
            first = replica.manager.first_raised
            return f"stopped where the real engine raises ({first.kind.value}): {first.message}"
        return None

    def fatal_stop(self, replica: Replica, plan: StepPlan) -> str | None:
        """A failed update ends the run (`stop_in` answers the fatal error first)."""
        return self.stop_in(replica, plan)

    def record_step(
        self, replica: Replica, plan: StepPlan, shape: BatchShape, start_s: float, duration_s: float
    ) -> None:
        stats = replica.pool_stats()
        scheduler = replica.scheduler
        chunks = shape.prefill_chunks
        num_prefill_tokens = 0
        prior_tokens = 0
        for prior, chunk in chunks:
            num_prefill_tokens += chunk
            prior_tokens += prior
        # The BatchShape properties, summed once here (this runs on every step).
        num_decode_seqs = shape.num_decode_seqs
        self.records.steps.append(
            (
                replica.index,
                replica.num_steps,
                start_s,
                duration_s,
                len(chunks),
                num_prefill_tokens,
                num_decode_seqs,
                num_decode_seqs + num_prefill_tokens,
                shape.decode_context_sum + prior_tokens,
                plan.num_preempted,
                len(scheduler.waiting),
                len(scheduler.running),
                len(scheduler.swapped) if scheduler.engine == "v0" else 0,  # type: ignore[union-attr]
                stats.num_free,
                stats.num_total - stats.num_free,
                stats.num_evictable,
            )
        )
        if self.frontend is not None:  # the step's tokens go out through the API server
            self.frontend.stream(work.request for work in plan.scheduled)

    def _tokens_delivered(self, request: Request) -> None:
        """`FrontendLoop.on_delivered`: the client has every token of terminal `request`."""
        if self.client is not None:
            self.client.done(request.request_id)

    def _no_progress(self, replica: Replica, stall: Stall, num_empty_steps: int = 0) -> None:
        """Record the stuck queue as a `no_progress` violation, before its requests are
        aborted (the diagnosis reads the queues and the blocks they hold)."""
        diagnosis = diagnose(replica.scheduler, replica.manager, stall, num_empty_steps)
        replica.manager.record_no_progress(diagnosis)

    def _abort(self, requests: Iterable[Request], reason: str) -> None:
        aborted = []
        for request in requests:
            if not request.state.is_terminal:
                request.finish(RequestState.ABORTED, reason, self.env.now)
                aborted.append(request)
        self._on_terminal(aborted)
        self._turns_ended(aborted)

    # ------------------------------------------------------------------ run
    def run(self) -> RunRecords:
        """Run to the end; the tables are complete (and their sinks closed) on return.

        On any exception the sinks are aborted (files left unfinished for the caller to
        discard, `sim.files.outdir`) and the exception propagates.
        """
        try:
            self._simulate()
            self._finish()
        except BaseException:
            self.sinks.abort()
            raise
        return self.records

    def _simulate(self) -> None:
        self.env.process(self._arrivals())
        for replica in self.replicas:
            loop = ReplicaStepLoop(
                replica,
                self,
                self.env,
                self.step_time,
                self.config.max_sim_time_s,
                advance_clock=not self.yield_every_step,
            )
            self.env.process(loop.run())
        # The cyclic GC keeps re-walking the millions of live objects of a long replay (~10% of
        # its time) and finds nothing: requests, sequences and plans form no reference cycles
        # (peak memory is the same with it off). It is switched back on however the run ends.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            self.env.run()
            if self._stop is None and not self._arrivals_done:
                # Session turns wait on a request that a stuck replica never finishes: with
                # no turn left to come, the replica diagnoses its queue and ends.
                self._arrivals_done = True
                for replica in self.replicas:
                    self._wake(replica)
                self.env.run()
            # The run is over: no turn follows the aborts below, and the turns still waiting
            # for their session's previous turn never arrive (`_finish` records them).
            if self._turns is not None:
                self._turns_not_arrived.extend(self._turns.after_request.values())
            self._turns = None
        finally:
            if gc_was_enabled:
                gc.enable()

    def _finish(self) -> None:
        """Every request accounted for: the unfinished aborted, then the never-arrived (whose
        ids come after every arrived one's when ids ascend), each with the reason."""
        reason = self._stop or "run ended"
        self.records.violations.extend(self.config.startup_violations)
        for replica in self.replicas:
            self._abort(replica.scheduler.unfinished(), reason)
            self.records.violations.extend(replica.manager.violations)
        never_arrived = self._specs
        if self._next_spec is not None:
            never_arrived = chain((self._next_spec,), never_arrived)
            self._next_spec = None
        for spec in chain(never_arrived, self._turns_not_arrived):
            request = request_of(spec)
            request.finish(RequestState.ABORTED, f"never arrived: {reason}", self.env.now)
            self._rows.arrived(spec.request_id)
            self._rows.terminal(request)
        self._rows.close()
        self.records.steps.close()
        if self.config.kv_events:
            self.records.kv_events = self._event_streams
        self.records.stopped_early = self._stop
        self.records.end_s = self.env.now
