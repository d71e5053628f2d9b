"""One pool of a disaggregated run: its replicas, router and records, and a step's row.

`sim.engine.disagg.DisaggEngine` holds two of these (prefill and decode). Each pool records
into its own in-memory `RunRecords` (the `requests` and `steps` tables of `sim.output.records`, with
the run statistics listening), so a disaggregated run writes the same tables per pool as a
co-located run writes for its one pool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sim.engine.engine import EngineConfig, Replica, RunRecords
from sim.latency.batch import BatchShape
from sim.latency.protocol import StepTimeModel, decode_window_of
from sim.output.records import REQUEST_DTYPE, STEP_DTYPE, ColumnarTable, RequestRows, memory_sinks
from sim.output.stats import RunStats
from sim.routing import ReplicaView, RoutingPolicy, make_policy
from sim.scheduler import StepPlan


@dataclass(slots=True)
class DisaggPool:
    """One pool of a disaggregated run (prefill or decode): its replicas, router and records."""

    name: str
    config: EngineConfig
    step_time: StepTimeModel
    replicas: list[Replica]
    records: RunRecords
    #: The `requests` table's row writer: rows in `request_id` order (`sim.output.records`).
    rows: RequestRows
    policy: RoutingPolicy
    views: list[ReplicaView]


def make_pool(
    name: str,
    config: EngineConfig,
    step_time: StepTimeModel,
    ids_ascending: bool,
    clock: Callable[[], tuple[float, int]],
) -> DisaggPool:
    """The pool's replicas (each on `clock`), its in-memory records and its router."""
    window = decode_window_of(step_time)
    replicas = [Replica(i, config, clock, window) for i in range(config.num_replicas)]
    sinks = memory_sinks()
    num_gpu_blocks = config.kv.num_gpu_blocks
    stats = RunStats(num_gpu_blocks, spill_to_file=sinks.spill_to_file)
    requests = ColumnarTable(REQUEST_DTYPE, sinks.requests)
    steps = ColumnarTable(STEP_DTYPE, sinks.steps)
    requests.listeners.append(stats.on_requests)
    steps.listeners.append(stats.on_steps)
    return DisaggPool(
        name,
        config,
        step_time,
        replicas,
        RunRecords(requests, steps, stats, num_gpu_blocks=num_gpu_blocks),
        RequestRows(requests, ids_ascending),
        make_policy(config.router, config.kv.block_size, config.router_load_weight),
        [ReplicaView(r) for r in replicas],
    )


def record_step(
    pool: DisaggPool,
    replica: Replica,
    plan: StepPlan,
    shape: BatchShape,
    start_s: float,
    duration_s: float,
) -> None:
    """A `sim.engine.engine.STEP_COLUMNS` row (V1 replicas: no swapped queue)."""
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
