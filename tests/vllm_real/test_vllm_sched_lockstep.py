"""Scheduler lockstep tier: kvsim's V1Scheduler against vLLM 0.11.0's real V1 Scheduler, per step.

Skipped, with the reason shown, when `.vllm/0.11.0` (or $KVSIM_VLLM_ROOT_0_11_0) is absent.
Run: `bash scripts/setup_vllm.sh 0.11.0 && pytest -m vllm tests/vllm_real/test_vllm_sched_lockstep.py`.
With KVSIM_REQUIRE_VLLM=1 (CI, `.ci/run`) a missing install fails the run instead.
"""

from __future__ import annotations

import warnings

import pytest
from typer.testing import CliRunner

from tests.harness.vllm_install import load_or_skip

warnings.filterwarnings("ignore", module="requests")

#: Every test here belongs to the lockstep tier (`pytest -m vllm` selects them).
pytestmark = pytest.mark.vllm


def _install():
    """The loaded vLLM 0.11.0, or a skip (a failure under KVSIM_REQUIRE_VLLM=1)."""
    return load_or_skip("0.11.0")


def _pair(case, requests):
    from sim.vllm_real.sched_lockstep import KvsimSide
    from sim.vllm_real.v1_sched_adapter import RealV1Scheduler

    install = _install()
    ours, real = KvsimSide(case, "0.11.0"), RealV1Scheduler(case, install=install)
    return ours, real


def _steps(ours, real, requests, num_steps):
    """Both sides' step records for `num_steps` steps."""
    mine, theirs = [], []
    for step in range(num_steps):
        for spec in requests:
            if spec.arrival_step == step:
                ours.add_request(spec)
                real.add_request(spec)
        mine.append(ours.step(float(step)))
        theirs.append(real.step())
    return mine, theirs


# --------------------------------------------------------------------------- random workloads
@pytest.mark.parametrize("pin", ["0.11.0", "4ac7713"])
def test_random_workloads_identical_step_by_step(pin):
    """The acceptance tier: >= 50 random workloads (FCFS / PRIORITY, prefix caching, sliding
    windows, chunked or not) decide identically on every step."""
    from sim.vllm_real.sched_lockstep import verify_scheduler

    result = verify_scheduler(num_workloads=60, seed=0, pin=pin, install=_install())
    assert result.identical, result.summary()
    assert result.num_workloads == 60
    assert result.num_workloads - len(result.real_raised) >= 50  # compared to the end
    assert result.num_steps > 1000
    assert result.num_preemptions > 0  # the walk reaches preemption
    assert result.num_prefix_hit_workloads > 0  # and prefix hits


def test_random_workloads_identical_with_kvsims_fast_path_and_cohort():
    """As `kvsim run` schedules (decode fast path, FCFS decode cohort): the same decisions."""
    from sim.vllm_real.sched_lockstep import verify_scheduler

    result = verify_scheduler(num_workloads=60, seed=0, install=_install(), fast_path=True)
    assert result.identical, result.summary()
    assert result.num_bulk_decodes > 0  # the cohort ran, and its bulk decodes matched


def test_trace_windows_identical():
    """Windows of the bundled Mooncake trace (shared prefixes), scaled down: identical, and
    its prefix sharing reaches the real prefix cache."""
    from sim.vllm_real.sched_lockstep import verify_scheduler
    from sim.vllm_real.sched_traces import trace_windows

    result = verify_scheduler(workloads=trace_windows(20, seed=1), install=_install())
    assert result.identical, result.summary()
    assert result.num_workloads == 20 and not result.real_raised
    assert result.num_prefix_hit_workloads > 0


def test_trace_window_scaling_of_the_docstring_example():
    """Mooncake request 5: 4,834 prompt tokens, all in 512-token hash blocks (9 whole + 226),
    173 outputs -> 9 x 16 + 7 = 151 tokens, the first block shared as key 0; 21 outputs."""
    from sim.vllm_real.sched_traces import DEFAULT_TRACE, _scaled
    from sim.workload.loaders import load_trace

    request = load_trace(DEFAULT_TRACE).requests[5]
    prompt = _scaled(request)
    assert sum(n for _, n in prompt) == 151
    assert prompt[0] == (0, 16) and [n for _, n in prompt] == [16] * 9 + [7]
    assert request.output_tokens // 8 == 21


def test_the_worked_example_of_the_adapter():
    """bs 16, 20 blocks (19 usable), budget 64, one 100-token prompt, 2 output tokens: chunks of
    64 (4 blocks) and 36 (7 blocks in all, token 1 sampled), then one decode (token 2, 101 ->
    102 tokens still in 7 blocks) that finishes it and frees all 7."""
    from sim.vllm_real.v1_sched_adapter import RequestSpec, SchedCase

    case = SchedCase(num_blocks=20, block_size=16, max_model_len=256, max_num_seqs=4,
                     max_num_batched_tokens=64)  # fmt: skip
    requests = [RequestSpec(0, ((1000, 100),), 2, 0, 0.0)]
    ours, real = _pair(case, requests)
    mine, theirs = _steps(ours, real, requests, 3)
    for records in (mine, theirs):
        assert [r.scheduled for r in records] == [[(0, 64)], [(0, 36)], [(0, 1)]]
        assert [r.free_after_schedule for r in records] == [15, 12, 12]
        assert [r.finished for r in records] == [[], [], [0]]
        assert [r.free_after_update for r in records] == [15, 12, 19]


# --------------------------------------------------------------------------- the divergence found
def test_skipped_oversized_prompts_return_in_reverse_order_on_the_real_scheduler():
    """The lockstep's finding (fixed in kvsim): without chunked prefill, two prompts over the
    budget left (63 > 64 - 2 decodes) are set aside while a small one is admitted; the real
    0.11.0 scheduler puts them back as [3, 2], so 3 runs first once the budget allows."""
    from sim.vllm_real.v1_sched_adapter import RequestSpec, SchedCase

    case = SchedCase(num_blocks=40, block_size=16, max_model_len=64, max_num_seqs=8,
                     max_num_batched_tokens=64, enable_chunked_prefill=False)  # fmt: skip
    requests = [
        RequestSpec(0, ((1000, 20),), 4, 0, 0.0),
        RequestSpec(1, ((1001, 20),), 2, 0, 0.001),
        RequestSpec(2, ((1002, 63),), 2, 1, 1.002),
        RequestSpec(3, ((1003, 63),), 2, 1, 1.003),
        RequestSpec(4, ((1004, 5),), 1, 1, 1.004),
    ]
    ours, real = _pair(case, requests)
    mine, theirs = _steps(ours, real, requests, 4)
    assert [r.request_id for r in real.real.waiting] == []
    for records in (mine, theirs):
        assert records[1].scheduled == [(0, 1), (1, 1), (4, 5)]  # 2 and 3 set aside
        assert records[2].scheduled == [(0, 1), (3, 63)]  # 3 first: the reversed order
        assert records[3].scheduled == [(0, 1), (2, 63)]


# --------------------------------------------------------------------------- real raises
def test_equal_priority_and_arrival_is_reported_as_the_real_type_error():
    """PRIORITY policy: two requests with equal (priority, arrival_time) make vLLM 0.11.0's
    waiting heap compare two `Request` objects, which define no order: TypeError. The
    comparison reports it (type, phase, step) instead of crashing, and kvsim's 0.11.0 pin ends
    the run on the same step (else `run_workload` returns a divergence, not a `RealRaised`)."""
    from sim.vllm_real.sched_lockstep import RealRaised, SchedVerifyResult, Workload, run_workload
    from sim.vllm_real.v1_sched_adapter import RequestSpec, SchedCase

    install = _install()
    case = SchedCase(num_blocks=20, block_size=16, max_model_len=128, max_num_seqs=4,
                     max_num_batched_tokens=64, policy="priority")  # fmt: skip
    requests = (
        RequestSpec(0, ((1000, 10),), 2, 0, 0.0),
        RequestSpec(1, ((1001, 10),), 2, 0, 0.0),
    )
    result = SchedVerifyResult("0.11.0", install.version)
    outcome = run_workload(0, Workload(case, requests), "0.11.0", install, result)
    assert isinstance(outcome, RealRaised)
    assert (outcome.upstream_type, outcome.phase, outcome.step) == ("TypeError", "add_request", 0)
    assert "'<' not supported" in outcome.message
    # Distinct arrival times: the same two requests run to the end on both sides.
    distinct = (requests[0], RequestSpec(1, ((1001, 10),), 2, 0, 0.001))
    assert run_workload(0, Workload(case, distinct), "0.11.0", install, result) is None
    assert result.num_steps >= 2


def test_an_exception_raised_outside_vllm_is_not_reported_as_vllm():
    """Only what vLLM's own code raised is a finding; the adapter's own errors propagate."""
    from sim.vllm_real.v1_sched_adapter import RealV1Scheduler, SchedCase

    install = _install()
    real = RealV1Scheduler(SchedCase(20, 16, 128, 4, 64), install=install)

    def broken() -> None:
        raise KeyError("adapter bug")

    with pytest.raises(KeyError):
        real._guard("test", broken)


# --------------------------------------------------------------------------- the CLI
def test_cli_verify_scheduler_reports_both_pins():
    from sim.cli.main import app

    _install()
    args = ["verify", "--scheduler", "--num-workloads", "3", "--fast-path"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stdout.splitlines() if " vs vLLM " in line]
    assert all("(fast path)" in line for line in lines)
    assert [line.split(" scheduler")[0] for line in lines] == [
        "v1-engine @0.11.0",
        "v1-engine @4ac7713",
    ]
    assert all("identical over 3 workloads" in line for line in lines)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--design", "v0-fixed"], "has no vLLM scheduler"),
        (["--pin", "0.9"], "--pin: unknown vLLM version '0.9'"),
        (["--num-workloads", "0"], "--num-workloads 0: must be at least 1"),
        (["--trace", "no-such-trace.csv"], "no-such-trace.csv"),
    ],
)
def test_cli_verify_scheduler_bad_input_is_exit_2(args, message):
    from sim.cli.main import app

    result = CliRunner().invoke(app, ["verify", "--scheduler", *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
