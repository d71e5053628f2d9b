"""The KV-connector seam (`sim.kv_connector.base` / `hooks`) in the V1 scheduler and engine.

Two test connectors: one that is switched on but never holds anything (the seam's code paths
run and must change nothing), and one that holds a fixed prefix for every request and loads it
asynchronously in a fixed time (the request waits, the replica sleeps until the load is done).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

from sim.engine.engine import Engine, EngineConfig, RunRecords
from sim.kv.config import Design, KVCacheConfig
from sim.kv.types import Segment
from sim.kv_connector.base import (
    FREE_NOW,
    NO_MATCH,
    NOTHING_FINISHED,
    ExternalMatch,
    FinishOutcome,
    TransferReport,
)
from sim.latency.linear import LinearStepTime
from sim.output.results import requests_frame, steps_frame
from sim.scheduler import SchedulerConfig
from sim.scheduler.request import Request, StepPlan
from sim.workload.request import RequestSpec

STEP = LinearStepTime(fixed_s=0.005, per_prefill_token_s=0.0001, per_decode_seq_s=0.0001)


class RecordingConnector:
    """Switched on, holds nothing, delays nothing: records each hook call."""

    needs_every_step = False

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []

    def get_num_new_matched_tokens(self, request: Request, num_local: int) -> ExternalMatch:
        self.calls.append(("match", request.request_id))
        return NO_MATCH

    def update_state_after_alloc(self, request, block_ids, num_local, num_external, now_s):
        self.calls.append(("alloc", request.request_id))

    def build_connector_meta(self, plan: StepPlan, now_s: float) -> None:
        return None

    def wait_for_save(self, end_s: float) -> None:
        return None

    def request_finished(self, request: Request, block_ids: list[int]) -> FinishOutcome:
        self.calls.append(("finished", request.request_id))
        return FREE_NOW

    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        return NOTHING_FINISHED

    def next_completion_s(self) -> float | None:
        return None


class FixedLoadConnector:
    """Holds the first `num_tokens` tokens of every prompt; loading them takes `load_s`;
    a finished request's blocks are kept `store_s` longer (as if its KV were being saved)."""

    needs_every_step = False

    def __init__(self, num_tokens: int, load_s: float, store_s: float = 0.0) -> None:
        self.num_tokens = num_tokens
        self.load_s = load_s
        self.store_s = store_s
        self.loads: dict[int, float] = {}  # request id -> completion time
        self.stores: dict[int, float] = {}

    def get_num_new_matched_tokens(self, request: Request, num_local: int) -> ExternalMatch:
        if self.num_tokens <= num_local:
            return NO_MATCH
        return ExternalMatch(self.num_tokens - num_local, load_async=True)

    def update_state_after_alloc(self, request, block_ids, num_local, num_external, now_s):
        if num_external:
            self.loads[request.request_id] = now_s + self.load_s

    def build_connector_meta(self, plan: StepPlan, now_s: float) -> None:
        return None

    def wait_for_save(self, end_s: float) -> None:
        return None

    def request_finished(self, request: Request, block_ids: list[int]) -> FinishOutcome:
        if self.store_s <= 0:
            return FREE_NOW
        assert request.finish_s is None  # called before the request is marked finished
        self.stores[request.request_id] = -1.0  # its time is set at the next poll
        return FinishOutcome(delay_free_blocks=True)

    def get_finished(self, finished_request_ids: set[int], now_s: float) -> TransferReport:
        for request_id in finished_request_ids:
            if self.stores.get(request_id) == -1.0:
                self.stores[request_id] = now_s + self.store_s
        recv = frozenset(r for r, t in self.loads.items() if t <= now_s)
        send = frozenset(r for r, t in self.stores.items() if 0 <= t <= now_s)
        for r in recv:
            del self.loads[r]
        for r in send:
            del self.stores[r]
        return TransferReport(finished_sending=send, finished_recving=recv)

    def next_completion_s(self) -> float | None:
        times = [*self.loads.values(), *(t if t >= 0 else 0.0 for t in self.stores.values())]
        return min(times) if times else None


class _Build:
    def __init__(self, connector) -> None:
        self.connector = connector
        self.built: list[int] = []

    def build(self, replica_index: int, block_size: int):
        self.built.append(replica_index)
        return self.connector


def _tables(records: RunRecords) -> SimpleNamespace:
    """The run's tables as rows: requests as named tuples (in id order), steps as tuples."""
    return SimpleNamespace(
        requests=list(requests_frame(records).itertuples(index=False)),
        steps=list(steps_frame(records).itertuples(index=False, name=None)),
        violations=records.violations,
        end_s=records.end_s,
    )


def _run(specs, connector=None, num_gpu_blocks=64, caching=True) -> tuple[Engine, SimpleNamespace]:
    config = EngineConfig(
        design=Design.V1_ENGINE,
        kv=KVCacheConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=16,
            enable_prefix_caching=caching,
            max_model_len=512,
            vllm_pin="0.11.0",
        ),
        scheduler=SchedulerConfig(max_model_len=512, enable_chunked_prefill=True),
        kv_connector=_Build(connector) if connector is not None else None,
    )
    engine = Engine(config, specs, STEP)
    return engine, _tables(engine.run())


def _shared_prefix_specs(n: int) -> list[RequestSpec]:
    return [
        RequestSpec(i, 0.01 * i, 100 + 7 * i, 5 + i % 4, prefix=(Segment(1, 64),)) for i in range(n)
    ]


def _request_rows(records: RunRecords) -> list[tuple]:
    return [
        (r.request_id, r.state, r.first_token_s, r.finish_s, r.num_prefix_hit_tokens)
        for r in records.requests
    ]


def test_a_connector_that_holds_nothing_changes_no_step_and_no_request():
    specs = _shared_prefix_specs(12)
    _, plain = _run(specs, num_gpu_blocks=20)
    connector = RecordingConnector()
    _, seamed = _run(specs, connector, num_gpu_blocks=20)
    assert seamed.steps == plain.steps
    assert _request_rows(seamed) == _request_rows(plain)
    assert plain.steps and not plain.violations and not seamed.violations
    # The hooks ran: a lookup and an allocation per admission, one finish per request.
    kinds = [kind for kind, _ in connector.calls]
    assert kinds.count("finished") == 12
    assert kinds.count("alloc") >= 12 and kinds.count("match") >= kinds.count("alloc")


def test_an_async_load_delays_the_first_token_by_the_load_time():
    """One 64-token prompt; the connector holds its first 48 tokens (3 blocks of 16); the
    load takes 0.5 s. At t=0 the scheduler allocates the 3 blocks and parks the request
    (nothing runs); the replica sleeps until 0.5 s, when the request resumes with 48 computed
    tokens and prefills the other 16: 0.005 + 16 * 0.0001 = 0.0066 s. First token at 0.5066 s
    (without a connector: 0.005 + 64 * 0.0001 = 0.0114 s)."""
    spec = [RequestSpec(0, 0.0, 64, 1)]
    _, plain = _run(spec)
    _, loaded = _run(spec, FixedLoadConnector(num_tokens=48, load_s=0.5))
    assert math.isclose(plain.requests[0].first_token_s, 0.0114)
    request = loaded.requests[0]
    assert request.state == "finished"
    assert math.isclose(request.first_token_s, 0.5066)
    assert request.num_prefix_hit_tokens == 48
    assert not loaded.violations
    # The only step that ran prefilled the 16 tokens the connector did not hold.
    assert [(row[4], row[5]) for row in loaded.steps] == [(1, 16)]


def test_a_replica_waiting_only_for_a_load_does_not_stall():
    """Two requests arrive together, both parked for a 1 s load: no `no_progress` violation,
    both finish after the load."""
    specs = [RequestSpec(0, 0.0, 40, 2), RequestSpec(1, 0.0, 40, 2)]
    _, records = _run(specs, FixedLoadConnector(num_tokens=32, load_s=1.0))
    assert not records.violations
    assert [r.state for r in records.requests] == ["finished", "finished"]
    assert all(r.first_token_s > 1.0 for r in records.requests)


def test_delayed_free_keeps_blocks_until_the_store_completes():
    """A 64-token prompt, 1 output token: the step ends at 0.0114 s; the connector keeps its
    blocks 0.25 s longer; the replica waits for that and frees them, so the run ends at
    0.2614 s with every block back in the pool."""
    engine, records = _run([RequestSpec(0, 0.0, 64, 1)], FixedLoadConnector(0, 0.0, store_s=0.25))
    assert math.isclose(records.requests[0].finish_s, 0.0114)
    assert math.isclose(records.end_s, 0.2614)
    manager = engine.replicas[0].manager
    assert manager.num_free_blocks == 64 - 1  # block 0 is the null block
    assert not records.violations


def test_no_connector_builds_no_hooks_and_each_replica_gets_its_own():
    specs = _shared_prefix_specs(2)
    engine, _ = _run(specs)
    assert engine.replicas[0].connector_hooks is None
    build = _Build(RecordingConnector())
    config = EngineConfig(
        design=Design.V1_ENGINE,
        kv=KVCacheConfig(num_gpu_blocks=64, enable_prefix_caching=True, max_model_len=512),
        scheduler=SchedulerConfig(max_model_len=512),
        num_replicas=3,
        kv_connector=build,
    )
    Engine(config, specs, STEP)
    assert build.built == [0, 1, 2]
