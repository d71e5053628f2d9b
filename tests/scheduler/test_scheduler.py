"""Scheduler behaviour against the spec (sections 5 and 7): queues, admission, budgets, preemption."""

from __future__ import annotations

from sim.audit import AuditLevel, audited
from sim.kv import Design, KVCacheConfig, make_manager
from sim.kv.types import TokenContent
from sim.scheduler import (
    Policy,
    PreemptionMode,
    Request,
    RequestState,
    SchedulerConfig,
    V0Scheduler,
    V1Scheduler,
)
from sim.scheduler.fast.v1 import with_decode_shortcuts

BS = 16


def _request(
    request_id: int,
    prompt_tokens: int,
    max_tokens: int = 4,
    arrival_s: float = 0.0,
    priority: int = 0,
):
    return Request.new(
        request_id,
        arrival_s,
        TokenContent.unique(1000 + request_id, prompt_tokens),
        max_tokens,
        priority,
    )


def _v0(num_gpu_blocks: int, design=Design.V0_V1, num_cpu_blocks: int = 0, **sched) -> V0Scheduler:
    kv = KVCacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS, num_cpu_blocks=num_cpu_blocks)
    manager = audited(make_manager(design, kv), level=AuditLevel.FULL)
    return V0Scheduler(
        SchedulerConfig(max_model_len=sched.pop("max_model_len", 2048), **sched), manager
    )


def _v1(num_gpu_blocks: int, **sched) -> V1Scheduler:
    kv = KVCacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS)
    manager = audited(make_manager(Design.V1_ENGINE, kv), level=AuditLevel.FULL)
    return with_decode_shortcuts(
        V1Scheduler(
            SchedulerConfig(max_model_len=sched.pop("max_model_len", 2048), **sched), manager
        )
    )


def _step(scheduler, now_s: float = 0.0):
    plan = scheduler.schedule(now_s)
    finished = scheduler.update(plan, now_s + 0.01)
    return plan, finished


# ----------------------------------------------------------------------------- v0


def test_v0_later_blocks_the_head_of_the_waiting_queue():
    scheduler = _v0(num_gpu_blocks=10)
    scheduler.add_request(_request(0, 8 * BS))  # 8 blocks: fits
    scheduler.add_request(_request(1, 4 * BS))  # 4 blocks: LATER (2 free)
    scheduler.add_request(_request(2, 1 * BS))  # would fit, but is behind the LATER head
    plan = scheduler.schedule(0.0)
    assert [w.request.request_id for w in plan.all_scheduled()] == [0]
    assert [r.request_id for r in scheduler.waiting] == [1, 2]


def test_v0_never_ignores_the_request_with_the_reason_and_scans_on():
    scheduler = _v0(num_gpu_blocks=4)
    scheduler.add_request(_request(0, 5 * BS))  # 5 blocks > G=4: NEVER
    scheduler.add_request(_request(1, BS))
    plan = scheduler.schedule(0.0)
    assert [r.request_id for r in plan.ignored] == [0]
    assert plan.ignored[0].state is RequestState.IGNORED
    assert "exceeds the capacity of block_manager" in plan.ignored[0].finish_reason
    assert [w.request.request_id for w in plan.all_scheduled()] == [1]


def test_v0_prompt_longer_than_the_limit_is_ignored():
    scheduler = _v0(num_gpu_blocks=100, max_model_len=64)
    scheduler.add_request(_request(0, 65))
    plan = scheduler.schedule(0.0)
    assert "too long and exceeds limit of 64" in plan.ignored[0].finish_reason


def test_v0_default_policy_steps_are_all_prefill_or_all_decode():
    scheduler = _v0(num_gpu_blocks=100)
    scheduler.add_request(_request(0, 20))
    plan, _ = _step(scheduler)
    assert [w.is_prefill for w in plan.all_scheduled()] == [True]
    scheduler.add_request(_request(1, 20))
    plan, _ = _step(scheduler)
    # A waiting prefill runs alone: request 0's decode stalls for this step.
    assert [(w.request.request_id, w.is_prefill) for w in plan.all_scheduled()] == [(1, True)]
    plan, _ = _step(scheduler)
    assert [(w.request.request_id, w.is_prefill) for w in plan.all_scheduled()] == [
        (0, False),
        (1, False),
    ]


def test_v0_recompute_preemption_takes_the_last_group_and_requeues_it_in_front():
    # 3 blocks. Two 16-token prompts take one block each; their first decode each needs a new
    # block, so the second decode finds no room and preempts the last running group.
    scheduler = _v0(num_gpu_blocks=3, max_num_seqs=4)
    for rid in range(3):
        scheduler.add_request(_request(rid, BS, max_tokens=8))
    _step(scheduler)  # prefill all three: 3 blocks used, F=0
    plan = scheduler.schedule(0.02)
    # Request 0 needs a block with F=0: the last group (2) is preempted, 0 appends (F=0 again);
    # request 1 then finds nothing left to preempt and preempts itself.
    assert plan.num_preempted == 2
    assert [w.request.request_id for w in plan.all_scheduled()] == [0]
    # `waiting.extendleft([2, 1])` reverses: the LAST preempted ends up at the front. (The spec's
    # section 5.3 says the earliest; deque.extendleft says otherwise, and so does the real code.)
    assert [r.request_id for r in scheduler.waiting] == [1, 2]
    for victim in scheduler.waiting:
        assert victim.num_preemptions == 1
        assert victim.seq.num_computed_tokens == 0 and victim.is_prefill


def test_v0_recompute_reprefills_prompt_plus_outputs():
    scheduler = _v0(num_gpu_blocks=3, max_num_seqs=4)
    for rid in range(3):
        scheduler.add_request(_request(rid, BS, max_tokens=8))
    _step(scheduler)
    plan = scheduler.schedule(0.02)
    scheduler.update(plan, 0.03)
    victim = scheduler.waiting[0]
    # It generated one token before being preempted: the re-prefill is 17 tokens.
    assert victim.seq.num_tokens == BS + 1


def test_v0_chunked_prefill_splits_by_the_remaining_budget():
    scheduler = _v0(num_gpu_blocks=100, enable_chunked_prefill=True, max_num_batched_tokens=48)
    scheduler.add_request(_request(0, 100))
    scheduler.add_request(_request(1, 30))
    plan, _ = _step(scheduler)
    assert [(w.request.request_id, w.num_tokens) for w in plan.all_scheduled()] == [(0, 48)]
    plan, _ = _step(scheduler)
    # Running first: request 0 continues with 48 tokens, nothing left for request 1.
    assert [
        (w.request.request_id, w.num_tokens, w.num_context_tokens) for w in plan.all_scheduled()
    ] == [(0, 48, 48)]
    plan, _ = _step(scheduler)
    # Listed as `SchedulerOutputs` lists them (new prefills first, scheduler.py:L899-903 of
    # 0.5.4), though the walk scheduled request 0's last chunk first.
    assert [(w.request.request_id, w.num_tokens) for w in plan.all_scheduled()] == [(1, 30), (0, 4)]


def test_v0_priority_policy_admits_lower_priority_value_first():
    scheduler = _v0(num_gpu_blocks=100, policy=Policy.PRIORITY)
    scheduler.add_request(_request(0, 20, priority=5, arrival_s=0.0))
    scheduler.add_request(_request(1, 20, priority=1, arrival_s=0.1))
    scheduler.add_request(_request(2, 20, priority=5, arrival_s=0.2))
    assert [r.request_id for r in scheduler.waiting] == [1, 0, 2]


def test_v0_priority_policy_preempts_worse_running_requests_for_the_head():
    scheduler = _v0(num_gpu_blocks=4, policy=Policy.PRIORITY, max_num_seqs=8)
    scheduler.add_request(_request(0, 3 * BS, priority=9, max_tokens=50))
    _step(scheduler)
    scheduler.add_request(_request(1, 3 * BS, priority=0, arrival_s=0.5))
    plan = scheduler.schedule(1.0)
    assert plan.num_preempted == 1
    assert scheduler.waiting[0].request_id == 1  # the better priority is at the head
    assert scheduler.waiting[1].request_id == 0


def test_v0_swap_without_cpu_space_is_the_real_fatal_error():
    scheduler = _v0(
        num_gpu_blocks=3, num_cpu_blocks=0, preemption_mode=PreemptionMode.SWAP, max_num_seqs=4
    )
    for rid in range(3):
        scheduler.add_request(_request(rid, BS, max_tokens=8))
    _step(scheduler)
    plan = scheduler.schedule(0.02)
    assert plan.fatal_error == (
        "Aborted due to the lack of CPU swap space. Please increase the swap space to avoid this error."
    )


def test_v0_forced_swap_moves_the_victim_to_swapped_and_back():
    scheduler = _v0(
        num_gpu_blocks=3, num_cpu_blocks=10, preemption_mode=PreemptionMode.SWAP, max_num_seqs=4
    )
    for rid in range(3):
        scheduler.add_request(_request(rid, BS, max_tokens=3))
    _step(scheduler)
    plan, _ = _step(scheduler, 0.02)
    assert plan.num_blocks_swapped_out >= 1
    assert [r.request_id for r in scheduler.swapped] == [2, 1]
    assert scheduler.swapped[0].state is RequestState.SWAPPED
    for i in range(10):
        _step(scheduler, 0.03 + i * 0.01)
    assert not scheduler.has_unfinished()


def test_v0_finished_request_frees_its_blocks():
    scheduler = _v0(num_gpu_blocks=10)
    scheduler.add_request(_request(0, 20, max_tokens=2))
    _, finished = _step(scheduler)
    assert not finished
    _, finished = _step(scheduler)
    assert [r.request_id for r in finished] == [0]
    assert finished[0].state is RequestState.FINISHED
    assert scheduler.block_manager.get_num_free_gpu_blocks() == 10


# ----------------------------------------------------------------------------- V1 engine


def test_v1_running_requests_are_scheduled_before_waiting_ones():
    scheduler = _v1(num_gpu_blocks=100, max_num_batched_tokens=64, enable_chunked_prefill=True)
    scheduler.add_request(_request(0, 100))
    plan, _ = _step(scheduler)
    assert [(w.request.request_id, w.num_tokens) for w in plan.all_scheduled()] == [(0, 64)]
    scheduler.add_request(_request(1, 10))
    plan, _ = _step(scheduler)
    assert [(w.request.request_id, w.num_tokens) for w in plan.all_scheduled()] == [
        (0, 36),
        (1, 10),
    ]


def test_v1_without_chunking_a_prompt_over_the_budget_is_skipped_not_blocking():
    scheduler = _v1(
        num_gpu_blocks=100,
        max_num_batched_tokens=64,
        enable_chunked_prefill=False,
        max_model_len=64,
    )
    scheduler.token_budget = 64
    scheduler.add_request(_request(0, 50))
    scheduler.add_request(_request(1, 30))  # 50 + 30 > 64: skipped this step
    scheduler.add_request(_request(2, 10))
    plan = scheduler.schedule(0.0)
    assert [w.request.request_id for w in plan.all_scheduled()] == [0, 2]
    assert [r.request_id for r in scheduler.waiting] == [1]


def test_v1_long_prefill_threshold_caps_each_chunk():
    scheduler = _v1(
        num_gpu_blocks=100, enable_chunked_prefill=True, long_prefill_token_threshold=32
    )
    scheduler.add_request(_request(0, 100))
    plan, _ = _step(scheduler)
    assert plan.all_scheduled()[0].num_tokens == 32


def test_v1_preempts_the_last_running_request_and_skips_waiting_that_step():
    scheduler = _v1(num_gpu_blocks=4, enable_chunked_prefill=True, max_num_seqs=8)  # 3 usable
    scheduler.add_request(_request(0, BS, max_tokens=20))
    scheduler.add_request(_request(1, BS, max_tokens=20))
    scheduler.add_request(_request(2, BS, max_tokens=20))
    _step(scheduler)  # three 1-block prompts: F=0
    scheduler.add_request(_request(3, 4))
    plan = scheduler.schedule(0.02)
    assert plan.num_preempted >= 1
    assert all(
        w.request.request_id != 3 for w in plan.all_scheduled()
    )  # no admission after a preemption
    # Request 0 preempts the last running request (2); request 1 then is the last and preempts
    # itself, ending the running loop. Each victim is prepended: [1, 2, 3].
    assert [r.request_id for r in scheduler.waiting] == [1, 2, 3]
    assert scheduler.waiting[0].seq.num_computed_tokens == 0


def test_v1_prefix_cache_hits_are_counted_at_admission():
    kv = KVCacheConfig(num_gpu_blocks=100, block_size=BS, enable_prefix_caching=True)
    manager = audited(make_manager(Design.V1_ENGINE, kv))
    scheduler = with_decode_shortcuts(
        V1Scheduler(SchedulerConfig(max_model_len=2048, enable_chunked_prefill=True), manager)
    )
    shared = TokenContent.unique(77, 64)
    first = Request.new(0, 0.0, shared.copy(), 2)
    scheduler.add_request(first)
    _step(scheduler)
    _step(scheduler)
    second = Request.new(1, 0.1, shared.copy(), 2)
    scheduler.add_request(second)
    plan = scheduler.schedule(0.2)
    work = plan.all_scheduled()[0]
    # 64 shared tokens = 4 full blocks; the last token is always recomputed, so 3 blocks hit.
    assert second.num_prefix_hit_tokens == 48
    assert (work.num_context_tokens, work.num_tokens) == (48, 16)
