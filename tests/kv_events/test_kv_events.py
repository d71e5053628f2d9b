"""KV cache events (`sim.kv_events`) and the router index built only from them.

The staleness-0 equivalence below is the one place that reads a replica's pool directly: the
reference router of the tests (`_DirectReadView`), which the event-fed router must equal.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.ci.fuzz_cases import generate_case
from sim.engine.engine import Engine
from sim.engine.run import resolve, run
from sim.kv_events import (
    KV_EVENT_COLUMNS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventStream,
    kv_events_frame,
)
from sim.output.results import build_result, requests_frame, write_result
from sim.routing import CacheIndex, ReplicaView, Router
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario, ScenarioError, load_scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"
MOONCAKE = ROOT / "sim/data/traces/mooncake_fast25/conversation_trace.jsonl"


class _DirectReadView(ReplicaView):
    """The reference: the held blocks read straight from the replica's V1 pool at routing time
    (what the router did before it consumed events). No real router can do this."""

    def holds_block(self, block_hash):
        return block_hash in self._replica.manager.block_pool.cached_block_hash_to_block

    def num_leading_blocks_held(self, block_hashes):
        held = 0
        for block_hash in block_hashes:
            if not self.holds_block(block_hash):
                break
            held += 1
        return held


def _engine(scenario: Scenario) -> Engine:
    resolved = resolve(scenario, ROOT)
    return Engine(resolved.engine, resolved.workload.requests, resolved.step_time)


def _direct_read_requests(scenario: Scenario) -> pd.DataFrame:
    engine = _engine(scenario)
    engine._cache_index = None
    engine._views = [_DirectReadView(r) for r in engine.replicas]
    return requests_frame(engine.run())


def _with(scenario: Scenario, **engine) -> Scenario:
    return apply_overrides(scenario, {f"engine.{k}": v for k, v in engine.items()})


def _inline(
    requests: list[dict], num_replicas: int = 2, num_gpu_blocks: int = 40, max_model_len: int = 256
) -> Scenario:
    return scenario_from_dict(
        {
            "name": "kv-events",
            "model": None,
            "cache": {
                "block_size": 16,
                "num_gpu_blocks": num_gpu_blocks,
                "num_cpu_blocks": 0,
                "enable_prefix_caching": True,
            },
            "scheduler": {"design": "v1-engine", "max_model_len": max_model_len},
            "engine": {"num_replicas": num_replicas, "router": "prefix_cache_aware"},
            "workload": {"kind": "inline", "requests": requests},
            "step_time": {
                "linear": {
                    "fixed_s": 0.005,
                    "per_prefill_token_s": 0.0001,
                    "per_decode_seq_s": 0.0001,
                }
            },
        }
    )


def _mooncake(num_replicas: int, first_n: int, rate_scale: float) -> Scenario:
    return apply_overrides(
        load_scenario(SCENARIOS / "mooncake_prefix_caching.yaml"),
        {
            "workload.path": str(MOONCAKE),
            "workload.first_n": first_n,
            "workload.rate_scale": rate_scale,
            "engine.num_replicas": num_replicas,
            "engine.router": "prefix_cache_aware",
        },
    )


def _assert_event_router_equals_direct_read(scenario: Scenario):
    events = run(_with(scenario, kv_events=True, router_staleness_s=0.0), base_dir=ROOT)
    direct = _direct_read_requests(scenario)
    pd.testing.assert_frame_equal(events.requests, direct)
    assert events.kv_events is not None
    return events


# ------------------------------------------------------------------ staleness 0 == direct read
@pytest.mark.parametrize(
    ("num_replicas", "first_n", "rate_scale"), [(4, 300, 1.0), (3, 150, 4.0), (2, 100, 8.0)]
)
def test_event_fed_router_at_staleness_0_routes_as_the_direct_read(
    num_replicas, first_n, rate_scale
):
    requests = _assert_event_router_equals_direct_read(
        _mooncake(num_replicas, first_n, rate_scale)
    ).requests
    # Not a vacuous comparison: the trace hits the cache and uses every replica.
    assert requests["num_prefix_hit_tokens"].sum() > 0
    assert requests["replica"].nunique() == num_replicas


_shared_prompts = st.lists(
    st.fixed_dictionaries(
        {
            "gap_s": st.sampled_from([0.0, 0.003, 0.02]),
            "prompt_tokens": st.integers(16, 200),
            "output_tokens": st.integers(1, 40),
            "prefix_id": st.integers(0, 3),
            "prefix_share": st.floats(0.3, 1.0),
        }
    ),
    min_size=2,
    max_size=30,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=_shared_prompts, num_replicas=st.integers(2, 4), num_gpu_blocks=st.integers(20, 60))
def test_event_fed_router_equals_direct_read_on_random_shared_prefix_workloads(
    rows, num_replicas, num_gpu_blocks
):
    # Small pools force evictions, so BlockRemoved events (and duplicates) are exercised too.
    arrival_s = 0.0
    requests = []
    for row in rows:
        arrival_s += row["gap_s"]
        requests.append(
            {
                "arrival_s": round(arrival_s, 6),
                "prompt_tokens": row["prompt_tokens"],
                "output_tokens": row["output_tokens"],
                "prefix_id": row["prefix_id"],
                "prefix_tokens": int(row["prompt_tokens"] * row["prefix_share"]),
            }
        )
    _assert_event_router_equals_direct_read(_inline(requests, num_replicas, num_gpu_blocks))


def test_event_fed_router_equals_direct_read_through_evictions():
    # 3 prefixes of 96 tokens cycling through 2 replicas of 14 blocks: blocks are evicted and
    # re-cached all the time, and the router must follow every BlockRemoved.
    requests = [
        {
            "arrival_s": round(0.004 * i, 6),
            "prompt_tokens": 112,
            "output_tokens": 8,
            "prefix_id": i % 3,
            "prefix_tokens": 96,
        }
        for i in range(40)
    ]
    result = _assert_event_router_equals_direct_read(_inline(requests, 2, 14, max_model_len=128))
    kinds = set(result.kv_events["kind"])
    assert kinds == {"BlockStored", "BlockRemoved"}
    assert result.requests["num_prefix_hit_tokens"].sum() > 0


# ------------------------------------------------------------------ the events themselves
def _tier(replica):
    """The replica's CPU offloading tier, or None."""
    hooks = replica.connector_hooks
    return getattr(hooks.connector, "tier", None) if hooks is not None else None


def _replayed(history, medium: str = "GPU") -> Counter:
    """Block hash -> cached copies in `medium`, replaying a replica's events from the start."""
    held: Counter = Counter()
    for timed in history:
        event = timed.event
        if getattr(event, "medium", "GPU") != medium:
            continue
        if isinstance(event, BlockStored):
            held.update(event.block_hashes)
        elif isinstance(event, BlockRemoved):
            held.subtract(event.block_hashes)
        else:
            held.clear()
    return +held


@pytest.mark.parametrize("seed", range(12))
def test_replaying_the_events_gives_the_pools_cache_map(seed):
    # Fuzz cases on the V1 engine (prefix caching on, 2 replicas): at the end of the run, each
    # replica's events add up to exactly the blocks its pool has cached, duplicates counted,
    # and its CPU events (when the case offloads) to the CPU tier's ready blocks.
    case = generate_case("v1-engine", seed)
    case = apply_overrides(
        case,
        {
            "cache.enable_prefix_caching": True,
            "engine.num_replicas": 2,
            "engine.kv_events": True,
            "engine.router": "prefix_cache_aware",
        },
    )
    engine = _engine(case)
    records = engine.run()
    assert records.kv_events is not None
    for replica, stream in zip(engine.replicas, records.kv_events, strict=True):
        pool = replica.manager.block_pool
        if replica.manager.num_kv_cache_groups > 1:
            assert stream is None  # a hybrid replica emits nothing
            continue
        history = stream.events()
        expected = Counter({h: len(ids) for h, ids in pool.cached_block_hash_to_block.items()})
        assert _replayed(history) == expected
        tier = _tier(replica)
        ready = Counter(
            {h: 1 for h, ref_cnt in tier.blocks.items() if ref_cnt >= 0} if tier else {}
        )
        assert _replayed(history, "CPU") == ready
        times = [timed.time_s for timed in history]
        assert times == sorted(times)


def test_a_stored_event_chains_its_blocks_to_the_parent():
    case = _inline(
        [
            {"arrival_s": 0.0, "prompt_tokens": 70, "output_tokens": 3},
        ],
        num_replicas=1,
    )
    result = run(_with(case, kv_events=True))
    table = result.kv_events
    stored = table[table["kind"] == "BlockStored"]
    # 70 prompt + 3 output tokens -> 4 full blocks of 16, cached as they fill: the prompt's 4
    # in the first event (one chunk), so each row's parent is the row before.
    assert list(stored["position"]) == [0, 1, 2, 3]
    assert stored["parent_block_hash"].isna().tolist() == [True, False, False, False]
    assert list(stored["parent_block_hash"].iloc[1:]) == list(stored["block_hash"].iloc[:-1])
    assert set(stored["num_tokens"]) == {16} and set(stored["medium"]) == {"GPU"}
    assert stored["lora_id"].isna().all()


def test_kv_events_table_is_written_only_when_enabled(tmp_path):
    case = _inline([{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 2}], 1)
    off = run(case)
    assert off.kv_events is None
    write_result(off, tmp_path / "off")
    assert not list((tmp_path / "off").glob("kv_events.*"))
    on = run(_with(case, kv_events=True))
    write_result(on, tmp_path / "on")
    back = pd.read_parquet(tmp_path / "on" / "kv_events.parquet")
    assert list(back.columns) == KV_EVENT_COLUMNS
    assert len(back) == len(on.kv_events) == 2  # 40 tokens: 2 full blocks stored
    csv = pd.read_csv(tmp_path / "on" / "kv_events.csv")
    assert list(csv["block_hash"]) == list(back["block_hash"])
    # The other tables do not change when the events are recorded.
    pd.testing.assert_frame_equal(on.requests, off.requests)
    pd.testing.assert_frame_equal(on.steps, off.steps)


def test_the_table_docstring_example():
    now = SimpleNamespace(t=0.5)
    stream = KVEventStream(0, 16, lambda: now.t)
    stream.stored([11, 12], None)
    now.t = 0.9
    stream.removed(12)
    now.t = 1.0
    stream.cleared()
    table = kv_events_frame([stream, None])
    assert list(table.columns) == KV_EVENT_COLUMNS
    assert list(table["event"]) == [0, 0, 1, 2]
    assert list(table["time_s"]) == [0.5, 0.5, 0.9, 1.0]
    assert list(table["kind"]) == ["BlockStored", "BlockStored", "BlockRemoved", "AllBlocksCleared"]
    assert table["block_hash"].tolist() == [11, 12, 12, pd.NA]
    assert table["parent_block_hash"].tolist() == [pd.NA, 11, pd.NA, pd.NA]
    assert table["num_tokens"].tolist() == [16, 16, pd.NA, pd.NA]
    assert table["medium"].iloc[:3].tolist() == ["GPU"] * 3 and pd.isna(table["medium"].iloc[3])
    assert table["lora_id"].isna().all()
    # The recorder gives the same events back in vLLM's format.
    assert [t.event for t in stream.events()] == [
        BlockStored((11, 12), None, 32, 16),
        BlockRemoved((12,)),
        AllBlocksCleared(),
    ]


def test_an_empty_table_has_the_columns():
    table = kv_events_frame([None, KVEventStream(1, 16, lambda: 0.0)])
    assert list(table.columns) == KV_EVENT_COLUMNS and len(table) == 0


def test_v0_designs_refuse_kv_events():
    """The v0 engine emits no events: `engine.kv_events` there would be an empty table, so it
    is refused (sim.scenario.no_effect), not accepted."""
    case = apply_overrides(
        _inline([{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 2}], 1),
        {"scheduler.design": "v0-v2", "engine.kv_events": True},
    )
    with pytest.raises(ScenarioError, match="engine.kv_events: the v0 engine"):
        run(case)


# ------------------------------------------------------------------ the router's index
def test_cache_index_docstring_example_staleness():
    now = SimpleNamespace(t=0.0)
    index = CacheIndex(1, staleness_s=1.0, clock=lambda: now.t)
    now.t = 2.0
    index.feeds[0].stored([101], None)
    index.advance(2.5)
    assert not index.holds(0, 101)
    index.advance(3.0)
    assert index.num_leading_blocks_held(0, [101]) == 1


def test_a_stale_index_applies_events_in_order():
    now = SimpleNamespace(t=0.0)
    index = CacheIndex(1, staleness_s=0.5, clock=lambda: now.t)
    feed = index.feeds[0]
    feed.stored([1, 2], None)
    now.t = 0.25
    feed.removed(2)
    now.t = 0.5
    feed.cleared()
    now.t = 0.75
    feed.stored([3], None)
    index.advance(0.5)  # only t = 0 delivered
    assert index.num_leading_blocks_held(0, [1, 2]) == 2
    index.advance(0.75)  # t = 0.25 too
    assert index.num_leading_blocks_held(0, [1, 2]) == 1
    index.advance(1.0)  # t = 0.5: cleared
    assert index.num_hashes_held(0) == 0
    index.advance(1.25)  # t = 0.75
    assert index.holds(0, 3)


def test_cache_index_keeps_a_hash_while_a_duplicate_survives():
    index = CacheIndex(1)
    feed = index.feeds[0]
    feed.stored([7, 8], None)
    feed.stored([7], None)  # a second block with hash 7
    feed.removed(7)
    assert index.num_leading_blocks_held(0, [7, 8]) == 2
    feed.removed(7)
    assert index.num_leading_blocks_held(0, [7, 8]) == 0
    assert index.num_hashes_held(0) == 1


def test_cache_index_all_blocks_cleared_empties_the_replica():
    index = CacheIndex(1)
    stream = KVEventStream(0, 16, lambda: 0.0, forward=index.feeds[0])
    stream.stored([1, 2], None)
    stream.cleared()
    assert index.num_hashes_held(0) == 0
    assert [type(t.event) for t in stream.events()] == [BlockStored, AllBlocksCleared]


def test_negative_staleness_is_refused():
    with pytest.raises(ValueError, match="staleness_s"):
        CacheIndex(1, staleness_s=-1.0)
    with pytest.raises(ValueError, match="clock"):
        CacheIndex(1, staleness_s=1.0)


def test_an_index_that_never_catches_up_routes_on_load_only():
    # Staleness longer than the run: the router never sees a block, so prefix-aware (load
    # weight 1) routes exactly as least outstanding.
    case = _mooncake(3, 200, 4.0)
    blind = run(_with(case, router_staleness_s=1e6), base_dir=ROOT)
    least = run(_with(case, router="least_outstanding"), base_dir=ROOT)
    assert list(blind.requests["replica"]) == list(least.requests["replica"])
    fresh = run(case, base_dir=ROOT)
    assert list(fresh.requests["replica"]) != list(least.requests["replica"])


def test_staleness_is_a_scenario_key():
    case = _with(
        _inline([{"arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 1}]),
        router_staleness_s=0.25,
    )
    assert resolve(case, ROOT).engine.router_staleness_s == 0.25
    with pytest.raises(Exception, match="router_staleness_s"):
        _with(case, router_staleness_s=-1)


def test_router_reads_kv_events_only_for_prefix_cache_aware():
    assert [r for r in Router if r.reads_kv_events] == [Router.PREFIX_CACHE_AWARE]


def test_build_result_keeps_the_table_none_when_not_recorded():
    case = _inline([{"arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 1}], 1)
    engine = _engine(case)
    assert build_result(engine.run()).kv_events is None
