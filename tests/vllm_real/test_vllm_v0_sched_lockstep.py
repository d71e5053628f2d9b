"""v0 scheduler lockstep tier: kvsim's V0Scheduler against vLLM 0.5.4's real Scheduler, per step.

Skipped, with the reason shown, when `.vllm/0.5.4` (or $KVSIM_VLLM_ROOT_0_5_4) is absent.
Run: `bash scripts/setup_vllm.sh 0.5.4 && pytest -m vllm tests/vllm_real/test_vllm_v0_sched_lockstep.py`.
With KVSIM_REQUIRE_VLLM=1 (CI, `.ci/run`) a missing install fails the run instead.
"""

from __future__ import annotations

import random

import pytest

from sim import native
from tests.harness.vllm_install import load_or_skip

pytestmark = pytest.mark.vllm

#: A mutation replaces a method or property of kvsim's scheduler classes; the compiled core's
#: classes (`sim.native`) cannot have one replaced, so those tests run on the sources tier only.
_on_sources_only = pytest.mark.skipif(
    native.selected() is native.Selection.COMPILED,
    reason="monkeypatching a compiled class has no effect; the sources tier runs this mutation",
)


def _install():
    return load_or_skip("0.5.4")


def _verify(workloads):
    from sim.vllm_real.v0_sched_lockstep import verify_v0_scheduler

    return verify_v0_scheduler(workloads=workloads, install=_install())


def _caching_workloads(num, seed):
    from sim.vllm_real.v0_sched_case import random_v0_caching_workload

    rng = random.Random(seed)
    return [random_v0_caching_workload(rng) for _ in range(num)]


def _workload(case, requests):
    from sim.vllm_real.sched_case import RequestSpec
    from sim.vllm_real.v0_sched_case import V0Workload

    return V0Workload(case, tuple(RequestSpec(*r) for r in requests))


# --------------------------------------------------------------------------- random workloads
def test_random_workloads_identical_step_by_step():
    """The acceptance tier: 60 random workloads over both real block managers (chunked or not,
    prefix caching, sliding windows, recompute / swap / auto preemption) decide identically
    on every step, or end on the same step as vLLM's own raise."""
    from sim.vllm_real.v0_sched_lockstep import verify_v0_scheduler

    result = verify_v0_scheduler(num_workloads=60, seed=0, install=_install())
    assert result.identical, result.summary()
    assert result.num_workloads == 60 and set(result.per_design) == {"v0-v1", "v0-v2"}
    assert result.num_workloads - len(result.real_raised) >= 45
    assert result.num_steps > 2000
    assert result.num_preemptions > 0 and result.num_swap_outs > 0
    assert result.num_caching_workloads > 0 and result.num_chunked_workloads > 0
    assert result.num_window_workloads > 0


def test_caching_workloads_identical_block_for_block():
    """Workloads that make the prefix cache evict: the same physical blocks in every scheduled
    group's table on every step (the LRU order `access_all_blocks_in_seq` stamps)."""
    result = _verify(_caching_workloads(40, seed=1))
    assert result.identical, result.summary()
    assert result.num_caching_workloads == 40


# --------------------------------------------------------------------------- mutations
@_on_sources_only
def test_the_comparison_catches_schedule_without_the_access_stamps(monkeypatch):
    """Seeded difference: kvsim's `schedule` without its per-step `access_all_blocks_in_seq`
    / `mark_blocks_as_computed` (the pre-lockstep model) -> a table differs: the evictor took
    another cached block than vLLM's."""
    from sim.scheduler.v0.scheduler import V0Scheduler

    monkeypatch.setattr(V0Scheduler, "_touch_scheduled", lambda self, plan, now_s: None)
    result = _verify(_caching_workloads(40, seed=1))
    assert result.divergence is not None and result.divergence.what == "tables"


@_on_sources_only
def test_the_comparison_catches_a_seeded_requeue_order(monkeypatch):
    """Seeded difference: the kept prefill-stage groups back in front of the decodes (kvsim's
    old chunked requeue) -> the running queue differs."""
    from sim.scheduler.v0.outputs import RunningOutputs

    monkeypatch.setattr(RunningOutputs, "kept", property(lambda self: self.prefill + self.decode))
    result = _verify([_chunked_requeue_case()])
    assert result.divergence is not None and result.divergence.what == "queues"


def test_the_comparison_catches_a_seeded_free_count(monkeypatch):
    """Seeded difference: kvsim's side reports one more free GPU block after every update."""
    from sim.vllm_real.v0_sched_lockstep import KvsimV0Side

    step = KvsimV0Side.step

    def off_by_one(self, now_s):
        record = step(self, now_s)
        record.free_gpu_after_update += 1
        return record

    monkeypatch.setattr(KvsimV0Side, "step", off_by_one)
    result = _verify([_chunked_requeue_case()])
    assert result.divergence is not None and result.divergence.what == "free_gpu_after_update"


# --------------------------------------------------------------------------- the divergences found
def _chunked_requeue_case():
    from sim.vllm_real.v0_sched_case import V0SchedCase

    case = V0SchedCase("v2", 15, 30, 8, 96, 5, 16, enable_chunked_prefill=True, sliding_window=25)
    return _workload(
        case,
        [(0, ((1000, 31),), 23, 2, 2.0), (1, ((1001, 4),), 6, 2, 2.001),
         (2, ((1, 8), (1002, 39)), 22, 7, 7.002), (3, ((1, 20), (1003, 27)), 10, 8, 8.003),
         (4, ((1004, 25),), 5, 4, 4.004), (5, ((1005, 1),), 24, 7, 7.005),
         (6, ((2, 8), (1006, 35)), 5, 4, 4.006), (7, ((1, 16), (1007, 40)), 22, 4, 4.007)],
    )  # fmt: skip


def test_chunked_requeue_puts_kept_decodes_before_kept_prefill_chunks():
    """The lockstep's first finding (seed 0, workload 4; fixed in kvsim): 0.5.4's chunked
    policy requeues the new prefills, then the running decodes, then the running prefill-stage
    groups (scheduler.py:L886-891); kvsim put the prefill-stage ones first. At step 4 vLLM's
    running queue is [4, 0, 1]: request 1's prompt is still being chunked."""
    result = _verify([_chunked_requeue_case()])
    assert result.identical, result.summary()


def test_swapped_prefill_stage_group_is_not_chunked_on_swap_in():
    """Finding (seed 1, workload 66; fixed in kvsim): the chunked policy calls
    `_schedule_swapped` without chunking (L866-867), so a swapped-out prefill-stage group comes
    back only when its whole rest fits the budget; kvsim chunked it (step 30: kvsim scheduled
    (3, 15), vLLM only the decode (2, 1))."""
    from sim.vllm_real.v0_sched_case import V0SchedCase

    case = V0SchedCase("v1", 30, 15, 8, 128, 4, 16, enable_chunked_prefill=True,
                       preemption_mode="swap")  # fmt: skip
    workload = _workload(
        case,
        [(0, ((2, 20), (1000, 56)), 18, 6, 6.0), (1, ((1001, 4),), 5, 6, 6.001),
         (2, ((0, 16), (1002, 50)), 21, 6, 6.002), (3, ((2, 16), (1003, 62)), 9, 6, 6.003),
         (4, ((1004, 14),), 5, 5, 5.004)],
    )  # fmt: skip
    result = _verify([workload])
    assert result.identical, result.summary()
    assert result.num_swap_outs > 0


def test_outputs_are_applied_in_upstreams_order_so_finishes_free_in_it():
    """Finding (seed 1, workload 5; fixed in kvsim): `_process_model_outputs` walks
    `scheduled_seq_groups` (new prefills first, L899-903), so two requests finishing in one
    chunked step free in that order; kvsim's walk order finished 5 before 0 (step 30)."""
    from sim.vllm_real.v0_sched_case import V0SchedCase

    case = V0SchedCase("v1", 9, 4, 16, 64, 6, 128, enable_chunked_prefill=True,
                       preemption_mode="recompute")  # fmt: skip
    workload = _workload(
        case,
        [(0, ((1000, 28),), 16, 3, 3.0), (1, ((2, 32), (1001, 19)), 16, 8, 8.001),
         (2, ((2, 32), (1002, 19)), 6, 0, 0.002), (3, ((1, 20), (1003, 9)), 14, 5, 5.003),
         (4, ((2, 16), (1004, 25)), 12, 8, 8.004), (5, ((1005, 32),), 8, 8, 8.005)],
    )  # fmt: skip
    result = _verify([workload])
    assert result.identical, result.summary()


def test_swapped_in_decodes_requeue_before_swapped_in_prefill_chunks():
    """Finding (`kvsim verify --scheduler --design v0-v2 --vllm-version 0.5.4 --seed 0`,
    workload 188; fixed in kvsim): the chunked policy requeues the swapped-in decodes before
    the swapped-in prefill-stage groups (L892-895); kvsim kept swap-in order (step 27: running
    [7, 0, 8, 4, 1] on kvsim, [7, 0, 8, 1, 4] on vLLM)."""
    from sim.vllm_real.v0_sched_case import V0SchedCase

    case = V0SchedCase("v2", 26, 13, 8, 128, 6, 16, enable_chunked_prefill=True,
                       enable_prefix_caching=True, preemption_mode="swap")  # fmt: skip
    workload = _workload(
        case,
        [(0, ((1000, 21),), 21, 6, 6.0), (1, ((1, 8), (1001, 1)), 10, 7, 7.001),
         (2, ((1, 8), (1002, 54)), 20, 0, 0.002), (3, ((2, 8), (1003, 19)), 7, 1, 1.003),
         (4, ((1004, 51),), 23, 6, 6.004), (5, ((0, 20), (1005, 31)), 3, 5, 5.005),
         (6, ((1006, 23),), 8, 8, 8.006), (7, ((1007, 12),), 19, 6, 6.007),
         (8, ((1008, 43),), 17, 4, 4.008)],
    )  # fmt: skip
    result = _verify([workload])
    assert result.identical, result.summary()
    assert result.num_swap_outs > 0


def test_cli_verify_scheduler_v0_design(capsys):
    """`kvsim verify --scheduler --design v0-v1 --vllm-version 0.5.4`: the v0 lockstep."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    _install()
    args = ["verify", "--scheduler", "--design", "v0-v1", "--vllm-version", "0.5.4",
            "--num-workloads", "5"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert (
        "v0 scheduler @0.5.4 vs vLLM 0.5.4: identical over 5 workloads (5 v0-v1;" in result.stdout
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--trace", "t.jsonl"], "--trace is for the V1 scheduler; --design v0-v1 has none"),
        (["--pin", "0.11.0"], "--pin is for the V1 scheduler"),
        (["--async"], "--async is for the V1 scheduler"),
        (["--num-workloads", "0"], "--num-workloads"),
    ],
)
def test_cli_verify_v0_scheduler_bad_input_is_exit_2(args, message):
    """Options of the V1 lockstep only, or no workloads: one line, exit 2."""
    from typer.testing import CliRunner

    from sim.cli.main import app

    base = ["verify", "--scheduler", "--design", "v0-v1", "--vllm-version", "0.5.4"]
    result = CliRunner().invoke(app, [*base, *args])
    assert result.exit_code == 2, result.output
    assert message in result.stderr
