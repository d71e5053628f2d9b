"""kvsim's model of vLLM's AsyncScheduler and the engine core's batch queue, without vLLM
(`sim.scheduler.v1.async_scheduler`, `sim.scheduler.v1.engine_core`); the lockstep against the
real ones is tests/vllm_real/test_vllm_async_lockstep.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sim.audit import AuditLevel, audited
from sim.kv import Design, KVCacheConfig, make_manager
from sim.kv.pins import VllmPin
from sim.kv.types import Sequence, TokenContent
from sim.scenario.schema import SchedulerSection
from sim.scheduler import Request, SchedulerConfig
from sim.scheduler.fast.v1 import with_decode_shortcuts
from sim.scheduler.v1.async_scheduler import AsyncOutputs, make_v1_scheduler
from sim.scheduler.v1.engine_core import EngineCoreLoop
from sim.scheduler.v1.release import FullSequenceGate
from sim.scheduler.v1.scheduler import V1Scheduler

BS = 16


def _scheduler(pin: str, num_blocks: int = 20, **sched) -> V1Scheduler:
    kv = KVCacheConfig(num_gpu_blocks=num_blocks, block_size=BS, vllm_pin=pin)
    manager = audited(make_manager(Design.V1_ENGINE, kv), level=AuditLevel.FULL)
    config = SchedulerConfig(max_model_len=128, async_scheduling=True, **sched)
    scheduler = with_decode_shortcuts(make_v1_scheduler(config, manager))
    assert isinstance(scheduler.outputs, AsyncOutputs)
    return scheduler


def _calls(pin: str, prompt: int, max_tokens: int) -> tuple[list, Request]:
    """Each engine-core call's scheduled (request, tokens) list (None: not scheduled)."""
    scheduler = _scheduler(pin)
    request = Request.new(0, 0.0, TokenContent.unique(1000, prompt), max_tokens)
    scheduler.add_request(request)
    loop = EngineCoreLoop(scheduler, VllmPin(pin), batch_queue_size=2)
    calls = []
    now = 0.0
    while loop.has_work():
        call = loop.step(now)
        sched = call.scheduled
        calls.append(
            None
            if sched is None
            else [(w.request.request_id, w.num_tokens) for w in sched.scheduled]
        )
        now += 1.0
    return calls, request


def test_0_11_schedules_a_request_once_more_after_its_last_token():
    """4-token prompt, 2 output tokens (worked by hand from 0.11.0's loop and AsyncScheduler):
    the prefill; a decode scheduled with token 1 in flight; a third step scheduled before
    token 2 (which ends it) comes back; then an empty batch, applied at once; the queue drains."""
    calls, request = _calls("0.11.0", prompt=4, max_tokens=2)
    assert calls == [[(0, 4)], [(0, 1)], [(0, 1)], [], None]
    assert request.seq.num_tokens == 6 and request.state.is_terminal
    assert request.first_token_s == 1.0 and request.finish_s == 2.0  # applied one call late


def test_0_33_does_not_schedule_past_the_last_token_in_flight():
    """0.33.0 `sched/scheduler.py:L798-812`: with token 2 in flight (C = 5, one placeholder,
    5 + 2 - 1 >= 4 + 2) the third step is empty; an empty batch waits in the queue."""
    calls, request = _calls("0.33.0", prompt=4, max_tokens=2)
    assert calls == [[(0, 4)], [(0, 1)], [], [], None]
    assert request.seq.num_tokens == 6 and request.finish_s == 2.0


def test_placeholders_return_to_zero_and_nothing_stays_in_flight():
    for pin in ("0.11.0", "0.33.0"):
        calls, request = _calls(pin, prompt=40, max_tokens=7)
        assert request.num_output_placeholders in (0, 1)  # the dropped last step's, at 0.11.0
        assert request.seq.num_in_flight_tokens == 0
        assert request.seq.output_len == 7


def test_0_33_frees_out_of_window_blocks_below_the_processed_tokens():
    """With 16 tokens in flight, a window of 16 frees one block fewer: the in-flight step still
    reads it (0.33.0 `kv_cache_manager.py:L558-568`); 0.11.0 frees below C either way."""

    def held_after(pin: str, in_flight: int) -> int:
        kv = KVCacheConfig(num_gpu_blocks=20, block_size=BS, sliding_window=16, vllm_pin=pin)
        manager = make_manager(Design.V1_ENGINE, kv)
        seq = Sequence.new(0, TokenContent.unique(7, 64))
        manager.allocate_slots(seq, 64)
        seq.num_computed_tokens = 64
        seq.content.append_output(-1, 1)
        seq.num_in_flight_tokens = in_flight
        free_before = manager.num_free_blocks
        manager.allocate_slots(seq, 1)
        return manager.num_free_blocks - free_before

    assert held_after("0.33.0", 0) == held_after("0.11.0", 16) == held_after("0.11.0", 0)
    assert held_after("0.33.0", 16) == held_after("0.33.0", 0) - 1


def test_0_33_admission_cap_counts_two_batches_in_flight():
    """`max_in_flight_tokens` = max_concurrent_batches x max_num_batched_tokens."""
    scheduler = _scheduler("0.33.0", max_num_batched_tokens=64, enable_chunked_prefill=True)
    gate = scheduler.release_policies.admission
    assert isinstance(gate, FullSequenceGate) and gate.max_in_flight_tokens == 128
    assert scheduler.max_concurrent_batches == 2


def test_the_speed_layer_stands_down_under_async():
    scheduler = _scheduler("0.33.0")
    assert scheduler.running_phase == scheduler.running_loop
    assert not scheduler.use_decode_cohort(None)


def test_async_with_a_v0_design_is_bad_input():
    with pytest.raises(ValidationError, match="async_scheduling"):
        SchedulerSection(design=Design.V0_V2, async_scheduling=True)
    assert SchedulerSection(design=Design.V1_ENGINE, async_scheduling=True).async_scheduling


@pytest.mark.parametrize(("design", "exit_code"), [("v0-v2", 2), ("v1-engine", 0)])
def test_a_scenario_asking_for_async(tmp_path, design, exit_code):
    """v0 has no async scheduler: bad input, one line naming the field, exit 2; V1 runs."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        "name: async-try\ncache: {block_size: 16, num_gpu_blocks: 40}\n"
        f"scheduler: {{design: {design}, max_model_len: 160, async_scheduling: true}}\n"
        "workload: {kind: inline, requests: [{arrival_s: 0.0, prompt_tokens: 64, "
        "output_tokens: 8}]}\nstep_time: {linear: {fixed_s: 0.005}}\n"
    )
    result = CliRunner().invoke(app, ["run", str(scenario), "-o", str(tmp_path / "out")])
    assert result.exit_code == exit_code, result.output
    if exit_code:
        assert "async_scheduling: the v0-v2 design" in result.output
