"""`kvsim fuzz --hybrid --group-types` (`sim.ci.fuzz_variant.group_layout`): hybrid cases draw
`cache.kv_cache_groups` from every group type kvsim models on the release."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

from sim.ci.fuzz import fuzz
from sim.ci.fuzz_cases import case_seed, draw_case
from sim.ci.fuzz_variant import CaseVariant, group_layout
from sim.cli.main import app
from sim.kv.pins import VllmPin

runner = CliRunner()

#: Per release, the group keys its layouts may draw beyond full attention.
TYPES = {
    "0.20.0": {"sliding_window", "attention_chunk_size", "mamba", "sink_len"},
    "0.26.0": {"sliding_window", "attention_chunk_size", "mamba", "rswa_window"},
    "0.33.0": {"sliding_window", "attention_chunk_size", "mamba", "rswa_window", "circular_buffer"},
}


@pytest.mark.parametrize("version", sorted(TYPES))
def test_group_layout_draws_only_the_releases_types_and_all_of_them(version):
    rng = np.random.default_rng(0)
    seen: set[str] = set()
    for _ in range(300):
        groups = group_layout(rng, VllmPin(version), 4)
        assert {} in groups and 2 <= len(groups) <= 2 + 2 * 2
        seen |= {key for group in groups for key in group}
    assert seen == TYPES[version]


@pytest.mark.parametrize("version", ["0.20.0", "0.33.0"])
def test_group_types_cases_are_valid_and_some_cache_over_a_variant(version):
    """30 cases: none invalid, none an internal error; about half give explicit groups, and
    some of those run prefix caching over a sink / R-SWA / ring group."""
    variant = CaseVariant(version, hybrid=True, async_mix=True, group_types=True)
    report = fuzz("v1-engine", 0, None, 30, variant=variant)
    assert report.num_invalid_cases == 0 and not report.kvsim_is_wrong, report.first_invalid
    explicit = caching_variant = 0
    for index in range(30):
        cache = draw_case("v1-engine", case_seed(0, index), True, variant).cache
        explicit += bool(cache.kv_cache_groups)
        caching_variant += cache.enable_prefix_caching and any(
            g.group_spec().is_full_variant for g in cache.kv_cache_groups
        )
    assert 8 <= explicit <= 22 and caching_variant >= 1


def test_group_types_needs_hybrid_and_is_in_the_replay_command():
    result = runner.invoke(
        app, ["fuzz", "--design", "v1-engine", "--group-types", "--max-cases", "1"]
    )
    assert result.exit_code == 2 and "--group-types: give --hybrid too" in result.output
    variant = CaseVariant("0.33.0", hybrid=True, group_types=True)
    assert variant.flags() == " --vllm-version 0.33.0 --hybrid --group-types"
    assert fuzz("v1-engine", 0, None, 1, variant=variant).to_dict()["group_types"] is True


@pytest.mark.slow
def test_on_0_33_0_every_group_type_stall_is_the_max_model_len_prompt():
    """The fuzz paragraph of docs/findings.md, on the first 240 cases of its run (master
    seed 23): over the single-replica cases with drawn groups the only violation kind is
    `no_progress`, and each such case has a request of exactly max_model_len tokens (vllm
    #29496)."""
    from sim.engine.run import run

    variant = CaseVariant("0.33.0", hybrid=True, async_mix=True, group_types=True)
    stalls = explicit = 0
    for index in range(240):
        case = draw_case("v1-engine", case_seed(23, index), True, variant)
        if not case.cache.kv_cache_groups or case.engine.num_replicas > 1:
            continue
        explicit += 1
        result = run(case)
        kinds = set(result.violations["kind"]) if len(result.violations) else set()
        assert kinds <= {"no_progress"}, (index, kinds)
        if kinds:
            stalls += 1
            assert (result.requests["prompt_tokens"] == case.scheduler.max_model_len).any(), index
    assert explicit >= 60 and stalls >= 1, (explicit, stalls)
