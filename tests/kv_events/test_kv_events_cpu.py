"""The CPU offloading tier's KV events (medium "CPU") and the router's view of them.

The engine-level equivalence reads a replica's pool and CPU tier directly: the reference
router (`_DirectReadView`, GPU leading blocks then the CPU tier's ready blocks, as the router
read them before it consumed events), which the event-fed router must equal at staleness 0.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
from hypothesis import given
from hypothesis import strategies as st

from sim.engine.engine import Engine
from sim.engine.run import resolve, run
from sim.kv.types import BlockHash, TokenContent
from sim.kv_connector.cpu_tier import NOT_READY, LRUCpuTier
from sim.kv_events import MEDIUM_CPU, BlockRemoved, BlockStored, KVEventStream
from sim.output.results import requests_frame
from sim.routing import CacheIndex, ReplicaView
from sim.routing.prefix_cache_aware import leading_blocks_held
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import Scenario, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]


def _h(*values: int) -> list[BlockHash]:
    return [BlockHash(v) for v in values]


def _view(index: CacheIndex, replica: int = 0) -> ReplicaView:
    return ReplicaView(SimpleNamespace(index=replica), index)


# ------------------------------------------------------------------ unit level
def test_the_router_sees_a_prefix_continue_in_the_cpu_tier():
    """GPU holds h0; the CPU tier holds h1 (ready), h2 (its store still running), h3: the
    prefix the replica can serve is h0, h1. With 32-token offloaded blocks (factor 2) the
    tier's keys are not the router's 16-token block hashes: only the GPU counts. Every block
    reaches the router as a KV event, never by reading the tier."""
    h0, h1, h2, h3 = _h(10, 11, 12, 13)
    for cpu_block_size, expected in ((16, (2, 1)), (32, (1, 0))):
        index = CacheIndex(1, block_size=16)
        index.feeds[0].stored([h0], None)
        tier = LRUCpuTier(4, block_size=cpu_block_size)
        tier.event_sink = index.feeds[0]
        tier.prepare_store([h1, h2, h3])
        tier.complete_store([h1, h3])  # h2's copy still runs: not reported
        assert tier.blocks[h2] == NOT_READY and index.feeds[0].cpu_held == {h1, h3}
        view = _view(index)
        assert view.num_leading_blocks_held([h0, h1, h2, h3]) == expected[0]
        assert view.num_leading_blocks_held([h1, h2]) == expected[1]  # GPU miss, CPU h1


def test_cpu_tier_docstring_example_events():
    # `sim.kv_connector.cpu_tier`'s worked example, recorded: stored [a, b] when their copy
    # completes, removed [b] for c, removed [a] for d; all with medium CPU.
    a, b, c, d = _h(1, 2, 3, 4)
    stream = KVEventStream(0, 16, lambda: 0.0)
    tier = LRUCpuTier(2, block_size=16)
    tier.event_sink = stream
    tier.prepare_store([a, b])
    tier.complete_store([a, b])
    tier.touch([a])
    tier.prepare_store([c])
    tier.prepare_load([a])
    tier.prepare_store([d])  # refused: no event
    tier.complete_load([a])
    tier.prepare_store([d])
    events = [timed.event for timed in stream.events()]
    assert events == [
        BlockStored((a, b), None, 32, 16, medium=MEDIUM_CPU),
        BlockRemoved((b,), MEDIUM_CPU),
        BlockRemoved((a,), MEDIUM_CPU),
    ]


def test_cpu_events_respect_the_staleness():
    now = SimpleNamespace(t=0.0)
    index = CacheIndex(1, staleness_s=1.0, clock=lambda: now.t, block_size=16)
    feed = index.feeds[0]
    view = _view(index)
    h0, h1 = _h(1, 2)
    feed.stored([h0], None)
    now.t = 2.0
    feed.tier_stored([h1], MEDIUM_CPU, 16)
    now.t = 3.5
    feed.tier_removed([h1], MEDIUM_CPU)
    seen = []
    for t in (1.0, 2.5, 3.0, 4.0, 4.5):
        index.advance(t)
        seen.append(view.num_leading_blocks_held([h0, h1]))
    assert seen == [1, 1, 2, 2, 1]


def test_all_blocks_cleared_keeps_the_cpu_tier():
    # vLLM's AllBlocksCleared is the GPU pool's reset; the CPU tier's blocks stay loadable.
    index = CacheIndex(1, block_size=16)
    h0, h1 = _h(1, 2)
    index.feeds[0].stored([h0], None)
    index.feeds[0].tier_stored([h0, h1], MEDIUM_CPU, 16)
    index.feeds[0].cleared()
    assert _view(index).num_leading_blocks_held([h0, h1]) == 2
    assert not _view(index).holds_block(h0)


@given(
    prompt_blocks=st.integers(0, 8),
    cached=st.lists(
        st.tuples(st.sets(st.integers(0, 7)), st.sets(st.integers(0, 7))), min_size=1, max_size=4
    ),
)
def test_lazy_leading_blocks_with_a_cpu_tier_equal_the_full_hash_list(prompt_blocks, cached):
    # The router's lazy walk (GPU, then the CPU tier) counts what the index counts.
    content = TokenContent.unique(3, prompt_blocks * 16 + 5)
    hashes = content.block_hashes(16, prompt_blocks)
    index = CacheIndex(len(cached), block_size=16)
    for replica, (gpu, cpu) in enumerate(cached):
        index.feeds[replica].stored([hashes[b] for b in sorted(gpu) if b < len(hashes)], None)
        index.feeds[replica].tier_stored(
            [hashes[b] for b in sorted(cpu) if b < len(hashes)], MEDIUM_CPU, 16
        )
    views = [_view(index, replica) for replica in range(len(cached))]
    expected = [view.num_leading_blocks_held(hashes) for view in views]
    assert leading_blocks_held(content, 16, views) == expected


# ------------------------------------------------------------------ engine level
class _DirectReadView(ReplicaView):
    """The reference: GPU cache map and CPU tier read straight from the replica at routing
    time (the router before it consumed events). No real router can do this."""

    def holds_block(self, block_hash):
        return block_hash in self._replica.manager.block_pool.cached_block_hash_to_block

    def holds_cpu_block(self, block_hash):
        connector = self._replica.connector_hooks.connector
        if connector.block_size_factor != 1:
            return False
        return connector.tier.blocks.get(block_hash, NOT_READY) >= 0

    def num_leading_blocks_held(self, block_hashes):
        held = 0
        for block_hash in block_hashes:
            if not self.holds_block(block_hash):
                break
            held += 1
        for block_hash in block_hashes[held:]:
            if not self.holds_cpu_block(block_hash):
                break
            held += 1
        return held


def _offloading(**cache) -> Scenario:
    # 4 prefixes of 96 tokens cycling through 3 replicas of 14 GPU blocks: a GPU cache evicts
    # a prefix before it returns; a 0.03 GiB CPU tier (15 blocks of 2 MiB) keeps some of it
    # and evicts too.
    requests = [
        {
            "arrival_s": round(0.004 * i, 6),
            "prompt_tokens": 112,
            "output_tokens": 8,
            "prefix_id": i % 4,
            "prefix_tokens": 96,
        }
        for i in range(48)
    ]
    return scenario_from_dict(
        {
            "name": "kv-events-cpu",
            "model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm"},
            "cache": {
                "block_size": 16,
                "num_gpu_blocks": 14,
                "enable_prefix_caching": True,
                "cpu_offload_gib": 0.03,
                **cache,
            },
            "scheduler": {"design": "v1-engine", "max_model_len": 128},
            "engine": {"num_replicas": 3, "router": "prefix_cache_aware", "kv_events": True},
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


def _direct_read(scenario: Scenario, gpu_only: bool = False) -> tuple[pd.DataFrame, int]:
    """The requests table routed by `_DirectReadView`, and how many routing decisions the
    index-fed view (kept up to date alongside) answered differently (must be 0)."""
    resolved = resolve(scenario, ROOT)
    engine = Engine(resolved.engine, resolved.workload.requests, resolved.step_time)
    index_views = engine._views
    engine._views = [_DirectReadView(r) for r in engine.replicas]
    if gpu_only:
        for view in engine._views:
            view.holds_cpu_block = lambda block_hash: False  # type: ignore[method-assign]
    policy = engine._policy
    mismatches = 0

    def choose(request, views):
        nonlocal mismatches
        engine._cache_index.advance(engine.env.now)
        content = request.seq.content
        hashes = content.block_hashes(16, content.num_tokens // 16)
        for direct, index in zip(views, index_views, strict=True):
            mismatches += direct.num_leading_blocks_held(hashes) != index.num_leading_blocks_held(
                hashes
            )
        return policy.choose(request, views)

    engine._policy = SimpleNamespace(choose=choose)
    return requests_frame(engine.run()), mismatches


def test_event_fed_router_with_a_cpu_tier_equals_the_direct_read_at_staleness_0():
    scenario = _offloading()
    events = run(scenario, base_dir=ROOT)
    direct, mismatches = _direct_read(scenario)
    pd.testing.assert_frame_equal(events.requests, direct)
    assert mismatches == 0  # num_leading_blocks_held: index == pool + tier, every decision
    # Not vacuous: the CPU tier reports stores and evictions, and reading only the GPU would
    # route differently.
    table = events.kv_events
    cpu = table[table["medium"] == "CPU"]
    assert set(cpu["kind"]) == {"BlockStored", "BlockRemoved"}
    gpu_only, _ = _direct_read(scenario, gpu_only=True)
    assert list(gpu_only["replica"]) != list(direct["replica"])


def test_with_factor_2_the_router_counts_the_gpu_only():
    # 32-token offloaded blocks: the tier still reports its blocks (block size 32), which the
    # router does not count; routing equals the GPU-only direct read.
    scenario = _offloading(cpu_offload_block_size=32)
    events = run(scenario, base_dir=ROOT)
    direct, mismatches = _direct_read(scenario, gpu_only=True)
    pd.testing.assert_frame_equal(events.requests, direct)
    assert mismatches == 0
    stored = events.kv_events[events.kv_events["kind"] == "BlockStored"]
    assert set(stored.loc[stored["medium"] == "CPU", "block_size"]) == {32}


def test_the_table_has_cpu_rows_without_parents():
    table = run(_offloading(), base_dir=ROOT).kv_events
    cpu = table[table["medium"] == "CPU"]
    stored = cpu[cpu["kind"] == "BlockStored"]
    assert len(stored) > 0
    assert stored["parent_block_hash"].isna().all()
    assert set(stored["block_size"]) == {16} and set(stored["num_tokens"]) == {16}
    gpu = table[table["medium"] == "GPU"]
    assert len(gpu) > 0 and gpu["parent_block_hash"].notna().any()


def test_without_offloading_no_cpu_events():
    scenario = apply_overrides(_offloading(), {"cache.cpu_offload_gib": 0.0})
    table = run(scenario, base_dir=ROOT).kv_events
    assert len(table) > 0 and set(table["medium"].dropna()) == {"GPU"}


def test_cpu_tier_events_import_no_pandas():
    # The tier's medium lives in `sim.kv_connector.cpu_tier`, not in `sim.kv_events` (whose
    # package loads the table, i.e. pandas): the tier and the router's index stay light.
    code = (
        "import sys; import sim.kv_connector.offloading, sim.routing; "
        "print('pandas' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
