"""Prefill/decode disaggregation in simulated time: two pools of V1 replicas and a KV link.

One SimPy environment drives both pools. Each replica is a `sim.engine.engine.Replica` (its own
audited manager, V1 scheduler and step-time model) with a P/D connector on the KV-connector
seam (`sim.cluster.pd_connector`, which cites vLLM 0.11.0's NIXL connector). A request's path,
as vLLM's P/D proxy runs it::

    arrival ──► prefill replica (the prefill pool's router), max_tokens = 1
        prefill step(s) ─► its one token; request_finished: blocks kept (delayed free)
    ──► decode replica (the decode pool's router), with the whole output budget:
        waiting loop: prompt - local hit = external tokens, loaded async; blocks allocated;
        WAITING_FOR_REMOTE_KVS; the read starts: latency + blocks x block bytes / link rate
        read done ─► prefill blocks freed (finished_sending); decode resumes with
        prompt - 1 computed tokens, computes the last one and samples the first output token
        (the client's TTFT), then decodes to max_tokens

Every replica runs the shared step loop (`sim.engine.step_loop`: the same idle, stall and
livelock rules as the co-located engine); `PoolHooks` is what a pool decides for it. A replica
with nothing to run sleeps until an arrival, a hand-off or its next transfer's completion. A
replica that can never progress again (stalled, or livelocked) aborts what it holds with a
`no_progress` finding; if every replica sleeps with requests left (the pools wait on each
other), the run records that deadlock the same way (`_deadlock`). Every request ends in exactly
one terminal state on each side it reached.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import simpy

from sim.audit.liveness import NoProgress, Stall, diagnose
from sim.cluster.disagg_pool import DisaggPool, make_pool, record_step
from sim.cluster.links import LinkSpec
from sim.cluster.pd_connector import (
    DecodeSideConfig,
    PrefillSideConfig,
    Transfer,
    TransferLedger,
)
from sim.engine.engine import Clock, EngineConfig, Replica, RunRecords, in_arrival_order
from sim.engine.replica import SimProcess
from sim.engine.step_loop import ReplicaStepLoop
from sim.kv_connector.hooks import ConnectorHooks
from sim.latency.batch import BatchShape
from sim.latency.protocol import StepTimeModel
from sim.scheduler import Request, RequestState, StepPlan
from sim.workload.request import RequestSpec


@dataclass(slots=True)
class DisaggRecords:
    """Plain records of a disaggregated run: one `RunRecords` per pool and the transfers."""

    prefill: RunRecords
    decode: RunRecords
    transfers: list[Transfer] = field(default_factory=list)
    #: request id -> the time its prefill finished (the hand-off to the decode pool).
    handoff_s: dict[int, float] = field(default_factory=dict)


class DisaggEngine:
    """Replays `specs` through a prefill pool and a decode pool joined by `link`."""

    def __init__(
        self,
        prefill: tuple[EngineConfig, StepTimeModel],
        decode: tuple[EngineConfig, StepTimeModel],
        specs: Iterable[RequestSpec],
        link: LinkSpec,
        block_bytes: int,
        num_streams: int = 1,
    ) -> None:
        for name, (config, _) in (("prefill", prefill), ("decode", decode)):
            if config.design.api != "v1":
                raise ValueError(f"{name} pool: disaggregation models the V1 engine only")
        if prefill[0].kv.block_size != decode[0].kv.block_size:
            raise ValueError("the prefill and decode pools must share one block size")
        self.env = Clock()
        ordered, _, ids_ascending = in_arrival_order(specs)
        self.specs = list(ordered)
        self.link = link
        self.block_bytes = block_bytes
        self.num_streams = num_streams
        self._step = 0
        self.ledger = TransferLedger(
            link,
            decode[0].kv.block_size,
            block_bytes,
            num_streams,
            on_send_scheduled=lambda index: _wake(self.prefill.replicas[index]),
        )
        # The prefill pool's requests arrive in the workload's order; the decode pool's come
        # in prefill-finish order, so its rows wait for `close()` to sort them.
        self.prefill = make_pool(
            "prefill",
            replace(prefill[0], kv_connector=PrefillSideConfig(self.ledger)),
            prefill[1],
            ids_ascending,
            self._clock,
        )
        self.decode = make_pool(
            "decode",
            replace(decode[0], kv_connector=DecodeSideConfig(self.ledger)),
            decode[1],
            False,
            self._clock,
        )
        self.records = DisaggRecords(self.prefill.records, self.decode.records)
        self._spec_of = {spec.request_id: spec for spec in self.specs}
        self._arrivals_done = False
        #: How many of `specs` (in order) have arrived at the prefill pool.
        self._num_arrived = 0
        #: Why the run ends early (the simulated-time limit), once it does.
        self._stop: str | None = None

    def _clock(self) -> tuple[float, int]:
        return (self.env.now, self._step)

    @staticmethod
    def hooks(replica: Replica) -> ConnectorHooks:
        """The replica's connector state (every replica here has a P/D connector)."""
        assert replica.connector_hooks is not None
        return replica.connector_hooks

    # ------------------------------------------------------------------ processes
    def _arrivals(self) -> SimProcess:
        pool = self.prefill
        max_model_len = pool.config.scheduler.max_model_len
        for spec in self.specs:
            delay = spec.arrival_s - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            if self._stop is not None:
                break
            # The proxy asks the prefill engine for one token (max_tokens=1).
            request = Request.new(
                spec.request_id, spec.arrival_s, spec.prompt_content(), 1, spec.priority
            )
            self._num_arrived += 1
            pool.rows.arrived(request.request_id)
            replica = pool.replicas[pool.policy.choose(request, pool.views)]
            request.replica = replica.index
            if request.prompt_tokens > max_model_len:
                # The V1 frontend rejects the prompt before it reaches the scheduler.
                request.finish(
                    RequestState.IGNORED,
                    f"prompt ({request.prompt_tokens} tokens) is longer than max_model_len "
                    f"({max_model_len})",
                    self.env.now,
                )
                pool.rows.terminal(request)
                continue
            replica.outstanding += 1
            replica.scheduler.add_request(request)
            _wake(replica)
        self._arrivals_done = True
        for replica in self.prefill.replicas + self.decode.replicas:
            _wake(replica)

    def _handoff(self, done: Request) -> None:
        """The proxy sends the finished prefill on to a decode replica, with its whole
        output budget (the decode engine generates every token the client sees)."""
        pool = self.decode
        spec = self._spec_of[done.request_id]
        request = Request.new(
            spec.request_id,
            spec.arrival_s,
            spec.prompt_content(),
            spec.output_tokens,
            spec.priority,
        )
        pool.rows.arrived(request.request_id)
        replica = pool.replicas[pool.policy.choose(request, pool.views)]
        request.replica = replica.index
        self.ledger.hand_off(request.request_id, done.replica)
        self.records.handoff_s[request.request_id] = self.env.now
        replica.outstanding += 1
        replica.scheduler.add_request(request)
        _wake(replica)

    def _idle(self, pool: DisaggPool, replica: Replica) -> simpy.Event:
        """Sleep until woken (an arrival, a hand-off, a send scheduled) or until the
        replica's next transfer completes, whichever comes first. A prefill replica going
        idle first lets the decode replicas that wait on the prefill pool re-check."""
        self._prefill_idle(pool)
        replica.wakeup = self.env.event()
        transfer_s = replica.next_kv_transfer_s()
        if transfer_s is None:
            return replica.wakeup
        return replica.wakeup | self.env.timeout(max(0.0, transfer_s - self.env.now))

    def _stop_at_time_limit(self, reason: str) -> None:
        """The simulated-time limit ends the run: every sleeping replica wakes to end."""
        self._stop = reason
        for other in self.prefill.replicas + self.decode.replicas:
            _wake(other)

    def _may_get_work(self, pool: DisaggPool, replica: Replica) -> bool:
        """Whether something still to come could give this replica work or free its blocks."""
        if not self._arrivals_done or replica.next_kv_transfer_s() is not None:
            return True
        if pool is self.prefill:
            # Blocks kept for sends the decode side has not started yet.
            return bool(self.hooks(replica).delayed_free)
        # A prefill still queued or running may hand a request off.
        return any(r.scheduler.has_unfinished() for r in self.prefill.replicas)

    def _prefill_idle(self, pool: DisaggPool) -> None:
        """A prefill replica goes idle: decode replicas waiting on the prefill pool re-check."""
        if pool is self.prefill:
            for replica in self.decode.replicas:
                _wake(replica)

    def _stall(self, pool: DisaggPool, replica: Replica) -> None:
        """Abort what a replica that can never progress again holds or waits for (recorded as
        `no_progress`); a decode request never read releases its prefill blocks."""
        replica.manager.record_no_progress(
            diagnose(replica.scheduler, replica.manager, Stall.STALLED)
        )
        reason = (
            f"stalled on the {pool.name} pool: nothing running and no waiting request can be "
            f"admitted ({replica.pool_stats().num_free} free blocks)"
        )
        self._abort(pool, list(replica.scheduler.unfinished()), reason)

    def _livelock(self, pool: DisaggPool, replica: Replica, num_empty_steps: int) -> None:
        """`sim.engine.step_loop.livelock_limit` empty steps in a row: the replica's queue is
        aborted (recorded as `no_progress`), as the co-located engine does."""
        replica.manager.record_no_progress(
            diagnose(replica.scheduler, replica.manager, Stall.LIVELOCK, num_empty_steps)
        )
        reason = f"livelock on the {pool.name} pool: steps keep preempting without running anything"
        self._abort(pool, list(replica.scheduler.unfinished()), reason)

    def _abort(self, pool: DisaggPool, requests: list[Request], reason: str) -> None:
        for request in requests:
            if not request.state.is_terminal:
                request.finish(RequestState.ABORTED, reason, self.env.now)
                self.ledger.give_up(request.request_id, self.env.now)
                pool.rows.terminal(request)

    def _unfinished(self, pool: DisaggPool) -> list[Request]:
        return [
            request
            for replica in pool.replicas
            for request in replica.scheduler.unfinished()
            if not request.state.is_terminal
        ]

    def _abort_unfinished(self, reason: str) -> None:
        """Abort what both pools hold, prefill first (the ledger gives up each one)."""
        for pool in (self.prefill, self.decode):
            self._abort(pool, self._unfinished(pool), reason)

    def _abort_all(self, reason: str) -> None:
        """The run stopped early: every request not yet terminal is aborted, and the
        requests that never arrived are accounted for too (as `sim.engine.engine` does)."""
        self._abort_unfinished(reason)
        rows = self.prefill.rows
        for spec in self.specs[self._num_arrived :]:
            request = Request.new(
                spec.request_id, spec.arrival_s, spec.prompt_content(), 1, spec.priority
            )
            request.finish(RequestState.ABORTED, f"never arrived: {reason}", self.env.now)
            rows.arrived(spec.request_id)
            rows.terminal(request)

    def _deadlock(self) -> None:
        """Every process sleeps but requests remain: the pools wait on each other.

        Example (one decode replica of 28 blocks of 4 tokens): two handed-off requests hold
        27 blocks for their prompts behind a preempted request that needs 11 at the head of
        the waiting queue; the prefill replica keeps blocks for prompts the decode replica
        cannot allocate, so its own queue cannot move either. vLLM 0.11.0 orders its queues
        the same way and would hang; kvsim records `no_progress` on each stuck decode
        replica and aborts what is left.
        """
        if not any(self._unfinished(pool) for pool in (self.prefill, self.decode)):
            return
        num_kept = sum(len(self.hooks(r).delayed_free) for r in self.prefill.replicas)
        for replica in self.decode.replicas:
            if not replica.scheduler.has_unfinished():
                continue
            diagnosis = diagnose(replica.scheduler, replica.manager, Stall.STALLED)
            message = (
                f"no progress (P/D deadlock): decode replica {replica.index} cannot admit "
                f"what the prefill pool handed off, while the prefill pool keeps the blocks of "
                f"{num_kept} prompts not yet read. {diagnosis.message}"
            )
            replica.manager.record_no_progress(
                NoProgress(
                    diagnosis.head_request_id,
                    diagnosis.needed_blocks,
                    diagnosis.free_blocks,
                    message,
                )
            )
        self._abort_unfinished("deadlock: the prefill and decode pools wait on each other")

    # ------------------------------------------------------------------ run
    def start(self) -> None:
        """Register the processes (`run` does; a test may then step `env` itself)."""
        self.env.process(self._arrivals())
        for pool in (self.prefill, self.decode):
            hooks = PoolHooks(self, pool)
            for replica in pool.replicas:
                # Every step yields its timeout (no `Clock.advance_to` shortcut), as this
                # engine always has: the tables of a disaggregated run stay as they were.
                loop = ReplicaStepLoop(
                    replica,
                    hooks,
                    self.env,
                    pool.step_time,
                    pool.config.max_sim_time_s,
                    advance_clock=False,
                )
                self.env.process(loop.run())

    def run(self) -> DisaggRecords:
        self.start()
        self.env.run()
        if self._stop is not None:
            self._abort_all(self._stop)
        else:
            self._deadlock()
        for pool in (self.prefill, self.decode):
            for replica in pool.replicas:
                pool.records.violations.extend(replica.manager.violations)
            pool.records.end_s = self.env.now
            pool.records.stopped_early = self._stop
            pool.rows.close()
            pool.records.steps.close()
        self.records.transfers = list(self.ledger.transfers)
        return self.records


def _wake(replica: Replica) -> None:
    if replica.wakeup is not None and not replica.wakeup.triggered:
        replica.wakeup.succeed()


@dataclass(slots=True)
class PoolHooks:
    """`sim.engine.step_loop.StepHooks` for the replicas of one pool of a `DisaggEngine`.

    Requests that end are written to the pool's rows; a prefill that finishes is handed off
    to the decode pool; an idle prefill replica wakes the decode replicas that wait on it;
    the run stops only at the simulated-time limit (no stop policy, no fatal-error stop).
    """

    engine: DisaggEngine
    pool: DisaggPool

    def stopped(self) -> bool:
        return self.engine._stop is not None

    def stop(self, reason: str) -> None:
        self.engine._stop_at_time_limit(reason)

    def begin_step(self, replica: Replica) -> None:
        self.engine._step = replica.num_steps

    def ended(self, replica: Replica, requests: Sequence[Request]) -> None:
        for request in requests:
            self.pool.rows.terminal(request)

    def stepped(self, replica: Replica, finished: Sequence[Request]) -> None:
        if self.pool is self.engine.prefill:
            for request in finished:
                self.engine._handoff(request)

    def record_step(
        self, replica: Replica, plan: StepPlan, shape: BatchShape, start_s: float, duration_s: float
    ) -> None:
        record_step(self.pool, replica, plan, shape, start_s, duration_s)

    def stop_in(self, replica: Replica, plan: StepPlan) -> str | None:
        return None

    def fatal_stop(self, replica: Replica, plan: StepPlan) -> str | None:
        return None

    def may_get_work(self, replica: Replica) -> bool:
        return self.engine._may_get_work(self.pool, replica)

    def idle(self, replica: Replica) -> simpy.Event:
        return self.engine._idle(self.pool, replica)

    def retire(self, replica: Replica) -> None:
        self.engine._prefill_idle(self.pool)

    def stall(self, replica: Replica) -> None:
        self.engine._stall(self.pool, replica)

    def livelock(self, replica: Replica, num_empty_steps: int) -> None:
        self.engine._livelock(self.pool, replica, num_empty_steps)
