"""The figures README.md quotes for Gemma-3-27B across the V1 releases
(scenarios/gemma3_hybrid_versions_v1.yaml; "What kvsim has found so far").

The table itself is checked by tests/docs/test_readme.py, which runs the README's console block
as written. Here: the startup figures behind it (resolved, no simulation; fast) and the
counterfactual runs that trace each difference to one release change (slow tier)."""

from __future__ import annotations

from pathlib import Path

import pytest

import sim
from sim.scenario.overrides import apply_overrides
from sim.scenario.resolve import resolve
from sim.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "gemma3_hybrid_versions_v1.yaml"
README = ROOT / "README.md"
PINS = ["0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]

#: Per pin: blocks, the logged size (tokens) and concurrency, the startup charge of one
#: max_model_len request.
STARTUP = {
    "0.11.0": (8_431, "19,264", "1.53x", 5_510),
    "0.19.1": (13_651, "31,200", "2.48x", 5_510),
    "0.20.0": (14_494, "33,120", "2.63x", 5_510),
    "0.25.1": (14_494, "86,195", "2.63x", 5_510),
    "0.26.0": (14_494, "55,341", "1.69x", 8_582),
    "0.33.0": (14_494, "55,341", "1.69x", 8_582),
}


def _inputs(version: str) -> dict:
    scenario = apply_overrides(load_scenario(SCENARIO), {"scheduler.vllm_version": version})
    return resolve(scenario, base_dir=SCENARIO.parent).inputs


@pytest.mark.parametrize("version", PINS)
def test_each_releases_pool_log_and_startup_charge(version: str) -> None:
    blocks, tokens, concurrency, startup = STARTUP[version]
    inputs = _inputs(version)
    assert inputs["num_gpu_blocks"] == blocks
    assert inputs["vllm_kv_cache_log"] == [
        f"GPU KV cache size: {tokens} tokens",
        f"Maximum concurrency for 32,768 tokens per request: {concurrency}",
    ]
    assert inputs["startup_blocks_per_request"] == startup


def test_the_extra_blocks_are_the_utilization_step() -> None:
    """0.02 of the driver's 79.19 GiB less 0.20.0's CUDA-graph estimate (`sim.memory.cudagraph`),
    in blocks of 10 layers x 16 tokens x 2 x 16 x 128 x 2 B."""
    old, new = _inputs("0.19.1")["memory"], _inputs("0.20.0")["memory"]
    step = int(new["total_memory_bytes"] * 0.92) - int(old["total_memory_bytes"] * 0.9)
    assert old["cudagraph_bytes"] == 0 and new["cudagraph_bytes"] == 595_507_201
    extra = new["available_kv_bytes"] - old["available_kv_bytes"]
    assert extra == step - new["cudagraph_bytes"]
    assert (round(step / 1e9, 2), round(new["cudagraph_bytes"] / 1e9, 2)) == (1.70, 0.60)
    assert new["block_bytes"] == 10 * 16 * 2 * 16 * 128 * 2 == 1_310_720
    assert 14_494 - 13_651 == 843 == extra // new["block_bytes"]


def test_0_19_1s_extra_blocks_are_the_sampler_it_no_longer_sorts() -> None:
    """0.11.0 sorts 1,024 rows of Gemma-3's 262,208-entry logits (9.75 fp32 copies, 10.47 GB);
    0.19.1's Triton kernel keeps 3.25 copies plus 132 buffer rows (3.63 GB): 5,220 blocks."""
    old, new = _inputs("0.11.0")["memory"], _inputs("0.19.1")["memory"]
    logits = 1_024 * 262_208 * 4
    assert old["peak_activation_bytes"] == int(9.75 * logits) == 10_471_538_688
    assert new["peak_activation_bytes"] == int(3.25 * logits) + 132 * 262_208 * 4
    saved = old["peak_activation_bytes"] - new["peak_activation_bytes"]
    assert new["available_kv_bytes"] - old["available_kv_bytes"] == saved
    assert 13_651 - 8_431 == 5_220 == new["available_kv_bytes"] // new["block_bytes"] - 8_431


def test_the_gates_charge_per_release() -> None:
    """0.19.1: 7 x 2,048 blocks against 13,650 usable (the gate never admits such a prompt);
    0.26.0: 6 sliding groups x 1,089 + 2,048, 72% of it never held at once (2,438)."""
    gate = _inputs("0.19.1")["admission_reserve"]
    assert (gate["charged_blocks"], gate["usable_blocks"], gate["gate_concurrency"]) == (
        14_336, 13_650, 0)  # fmt: skip
    late = _inputs("0.26.0")["admission_reserve"]
    sliding = [g["charged_blocks"] for g in late["groups"] if g["sliding_window"]]
    assert sliding == [1_089] * 6 and late["charged_blocks"] == 8_582
    assert late["resident_blocks"] == 2_438 and round(late["reserved_share"] * 100) == 72
    assert late["in_flight_tokens"] == 2 * 8_192


def test_a_mamba_hybrids_log_jumps_five_fold_at_0_25_1() -> None:
    """The README's Nemotron-H overrides: one pool from 0.20.0, two logged sizes."""
    logged = {}
    for version in ("0.20.0", "0.25.1", "0.33.0"):
        scenario = apply_overrides(load_scenario(SCENARIO), {
            "scheduler.vllm_version": version, "model": "nemotron-h-8b",
            "cache.enable_prefix_caching": False, "scheduler.max_model_len": 8192})  # fmt: skip
        inputs = resolve(scenario, base_dir=SCENARIO.parent).inputs
        assert inputs["num_gpu_blocks"] == 6_875 and inputs["startup_blocks_per_request"] == 22
        assert inputs["hybrid_pool"]["block_size"] == 528
        logged[version] = inputs["vllm_kv_cache_log"]
    assert logged["0.20.0"][0] == "GPU KV cache size: 518,496 tokens"
    assert logged["0.25.1"] == logged["0.33.0"]
    assert logged["0.25.1"][0] == "GPU KV cache size: 2,560,000 tokens"
    assert {lines[1][-7:] for lines in logged.values()} == {"312.50x"}


def test_the_readme_quotes_these_figures() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())  # line breaks aside
    for quoted in ("8,431 blocks on 0.11.0, 13,651 on 0.19.1, 14,494 from 0.20.0", "(10.47 GB)",
                   "(3.63 GB;", "5,220 more blocks", "843 more blocks", "1.70 GB",
                   "0.60 GB CUDA-graph estimate", "454 blocks fewer than 0.19.1",
                   "(566.3 tok/s, 8.21 s)", "from 7.81 s to 6.97 s", "rises 1.5%",
                   "`GPU KV cache size: 33,120 tokens`", "86,195 on 0.25.1", "55,341 on 0.26.0",
                   "(19,264 on 0.11.0, 31,200 on 0.19.1)", "8,582 blocks, not 5,510",
                   "1.69x, not 2.63x", "14,336 in all", "against 13,650 usable",
                   "72% of those 8,582", "(2,438)", "1,089 blocks", "577 with",
                   "(567.0 tok/s, 7.81 s)", "530.8 tok/s and 9.32 s", "preempt 4 times each",
                   "the 2 against 4", "6,875 blocks",
                   "logged as 518,496 tokens on 0.20.0 and 2,560,000 from 0.25.1",
                   "run densely, 0.33.0's row is 0.26.0's (575.1 tok/s, TTFT p99 7.00 s)",
                   "sparse it reads 575.5 tok/s and 6.98 s"):  # fmt: skip
        assert quoted in text, quoted


def _row(overrides: dict) -> tuple[int, float, float]:
    summary = sim.run(SCENARIO, overrides=overrides).summary
    return (
        summary["num_preemptions"],
        round(summary["throughput_tok_per_s"], 1),
        round(summary["ttft_p99_s"], 2),
    )


@pytest.mark.slow
def test_each_difference_is_one_release_change(monkeypatch) -> None:
    """0.20.0 at 0.9 without its CUDA-graph estimate is 0.19.1's row (with it, 454 blocks
    fewer); 0.19.1 synchronous isolates the larger pool (0.11.0: 15.05 s) from async (7.81 s);
    with async off 0.20.0, 0.25.1 and 0.26.0 preempt alike (4), so the 2 vs 4 under async are
    0.26.0's in-flight accounting."""
    import sim.memory.derive as derive_module

    v = "scheduler.vllm_version"
    at_0_9 = {v: "0.20.0", "cache.gpu_memory_utilization": 0.9}
    assert _row(at_0_9) == (4, 566.3, 8.21)
    at_0_9_inputs = resolve(
        apply_overrides(load_scenario(SCENARIO), at_0_9), base_dir=SCENARIO.parent
    ).inputs
    assert _inputs("0.19.1")["num_gpu_blocks"] - at_0_9_inputs["num_gpu_blocks"] == 454
    with monkeypatch.context() as patch:  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0
        patch.setattr(derive_module, "cudagraph_estimate_bytes", lambda *a, **k: 0)
        assert _row(at_0_9) == (2, 567.0, 7.81)
    assert _row({v: "0.19.1"}) == (2, 567.0, 7.81)
    assert _row({v: "0.19.1", "scheduler.async_scheduling": False}) == (7, 530.8, 9.32)
    assert _row({v: "0.11.0"}) == (4, 469.7, 15.05)
    sync = {pin: _row({v: pin, "scheduler.async_scheduling": False})[0]
            for pin in ("0.20.0", "0.25.1", "0.26.0")}  # fmt: skip
    assert sync == {"0.20.0": 4, "0.25.1": 4, "0.26.0": 4}
    assert {pin: _row({v: pin})[0] for pin in ("0.20.0", "0.25.1", "0.26.0")} == {
        "0.20.0": 2, "0.25.1": 2, "0.26.0": 4}  # fmt: skip


def test_only_0_33_0_runs_sparse_retention_of_the_sliding_groups() -> None:
    """`vllm serve`'s 0.33.0 default (`prefix_cache_retention_interval` 0,
    sim/scenario/retention.py) reaches the sliding groups; no earlier release has it."""
    assert _inputs("0.33.0")["prefix_cache_retention_interval"] == 0
    for version in PINS[:-1]:
        assert "prefix_cache_retention_interval" not in _inputs(version), version


@pytest.mark.slow
def test_sparse_retention_is_the_only_difference_of_the_last_two_rows(monkeypatch) -> None:
    """No request hits the cache (the 120 conversations share no prefix); 0.33.0 run densely
    (retention left unset) is 0.26.0's row, and sparse it is the README's."""
    import sim.scenario.kv_pool as kv_pool_module

    result = sim.run(SCENARIO)
    assert int(result.requests["num_prefix_hit_tokens"].sum()) == 0
    assert _row({}) == (5, 575.5, 6.98)
    monkeypatch.setattr(kv_pool_module, "with_serve_retention", lambda config, inputs: config)
    assert _row({}) == _row({"scheduler.vllm_version": "0.26.0"}) == (4, 575.1, 7.0)
