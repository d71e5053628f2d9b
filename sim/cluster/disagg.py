"""Prefill/decode disaggregation in simulated time: two pools of V1 replicas and a KV link.

One SimPy environment drives both pools (each replica has its own audited manager, scheduler,
step-time model and step loop) and a process per KV transfer. A request's path, as vLLM
0.11.0's P/D proxy and NIXL connector run it (`sim.cluster.pd_connector` cites the lines)::

    arrival ──► prefill replica (router of the prefill pool), max_tokens = 1
        prefill step(s) ─► its one token; blocks held (delayed free)
    ──► decode replica (router of the decode pool): allocate the prompt's blocks (FIFO)
        transfer: link latency + prompt blocks x block bytes / (link rate x streams)
        done ─► prefill blocks freed; decode computes the last prompt token, samples the
        first output token (the client's TTFT), then decodes to max_tokens

A replica with nothing to run sleeps on an event that an arrival, a hand-off or a finished
transfer triggers. A replica that can never make progress again (nothing running, nothing
admissible, nothing that could wake it) aborts what it holds with the reason, so every request
ends in exactly one terminal state on each side it reached.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import simpy

from sim.audit.liveness import NoProgress, Stall, diagnose
from sim.cluster.links import LinkSpec, kv_transfer_bytes, transfer_time_s
from sim.cluster.pd_connector import DecodeAdmission, HeldUntilSent
from sim.engine import EngineConfig, Replica, RunRecords, batch_shape
from sim.latency.batch import BatchShape
from sim.routing import ReplicaView, RoutingPolicy, make_policy
from sim.scheduler import Request, RequestState, StepPlan, V1Scheduler
from sim.workload.request import RequestSpec


@dataclass(frozen=True, slots=True)
class Transfer:
    """One request's KV transfer (times in simulated seconds)."""

    request_id: int
    prefill_replica: int
    decode_replica: int
    num_blocks: int
    num_bytes: int
    start_s: float
    end_s: float


@dataclass(slots=True)
class DisaggRecords:
    """Plain records of a disaggregated run: one `RunRecords` per pool and the transfers."""

    prefill: RunRecords
    decode: RunRecords
    transfers: list[Transfer] = field(default_factory=list)
    #: request id -> the time its prefill finished (the hand-off to the decode pool).
    handoff_s: dict[int, float] = field(default_factory=dict)


@dataclass(slots=True)
class _Pool:
    name: str
    config: EngineConfig
    step_time: object
    replicas: list[Replica]
    records: RunRecords
    policy: RoutingPolicy
    views: list[ReplicaView]


class DisaggEngine:
    """Replays `specs` through a prefill pool and a decode pool joined by `link`."""

    def __init__(
        self,
        prefill: tuple[EngineConfig, object],
        decode: tuple[EngineConfig, object],
        specs: Iterable[RequestSpec],
        link: LinkSpec,
        block_bytes: int,
        num_streams: int = 1,
    ) -> None:
        for name, (config, _) in (("prefill", prefill), ("decode", decode)):
            if config.design.api != "v1":
                raise ValueError(f"{name} pool: disaggregation models the V1 engine only")
        self.env = simpy.Environment()
        self.specs = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
        self.link = link
        self.block_bytes = block_bytes
        self.num_streams = num_streams
        self._step = 0
        self.prefill = self._pool("prefill", *prefill)
        self.decode = self._pool("decode", *decode)
        self.records = DisaggRecords(self.prefill.records, self.decode.records)
        # Prefill replicas delay the free of a finished prompt until its KV is sent.
        self.held: list[HeldUntilSent] = []
        for replica in self.prefill.replicas:
            scheduler = replica.scheduler
            assert isinstance(scheduler, V1Scheduler)
            hold = HeldUntilSent(scheduler.kv_cache_manager)
            # The scheduler's `free` of a finished request goes through the hold.
            scheduler.kv_cache_manager = hold  # type: ignore[assignment]
            self.held.append(hold)
        block_size = self.decode.config.kv.block_size
        self.admission = [
            DecodeAdmission(replica.manager, block_size) for replica in self.decode.replicas
        ]
        self._arrivals_done = False
        self._spec_of = {spec.request_id: spec for spec in self.specs}
        #: request id -> the prefill replica holding its blocks until the transfer is done.
        self._prefill_replica_of: dict[int, int] = {}
        self._num_transfers_to = [0] * len(self.decode.replicas)

    def _pool(self, name: str, config: EngineConfig, step_time) -> _Pool:
        window = getattr(step_time, "decode_window", None)
        replicas = [Replica(i, config, self._clock, window) for i in range(config.num_replicas)]
        return _Pool(
            name,
            config,
            step_time,
            replicas,
            RunRecords(num_gpu_blocks=config.kv.num_gpu_blocks),
            make_policy(config.router, config.kv.block_size, config.router_load_weight),
            [ReplicaView(r) for r in replicas],
        )

    def _clock(self) -> tuple[float, int]:
        return (self.env.now, self._step)

    # ------------------------------------------------------------------ processes
    def _arrivals(self):
        pool = self.prefill
        max_model_len = pool.config.scheduler.max_model_len
        for spec in self.specs:
            delay = spec.arrival_s - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            # The proxy asks the prefill engine for one token (max_tokens=1).
            request = Request.new(
                spec.request_id, spec.arrival_s, spec.prompt_content(), 1, spec.priority
            )
            pool.records.requests.append(request)
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
        pool.records.requests.append(request)
        replica = pool.replicas[pool.policy.choose(request, pool.views)]
        request.replica = replica.index
        replica.outstanding += 1
        self.admission[replica.index].add(request)
        self.records.handoff_s[request.request_id] = self.env.now
        self._prefill_replica_of[request.request_id] = done.replica
        _wake(replica)

    def _transfer(self, request: Request, prefill_index: int, decode_index: int):
        num_blocks = -(-request.prompt_tokens // self.decode.config.kv.block_size)
        num_bytes = kv_transfer_bytes(
            request.prompt_tokens, self.decode.config.kv.block_size, self.block_bytes
        )
        start_s = self.env.now
        yield self.env.timeout(transfer_time_s(num_bytes, self.link, self.num_streams))
        self.records.transfers.append(
            Transfer(
                request.request_id,
                prefill_index,
                decode_index,
                num_blocks,
                num_bytes,
                start_s,
                self.env.now,
            )
        )
        # finished_sending on the prefill side: its blocks are freed now.
        self.held[prefill_index].release(request.request_id)
        _wake(self.prefill.replicas[prefill_index])
        # finished_recving on the decode side: the request joins the scheduler's queue.
        decode = self.decode.replicas[decode_index]
        self.admission[decode_index].kv_received(request)
        decode.scheduler.add_request(request)
        self._num_transfers_to[decode_index] -= 1
        _wake(decode)

    def _replica_loop(self, pool: _Pool, replica: Replica):
        env = self.env
        scheduler = replica.scheduler
        predict_s = pool.step_time.predict_s  # type: ignore[attr-defined]
        is_decode = pool is self.decode
        admission = self.admission[replica.index] if is_decode else None
        empty_streak = 0
        while True:
            if admission is not None:
                self._admit(admission, replica)
            if not scheduler.has_unfinished():
                if self._may_get_work(pool, replica):
                    replica.wakeup = env.event()
                    yield replica.wakeup
                    continue
                if admission is not None and admission.pending:
                    self._stall(pool, replica, list(admission.pending), admission)
                self._wake_decode_pool(pool)
                return
            self._step = replica.num_steps
            plan = scheduler.schedule(env.now)
            ended = len(plan.ignored) + len(plan.failed)
            replica.outstanding -= ended
            if plan.is_empty:
                if (ended or plan.num_preempted) and empty_streak <= 8 + 2 * len(scheduler.running):
                    empty_streak += 1
                    self._record_step(pool, replica, plan, batch_shape(plan), env.now, 0.0)
                    replica.num_steps += 1
                    continue
                if self._may_get_work(pool, replica):
                    replica.wakeup = env.event()
                    yield replica.wakeup
                    continue
                pending = list(admission.pending) if admission is not None else []
                self._stall(pool, replica, list(scheduler.unfinished()) + pending, admission)
                self._wake_decode_pool(pool)
                return
            empty_streak = 0
            shape = batch_shape(plan)
            duration_s = predict_s(shape)
            start_s = env.now
            yield env.timeout(duration_s)
            finished = scheduler.update(plan, env.now)
            replica.outstanding -= len(finished)
            self._record_step(pool, replica, plan, shape, start_s, duration_s)
            replica.num_steps += 1
            if not is_decode:
                for request in finished:
                    self._handoff(request)

    def _admit(self, admission: DecodeAdmission, replica: Replica) -> None:
        admitted, failed = admission.admit()
        for request, error in failed:
            request.finish(RequestState.FAILED, error.violation.message, self.env.now)
            replica.outstanding -= 1
            # Its prefill blocks are still held: the sender frees them (NIXL's abort path).
            self._release_prefill_of(request)
        for request in admitted:
            prefill_index = self._prefill_replica_of[request.request_id]
            self._num_transfers_to[replica.index] += 1
            self.env.process(self._transfer(request, prefill_index, replica.index))

    def _wake_decode_pool(self, pool: _Pool) -> None:
        """A prefill replica is done for good: idle decode replicas re-check for a stall."""
        if pool is self.prefill:
            for replica in self.decode.replicas:
                _wake(replica)

    def _release_prefill_of(self, request: Request) -> None:
        prefill_index = self._prefill_replica_of[request.request_id]
        self.held[prefill_index].release(request.request_id)
        _wake(self.prefill.replicas[prefill_index])

    def _may_get_work(self, pool: _Pool, replica: Replica) -> bool:
        """Whether something still to come could give this replica work or free its blocks."""
        if not self._arrivals_done:
            return True
        if pool is self.prefill:
            # Transfers still to run free its held blocks.
            return self.held[replica.index].num_held_requests > 0
        # A prefill still queued or running may hand off; a transfer to it completes.
        return self._num_transfers_to[replica.index] > 0 or any(
            r.scheduler.has_unfinished() for r in self.prefill.replicas
        )

    def _stall(
        self,
        pool: _Pool,
        replica: Replica,
        requests: list[Request],
        admission: DecodeAdmission | None,
    ) -> None:
        """Abort what a replica that can never progress again holds or waits for; a decode
        request still waiting for blocks releases its prefill blocks (the sender's abort)."""
        pending_set = set(admission.pending) if admission is not None else set()
        replica.manager.record_no_progress(
            diagnose(replica.scheduler, replica.manager, Stall.STALLED)
        )
        reason = (
            f"stalled on the {pool.name} pool: nothing running and no waiting request can be "
            f"admitted ({replica.pool_stats().num_free} free blocks)"
        )
        for request in requests:
            if not request.state.is_terminal:
                request.finish(RequestState.ABORTED, reason, self.env.now)
                if pool is self.decode and request in pending_set:
                    self._release_prefill_of(request)
        if admission is not None:
            admission.pending.clear()

    def _record_step(
        self,
        pool: _Pool,
        replica: Replica,
        plan: StepPlan,
        shape: BatchShape,
        start_s: float,
        duration_s: float,
    ) -> None:
        """A `sim.engine.STEP_COLUMNS` row (V1 replicas: no swapped queue)."""
        stats = replica.pool_stats()
        scheduler = replica.scheduler
        num_prefill_tokens = sum(chunk for _, chunk in shape.prefill_chunks)
        prior_tokens = sum(prior for prior, _ in shape.prefill_chunks)
        num_decode_seqs = shape.num_decode_seqs
        pool.records.steps.append(
            (
                replica.index,
                replica.num_steps,
                start_s,
                duration_s,
                len(shape.prefill_chunks),
                num_prefill_tokens,
                num_decode_seqs,
                num_decode_seqs + num_prefill_tokens,
                shape.decode_context_sum + prior_tokens,
                plan.num_preempted,
                len(scheduler.waiting),
                len(scheduler.running),
                0,
                stats.num_free,
                stats.num_total - stats.num_free,
                stats.num_evictable,
            )
        )

    def _deadlock(self) -> None:
        """Every process sleeps but requests remain: the pools wait on each other.

        Example (one decode replica of 28 blocks): two requests hold 27 blocks for their
        received prompts, behind a preempted one that needs 11 at the head of the waiting
        queue; the prefill replica holds its blocks for three prompts the decode replica
        cannot allocate, so its own queue cannot move either. vLLM 0.11.0 orders its queues
        the same way and would hang; kvsim records `no_progress` on each stuck decode
        replica and aborts what is left.
        """
        stuck = [
            request
            for pool in (self.prefill, self.decode)
            for replica in pool.replicas
            for request in replica.scheduler.unfinished()
            if not request.state.is_terminal
        ]
        stuck += [request for a in self.admission for request in a.pending]
        if not stuck:
            return
        held = ", ".join(
            f"prefill {i}: {h.num_held_requests} requests' blocks"
            for i, h in enumerate(self.held)
            if h.num_held_requests
        )
        for replica, admission in zip(self.decode.replicas, self.admission, strict=True):
            if not replica.scheduler.has_unfinished() and not admission.pending:
                continue
            diagnosis = diagnose(replica.scheduler, replica.manager, Stall.STALLED)
            message = (
                f"no progress (P/D deadlock): decode replica {replica.index} holds "
                f"{_held_blocks(replica)} blocks, {len(admission.pending)} handed-off requests "
                f"wait for blocks, and the prefill pool holds blocks for KV not yet sent "
                f"({held or 'none'}). {diagnosis.message}"
            )
            replica.manager.record_no_progress(
                NoProgress(
                    diagnosis.head_request_id,
                    diagnosis.needed_blocks,
                    diagnosis.free_blocks,
                    message,
                )
            )
        reason = "deadlock: the prefill and decode pools wait on each other"
        for request in stuck:
            request.finish(RequestState.ABORTED, reason, self.env.now)
        for admission in self.admission:
            admission.pending.clear()

    # ------------------------------------------------------------------ run
    def start(self) -> None:
        """Register the processes (`run` does; a test may then step `env` itself)."""
        self.env.process(self._arrivals())
        for pool in (self.prefill, self.decode):
            for replica in pool.replicas:
                self.env.process(self._replica_loop(pool, replica))

    def run(self) -> DisaggRecords:
        self.start()
        self.env.run()
        self._deadlock()
        for pool in (self.prefill, self.decode):
            for replica in pool.replicas:
                pool.records.violations.extend(replica.manager.violations)
            pool.records.end_s = self.env.now
            pool.records.requests.sort(key=lambda r: r.request_id)
        return self.records


def _held_blocks(replica: Replica) -> int:
    stats = replica.pool_stats()
    return stats.num_total - stats.num_free


def _wake(replica: Replica) -> None:
    if replica.wakeup is not None and not replica.wakeup.triggered:
        replica.wakeup.succeed()
