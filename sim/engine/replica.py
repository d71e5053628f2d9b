"""The parts the engine is built from: its clock, its configuration and records, one replica
(scheduler + audited block manager + its load figures), and the small conversions between a
workload's specs, requests and a step's batch shape. `sim.engine.engine` runs them in simulated time.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, Protocol, runtime_checkable

import simpy

from sim.audit import AuditedV0Manager, AuditedV1Manager, AuditLevel, ViolationPolicy
from sim.audit.violations import Violation
from sim.kv.config import Design, KVCacheConfig, make_manager
from sim.kv.protocol import PoolStats
from sim.kv_connector.base import KVConnectorConfig
from sim.kv_connector.hooks import ConnectorHooks
from sim.kv_events import KVEventStream
from sim.latency.batch import BatchShape
from sim.output.records import (
    STEP_COLUMNS as STEP_COLUMNS,  # re-exported: the steps table's columns
)
from sim.output.records import (
    ColumnarTable,
)
from sim.output.stats import RunStats
from sim.routing import Router
from sim.scheduler import Request, SchedulerConfig, StepPlan, V0Scheduler, V1Scheduler
from sim.scheduler.fast.v1 import with_decode_shortcuts
from sim.scheduler.v1.async_scheduler import make_v1_scheduler
from sim.workload.request import RequestSpec

#: A SimPy process: a generator of the events it waits for (an event, or a condition of two).
SimProcess = Generator[simpy.Event, Any, None]


class Clock(simpy.Environment):
    """SimPy's environment, plus a clock that the running process may move forward itself.

    SimPy moves `now` only by popping the next event. A replica whose step ends at `t`
    strictly before the next scheduled event (`peek()`) would yield a timeout that is then the
    first event, pops at `t` and resumes that same replica, with no other process run in
    between; `advance_to(t)` gives the same `now` (the same float: `now + dt`, as
    `Environment.schedule` computes it) without the event. At a tie (`t == peek()`) the
    replica must yield: the event already scheduled at `t` runs first.

    Example: steps of 10 ms from 0.0 with the next arrival at 0.025: steps end at 0.01 and
    0.02 by `advance_to`; the step ending at 0.03 yields, and the arrival runs at 0.025 first.
    """

    def advance_to(self, time_s: float) -> None:
        if not self.now <= time_s < self.peek():
            raise ValueError(
                f"cannot advance the clock to {time_s}: now {self.now}, next event {self.peek()}"
            )
        self._now = time_s


@dataclass(frozen=True, slots=True)
class EngineConfig:
    design: Design
    kv: KVCacheConfig
    scheduler: SchedulerConfig
    num_replicas: int = 1
    router: Router = Router.ROUND_ROBIN
    #: The prefix-cache-aware router's load term (blocks per outstanding request).
    router_load_weight: float = 1.0
    #: How late KV events reach the router's cache index (`sim.routing.cache_index`).
    router_staleness_s: float = 0.0
    #: Record every replica's KV events for the `kv_events` table (`sim.kv_events`).
    kv_events: bool = False
    violation_policy: ViolationPolicy = ViolationPolicy.RECORD
    audit_level: AuditLevel = AuditLevel.CHEAP
    #: Simulated-time limit; requests unfinished by then are aborted. None: run to completion.
    max_sim_time_s: float | None = None
    #: Builds the block manager instead of kvsim's model, e.g. vLLM's real code
    #: (`sim.vllm_real`): called as `factory(design, kv_config)`.
    manager_factory: Callable[[Design, KVCacheConfig], object] | None = None
    #: A V1 KV connector per replica (`sim.kv_connector`), e.g. CPU offloading; None: none.
    kv_connector: KVConnectorConfig | None = None
    #: Findings of the startup checks (`sim.scenario.resolve`), recorded first in the run's
    #: violations: a latent stall is a finding even when no request of the workload meets it.
    startup_violations: tuple[Violation, ...] = ()
    #: API server processes and the stream interval (`sim.engine.frontend`; only a run with
    #: an API server reads them).
    api_server_count: int = 1
    stream_interval: int = 1


@dataclass(slots=True)
class RunRecords:
    """The records of one run: the `requests` and `steps` tables (columnar, in their sinks),
    the summary statistics gathered from them, and the violations; `sim.output.results` turns them
    into DataFrames and a summary."""

    requests: ColumnarTable
    steps: ColumnarTable
    stats: RunStats
    violations: list[Violation] = field(default_factory=list)
    fatal_error: str | None = None
    stopped_early: str | None = None
    end_s: float = 0.0
    num_gpu_blocks: int = 0
    #: Per replica, the recorder of its KV events (None: a replica that emits none); None
    #: unless `EngineConfig.kv_events`.
    kv_events: list[KVEventStream | None] | None = None


class Replica:
    """One engine instance: an audited manager and a scheduler."""

    def __init__(
        self,
        index: int,
        config: EngineConfig,
        clock: Callable[[], tuple[float, int]],
        decode_window: int | None = None,
    ) -> None:
        self.index = index
        factory = config.manager_factory or make_manager
        manager: Any = factory(config.design, config.kv)
        kwargs: dict[str, Any] = dict(
            policy=config.violation_policy, level=config.audit_level, clock=clock
        )
        if config.design.api == "v1":
            self.manager: AuditedV0Manager | AuditedV1Manager = AuditedV1Manager(manager, **kwargs)
            connector = (
                config.kv_connector.build(index, config.kv.block_size)
                if config.kv_connector is not None
                else None
            )
            self.scheduler: V0Scheduler | V1Scheduler = with_decode_shortcuts(
                make_v1_scheduler(config.scheduler, self.manager, connector)
            )
        else:
            self.manager = AuditedV0Manager(manager, **kwargs)
            self.scheduler = V0Scheduler(config.scheduler, self.manager)
        if config.scheduler.decode_cohort:
            # The cohort sums decode contexts capped at the step-time model's attention window.
            self.scheduler.use_decode_cohort(decode_window)
        self.num_steps = 0
        self.outstanding = 0
        self.wakeup: simpy.Event | None = None
        #: The scheduler's KV-connector side when a connector is configured, else None.
        self.connector_hooks: ConnectorHooks | None = None
        if isinstance(self.scheduler, V1Scheduler) and self.scheduler.connector_hooks.enabled:
            self.connector_hooks = self.scheduler.connector_hooks

    def pool_stats(self) -> PoolStats:
        """The replica's block pool counts (the engine reads them after every step)."""
        return self.manager.pool_stats()

    def next_kv_transfer_s(self) -> float | None:
        """When the next KV transfer in flight completes (None: none, or no connector)."""
        hooks = self.connector_hooks
        return None if hooks is None else hooks.next_completion_s()


@runtime_checkable
class ArrivalOrderedSpecs(Protocol):
    """A spec source that may say its specs already come by (arrival, id) with ids
    ascending (`sim.workload.synthetic.LazySpecs`), and knows how many it holds."""

    in_arrival_order: bool

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[RequestSpec]: ...


def is_lazy_in_arrival_order(specs: Iterable[RequestSpec]) -> bool:
    """Whether `specs` is consumed as it is, one spec at a time (`in_arrival_order`)."""
    return isinstance(specs, ArrivalOrderedSpecs) and specs.in_arrival_order


def in_arrival_order(specs: Iterable[RequestSpec]) -> tuple[Iterator[RequestSpec], int, bool]:
    """The specs by (arrival, id), their number, and whether their ids then ascend.

    A source that says it is `in_arrival_order` (a lazy synthetic workload,
    `sim.workload.synthetic.LazySpecs`) with ids ascending is consumed as it is, one spec at a
    time, so a multi-million-request workload is never all in memory; anything else is sorted.
    """
    if isinstance(specs, ArrivalOrderedSpecs) and specs.in_arrival_order:
        return iter(specs), len(specs), True
    ordered = sorted(specs, key=lambda s: (s.arrival_s, s.request_id))
    ascending = all(a.request_id < b.request_id for a, b in pairwise(ordered))
    return iter(ordered), len(ordered), ascending


def request_of(spec: RequestSpec, arrival_s: float | None = None) -> Request:
    """The request of `spec`, arriving at `arrival_s` (default: the spec's own arrival)."""
    arrival_s = spec.arrival_s if arrival_s is None else arrival_s
    request = Request.new(
        spec.request_id, arrival_s, spec.prompt_content(), spec.output_tokens, spec.priority
    )
    if spec.session_id is not None:
        request.session_id, request.turn = spec.session_id, spec.turn
    return request


def batch_shape(plan: StepPlan) -> BatchShape:
    works = plan.scheduled
    if not works:  # the common step: the cohort and maybe a few quiet decodes
        return BatchShape(tuple(plan.quiet_contexts), (), plan.bulk)
    decodes = []
    chunks = []
    for work in works:
        if work.is_prefill:
            chunks.append((work.num_context_tokens, work.num_tokens))
        else:
            decodes.append(work.num_context_tokens)
    decodes += plan.quiet_contexts
    return BatchShape(tuple(decodes), tuple(chunks), plan.bulk)
