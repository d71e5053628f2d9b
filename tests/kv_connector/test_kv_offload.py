"""CPU KV offloading (`sim.kv_connector.offloading`, vLLM 0.11.0's OffloadingConnector)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sim.audit import AuditLevel, ViolationKind
from sim.ci.fuzz_cases import generate_case
from sim.engine.engine import Engine, EngineConfig, RunRecords
from sim.engine.run import resolve, run
from sim.kv.config import Design, KVCacheConfig
from sim.kv.types import BlockHash, Segment
from sim.kv_connector.cpu_tier import NOT_READY, LRUCpuTier
from sim.kv_connector.link import PCIE_GEN5_X16_GBPS, Link, TransferQueue, host_link
from sim.kv_connector.offloading import OffloadingConfig
from sim.latency.linear import LinearStepTime
from sim.output.results import requests_frame, steps_frame
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import ScenarioError, scenario_from_dict
from sim.scheduler import SchedulerConfig
from sim.workload.request import RequestSpec

STEP = LinearStepTime(fixed_s=0.005, per_prefill_token_s=0.0001, per_decode_seq_s=0.0001)
#: 1 ms per block of 1 MB plus 1 ms per transfer: easy arithmetic.
SLOW_LINK = Link("test", bandwidth_GBps=1.0, efficiency=1.0, latency_s=0.001)


def _tables(records: RunRecords) -> SimpleNamespace:
    """The run's tables as rows: requests as named tuples (in id order), steps as tuples."""
    return SimpleNamespace(
        requests=list(requests_frame(records).itertuples(index=False)),
        steps=list(steps_frame(records).itertuples(index=False, name=None)),
        violations=records.violations,
        end_s=records.end_s,
    )


def _h(*values: int) -> list[BlockHash]:
    return [BlockHash(v) for v in values]


def test_cpu_tier_worked_example():
    tier = LRUCpuTier(2, block_size=16)
    a, b, c, d = _h(1, 2, 3, 4)
    plan = tier.prepare_store([a, b])
    assert plan is not None and plan.block_hashes_to_store == [a, b]
    assert tier.lookup([a]) == 0  # not ready while the store runs
    tier.complete_store([a, b])
    assert tier.lookup([a, b, c]) == 2
    tier.touch([a])
    plan = tier.prepare_store([c])
    assert plan is not None and plan.block_hashes_evicted == [b]
    assert (tier.lookup([a]), tier.lookup([b])) == (1, 0)
    tier.prepare_load([a])
    assert tier.prepare_store([d]) is None  # a is being read, c's store is running
    assert tier.stats.num_refused_stores == 1
    tier.complete_load([a])
    plan = tier.prepare_store([d])
    assert plan is not None and plan.block_hashes_evicted == [a]


def test_cpu_tier_refuses_to_load_a_block_never_stored():
    tier = LRUCpuTier(4, block_size=16)
    tier.prepare_store(_h(1))
    try:
        tier.prepare_load(_h(1))  # stored but not complete
    except AssertionError as error:
        assert "invariant" in str(error)
    else:
        raise AssertionError("loading a block whose store is running must fail")


def test_link_worked_example_and_queue_order():
    link = host_link("h100-sxm")
    assert link.bandwidth_GBps == PCIE_GEN5_X16_GBPS
    # 10 Llama-3.1-8B bf16 blocks (2 MiB each): 10 us + 20,971,520 / 50.4e9 s.
    assert math.isclose(link.transfer_s(10 * 2_097_152), 10e-6 + 416.1e-6, rel_tol=1e-4)
    assert host_link("l4").name == "pcie-gen4-x16"
    queue = TransferQueue(Link("1s", bandwidth_GBps=1.0, efficiency=1.0, latency_s=0.0))
    assert queue.submit(0.0, 10**9) == 1.0
    assert queue.submit(0.5, 10**9) == 2.0


def _config(
    num_gpu_blocks: int, num_cpu_blocks: int | None, num_replicas: int = 1, fast_path: bool = False
):
    connector = (
        OffloadingConfig(num_cpu_blocks, gpu_block_bytes=10**6, link=SLOW_LINK)
        if num_cpu_blocks
        else None
    )
    return EngineConfig(
        design=Design.V1_ENGINE,
        kv=KVCacheConfig(
            num_gpu_blocks=num_gpu_blocks,
            block_size=16,
            enable_prefix_caching=True,
            max_model_len=1024,
            vllm_pin="0.11.0",
        ),
        scheduler=SchedulerConfig(
            max_model_len=1024,
            enable_chunked_prefill=True,
            decode_fast_path=fast_path or num_cpu_blocks is None,  # as the runner sets it
            decode_cohort=num_cpu_blocks is None,
        ),
        num_replicas=num_replicas,
        kv_connector=connector,
        audit_level=AuditLevel.FULL,  # refcounts and tables checked after every manager call
    )


def _run(specs, num_gpu_blocks: int, num_cpu_blocks: int | None) -> tuple[Engine, SimpleNamespace]:
    engine = Engine(_config(num_gpu_blocks, num_cpu_blocks), specs, STEP)
    return engine, _tables(engine.run())


def _prefill_tokens(records: RunRecords) -> int:
    return sum(row[5] for row in records.steps)


def test_a_cpu_tier_raises_hits_and_cuts_prefill_when_the_gpu_cache_is_too_small():
    """A 256-token system prompt (16 blocks) recurs every fourth request; the three between
    are unique 256-token prompts. 40 GPU blocks cannot keep the shared prefix through three
    unique prompts; a 200-block CPU tier can."""
    shared = (Segment(7, 256),)
    specs = []
    for i in range(16):
        prefix = shared if i % 4 == 0 else ()
        specs.append(RequestSpec(i, 1.0 * i, 256 + 16, 2, prefix=prefix))
    _, plain = _run(specs, 40, None)
    engine, offload = _run(specs, 40, 200)
    assert not plain.violations and not offload.violations
    hits_plain = sum(r.num_prefix_hit_tokens for r in plain.requests)
    hits_offload = sum(r.num_prefix_hit_tokens for r in offload.requests)
    assert hits_plain == 0  # every shared prefix was evicted before it recurred
    assert hits_offload == 3 * 256  # requests 4, 8 and 12 load the prefix back
    assert _prefill_tokens(offload) == _prefill_tokens(plain) - 3 * 256
    connector = engine.replicas[0].scheduler.connector_hooks.connector
    assert connector.stats.num_loaded_tokens == 3 * 256


def test_a_load_delays_the_first_token_by_the_transfer_time():
    """Request 0 (64 tokens, 1 output) fills 4 blocks, which are stored to the CPU tier.
    Request 1 (160 unique tokens) then needs 10 of the 11 usable GPU blocks and evicts three of
    request 0's from the GPU (its tail first: vLLM frees a table in reverse), leaving its first
    block cached. Request 2 repeats request 0's prompt at t = 10 s: GPU hit 1 block (16
    tokens), CPU hit the next 3 (48 tokens): a load of 3 blocks of 1 MB over a 1 GB/s link
    with 1 ms latency = 0.001 + 0.003 = 0.004 s. Its 64 tokens are then all computed, so the
    last is recomputed: one prefill step of 1 token = 0.005 + 0.0001 = 0.0051 s. TTFT 0.0091 s
    (without the tier it would prefill 48 tokens: 0.005 + 0.0048 = 0.0098 s)."""
    prompt = (Segment(3, 64),)
    specs = [
        RequestSpec(0, 0.0, 64, 1, prefix=prompt),
        RequestSpec(1, 1.0, 160, 1),
        RequestSpec(2, 10.0, 64, 1, prefix=prompt),
    ]
    _, plain = _run(specs, 12, None)
    engine, offload = _run(specs, 12, 100)
    ttft_plain = plain.requests[2].first_token_s - 10.0
    ttft_offload = offload.requests[2].first_token_s - 10.0
    assert plain.requests[2].num_prefix_hit_tokens == 16
    assert math.isclose(ttft_plain, 0.0098)
    assert math.isclose(ttft_offload, 0.0091)
    assert offload.requests[2].num_prefix_hit_tokens == 63
    connector = engine.replicas[0].scheduler.connector_hooks.connector
    assert connector.stats.loaded_tokens_by_request == {2: 48}


def test_blocks_wait_for_their_store_and_return_to_the_pool():
    """A finished request's blocks stay held until its stores complete, then are all freed;
    the CPU tier then holds its 4 blocks, ready."""
    engine, records = _run([RequestSpec(0, 0.0, 64, 1)], 12, 100)
    # Prefill ends at 0.0114 s; the 4-block store takes 0.001 + 0.004 s.
    assert math.isclose(records.requests[0].finish_s, 0.0114)
    assert math.isclose(records.end_s, 0.0114 + 0.005)
    replica = engine.replicas[0]
    assert replica.manager.num_free_blocks == 11
    tier = replica.scheduler.connector_hooks.connector.tier
    assert list(tier.blocks.values()) == [0, 0, 0, 0]


#: The smallest workload the property test found that stalls (kvsim and vLLM 0.11.0 alike):
#: (shared prefix id, prompt tokens beyond the prefix, output tokens, gap to the previous arrival)
#: on 27 GPU blocks (26 usable) and 29 CPU blocks. Requests 0 (prefix 3) and 1 (prefix 1) finish
#: in the first step and keep their 13 + 5 blocks until their stores end; request 2 (prefix 2,
#: 214 tokens) then takes 14 blocks, evicting 5 of request 0's 12 cached prefix blocks, and
#: request 3 (prefix 3) hits 7 on the GPU and loads the other 5 from the CPU: 14 + 12 = 26 held.
#: Request 3's load completes, but its 193rd token needs a 13th block and none is free; at 225
#: tokens request 2 needs a 15th, preempts itself (the only running request) and heads the
#: queue needing 15 blocks of which 14 can ever be free.
STALL_ROWS = [(3, 1, 1, 0.0), (1, 1, 1, 0.0), (2, 86, 12, 0.0), (3, 1, 1, 0.0)]
STALL_GPU_BLOCKS, STALL_CPU_BLOCKS = 27, 29


def _offload_specs(rows: list[tuple[int, int, int, float]]) -> list[RequestSpec]:
    """Requests from (shared prefix id (0: none), extra prompt tokens, output tokens, gap) rows:
    prefix id p is a 64 * p-token segment shared by every request with that id."""
    specs = []
    arrival = 0.0
    for i, (prefix_id, extra, output, gap) in enumerate(rows):
        arrival += gap
        prefix = (Segment(100 + prefix_id, 64 * prefix_id),) if prefix_id else ()
        specs.append(RequestSpec(i, arrival, 64 * prefix_id + extra, output, prefix=prefix))
    return specs


def _is_head_of_line_stall(records: SimpleNamespace, engine: Engine, num_gpu_blocks: int) -> bool:
    """Whether the run's violations are vLLM 0.11.0's own head-of-line stall, one for each
    replica whose queue was aborted: nothing runs, the head of `waiting` (e.g. a request that
    preempted itself) needs more blocks than are free although it would fit alone, the rest of
    the pool is held by waiting requests, and no transfer is still to complete.

    Upstream the V1 scheduler preempts only running requests (`self.running.pop()`,
    `v1/core/sched/scheduler.py` L255-286 @0.11.0), the waiting loop stops at a head whose
    `allocate_slots` fails (`new_blocks is None: break`, L471-483) and a request whose async
    load has completed keeps its blocks while it waits (L403-409), so nothing ever frees them:
    the engine core keeps stepping (`EngineCore.step`, `v1/engine/core.py` L272-291) with
    nothing scheduled, and `kv_connector_no_forward` (`v1/worker/kv_connector_model_runner_mixin.py`
    L69-84) has no transfer left to report. The P/D connector's case of the same stall is
    checked against vLLM itself in `tests/test_vllm_pd_deadlock.py`.
    """
    stalled = [r for r in engine.replicas if r.scheduler.waiting]
    if len(records.violations) != len(stalled):
        return False  # one violation for each replica whose queue was aborted
    num_usable = num_gpu_blocks - 1  # less the null block
    by_head = {v.request_id: v for v in records.violations}
    for replica in stalled:
        manager, scheduler = replica.manager, replica.scheduler
        violation = by_head.get(scheduler.waiting[0].request_id)
        held = sum(manager.num_seq_blocks(r.seq.seq_id) for r in scheduler.waiting)
        if not (
            violation is not None
            and violation.kind is ViolationKind.NO_PROGRESS
            and not scheduler.running
            and violation.free_blocks < violation.needed_blocks <= num_usable
            and manager.num_free_blocks + held == num_usable
            and replica.next_kv_transfer_s() is None  # no load (or finished store) to come
        ):
            return False
    return True


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # shared prefix id (0: none)
            st.integers(1, 200),  # prompt tokens beyond the prefix
            st.integers(1, 12),  # output tokens
            st.floats(0.0, 0.2),  # gap to the previous arrival
        ),
        min_size=1,
        max_size=25,
    ),
    st.integers(27, 60),  # the longest request (3 * 64 + 200 + 12 tokens) fits in 26 blocks
    st.integers(1, 120),  # small tiers refuse stores; large ones serve loads
    st.integers(1, 2),
)
@example(STALL_ROWS, STALL_GPU_BLOCKS, STALL_CPU_BLOCKS, 1)
def test_offloading_keeps_every_invariant(rows, num_gpu_blocks, num_cpu_blocks, num_replicas):
    """Random workloads: the full audit (conservation and refcounts after every manager call,
    so also while loads hold blocks and finished requests' blocks wait for their stores) finds
    nothing, every request finishes, every GPU block returns to the pool, and the CPU tier ends
    with no load pinning a block and no store running (every request finished, so every store
    was reported).

    The one exception is a stall vLLM 0.11.0 shares (`_is_head_of_line_stall`, `STALL_ROWS`):
    fitting the longest request in the GPU pool does not make a run live once loaded requests
    wait holding blocks behind a head that preempted itself. Then the queue is aborted where it
    stood: the aborted requests keep their blocks (kvsim's abort frees nothing) and the stores
    of an aborted request are never reported, but still no load pins a CPU block."""
    engine = Engine(
        _config(num_gpu_blocks, num_cpu_blocks, num_replicas), _offload_specs(rows), STEP
    )
    records = _tables(engine.run())
    if records.violations:
        assert _is_head_of_line_stall(records, engine, num_gpu_blocks), records.violations
        assert {r.state for r in records.requests} <= {"finished", "aborted"}
        for replica in engine.replicas:
            tier = replica.scheduler.connector_hooks.connector.tier
            assert all(ref_cnt in (0, NOT_READY) for ref_cnt in tier.blocks.values())
        return
    assert len(records.requests) == len(rows)
    assert all(r.state == "finished" for r in records.requests)
    for replica in engine.replicas:
        assert replica.manager.num_free_blocks == num_gpu_blocks - 1
        connector = replica.scheduler.connector_hooks.connector
        tier = connector.tier
        assert len(tier.blocks) <= tier.num_blocks
        assert all(ref_cnt == 0 for ref_cnt in tier.blocks.values())
        assert NOT_READY not in tier.blocks.values()
        assert connector.next_completion_s() is None


def test_offload_stall_behind_a_self_preempted_head_is_vllm_0_11_0s_own():
    """`STALL_ROWS` (found by `test_offloading_keeps_every_invariant`): a stall, not a lost
    store report. Request 3's load and every finished request's stores had completed and were
    reported (no transfer left, no block kept for a store); what holds request 3's 12 blocks is
    the waiting queue's head, request 2, which preempted itself and cannot get 15 of the 14
    blocks that are free. vLLM 0.11.0 stops at that head too (see `_is_head_of_line_stall`)."""
    engine = Engine(_config(STALL_GPU_BLOCKS, STALL_CPU_BLOCKS), _offload_specs(STALL_ROWS), STEP)
    records = _tables(engine.run())
    assert _is_head_of_line_stall(records, engine, STALL_GPU_BLOCKS)
    (violation,) = records.violations
    assert (violation.request_id, violation.needed_blocks, violation.free_blocks) == (2, 15, 14)
    assert "waiting for their KV: request 3 holds 12" in violation.message
    assert [r.state for r in records.requests] == ["finished", "finished", "aborted", "aborted"]
    replica = engine.replicas[0]
    hooks = replica.scheduler.connector_hooks
    assert not hooks.delayed_free  # requests 0 and 1's stores were reported: blocks freed
    # Nothing runs after step 0 (8 blocks free, request 2 needs 14) until request 0's store of
    # 12 blocks ends at 0.0308 + 0.001 + 12 x 0.001 s and frees its 13: a store completes with
    # no batch running, as vLLM's `kv_connector_no_forward` reports it.
    assert math.isclose(records.steps[1][2], 0.0308 + 0.001 + 0.012)  # start_s
    assert hooks.connector.stats.loaded_tokens_by_request == {3: 80}  # 5 blocks, 7 GPU hits
    # The stalled step (its row) preempted request 2, the last to run: 225 tokens, 14 blocks.
    last = records.steps[-1]
    assert last[9] == 1 and last[7] == 0  # num_preempted, num_tokens
    assert replica.manager.num_seq_blocks(3) == 12


def _scenario(**cache) -> dict:
    return {
        "name": "offload",
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm"},
        "cache": {"block_size": 16, "num_gpu_blocks": 64, "enable_prefix_caching": True, **cache},
        "scheduler": {"design": "v1-engine", "max_model_len": 512},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4}],
        },
        "step_time": {"linear": {"fixed_s": 0.005}},
    }


def test_cpu_offload_gib_sizes_the_tier_from_the_model_and_turns_off_the_decode_fast_path():
    # Llama-3.1-8B bf16: 2 MiB a 16-token block; 1 GiB = 512 blocks; 32-token blocks: 256.
    resolved = resolve(scenario_from_dict(_scenario(cpu_offload_gib=1)))
    assert resolved.inputs["kv_offload"]["num_cpu_blocks"] == 512
    assert resolved.engine.kv_connector.build(0, 16).tier.num_blocks == 512
    assert not resolved.engine.scheduler.decode_cohort
    assert not resolved.engine.scheduler.decode_fast_path  # test_refused_store_retried_...
    wide = resolve(scenario_from_dict(_scenario(cpu_offload_gib=1, cpu_offload_block_size=32)))
    assert wide.inputs["kv_offload"]["num_cpu_blocks"] == 256
    off = resolve(scenario_from_dict(_scenario()))
    assert off.engine.kv_connector is None and "kv_offload" not in off.inputs
    assert off.engine.scheduler.decode_fast_path and off.engine.scheduler.decode_cohort


def test_cpu_offload_on_a_v0_design_is_a_one_line_input_error():
    data = _scenario(cpu_offload_gib=1)
    data["scheduler"]["design"] = "v0-v2"
    with pytest.raises(ScenarioError, match=r"^cache.cpu_offload_gib: .*v1-engine"):
        resolve(scenario_from_dict(data))
    data = _scenario(cpu_offload_gib=1, cpu_offload_block_size=24)
    with pytest.raises(ScenarioError, match=r"^cache.cpu_offload_block_size: 24"):
        resolve(scenario_from_dict(data))


def test_refused_store_retried_on_quiet_decodes():
    """Why offloading turns the decode fast path off. A 1-block CPU tier refuses request 0's
    2-block store; upstream retries it on every step the request is scheduled, and the refusal
    ends the step's stores (`break`), so request 1's block is never tried. The fast path skips
    request 0's quiet decodes, so request 1's store would go through: a different CPU tier."""
    specs = [RequestSpec(0, 0.0, 35, 17), RequestSpec(1, 0.0, 1, 16)]
    tiers = []
    for fast_path in (False, True):  # False: what the runner sets with offloading
        engine = Engine(_config(30, 1, fast_path=fast_path), specs, STEP)
        engine.run()
        tiers.append(engine.replicas[0].scheduler.connector_hooks.connector.tier)
    walk, fast = tiers
    assert list(walk.blocks) == [] and walk.stats.num_refused_stores == 17  # one per step
    assert len(fast.blocks) == 1 and fast.stats.num_refused_stores == 4


def test_fuzz_draws_offloading_cases_whose_violations_are_those_without_the_tier():
    cases = [generate_case("v1-engine", seed) for seed in range(40)]
    offloading = [case for case in cases if case.cache.cpu_offload_gib > 0]
    assert 3 <= len(offloading) < len(cases)
    for case in offloading[:4]:
        without = apply_overrides(case, {"cache.cpu_offload_gib": 0.0})
        assert run(case).violation_kinds == run(without).violation_kinds
