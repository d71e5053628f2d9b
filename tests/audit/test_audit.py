"""The auditor on the 4-vs-3 case (vLLM #7470) for every design, and its invariant checks."""

from __future__ import annotations

from typing import Protocol

import pytest

from sim.audit import (
    AuditedV0Manager,
    AuditedV1Manager,
    AuditError,
    AuditLevel,
    ViolationKind,
    ViolationPolicy,
    audited,
)
from sim.kv import AllocStatus, Design, KVCacheConfig, make_manager
from sim.kv.protocol import DecodeFastPath, PoolStats, V0BlockManager, V1KVCacheManager
from sim.kv.types import Sequence, SequenceGroup, SequenceStatus

BS = 16
W = 24  # v0-V2: M = 24 // 16 + 2 = 3 blocks; v0-V1: ceil(24 / 16) = 2 blocks


def _group(request_id: int, num_tokens: int) -> SequenceGroup:
    return SequenceGroup(request_id, [Sequence.new(request_id, num_tokens)])


def _admit(manager, group: SequenceGroup) -> None:
    assert manager.can_allocate(group) is AllocStatus.OK
    manager.allocate(group)
    for seq in group.seqs:
        seq.status = SequenceStatus.RUNNING


def _v0(design: Design, num_gpu_blocks: int = 10, policy=ViolationPolicy.RECORD):
    config = KVCacheConfig(num_gpu_blocks=num_gpu_blocks, block_size=BS, sliding_window=W)
    return audited(make_manager(design, config), policy=policy, level=AuditLevel.FULL)


def test_v0_v2_4_vs_3_is_one_admission_undercount_and_a_leak():
    manager = _v0(Design.V0_V2)
    _admit(manager, _group(0, 112))  # 7 blocks
    assert manager.get_num_free_gpu_blocks() == 3
    b = _group(7, 64)  # 4 blocks; can_allocate caps at min(4, M=3)
    assert manager.can_allocate(b) is AllocStatus.OK
    with pytest.raises(AuditError) as raised:
        manager.allocate(b)
    kinds = [v.kind for v in manager.violations]
    # A's allocation already took 7 blocks against 3 counted (it fit); B's needs 4 with 3 free.
    assert kinds == [
        ViolationKind.ADMISSION_OVERTAKE,
        ViolationKind.ADMISSION_UNDERCOUNT,
        ViolationKind.LEAKED_BLOCKS,
    ]
    overtake, undercount, leak = manager.violations
    assert (overtake.counted_blocks, overtake.needed_blocks, overtake.request_id) == (3, 7, 0)
    assert (undercount.counted_blocks, undercount.needed_blocks, undercount.free_blocks) == (
        3,
        4,
        3,
    )
    assert undercount.request_id == 7
    assert undercount.message == (
        "can_allocate counted 3 blocks for request 7 (64 tokens, window 3 blocks) "
        "but allocate needed 4 with 3 free"
    )
    assert raised.value.violation is undercount
    # The real code leaks the 3 ids it popped; under the record policy the auditor returns them.
    assert leak.recovered_blocks == 3
    assert "leaked 3 blocks" in leak.message
    assert manager.get_num_free_gpu_blocks() == 3
    assert manager.pool_stats().is_conserved


def test_v0_v2_4_vs_3_stop_policy_keeps_the_leak():
    manager = _v0(Design.V0_V2, policy=ViolationPolicy.STOP)
    _admit(manager, _group(0, 112))
    b = _group(1, 64)
    assert manager.can_allocate(b) is AllocStatus.OK
    with pytest.raises(AuditError):
        manager.allocate(b)
    assert manager.get_num_free_gpu_blocks() == 0  # as the real engine: 3 ids lost
    assert manager.violations[-1].recovered_blocks == 0


def _fill(manager, num_free_wanted: int, first_id: int = 100) -> None:
    """Admit 1-block sequences until `num_free_wanted` blocks are free."""
    request_id = first_id
    while manager.get_num_free_gpu_blocks() > num_free_wanted:
        _admit(manager, _group(request_id, BS))
        request_id += 1


@pytest.mark.parametrize("design", [Design.V0_V1, Design.V0_FIXED])
def test_4_vs_3_has_no_violation_on_consistent_v0_designs(design):
    manager = _v0(design)
    _admit(manager, _group(0, 112))
    _fill(manager, 3)
    assert manager.get_num_free_gpu_blocks() == 3
    b = _group(7, 64)
    assert manager.can_allocate(b) is AllocStatus.OK
    free_before = manager.get_num_free_gpu_blocks()
    manager.allocate(b)
    taken = free_before - manager.get_num_free_gpu_blocks()
    assert taken == manager.inner.admission_blocks(b) <= 3
    assert manager.violations == []


def test_4_vs_3_on_the_v1_engine_is_cannot_allocate_not_a_crash():
    config = KVCacheConfig(num_gpu_blocks=11, block_size=BS, sliding_window=W)
    manager = audited(make_manager(Design.V1_ENGINE, config), level=AuditLevel.FULL)
    a = Sequence.new(0, 112)
    assert manager.allocate_slots(a, 112) is not None
    assert manager.num_free_blocks == 3
    b = Sequence.new(7, 64)
    assert manager.allocate_slots(b, 64) is None
    assert manager.num_free_blocks == 3
    assert manager.violations == []


class _BrokenPool:
    """A manager whose pool loses a block: the auditor must notice on the next call."""

    block_size = BS
    watermark_blocks = 0

    def pool_stats(self) -> PoolStats:
        return PoolStats(num_total=10, num_free=4, num_held=5)

    def block_refcounts(self):
        return {}

    def seq_block_ids(self, seq_id):
        return []

    def max_seq_footprint(self, seq):
        return None

    def free(self, seq):
        pass


def test_conservation_breach_is_reported():
    manager = audited(_BrokenPool())
    manager.free(Sequence.new(1, 4))
    assert [v.kind for v in manager.violations] == [ViolationKind.CONSERVATION]
    assert "free 4 + held 5 != total 10" in manager.violations[0].message


def test_v0_v1_swap_out_of_a_wrapped_ring_is_a_double_free_violation():
    config = KVCacheConfig(num_gpu_blocks=10, num_cpu_blocks=10, block_size=BS, sliding_window=16)
    manager = audited(make_manager(Design.V0_V1, config), level=AuditLevel.FULL)
    group = _group(1, 64)  # ring of ceil(16/16) = 1 block: table [b, b, b, b]
    _admit(manager, group)
    assert manager.can_swap_out(group)
    with pytest.raises(AuditError):
        manager.swap_out(group)
    assert manager.violations[-1].kind is ViolationKind.DOUBLE_FREE
    assert "Double free" in manager.violations[-1].message


@pytest.mark.parametrize("error", [KeyError(7), AssertionError("kvsim invariant"), IndexError(3)])
def test_model_bug_is_not_a_manager_error_violation(error, monkeypatch):
    """Regression: the auditor recorded any KeyError / AssertionError / IndexError out of a
    model as a `manager_error` violation, so a kvsim bug read as a vLLM finding. Now only a
    `ManagerError` (a named upstream failure) is recorded; anything else propagates."""
    from sim.kv.v0_v2 import BlockSpaceManagerV2
    from sim.kv.v1_engine import KVCacheManager

    def broken(*args, **kwargs):
        raise error

    v0 = _v0(Design.V0_V2)
    monkeypatch.setattr(BlockSpaceManagerV2, "allocate", broken)
    group = _group(1, 16)
    assert v0.can_allocate(group) is AllocStatus.OK
    with pytest.raises(type(error)):
        v0.allocate(group)
    assert v0.violations == []

    v1 = audited(make_manager(Design.V1_ENGINE, KVCacheConfig(10, BS)), level=AuditLevel.FULL)
    monkeypatch.setattr(KVCacheManager, "allocate_slots", broken)
    with pytest.raises(type(error)):
        v1.allocate_slots(Sequence.new(1, 16), 16)
    assert v1.violations == []


def test_model_bug_propagates_out_of_a_run(monkeypatch):
    """At the run level too: a model's KeyError ends `sim.run` with the KeyError (an internal
    error with its traceback), not with a violation in the tables."""
    from pathlib import Path

    from sim.engine.run import run
    from sim.kv.v0_v2 import BlockSpaceManagerV2

    def broken(*args, **kwargs):
        raise KeyError("kvsim bug")

    monkeypatch.setattr(BlockSpaceManagerV2, "append_slots", broken)
    scenario = Path(__file__).resolve().parents[2] / "scenarios" / "swa_4_vs_3_v0_v2.yaml"
    with pytest.raises(KeyError, match="kvsim bug"):
        run(scenario)


def test_release_054_empty_append_index_error_is_a_manager_error_violation():
    """vLLM 0.5.4's IndexError (#7371), which the model raises on purpose as the named
    `EmptyAppendIndexError`, is a violation (the real engine raises there)."""
    from sim.kv.types import EmptyAppendIndexError, ManagerError

    config = KVCacheConfig(10, BS, vllm_pin="0.5.4")
    manager = audited(make_manager(Design.V0_V2, config), level=AuditLevel.FULL)
    group = _group(1, 64)
    _admit(manager, group)
    group.seqs[0].num_computed_tokens = 32  # a continuing chunk of a block-aligned prompt
    with pytest.raises(AuditError):
        manager.append_slots(group.seqs[0])
    assert [v.kind for v in manager.violations] == [ViolationKind.MANAGER_ERROR]
    assert "EmptyAppendIndexError" in manager.violations[0].message
    assert issubclass(EmptyAppendIndexError, IndexError) and issubclass(
        EmptyAppendIndexError, ManagerError
    )


# ----------------------------------------------------------------------------- pass-through


def _protocol_members(*protocols: type) -> set[str]:
    """The public methods, properties and attributes the manager protocols declare."""
    names: set[str] = set()
    for protocol in protocols:
        for cls in protocol.__mro__:
            if getattr(cls, "_is_protocol", False) and cls is not Protocol:
                names |= {n for n in vars(cls) if not n.startswith("_")}
                names |= {n for n in vars(cls).get("__annotations__", {}) if not n.startswith("_")}
    return names


def _audited_names(auditor: type) -> set[str]:
    """What the auditor itself defines (audited calls and its own queries)."""
    return {n for cls in auditor.__mro__[:-1] for n in vars(cls) if not n.startswith("_")}


def _uncovered(auditor: type, *protocols: type) -> set[str]:
    covered = _audited_names(auditor) | auditor.PASSED_THROUGH
    return _protocol_members(*protocols) - covered


AUDITORS = [
    (AuditedV0Manager, (V0BlockManager, DecodeFastPath)),
    (AuditedV1Manager, (V1KVCacheManager, DecodeFastPath)),
]


@pytest.mark.parametrize(
    ("auditor", "protocols"), AUDITORS, ids=lambda a: getattr(a, "__name__", "")
)
def test_every_manager_method_is_audited_or_listed(auditor, protocols):
    assert _uncovered(auditor, *protocols) == set()
    # A name both defined and listed would hide which of the two is meant.
    assert _audited_names(auditor) & auditor.PASSED_THROUGH == set()


def test_a_new_protocol_method_is_caught():
    class Extended(V1KVCacheManager, Protocol):
        def new_query(self) -> int: ...

        @property
        def new_count(self) -> int: ...

    assert _uncovered(AuditedV1Manager, Extended, DecodeFastPath) == {"new_query", "new_count"}


def test_an_unlisted_attribute_is_not_passed_through():
    inner = make_manager(Design.V1_ENGINE, KVCacheConfig(10, BS))
    manager = audited(inner)
    assert manager.block_size == inner.block_size  # listed
    # A public attribute of the real manager that the auditor neither defines nor lists (one
    # that exists, rather than one set on the fly: compiled managers take no new attributes).
    unlisted = sorted(
        name
        for name in dir(inner)
        if not name.startswith("_")
        and name not in type(manager).PASSED_THROUGH
        and not hasattr(type(manager), name)
    )
    assert unlisted, "every public attribute of the manager is audited or listed"
    with pytest.raises(AttributeError, match=f"neither audits nor passes through '{unlisted[0]}'"):
        getattr(manager, unlisted[0])
    assert getattr(manager, unlisted[0], None) is None


@pytest.mark.parametrize("pin", ["4ac7713", "0.11.0", "0.33.0"])
def test_audited_v1_manager_passes_its_pin_through(pin):
    """Regression (found by scripts/golden_tables.py while merging #21's branches): the V1
    auditor listed the old `vllm_release` query, not `pin`, so `policies_for` read None through
    the auditor and ran 0.33.0 scenarios under 4ac7713's admission rules."""
    from sim.scheduler.v1.release import policies_for

    config = KVCacheConfig(num_gpu_blocks=8, block_size=16, vllm_pin=pin)
    manager = make_manager(Design.V1_ENGINE, config)
    assert policies_for(audited(manager), 64).release is policies_for(manager, 64).release
    assert policies_for(audited(manager), 64).release.value == pin
