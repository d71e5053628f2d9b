"""The CUDA-graph estimate vLLM 0.20.0+ subtracts from the KV budget (`sim.memory.cudagraph`):
which pins apply it, the graph counts the code gives, the docstring's worked example, the
replay of public logs (fit and held-out errors as docs/accuracy.md quotes them) and the
invariant that the pool never grows when the term applies."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.engine.run import resolve
from sim.memory import cudagraph
from sim.memory.cudagraph import (
    CUDAGRAPH_FIT,
    CaptureMode,
    capture_sizes,
    cudagraph_estimate_bytes,
    estimate_from_counts,
    graph_counts,
    split_rule,
)
from sim.memory.derive import MemoryBudget, derive_num_gpu_blocks
from sim.memory.terms import VllmEngine
from sim.memory.validation import load_logs, predicted_budget
from sim.scenario.schema import scenario_from_dict

LLAMA = get_model("llama-3.1-8b")
H100 = get_gpu("h100-sxm")
GIB, MIB = 2**30, 2**20
REQUESTS = [{"arrival_s": 0.0, "prompt_tokens": 64, "output_tokens": 4}]
LINEAR = {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001, "per_decode_seq_s": 0.0001}}


def _budget(release: str | None, **kw: Any) -> MemoryBudget:
    launch: dict[str, Any] = {"max_num_batched_tokens": 8192, "max_num_seqs": 256} | kw
    return derive_num_gpu_blocks(LLAMA, H100, engine=VllmEngine.V1, vllm_release=release, **launch)


@pytest.mark.parametrize("pin", ["0.20.0", "0.25.1", "0.26.0", "0.33.0"])
def test_pins_from_0_20_subtract_the_estimate(pin: str) -> None:
    b = _budget(pin)
    assert b.cudagraph_bytes > 0
    without = _budget(pin, estimate_cudagraphs=False)
    assert without.cudagraph_bytes == 0
    assert without.available_kv_bytes - b.available_kv_bytes == b.cudagraph_bytes


@pytest.mark.parametrize("pin", ["0.11.0", "0.19.1", None])
def test_releases_before_0_20_do_not(pin: str | None) -> None:
    assert _budget(pin).cudagraph_bytes == 0


def test_the_env_variable_opts_0_19_in() -> None:
    """0.19.1 has the profiler but its default is off (envs.py L1654-1656)."""
    assert _budget("0.19.1", estimate_cudagraphs=True).cudagraph_bytes > 0


def test_the_env_variable_cannot_add_a_profiler_0_11_lacks() -> None:
    """Regression: the override once turned the term on for releases with no profiler."""
    assert _budget("0.11.0", estimate_cudagraphs=True).cudagraph_bytes == 0


def test_enforce_eager_captures_nothing() -> None:
    assert _budget("0.33.0", enforce_eager=True).cudagraph_bytes == 0


def test_the_v0_engine_has_no_term() -> None:
    b = derive_num_gpu_blocks(LLAMA, H100, vllm_release="0.20.0")
    assert b.cudagraph_bytes == 0


def test_capture_sizes_of_the_default_launch() -> None:
    """0.20.0 config/vllm.py L1463-1524: 1, 2, 4, multiples of 8 below 256, of 16 to 512."""
    sizes = capture_sizes((0, 20), 256, 8192)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-2:] == [496, 512]
    assert len(sizes) == 3 + len(range(8, 256, 8)) + len(range(256, 513, 16)) == 51
    assert graph_counts(CaptureMode.FULL_AND_PIECEWISE, sizes, 256) == (51, 35)
    assert graph_counts(CaptureMode.PIECEWISE, sizes, 256) == (51, 0)
    assert graph_counts(CaptureMode.NONE, sizes, 256) == (0, 0)


def test_capture_sizes_follow_max_num_seqs_and_the_token_budget() -> None:
    assert capture_sizes((0, 20), 4, 8192) == [1, 2, 4, 8]  # largest = 4 x 2
    assert capture_sizes((0, 20), 256, 128)[-1] == 128  # capped at the token budget
    assert capture_sizes((0, 20), 1024, 8192)[-1] == 512


def test_0_25_adds_a_token_budget_below_the_max() -> None:
    """0.25.1 config/vllm.py L1766-1772: the budget itself joins the sizes; 0.20.0 pads to 96."""
    assert capture_sizes((0, 20), 256, 100)[-2:] == [88, 96]
    assert capture_sizes((0, 25), 256, 100)[-2:] == [96, 100]
    assert capture_sizes((0, 26), 256, 8192) == capture_sizes((0, 20), 256, 8192)


def test_0_33_adds_max_num_seqs_and_the_blackwell_ceiling() -> None:
    """0.33.0 config/vllm.py L2460-2600: max_num_seqs joins the sizes; 1024 on 10.x."""
    assert 100 in capture_sizes((0, 33), 100, 8192)
    assert 100 not in capture_sizes((0, 26), 100, 8192)
    assert capture_sizes((0, 33), 1024, 8192, compute_capability=(10, 0))[-1] == 1024
    assert capture_sizes((0, 33), 1024, 8192, compute_capability=(9, 0))[-1] == 512


def test_worked_example_of_the_module_docstring() -> None:
    first = int(0.33 * GIB)
    per_graph = int(2.3 * MIB)
    assert (first, per_graph) == (354_334_801, 2_411_724)
    expected = first + per_graph * ((51 - 1) + (35 - 1))
    assert expected == 556_919_617
    got = cudagraph_estimate_bytes(release=(0, 20), max_num_seqs=256, max_num_batched_tokens=8192)
    assert got == expected
    assert f"{got / GIB:.2f}" == "0.52"
    assert "556,919,617 B (0.52 GiB)" in (cudagraph.__doc__ or "")


def test_one_first_capture_however_many_modes() -> None:
    """FULL and PIECEWISE overlay one pool: max of the first captures, not their sum."""
    assert estimate_from_counts(1, 1) == estimate_from_counts(1, 0) == int(0.33 * GIB)
    assert estimate_from_counts(0, 0) == 0


def test_every_entry_records_the_split_its_id_gives() -> None:
    for log in cudagraph.load_cudagraph_logs():
        assert log.split == split_rule(log.id), log.id


def test_the_shipped_constants_are_the_fit_of_the_fit_half() -> None:
    assert cudagraph.fit_cudagraph() == CUDAGRAPH_FIT


def test_replay_errors_as_docs_quote_them() -> None:
    """docs/accuracy.md: the fit uses the 2 fit entries without unmodelled features (within
    0.6%); held out, n=4, median |error| 131.4%, worst 274.2% (three hybrid / speculative
    27B starts whose few graphs are small), the one modelled held-out entry +1.0%."""
    fit = dict((log.id, e) for log, e in cudagraph.relative_errors("fit", modelled_only=True))
    held = dict((log.id, e) for log, e in cudagraph.relative_errors("held_out"))
    assert len(fit) == 2 and max(abs(e) for e in fit.values()) <= 0.006
    assert len(held) == 4
    assert f"{cudagraph.median_abs_error('held_out'):.1%}" == "131.4%"
    assert f"{max(abs(e) for e in held.values()):.1%}" == "274.2%"
    modelled = cudagraph.relative_errors("held_out", modelled_only=True)
    assert [(log.id, f"{e:+.1%}") for log, e in modelled] == [("gpustack251-pw16-tp2", "+1.0%")]


def test_the_fit_ignores_unmodelled_entries() -> None:
    """A hybrid entry in the fit half is reported (-19.0%) but does not move the constants."""
    fit = dict((log.id, e) for log, e in cudagraph.relative_errors("fit"))
    assert f"{fit['club3090-652-qwen36-35b-a3b-5090']:+.1%}" == "-19.0%"
    logs = cudagraph.load_cudagraph_logs()
    as_if_modelled = [log.model_copy(update={"unmodelled": []}) for log in logs]
    assert cudagraph.fit_cudagraph(as_if_modelled) != cudagraph.fit_cudagraph(logs)


def test_startup_logs_before_0_20_are_not_affected() -> None:
    """Regression guard: the pool replay of sim/data/vllm_startup_logs.yaml (all < 0.20,
    the 0.19.0 one included) subtracts no CUDA-graph term."""
    for log in load_logs():
        assert predicted_budget(log).cudagraph_bytes == 0, log.id


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.integers(1, 2048),
    tokens=st.integers(1, 16384),
    util=st.floats(0.5, 0.95),
    pin=st.sampled_from(["0.20.0", "0.25.1", "0.26.0", "0.33.0"]),
)
def test_the_pool_never_grows_when_the_term_applies(
    seqs: int, tokens: int, util: float, pin: str
) -> None:
    launch: dict[str, Any] = {"max_num_seqs": seqs, "max_num_batched_tokens": max(tokens, seqs)}
    on = _budget(pin, gpu_memory_utilization=util, **launch)
    off = _budget(pin, gpu_memory_utilization=util, estimate_cudagraphs=False, **launch)
    assert on.num_gpu_blocks <= off.num_gpu_blocks
    assert off.available_kv_bytes - on.available_kv_bytes == on.cudagraph_bytes > 0


@settings(max_examples=60, deadline=None)
@given(seqs=st.integers(1, 2048), tokens=st.integers(1, 16384))
def test_more_sequences_never_shrink_the_estimate(seqs: int, tokens: int) -> None:
    def est(s: int) -> int:
        return cudagraph_estimate_bytes(
            release=(0, 20), max_num_seqs=s, max_num_batched_tokens=tokens
        )

    assert est(seqs) <= est(seqs + 1)


@pytest.mark.parametrize(("pin", "applies"), [("0.19.1", False), ("0.20.0", True)])
def test_a_scenarios_memory_terms_carry_the_estimate(pin: str, applies: bool) -> None:
    """The run's `inputs.memory` (where kvsim prints the pool's terms) has the term, and the
    pool it derives is the smaller by it."""
    data = {
        "name": "cudagraph",
        "model": "llama-3.1-8b",
        "cache": {"num_gpu_blocks": "derive"},
        "scheduler": {"design": "v1-engine", "max_model_len": 4096, "vllm_version": pin},
        "workload": {"kind": "inline", "requests": REQUESTS},
        "step_time": LINEAR,
    }
    inputs = resolve(scenario_from_dict(data)).inputs
    memory = inputs["memory"]
    settings = {name: s["value"] for name, s in inputs["settings"].items()}
    expected = cudagraph_estimate_bytes(
        release=(0, 20) if applies else (0, 19),
        max_num_seqs=settings["max_num_seqs"],
        max_num_batched_tokens=inputs["max_num_batched_tokens"],
    )
    assert memory["cudagraph_bytes"] == expected
    assert (expected > 0) is applies


def test_docs_accuracy_quotes_these_figures() -> None:
    """docs/accuracy.md "## KV memory" quotes the fit, the errors and the Llama example."""
    text = " ".join((Path(__file__).parents[2] / "docs" / "accuracy.md").read_text().split())
    fit = CUDAGRAPH_FIT
    held = [abs(e) for _, e in cudagraph.relative_errors("held_out")]
    fitted = [abs(e) for _, e in cudagraph.relative_errors("fit", modelled_only=True)]
    on = _budget("0.20.0", max_num_seqs=1024, gpu_memory_utilization=0.92)
    off = _budget(
        "0.20.0", max_num_seqs=1024, gpu_memory_utilization=0.92, estimate_cudagraphs=False
    )
    quoted = [
        f"{fit.first_capture_gib} GiB for the first capture and {fit.per_graph_mib} MiB a graph",
        f"{len(cudagraph.load_cudagraph_logs())} public",
        f"within {max(fitted):.1%}".replace("%", " %"),
        f"Held out: {len(held)}, median |error| {statistics.median(held):.0%}".replace("%", " %"),
        f"worst +{max(held):.0%}".replace("%", " %"),
        f"loses {on.cudagraph_bytes / GIB:.2f} GiB",
        f"{off.num_gpu_blocks:,} -> {on.num_gpu_blocks:,} blocks",
    ]
    for phrase in quoted:
        assert phrase in text, phrase
