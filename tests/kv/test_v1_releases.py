"""The version-pinned V1 engine: 4ac7713, 0.11.0 and 0.33.0 (`sim.kv.pins`).

Each behaviour that differs between releases has exact-id tests on every pin, the full-fit gate
has a thrash test, and the 0.11.0 pin runs in lockstep with the real vLLM 0.11.0 manager.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.audit import AuditLevel, audited
from sim.engine.run import resolve, run
from sim.kv import Design, KVCacheConfig, make_manager
from sim.kv.pins import VllmPin, manager_pin, resolve_pin
from sim.kv.types import Segment, Sequence, TokenContent
from sim.kv.v1_engine import KVCacheManager
from sim.kv.v1_engine.free_queue import FreeBlockQueue
from sim.scenario.schema import ScenarioError, load_scenario, scenario_from_dict
from sim.scheduler import Policy, Request, SchedulerConfig, V1Scheduler
from sim.scheduler.fast.v1 import with_decode_shortcuts
from sim.scheduler.v1.release import FirstChunkGate, FullSequenceGate

BS = 16
ROOT = Path(__file__).resolve().parents[2]
OLD = ["4ac7713", "0.11.0"]  # the releases with 4ac7713's free order and admission
ALL = [*OLD, "0.33.0"]


def make(num_gpu_blocks: int, pin: str, **kwargs) -> KVCacheManager:
    return KVCacheManager(
        KVCacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS, vllm_pin=pin, **kwargs)
    )


def seq_of(seq_id: int, key: int, num_tokens: int) -> Sequence:
    content = TokenContent.from_segments([Segment(key, num_tokens)])
    return Sequence(seq_id, content, content.num_tokens)


def free_ids(m: KVCacheManager) -> list[int]:
    return m.block_pool.free_block_queue.ids()


# ------------------------------------------------------------------------------- pins
def test_release_names_resolve_and_unknown_ones_are_refused():
    assert manager_pin("v1-engine", None) is VllmPin.C4AC7713  # managers built without a pin
    assert resolve_pin("v1-engine", None) is VllmPin.V0_33_0  # scenarios: the latest
    assert resolve_pin("v1-engine", "0.11.0") is VllmPin.V0_11_0
    with pytest.raises(ValueError, match="unknown vLLM version '0.9'"):
        make(10, "0.9")


def test_free_queue_prepend_keeps_the_given_order_at_the_head():
    q = FreeBlockQueue(range(1, 5))
    q.popleft_n(2)
    q.prepend_n([2, 1])
    assert q.ids() == [2, 1, 3, 4]
    assert q.popleft_n(1) == [2]


# ---------------------------------------------------------------------- free-block reuse
@pytest.mark.parametrize("pin", ALL)
def test_free_order_without_caching_exact_ids(pin):
    """4ac7713/0.11.0 append freed blocks at the tail; 0.33.0 puts them at the head (LIFO)."""
    m = make(6, pin)  # blocks 1..5
    a, b, c = seq_of(1, 1, 40), seq_of(2, 2, 16), seq_of(3, 3, 32)
    assert m.allocate_slots(a, 40) == [1, 2, 3]
    assert m.allocate_slots(b, 16) == [4]
    m.free(a)  # freed tail first: [3, 2, 1]
    if pin in OLD:
        assert free_ids(m) == [5, 3, 2, 1]
        assert m.allocate_slots(c, 32) == [5, 3]
    else:
        assert free_ids(m) == [3, 2, 1, 5]
        assert m.allocate_slots(c, 32) == [3, 2]


@pytest.mark.parametrize("pin", ALL)
def test_free_order_with_caching_keeps_a_prefix_hit_on_0_33(pin):
    """Uncached blocks are reused first on 0.33.0, so a later request keeps more of A's prefix.

    A (56 tokens) holds 1..4 with 1-3 cached (h0, h1, h2); D (20 tokens, other content) then
    E (40 tokens) allocate after A is freed; C repeats A's prompt.
    """
    m = make(7, pin, enable_prefix_caching=True)  # blocks 1..6
    a = seq_of(1, 1, 56)
    assert m.allocate_slots(a, 56) == [1, 2, 3, 4]
    m.free(a)  # [4, 3, 2, 1]: 4 has no hash
    d = seq_of(2, 2, 20)
    e = seq_of(3, 3, 40)
    c = seq_of(4, 1, 56)
    if pin in OLD:
        assert free_ids(m) == [5, 6, 4, 3, 2, 1]
        assert m.allocate_slots(d, 20) == [5, 6]  # 5 cached (D's h0), 6 partial
        m.free(d)
        assert free_ids(m) == [4, 3, 2, 1, 6, 5]
        assert m.allocate_slots(e, 40) == [4, 3, 2]  # evicts A's h2 and h1
        assert m.get_computed_blocks(c) == ([1], 16)
    else:
        assert free_ids(m) == [4, 5, 6, 3, 2, 1]
        assert m.allocate_slots(d, 20) == [4, 5]  # 4 cached (D's h0), 5 partial
        m.free(d)
        assert free_ids(m) == [5, 6, 3, 2, 1, 4]
        assert m.allocate_slots(e, 40) == [5, 6, 3]  # evicts A's h2 only
        assert m.get_computed_blocks(c) == ([1, 2], 32)


_OPS = st.lists(
    st.tuples(st.sampled_from(["alloc", "free"]), st.integers(0, 5), st.integers(1, 70)),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=_OPS, window=st.sampled_from([None, 20, 40]))
def test_free_order_changes_ids_not_counts(ops, window):
    """Without prefix caching the 0.33.0 free order changes which ids are handed out, never
    whether a call succeeds or how many blocks are free (the order is a permutation)."""
    old, new = make(12, "4ac7713", sliding_window=window), make(12, "0.33.0", sliding_window=window)
    seqs = {}
    for op, slot, num_tokens in ops:
        if op == "free":
            seq = seqs.pop(slot, None)
            if seq is not None:
                old.free(seq)
                new.free(seq)
            continue
        seq = seqs.get(slot)
        if seq is None:  # a new prompt of num_tokens
            seq = seqs[slot] = seq_of(slot, slot, num_tokens)
        else:  # a running one: what it had is computed, num_tokens more arrive
            seq.num_computed_tokens = seq.num_tokens
            seq.append_tokens(num_tokens)
        got_old = old.allocate_slots(seq, num_tokens)
        got_new = new.allocate_slots(seq, num_tokens)
        assert (got_old is None) == (got_new is None)
        if got_old is not None:
            assert len(got_old) == len(got_new)
        else:  # refused: preempt it (recompute), as the scheduler would
            old.free(seqs.pop(slot))
            new.free(seq)
        assert old.num_free_blocks == new.num_free_blocks
        assert old.num_seq_blocks(slot) == new.num_seq_blocks(slot)


# ------------------------------------------------------------------- full-sequence count
def test_full_sequence_count_full_attention_and_hits():
    m = make(20, "0.33.0", enable_prefix_caching=True)
    assert m.num_blocks_to_admit(seq_of(1, 9, 200), [], 64) == 13  # cdiv(200, 16)
    a = seq_of(2, 1, 64)
    m.allocate_slots(a, 64)  # 4 full blocks cached, held by A
    b = Sequence(3, TokenContent.from_segments([Segment(1, 64), Segment(5, 36)]), 100)
    hits, num_hit_tokens = m.get_computed_blocks(b)
    assert (hits, num_hit_tokens) == ([1, 2, 3, 4], 64)
    assert m.num_blocks_to_admit(b, hits, 64) == 7 - 4  # held hits cost nothing
    m.free(a)
    assert m.num_blocks_to_admit(b, hits, 64) == 7 - 4 + 4  # evictable hits leave the pool


def test_full_sequence_count_is_capped_by_the_sliding_window():
    # cap = cdiv(min(W - 1 + in_flight, max_model_len), bs) + 1 = cdiv(31 + 64, 16) + 1 = 7
    assert make(20, "0.33.0", sliding_window=32).num_blocks_to_admit(seq_of(1, 1, 200), [], 64) == 7
    # max_model_len = 80: T = 80 -> 5 blocks, under the cap cdiv(80, 16) + 1 = 6
    m = make(20, "0.33.0", sliding_window=32, max_model_len=80)
    assert m.num_blocks_to_admit(seq_of(1, 1, 200), [], 64) == 5


# --------------------------------------------------------------------------- scheduler
def _v1(num_gpu_blocks: int, pin: str, **sched) -> V1Scheduler:
    kv = KVCacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS, vllm_pin=pin)
    manager = audited(make_manager(Design.V1_ENGINE, kv), level=AuditLevel.FULL)
    return with_decode_shortcuts(
        V1Scheduler(
            SchedulerConfig(max_model_len=sched.pop("max_model_len", 2048), **sched), manager
        )
    )


def _request(request_id: int, prompt_tokens: int, max_tokens: int = 4) -> Request:
    return Request.new(
        request_id, 0.0, TokenContent.unique(1000 + request_id, prompt_tokens), max_tokens, 0
    )


@pytest.mark.parametrize("pin", ALL)
def test_admission_gate_first_chunk_vs_full_sequence(pin):
    """10 usable blocks, 64-token chunks, a 200-token prompt (13 blocks)."""
    scheduler = _v1(11, pin, max_num_batched_tokens=64, enable_chunked_prefill=True)
    gate = scheduler.release_policies.admission
    scheduler.add_request(_request(0, 200))
    plan = scheduler.schedule(0.0)
    scheduled = [(w.request.request_id, w.num_tokens) for w in plan.all_scheduled()]
    if pin in OLD:
        assert isinstance(gate, FirstChunkGate)
        assert scheduled == [(0, 64)]  # the first chunk's 4 blocks fit
    else:
        assert gate == FullSequenceGate(max_in_flight_tokens=64)
        assert scheduled == []  # 13 > 10: it waits, nothing allocated
        assert scheduler.kv_cache_manager.num_free_blocks == 10
        assert [r.request_id for r in scheduler.waiting] == [0]


@pytest.mark.parametrize("pin", ALL)
def test_prompt_over_the_budget_without_chunking_skips_or_stops(pin):
    scheduler = _v1(
        100, pin, max_num_batched_tokens=64, enable_chunked_prefill=False, max_model_len=64
    )
    scheduler.token_budget = 64
    for request_id, prompt in [(0, 50), (1, 30), (2, 10)]:
        scheduler.add_request(_request(request_id, prompt))
    plan = scheduler.schedule(0.0)
    scheduled = [w.request.request_id for w in plan.all_scheduled()]
    if pin in OLD:  # 1 (50 + 30 > 64) is set aside, 2 is admitted behind it
        assert scheduled == [0, 2]
        assert [r.request_id for r in scheduler.waiting] == [1]
    else:  # 0.33.0 stops at 1
        assert scheduled == [0]
        assert [r.request_id for r in scheduler.waiting] == [1, 2]


@pytest.mark.parametrize("pin", ALL)
def test_skipped_oversized_prompts_requeue_reversed(pin):
    """Found by the scheduler lockstep (tests/vllm_real/test_vllm_sched_lockstep.py): 4ac7713 / 0.11.0 put
    several prompts set aside back at the head in reverse order (a side queue filled by
    `prepend_request`, then prepended whole). 40 is admitted (24 left), 30 and 30 are set
    aside, 10 is admitted: waiting [2, 1] on the old pins; 0.33.0 stops at 1 instead."""
    scheduler = _v1(
        100, pin, max_num_batched_tokens=64, enable_chunked_prefill=False, max_model_len=64
    )
    scheduler.token_budget = 64
    for request_id, prompt in [(0, 40), (1, 30), (2, 30), (3, 10)]:
        scheduler.add_request(_request(request_id, prompt))
    plan = scheduler.schedule(0.0)
    scheduled = [w.request.request_id for w in plan.all_scheduled()]
    if pin in OLD:
        assert scheduled == [0, 3]
        assert [r.request_id for r in scheduler.waiting] == [2, 1]
    else:
        assert scheduled == [0]
        assert [r.request_id for r in scheduler.waiting] == [1, 2, 3]


def _priority(num_gpu_blocks: int, pin: str) -> V1Scheduler:
    return _v1(
        num_gpu_blocks,
        pin,
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
        policy=Policy.PRIORITY,
    )


def _prio_request(request_id, prompt_tokens, priority, arrival_s=0.0):
    content = TokenContent.unique(1000 + request_id, prompt_tokens)
    return Request.new(request_id, arrival_s, content, 40, priority)


@pytest.mark.parametrize("pin", ALL)
def test_equal_priority_and_arrival_kill_the_old_engines(pin):
    """4ac7713 / 0.11.0's waiting heap compares two tied (priority, arrival) entries and raises
    TypeError (Request has no order; upstream #29747, fixed by #29764): kvsim ends the run
    there (`fatal_error`). Checked against the real 0.11.0 in tests/vllm_real/test_vllm_sched_lockstep.py.
    0.33.0 orders ties by `Request.__lt__`."""
    scheduler = _priority(40, pin)
    assert scheduler.use_exact_arrival_times() is (pin in OLD)
    scheduler.add_request(_prio_request(0, 16, 1))
    scheduler.add_request(_prio_request(1, 16, 1))  # pushed under 0: the heap compares them
    plan = scheduler.schedule(0.0)
    if pin in OLD:
        assert plan.fatal_error is not None and "requests 1 and 0 tie" in plan.fatal_error
    else:
        assert plan.fatal_error is None


def test_simulated_arrival_ties_are_ordered_by_id_by_default():
    """Without `use_exact_arrival_times` (a simulation: a real frontend would stamp the burst
    apart) the same tie is no crash; the lower id goes first."""
    scheduler = _priority(40, "0.11.0")
    scheduler.add_request(_prio_request(1, 16, 1))
    scheduler.add_request(_prio_request(0, 16, 1))
    plan = scheduler.schedule(0.0)
    assert plan.fatal_error is None
    assert [w.request.request_id for w in plan.scheduled] == [0, 1]


@pytest.mark.parametrize("pin", ALL)
def test_a_tie_the_heap_never_compares_is_harmless(pin):
    """The same tie, but 0 was admitted (popped) before 1 arrived: the heap never holds both."""
    scheduler = _priority(40, pin)
    scheduler.use_exact_arrival_times()
    scheduler.add_request(_prio_request(0, 16, 1))
    scheduler.update(scheduler.schedule(0.0), 0.01)
    scheduler.add_request(_prio_request(1, 16, 1))
    plan = scheduler.schedule(0.02)
    assert plan.fatal_error is None
    assert _ids(plan) == [(0, 1), (1, 16)]


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("pin", ALL)
def test_priority_victim_among_equals(pin, exact):
    """4 usable blocks; 0 and 1 tie at (priority 0, arrival 0.0) but never meet in the waiting
    heap (0 is admitted before 1 arrives). When 0 crosses into a 3rd block the pool is full
    and one of them must go: vLLM (`max` over (priority, arrival)) takes the first in
    `running`, 0 itself; kvsim's default order breaks the tie by the higher id, 1. Found by
    the scheduler lockstep with exact arrival times."""
    scheduler = _priority(5, pin)
    if exact:
        scheduler.use_exact_arrival_times()
    scheduler.add_request(_prio_request(0, 16, 0))
    now_s = 0.0
    for step in range(20):
        if step == 1:
            scheduler.add_request(_prio_request(1, 16, 0))
        plan = scheduler.schedule(now_s)
        assert plan.fatal_error is None
        if plan.num_preempted:
            break
        scheduler.update(plan, now_s + 0.01)
        now_s += 0.02
    assert plan.num_preempted == 1
    assert [r.request_id for r in scheduler.waiting] == [0 if exact else 1]


def _ids(plan) -> list[tuple[int, int]]:
    return sorted((w.request.request_id, w.num_tokens) for w in plan.all_scheduled())


@pytest.mark.parametrize("pin", ALL)
def test_priority_victim_scheduled_earlier_in_the_step(pin):
    """3 usable blocks. b (priority 5) then a (priority 0) each hold 1 prompt block; b's first
    decode took a 2nd block, so a's first decode finds none free. b, scheduled first in this
    step, is the victim: 4ac7713/0.11.0 keep its token scheduled (and advance it), 0.33.0
    un-schedules it and refunds the token."""
    scheduler = _priority(4, pin)
    scheduler.add_request(_prio_request(1, 16, 5))
    scheduler.update(scheduler.schedule(0.0), 0.01)
    scheduler.add_request(_prio_request(0, 16, 0, 0.01))
    scheduler.update(scheduler.schedule(0.02), 0.03)
    plan = scheduler.schedule(0.04)
    assert plan.num_preempted == 1
    assert [r.request_id for r in scheduler.waiting] == [1]
    victim = scheduler.waiting[0]
    if pin in OLD:
        assert _ids(plan) == [(0, 1), (1, 1)]
        assert victim.seq.num_computed_tokens == 1  # advanced after being reset to 0
    else:
        assert _ids(plan) == [(0, 1)]
        assert victim.seq.num_computed_tokens == 0


@pytest.mark.parametrize("pin", ALL)
def test_priority_self_preemption_ends_the_loop_or_moves_on(pin):
    """4 usable blocks. v (priority 9, 32-token prompt) holds 3 blocks after its first decode,
    u (priority 0, 1 token) holds 1. 16 decodes later both cross a block boundary in the same
    step; v, first in `running` and the worst, preempts itself. 4ac7713/0.11.0 end the running
    loop there (u waits a step); 0.33.0 goes on and schedules u with v's freed blocks."""
    scheduler = _priority(5, pin)
    scheduler.add_request(_prio_request(1, 32, 9))
    scheduler.update(scheduler.schedule(0.0), 0.01)
    scheduler.add_request(_prio_request(2, 1, 0, 0.01))
    now_s = 0.02
    for _ in range(16):
        plan = scheduler.schedule(now_s)
        assert plan.num_preempted == 0
        scheduler.update(plan, now_s + 0.005)
        now_s += 0.01
    plan = scheduler.schedule(now_s)
    assert plan.num_preempted == 1
    assert [r.request_id for r in scheduler.waiting] == [1]
    assert [(r.request_id, r.seq.num_tokens) for r in scheduler.running] == [(2, 17)]
    assert _ids(plan) == ([] if pin in OLD else [(2, 1)])


# ------------------------------------------------------------------------- scenarios
def _thrash(version: str | None) -> dict:
    """12 long prompts (600-632 tokens, 38-40 blocks) into 63 usable blocks, 128-token chunks."""
    scheduler = {
        "design": "v1-engine",
        "max_model_len": 800,
        "enable_chunked_prefill": True,
        "max_num_batched_tokens": 128,
        "max_num_seqs": 16,  # 12 requests; at most the budget, or vLLM refuses to start
    }
    if version is not None:
        scheduler["vllm_version"] = version
    requests = [
        {"arrival_s": 0.001 * i, "prompt_tokens": 600 + 16 * (i % 3), "output_tokens": 32}
        for i in range(12)
    ]
    data = {
        "name": "thrash",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": 64,
            "num_cpu_blocks": 0,
            "enable_prefix_caching": False,
        },
        "scheduler": scheduler,
        "workload": {"kind": "inline", "requests": requests},
        "step_time": {
            "linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001, "per_decode_seq_s": 0.0001}
        },
    }
    return run(scenario_from_dict(data)).summary


def test_full_fit_gate_removes_the_chunked_prefill_thrash():
    """Two prompts of 38+ blocks cannot both fit in 63; admitted on their first chunk they
    preempt each other (4ac7713, 0.11.0); gated on the whole prompt, one waits (0.33.0)."""
    old, v011, new = (_thrash(v) for v in ALL)
    assert old["num_preemptions"] >= 50
    assert v011["num_preemptions"] == old["num_preemptions"]
    assert new["num_preemptions"] == 0
    for summary in (old, new):
        assert summary["states"]["finished"] == 12
        assert summary["num_violations"] == 0
    assert new["ttft_p99_s"] < old["ttft_p99_s"]
    assert _thrash(None) == new  # an unpinned scenario runs the latest release


def test_unpinned_v1_scenario_resolves_to_the_latest_release():
    data = {
        "model": None,
        "cache": {"num_gpu_blocks": 64},
        "scheduler": {"design": "v1-engine", "max_model_len": 256},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 2}],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }
    resolved = resolve(scenario_from_dict(data))
    assert resolved.inputs["vllm_version"] == "0.33.0"
    assert resolved.engine.kv.vllm_pin == "0.33.0"


def test_vllm_version_on_a_v0_design_is_a_one_line_error():
    data = {
        "model": None,
        "scheduler": {"design": "v0-v2", "vllm_version": "0.11.0", "max_model_len": 64},
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 2}],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }
    # v0-v2 has v0 versions of its own (`sim.kv.pins`), and a V1 release is not one.
    with pytest.raises(ScenarioError, match=r"unknown vLLM version '0.11.0' for v0-v2"):
        scenario_from_dict(data, "s.yaml")


@pytest.mark.parametrize("name", ["swa_4_vs_3_v1_engine.yaml", "mooncake_prefix_caching.yaml"])
def test_bundled_v1_scenarios_document_4ac7713(name):
    assert load_scenario(ROOT / "scenarios" / name).scheduler.vllm_version == "4ac7713"


@pytest.mark.parametrize("pin", OLD)  # unpinned fuzz cases run 0.33.0 (tests/ci/test_fuzz.py)
def test_fuzz_cases_are_quiet_on_the_older_pins(pin):
    """`kvsim fuzz`'s random V1 cases (policies, windows, caching, chunking; full audit) on a
    pinned older release: no violation and no crash; the only stall (`no_progress`) is vLLM
    #29496, a prompt split into chunks of exactly max_model_len tokens that never gets its last token."""
    from sim.ci.fuzz import case_seed, generate_case, run_case
    from sim.workload import load_workload

    num_stalled = 0
    for index in range(80):
        scenario = generate_case("v1-engine", case_seed(0, index))
        scheduler = scenario.scheduler.model_copy(update={"vllm_version": pin})
        case = run_case(scenario.model_copy(update={"scheduler": scheduler}))
        kinds = {kind for kind, _, _ in case.kinds}
        assert kinds <= {"no_progress"} and case.fatal_error is None, (index, case)
        if kinds:
            num_stalled += 1
            # Inline requests or session turns (`kvsim fuzz` draws both).
            prompts = [r.prompt_tokens for r in load_workload(scenario.workload)]
            # Split into chunks (chunked prefill, or a long-prefill threshold below the prompt).
            chunked = scheduler.enable_chunked_prefill or scheduler.long_prefill_token_threshold
            assert chunked, (index, case)
            assert scheduler.max_model_len in prompts, (index, case)
    assert num_stalled >= 1  # case 1 (seed 673228719) is one


# ----------------------------------------------------------------- real vLLM 0.11.0
def _real_0_11_0():
    from sim.vllm_real.loader import VllmNotAvailableError, resolve_root

    try:
        resolve_root(vllm_version="0.11.0")
    except VllmNotAvailableError as exc:
        pytest.skip(f"vLLM 0.11.0 not set up: {exc}")


def _verify_pinned(monkeypatch, pin: str, num_ops: int, seed: int):
    """The manager lockstep against real 0.11.0, with kvsim's manager pinned to `pin`."""
    from sim.vllm_real import lockstep

    random_config = lockstep.random_config

    def pinned_config(rng, design):
        return dataclasses.replace(random_config(rng, design), vllm_pin=pin)

    monkeypatch.setattr(lockstep, "random_config", pinned_config)
    return lockstep.verify(None, "v1-engine", num_ops=num_ops, seed=seed)


@pytest.mark.vllm
@pytest.mark.parametrize("seed", [1, 2])
def test_lockstep_0_11_0_pin_against_real_0_11_0(monkeypatch, seed):
    _real_0_11_0()
    result = _verify_pinned(monkeypatch, "0.11.0", 1500, seed)
    assert result.identical, result.summary()
    assert result.num_ops >= 1500


@pytest.mark.vllm
def test_lockstep_0_33_0_pin_diverges_from_real_0_11_0(monkeypatch):
    """The 0.33.0 free order is a real code path: the 0.11.0 lockstep catches it at once."""
    _real_0_11_0()
    result = _verify_pinned(monkeypatch, "0.33.0", 1500, 1)
    assert not result.identical
