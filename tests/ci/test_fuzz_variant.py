"""`kvsim fuzz --vllm-version / --hybrid / --async-mix` (`sim.ci.fuzz_variant`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.ci.fuzz import fuzz
from sim.ci.fuzz_cases import case_seed, draw_case, generate_case
from sim.ci.fuzz_variant import CaseVariant
from sim.cli.main import app
from sim.engine.run import run
from sim.kv.types import cdiv

VARIANT = CaseVariant("0.33.0", hybrid=True, async_mix=True)
runner = CliRunner()


@settings(max_examples=60, deadline=None)
@given(st.integers(min_value=0, max_value=2**32 - 1))
def test_a_variant_changes_only_what_it_names(seed):
    """Same workload and scheduler draws as the base case; only the pin, async scheduling and
    (hybrid) the model, window and pool differ, the pool by the full group's share."""
    base, varied = generate_case("v1-engine", seed), generate_case("v1-engine", seed, True, VARIANT)
    assert varied.workload == base.workload
    keep = {"vllm_version", "async_scheduling"}
    assert varied.scheduler.model_dump(exclude=keep) == base.scheduler.model_dump(exclude=keep)
    assert varied.scheduler.vllm_version == "0.33.0"
    if varied.model == base.model:  # not hybrid (or an offload case, which keeps its model)
        assert varied.cache == base.cache
        return
    cache = base.cache
    extra = cdiv(base.scheduler.max_model_len, cache.block_size) + 1
    assert varied.cache.num_gpu_blocks == cache.num_gpu_blocks + extra
    assert varied.model["layer_pattern"] == "alternating"
    assert 1 <= varied.model["sliding_window"] <= 6 * cache.block_size


def test_variant_cases_are_valid_hybrid_and_mix_async():
    """40 cases: none invalid, none an internal error; about half hybrid (two KV groups), and
    async scheduling on in some and off in others."""
    report = fuzz("v1-engine", 0, None, 40, variant=VARIANT)
    assert report.num_invalid_cases == 0 and not report.kvsim_is_wrong, report.first_invalid
    groups, asyncs = 0, set()
    for index in range(40):
        result = run(draw_case("v1-engine", case_seed(0, index), True, VARIANT))
        groups += len(result.inputs.get("kv_cache_groups") or ()) == 2
        asyncs.add(result.inputs["settings"]["async_scheduling"]["value"])
    assert 10 <= groups <= 30 and asyncs == {True, False}


def test_base_fuzz_is_unchanged_by_the_variant_code():
    """No variant: the case seed stands for what `generate_case` always drew (no pin named)."""
    case = draw_case("v1-engine", case_seed(0, 3))
    assert case.scheduler.vllm_version is None and case.scheduler.async_scheduling is None


def test_replay_command_names_the_variant():
    report = fuzz("v1-engine", 0, None, 12, variant=VARIANT)
    for row in report.to_dict()["findings"]:
        assert " --vllm-version 0.33.0 --hybrid --async-mix --case-seed " in row["reproduce"]
    assert report.to_dict()["hybrid"] is True


def test_bad_variant_options_are_one_line_exit_2(tmp_path):
    cases = [
        (["--design", "v0-v2", "--hybrid"], "--hybrid: only for --design v1-engine"),
        (["--design", "v0-v1", "--async-mix"], "--async-mix: only for --design v1-engine"),
        (["--design", "v1-engine", "--vllm-version", "9.9.9"], "unknown vLLM version '9.9.9'"),
        (["--design", "v1-engine", "--vllm-root", str(tmp_path / "no")], "--vllm-root"),
    ]
    for args, message in cases:
        result = runner.invoke(app, ["fuzz", *args, "--max-cases", "1"])
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output and len(result.output.strip().splitlines()) == 1
