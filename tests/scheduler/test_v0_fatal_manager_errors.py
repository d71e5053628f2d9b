"""A v0 manager call that fails where the run cannot go on (a swap, a free) is a fatal error.

vLLM 0.5.4's scheduler catches nothing around `swap_out`, `swap_in` or `free`: the exception
leaves the engine at that call. kvsim records the violation and ends the run there with a
`fatal_error`, every unfinished request aborted; before, it failed the request and went on
from a half-swapped table, and a later call raised out of `sim.run` (an internal error).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sim.audit import AuditError, AuditLevel, ViolationKind, audited
from sim.ci.fuzz import run_case
from sim.ci.fuzz_cases import generate_case
from sim.ci.selfcheck import first_difference, tables_of, without_shortcuts
from sim.engine.run import run
from sim.kv import AllocStatus, Design, KVCacheConfig, make_manager
from sim.kv.types import DoubleFreeError, Sequence, SequenceGroup, SequenceStatus
from sim.kv.v0_v2 import BlockSpaceManagerV2
from sim.scenario.schema import load_scenario, scenario_from_dict
from tests.harness.kv_v0 import decode

REGRESSIONS = Path(__file__).resolve().parents[1] / "regressions"


def _assert_ended_by(result, fatal_prefix: str) -> None:
    """The run stopped at its fatal error, and no request was left half-way."""
    assert result.summary["fatal_error"].startswith(fatal_prefix)
    assert result.summary["stopped_early"] == f"fatal engine error: {result.summary['fatal_error']}"
    states = set(result.requests["state"])
    assert states <= {"finished", "aborted", "failed", "ignored"}, states
    assert "aborted" in states


def test_failed_swap_out_went_on_to_a_double_free():
    """Regression (fuzz v0-v2 case seeds 3212736091, 1562480905): v0-V2's swap_out of a table
    holding the null block returns the null block's id to the free list, then raises
    NullBlockWriteError (as vLLM does). kvsim went on, gave that id to another request, and a
    later free in `V0Scheduler.update` raised DoubleFreeError out of `sim.run`."""
    scenario = load_scenario(REGRESSIONS / "v0_v2_swap_out_null_block_is_fatal.yaml")
    result = run(scenario)
    _assert_ended_by(result, "swap_out raised NullBlockWriteError")
    kinds = list(result.violations["kind"])
    assert kinds == ["admission_overtake", "manager_error"]  # nothing after the swap_out
    assert result.violations.iloc[-1]["call"] == "swap_out"
    # The shortcut-free run (the fuzz self-check) ends the same way.
    slow = run(without_shortcuts(scenario))
    assert first_difference(tables_of(result), tables_of(slow)) is None


def test_failed_swap_in_freed_a_half_swapped_table():
    """Regression (fuzz v0-v2 case seed 725510040): a prefix-caching swap_in that the
    admission undercounted ran out of blocks half-way; kvsim failed the request and freed its
    table, whose unswapped block had no id: `assert block_id is not None` escaped `sim.run`.
    Also: the swapped-in requests of that step must stay queued, so the step's row and the
    final abort see them with the shortcuts on and off alike."""
    scenario = load_scenario(REGRESSIONS / "v0_v2_swap_in_undercount_is_fatal.yaml")
    result = run(scenario)
    _assert_ended_by(result, "swap_in of request 1 ran out of blocks")
    assert list(result.violations["kind"]) == ["swap_undercount"]
    slow = run(without_shortcuts(scenario))
    assert first_difference(tables_of(result), tables_of(slow)) is None


@pytest.mark.parametrize(
    ("case_seed", "kind"),
    [(3212736091, "manager_error"), (1562480905, "manager_error"), (725510040, "swap_undercount")],
)
def test_fuzz_cases_that_escaped_end_with_a_fatal_error(case_seed, kind):
    """The exact fuzz cases: a finding plus a fatal error, and the cross-check agrees."""
    case = run_case(generate_case("v0-v2", case_seed), cross_check=True)
    assert kind in case.kind_names
    assert case.fatal_error is not None
    assert case.difference is None


def test_double_free_in_update_escaped_the_run(monkeypatch):
    """Regression: `V0Scheduler.update` freed a finished request with nothing catching the
    auditor's error, so a DoubleFreeError there escaped `sim.run`. vLLM frees finished groups
    before returning their outputs, so the engine dies there: a double_free violation, the
    run's fatal error, and the request that could not be freed is aborted, not finished."""
    calls = []
    real_free = BlockSpaceManagerV2.free

    def free_raising_once(self, seq):
        calls.append(seq.seq_id)
        if len(calls) == 1:
            raise DoubleFreeError("block 3 freed with refcount 0")
        real_free(self, seq)

    monkeypatch.setattr(BlockSpaceManagerV2, "free", free_raising_once)
    requests = [
        {"arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 2},
        {"arrival_s": 0.0, "prompt_tokens": 20, "output_tokens": 6},
    ]
    data = {
        "name": "update-double-free",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 10, "num_cpu_blocks": 0},
        "scheduler": {"design": "v0-v2", "max_model_len": 64},
        "engine": {"audit_level": "full"},
        "workload": {"kind": "inline", "requests": requests},
        "step_time": {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001}},
    }
    result = run(scenario_from_dict(data))
    _assert_ended_by(result, "free raised DoubleFreeError: block 3 freed with refcount 0")
    assert list(result.violations["kind"]) == ["double_free"]
    assert list(result.requests["state"]) == ["aborted", "aborted"]
    assert len(calls) == 1  # nothing ran after the failed free


def test_stale_can_append_slots_yes_decided_the_kind():
    """Regression (fuzz v0-v2 --seed 2, case seed 3644697408, an internal inconsistency): the
    auditor kept a `can_append_slots` yes until a later no, so an append that no query
    preceded (the one right after a swap-in) was an append_undercount if some earlier step had
    asked, and a manager_error if the decode fast path had skipped that earlier query."""
    scenario = load_scenario(REGRESSIONS / "v0_v2_swap_in_append_no_stale_promise.yaml")
    fast, slow = run(scenario), run(without_shortcuts(scenario))
    assert first_difference(tables_of(fast), tables_of(slow)) is None
    assert list(fast.violations["kind"]) == ["manager_error"]
    assert "no can_append_slots yes before it" in fast.violations.iloc[0]["message"]


def test_a_can_append_slots_yes_covers_only_the_next_append():
    """The same at the auditor: 2 blocks; A (16 tokens) is asked about and appends a 2nd
    block; A's next block is then appended without a fresh query and runs dry."""
    config = KVCacheConfig(num_gpu_blocks=2, block_size=16)
    manager = audited(make_manager(Design.V0_V2, config), level=AuditLevel.FULL)
    group = SequenceGroup(0, [Sequence.new(0, 16)])
    assert manager.can_allocate(group) is AllocStatus.OK
    manager.allocate(group)
    seq = group.seqs[0]
    seq.status = SequenceStatus.RUNNING
    assert manager.can_append_slots(group)
    decode(manager, seq)  # token 17: the 2nd and last block
    assert manager.get_num_free_gpu_blocks() == 0
    decode(manager, seq, 15)  # 32 tokens: still 2 blocks
    with pytest.raises(AuditError):
        decode(manager, seq)  # token 33: a 3rd block, no query said yes to it
    assert [v.kind for v in manager.violations] == [ViolationKind.MANAGER_ERROR]
