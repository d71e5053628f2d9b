"""The scheduler side of vLLM's V1 KV-connector API, as a typed seam (vLLM 0.11.0).

Models `KVConnectorBase_V1`'s scheduler-side methods
(`vllm/distributed/kv_transfer/kv_connector/v1/base.py:L250-338 @0.11.0`) and the worker-side
report the scheduler consumes (`get_finished` -> `KVConnectorOutput.finished_sending /
finished_recving`, `base.py:L214-230`). kvsim has no worker process: a connector computes when
each transfer completes (bytes / bandwidth + latency, `sim.kv_connector.link`) and reports it
at the first poll at or after that time.

How the V1 scheduler calls it (`vllm/v1/core/sched/scheduler.py @0.11.0`, mirrored in
`sim.scheduler.v1.scheduler` and `sim.kv_connector.hooks`):

1. waiting loop, a request with no computed tokens: after the local prefix lookup,
   `get_num_new_matched_tokens(request, num_local_computed_tokens)` (L386-402). An async match
   schedules no new tokens; `allocate_slots` takes blocks for the external ones (L414-478).
2. `update_state_after_alloc(request, blocks, num_external_tokens)` right after a successful
   `allocate_slots` (L489-494); an async load then parks the request in
   `WAITING_FOR_REMOTE_KVS` at the head of `waiting` (L499-504).
3. such a request is skipped while its load runs; once `finished_recving` names it, its
   computed tokens become its blocks' tokens (`_update_waiting_for_remote_kv`, L1237-1268).
4. `build_connector_meta(scheduler_output)` at the end of `schedule()` (L604-607): the step's
   stores.
5. a finishing request: `request_finished(request, block_ids)` -> (delay_free_blocks, params)
   before its blocks are freed (`_free_request`, L1147-1160); delayed blocks are freed when
   `finished_sending` names it (`_update_from_kv_xfer_finished`, L1270-1296).

Upstream's `(None, False)` ("ask again later") is `ExternalMatch.retry_later()` here; the
connectors kvsim models never return it, but the scheduler honours it (skips the request).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the scheduler imports this module
    from sim.scheduler.request import Request, StepPlan


class MatchStatus(enum.Enum):
    """Whether the connector could tell how many tokens it holds for a request."""

    KNOWN = "known"
    #: Upstream's `None` first element: not yet known; the scheduler skips the request.
    RETRY_LATER = "retry_later"


@dataclass(frozen=True, slots=True)
class ExternalMatch:
    """`get_num_new_matched_tokens`'s answer: tokens loadable beyond the local prefix hit.

    `load_async` True: they arrive between steps; the request waits in
    `WAITING_FOR_REMOTE_KVS` until the transfer completes. Upstream requires it False when
    `num_external_tokens` is 0.
    """

    num_external_tokens: int = 0
    load_async: bool = False
    status: MatchStatus = MatchStatus.KNOWN

    def __post_init__(self) -> None:
        if self.num_external_tokens < 0:
            raise ValueError(f"num_external_tokens must be >= 0, got {self.num_external_tokens}")
        if self.load_async and self.num_external_tokens == 0:
            raise ValueError("load_async needs num_external_tokens > 0 (base.py:L272-274)")

    @classmethod
    def retry_later(cls) -> ExternalMatch:
        return cls(0, False, MatchStatus.RETRY_LATER)


NO_MATCH = ExternalMatch()


@dataclass(frozen=True, slots=True)
class FinishOutcome:
    """`request_finished`'s answer: keep the blocks until `finished_sending` names the
    request (`delay_free_blocks`), and the KV-transfer params for the request's output."""

    delay_free_blocks: bool = False
    kv_transfer_params: dict[str, Any] | None = None


FREE_NOW = FinishOutcome()


@dataclass(frozen=True, slots=True)
class TransferReport:
    """The worker's `get_finished` for one poll: request ids whose transfers completed."""

    #: Stores (saves, sends) done for a finished request: its delayed blocks may be freed.
    finished_sending: frozenset[int] = field(default_factory=frozenset)
    #: Loads (receives) done: the request may be scheduled.
    finished_recving: frozenset[int] = field(default_factory=frozenset)

    @property
    def is_empty(self) -> bool:
        return not self.finished_sending and not self.finished_recving


NOTHING_FINISHED = TransferReport()


class KVConnector(Protocol):
    """A scheduler-side KV connector with a simulated worker side (see module docstring).

    Times are simulated seconds. A connector that must see every scheduled decode in
    `build_connector_meta` sets `needs_every_step`: the runner then turns the decode fast path
    and cohort off (their decodes have no entry in `plan.scheduled`). The offloading connector
    does: a block-filling decode always calls the manager with prefix caching on, but a store
    the CPU tier refused is retried on every later step of its request, quiet ones included,
    and that retry decides whether other requests' stores in the step are tried at all.
    """

    needs_every_step: bool

    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> ExternalMatch: ...

    def update_state_after_alloc(
        self,
        request: Request,
        block_ids: list[int],
        num_local_computed_tokens: int,
        num_external_tokens: int,
        now_s: float,
    ) -> None:
        """After `allocate_slots` succeeded for a waiting request. `block_ids` are the
        request's whole table (local hits first); a load of `num_external_tokens` starts at
        `now_s` (upstream: `start_load_kv` at the start of this step's forward pass)."""
        ...

    def build_connector_meta(self, plan: StepPlan, now_s: float) -> None:
        """At the end of `schedule()`, after computed tokens advanced: what this step stores."""
        ...

    def wait_for_save(self, end_s: float) -> None:
        """The step's forward pass ended at `end_s`: its stores start (worker `wait_for_save`)."""
        ...

    def request_finished(self, request: Request, block_ids: list[int]) -> FinishOutcome: ...

    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        """The worker's poll at `now_s`: transfers completed by then. `finished_request_ids`
        are the requests that finished since the previous poll."""
        ...

    def next_completion_s(self) -> float | None:
        """The earliest time a pending transfer completes (None: nothing in flight), so a
        replica with nothing else to do can sleep until then instead of stalling."""
        ...


class PassiveConnector:
    """Every hook a no-op: a connector overrides only the hooks it acts on (the P/D sides in
    `sim.cluster.pd_connector`). Not itself "no connector": the scheduler's hooks stay on for
    a subclass (`ConnectorHooks.enabled` tests for `NoConnector`)."""

    needs_every_step = False

    def get_num_new_matched_tokens(
        self, request: Request, num_local_computed_tokens: int
    ) -> ExternalMatch:
        return NO_MATCH

    def update_state_after_alloc(
        self,
        request: Request,
        block_ids: list[int],
        num_local_computed_tokens: int,
        num_external_tokens: int,
        now_s: float,
    ) -> None:
        return None

    def build_connector_meta(self, plan: StepPlan, now_s: float) -> None:
        return None

    def wait_for_save(self, end_s: float) -> None:
        return None

    def request_finished(self, request: Request, block_ids: list[int]) -> FinishOutcome:
        return FREE_NOW

    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        return NOTHING_FINISHED

    def next_completion_s(self) -> float | None:
        return None


class NoConnector(PassiveConnector):
    """No KV connector (vLLM's `self.connector = None`): every hook is a no-op, so a run
    without one is exactly the run without the seam."""


class KVConnectorConfig(Protocol):
    """What the engine config names: builds one connector per replica (each replica has its
    own worker, transfer links and, for offloading, its own CPU tier)."""

    def build(self, replica_index: int, block_size: int) -> KVConnector: ...
