"""The auditor's in-flight read check (`sim.audit.in_flight`): a sliding-window block freed
while an async step in flight reads it (vllm PR #47728 / vllm-ascend #13501)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.audit.in_flight import InFlightReads, first_read_position
from sim.engine.run import run
from sim.kv.config import KVCacheGroupSpec

ROOT = Path(__file__).resolve().parents[2]
BEFORE = ROOT / "tests/regressions/v1_engine_0_25_1_async_swa_freed_while_in_flight_vllm_47728.yaml"
CHUNKED = (
    ROOT
    / "tests/regressions/v1_engine_0_25_1_async_chunked_local_freed_while_in_flight_vllm_47728.yaml"
)
PINS_BEFORE_FIX = ["0.11.0", "0.19.1", "0.20.0", "0.25.1"]
PINS_WITH_FIX = ["0.26.0", "0.33.0"]


def _kinds(overrides: dict, scenario: Path = BEFORE) -> list[str]:
    result = run(scenario, overrides=overrides)
    return list(result.violations["kind"]) if len(result.violations) else []


def test_worked_example_window_128_block_32():
    """The docstring's numbers: a step from position 158 reads position 31, in block 0; the
    record holds until that block leaves the table, and is reported once."""
    tables = {0: [7, 8, 9, 10, 11]}

    def block_id_at(request_id: int, group: int, index: int) -> int | None:
        table = tables[request_id]
        return table[index] if index < len(table) and table[index] != 0 else None

    reads = InFlightReads((KVCacheGroupSpec(128),), 32, block_id_at)
    reads.step_scheduled(0, 158, 159)
    assert reads.pruned(0) == []
    tables[0][0] = 0  # the prune nulls block 0
    (lost,) = reads.pruned(0)
    assert (lost.block_index, lost.block_id, lost.first_position) == (0, 7, 31)
    assert reads.pruned(0) == []  # reported once
    reads.step_settled(0, 158)
    reads.step_scheduled(0, 159, 160)  # reads [32, 159]: block 1, beyond a prune on 160
    assert reads._steps == {}
    tables[0][1] = 0
    assert reads.pruned(0) == []


def test_full_attention_is_not_tracked():
    full = KVCacheGroupSpec()
    assert not InFlightReads((full, full), 16, lambda r, g, i: None).tracks_anything


def test_chunked_local_step_at_a_chunk_end_reads_the_whole_chunk():
    """Chunks of 8 in blocks of 4: the step computing position 7 reads from 0; its schedule
    makes C = 8, and a prune on 8 frees blocks 0 and 1, so block 0 is at risk; the step from
    position 8 reads from 8 and risks nothing."""
    chunked = KVCacheGroupSpec(attention_chunk_size=8)
    assert [first_read_position(chunked, p) for p in (7, 8, 15, 16)] == [0, 8, 8, 16]
    tables = {0: [5, 6, 7]}

    def block_id_at(request_id: int, group: int, index: int) -> int | None:
        table = tables[request_id]
        return table[index] if index < len(table) and table[index] != 0 else None

    reads = InFlightReads((chunked, KVCacheGroupSpec()), 4, block_id_at)
    reads.step_scheduled(0, 7, 8)
    tables[0][:2] = [0, 0]
    (lost,) = reads.pruned(0)
    assert (lost.group, lost.block_index, lost.block_id, lost.first_position) == (0, 0, 5, 0)
    reads.step_scheduled(0, 8, 9)
    assert 8 not in reads._steps[0]


@pytest.mark.parametrize("version", PINS_BEFORE_FIX)
def test_pins_before_0_26_free_a_block_in_flight_regression_vllm_47728(version):
    assert _kinds({"scheduler.vllm_version": version}) == ["freed_while_in_flight"]


@pytest.mark.parametrize("version", PINS_WITH_FIX)
def test_processed_basis_pins_keep_the_block_regression_vllm_47728(version):
    assert _kinds({"scheduler.vllm_version": version}) == []


def test_synchronous_scheduling_has_nothing_in_flight():
    assert _kinds({"scheduler.async_scheduling": False}) == []


def test_the_check_catches_a_fixed_release_pruning_on_c(monkeypatch):
    """Negative control: 0.26.0's model with its processed-basis prune switched off frees the
    block in flight, and the auditor says so (the check is not vacuous on fixed pins)."""
    from sim.kv.pins import VllmPin

    monkeypatch.setattr(VllmPin, "frees_on_processed_basis", property(lambda self: False))
    assert _kinds({"scheduler.vllm_version": "0.26.0"}) == ["freed_while_in_flight"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    version=st.sampled_from(PINS_WITH_FIX),
    window_blocks=st.integers(1, 6),
    block_size=st.sampled_from([4, 8, 16]),
    requests=st.lists(
        st.tuples(st.integers(1, 200), st.integers(1, 40), st.floats(0, 0.05)),
        min_size=1,
        max_size=6,
    ),
    budget=st.sampled_from([16, 64, 256]),
    spare_blocks=st.integers(0, 24),
)
def test_processed_basis_never_frees_a_block_in_flight(
    version, window_blocks, block_size, requests, budget, spare_blocks
):
    """Invariant: on the releases that prune on C minus the in-flight tokens, no block a step
    in flight reads is ever freed, whatever the window, chunking, preemption or timing."""
    overrides = {
        "scheduler.vllm_version": version,
        "scheduler.max_num_batched_tokens": budget,
        "cache.block_size": block_size,
        "cache.sliding_window": window_blocks * block_size + 1,
        # The startup check's bound for one 256-token request, plus a few (pool pressure).
        "cache.num_gpu_blocks": 256 // block_size + 2 + spare_blocks,
        "scheduler.max_model_len": 256,
        "workload.requests": [
            {"arrival_s": t, "prompt_tokens": p, "output_tokens": o}
            for p, o, t in sorted(requests, key=lambda r: r[2])
        ],
    }
    assert "freed_while_in_flight" not in _kinds(overrides)


@pytest.mark.parametrize("version", PINS_BEFORE_FIX + PINS_WITH_FIX)
def test_chunked_local_groups_free_a_chunk_in_flight_before_0_26_regression_vllm_47728(version):
    """The same race at a chunk boundary (Llama-4's layout, scaled down): three groups'
    chunk-0 blocks freed while the decode of position 127 reads them, one finding per group,
    on every pin before 0.26.0; none from 0.26.0."""
    kinds = _kinds({"scheduler.vllm_version": version}, CHUNKED)
    assert kinds == (["freed_while_in_flight"] * 3 if version in PINS_BEFORE_FIX else [])
