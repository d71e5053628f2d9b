"""The admission reserve (`sim.planning.admission_reserve`, vllm #54703) and the startup
bound it shares with vLLM's pool sizing (`VllmPin.window_bound_tokens`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.kv.pins import VllmPin
from sim.kv.types import cdiv
from sim.planning.admission_reserve import admission_reserve, group_reserve
from sim.scenario.resolve import resolve
from sim.scenario.schema import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
GEMMA2 = ROOT / "scenarios" / "gemma2_hybrid_v1.yaml"


def test_vllm_54703_numbers_tiny_window_conv_state():
    """#54703's arithmetic: 32,768 tokens in flight, a conv state as a 4-token window in
    4-token blocks and a 512-token window in 32-token blocks, a long request."""
    reserve = admission_reserve((4, 512), (4, 32), 10_000, 32_768, 131_072, 65_536)
    conv, swa = reserve.groups
    assert (conv.charged_blocks, conv.resident_blocks) == (8_194, 2)
    assert (swa.charged_blocks, swa.resident_blocks) == (1_041, 17)
    assert reserve.reserved_blocks == 8_192 + 1_024
    assert reserve.reserved_share == pytest.approx(9_216 / 9_235)
    assert (reserve.gate_concurrency, reserve.pooled_concurrency) == (1, 41)


@given(
    window=st.one_of(st.none(), st.integers(1, 5_000)),
    block_size=st.sampled_from([1, 4, 16, 32]),
    tokens=st.integers(1, 20_000),
    in_flight=st.one_of(st.none(), st.integers(1, 40_000)),
    extra=st.integers(0, 10_000),
)
def test_charge_bounds(window, block_size, tokens, in_flight, extra):
    """The charge never exceeds the whole sequence nor falls below what is held once
    processed; full attention reserves nothing; more tokens in flight never charge less;
    with no cap (0.19.1) the charge is the whole sequence."""
    max_model_len = 20_000
    g = group_reserve(0, window, block_size, tokens, in_flight, max_model_len)
    assert g.resident_blocks <= g.charged_blocks <= cdiv(tokens, block_size)
    if window is None or in_flight is None:
        assert g.charged_blocks == cdiv(tokens, block_size)
    if window is None:
        assert g.reserved_blocks == 0
    if in_flight is not None:
        more = group_reserve(0, window, block_size, tokens, in_flight + extra, max_model_len)
        assert more.charged_blocks >= g.charged_blocks


def _reserve(version: str, async_scheduling: bool) -> dict | None:
    scenario = load_scenario(GEMMA2)
    sched = scenario.scheduler.model_copy(
        update={
            "vllm_version": version,
            "async_scheduling": async_scheduling,
            "max_model_len": 8192,
            "max_num_batched_tokens": 2048,
        }
    )
    resolved = resolve(scenario.model_copy(update={"scheduler": sched}), GEMMA2.parent)
    return resolved.inputs.get("admission_reserve")


@pytest.mark.parametrize(
    ("version", "async_scheduling", "in_flight"),
    [
        ("0.33.0", True, 4096),
        ("0.33.0", False, 2048),
        ("0.26.0", True, 4096),
        ("0.25.1", True, 2048),
    ],
)
def test_gemma2_reserve_counts_the_release_bound(version, async_scheduling, in_flight):
    """Gemma-2 (W=4,096, bs=16), max_model_len 8,192: the sliding group is charged
    min(512, cdiv(4,095 + T, 16) + 1) and holds 257 once processed; T doubles under async from
    0.26.0 only."""
    reserve = _reserve(version, async_scheduling)
    assert reserve is not None and reserve["in_flight_tokens"] == in_flight
    sliding, full = reserve["groups"]
    assert sliding["charged_blocks"] == min(512, cdiv(4095 + in_flight, 16) + 1)
    assert (sliding["resident_blocks"], full["reserved_blocks"]) == (257, 0)


def test_no_reserve_without_the_full_sequence_gate():
    assert _reserve("0.11.0", True) is None


def test_0_19_1_charges_the_whole_sequence():
    reserve = _reserve("0.19.1", False)
    assert reserve is not None and reserve["charged_blocks"] == 2 * 512


def test_window_bound_tokens_per_release():
    assert VllmPin.V0_25_1.window_bound_tokens(8192, 2) == 8192
    assert VllmPin.V0_26_0.window_bound_tokens(8192, 2) == 16_384
    assert VllmPin.V0_33_0.window_bound_tokens(8192, 1) == 8192


def _startup(version: str, async_scheduling: bool) -> None:
    """One 8,192-token request with a 4,096-token window, bs 16, budget 2,048: the sliding
    group needs cdiv(4,095 + T, 16) + 1 blocks at startup (385 for T = 2,048, 513 for 4,096)."""
    from sim.scenario.schema import Scenario

    scenario = Scenario.model_validate(
        {
            "name": "startup-bound",
            "model": None,
            "cache": {"block_size": 16, "num_gpu_blocks": 400, "sliding_window": 4096},
            "scheduler": {
                "design": "v1-engine",
                "vllm_version": version,
                "max_model_len": 8192,
                "max_num_batched_tokens": 2048,
                "async_scheduling": async_scheduling,
            },
            "workload": {
                "kind": "inline",
                "requests": [{"arrival_s": 0.0, "prompt_tokens": 8, "output_tokens": 1}],
            },
            "step_time": {"linear": {"fixed_s": 0.001}},
        }
    )
    resolve(scenario, ".")


def test_startup_check_counts_in_flight_tokens_regression_0_26_async():
    """Regression: kvsim's startup check charged a sliding window W - 1 + the token budget on
    every pin; from 0.26.0 vLLM sizes it on max_in_flight_tokens, twice the budget under
    async (`max_memory_usage_bytes`), so 400 blocks start 0.25.1 and 0.26.0 synchronous but
    not 0.26.0 async (513 > 399)."""
    _startup("0.25.1", True)
    _startup("0.26.0", False)
    with pytest.raises(ScenarioError, match="needs 513 blocks but only 399"):
        _startup("0.26.0", True)


def test_gemma2_figures_docs_findings_quotes():
    """docs/findings.md: Gemma-2-9B on 0.33.0 (its defaults: async, an 8,192-token budget),
    max_model_len 8,192, the derived 21,093 blocks (21,296 before the CUDA-graph estimate):
    255 of 1,024 blocks per request reserved, 20 requests at once by the gate, 26 pooled."""
    scenario = load_scenario(GEMMA2)
    sched = scenario.scheduler.model_copy(update={"vllm_version": "0.33.0", "max_model_len": 8192})
    resolved = resolve(scenario.model_copy(update={"scheduler": sched}), GEMMA2.parent)
    reserve = resolved.inputs["admission_reserve"]
    assert resolved.inputs["num_gpu_blocks"] == 21_093
    assert (reserve["charged_blocks"], reserve["resident_blocks"]) == (1_024, 769)
    assert (reserve["gate_concurrency"], reserve["pooled_concurrency"]) == (20, 26)
    text = (ROOT / "docs" / "findings.md").read_text(encoding="utf-8")
    assert "255 of 1,024 blocks per request" in text and "admits 20 such requests" in text


def test_chunked_local_group_reserve_worked_example():
    """The docstring's Llama-4 numbers: chunks of 8,192 in 16-token blocks, 16,384 tokens in
    flight (0.26.0 on, async), a 131,071-token request: the gate charges cdiv(8,192 + 16,384,
    16) = 1,536 blocks; once processed the request holds its last chunk, 8,192 - 7,680 = 512.
    0.19.1 (no cap) charges all 8,192."""
    g = group_reserve(0, None, 16, 131_071, 16_384, 131_072, attention_chunk_size=8_192)
    assert (g.charged_blocks, g.resident_blocks, g.reserved_blocks) == (1_536, 512, 1_024)
    uncapped = group_reserve(0, None, 16, 131_071, None, 131_072, attention_chunk_size=8_192)
    assert uncapped.charged_blocks == 8_192
    reserve = admission_reserve(
        (None, None), (16, 16), 20_000, 16_384, 131_072, 131_071, chunk_sizes=(8_192, None)
    )
    assert reserve.charged_blocks == 1_536 + 8_192
