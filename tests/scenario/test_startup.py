"""vLLM's startup refusals (`sim.scenario.startup`), options that would do nothing (`sim.scenario.no_effect`), and
summary.json recording what ran.

The rules are vLLM's own (`SchedulerConfig` and `ModelConfig.verify_with_parallel_config` of
each pinned release, cited in `sim.scenario.startup`); the properties below restate them independently
so that a rule drifting from its statement fails here.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.catalog import ModelSpec
from sim.cli.main import app
from sim.engine.engine import Engine
from sim.kv.config import Design
from sim.scenario.resolve import preflight, resolve
from sim.scenario.schema import ScenarioError, scenario_from_dict
from sim.scenario.startup import check_tensor_parallel, check_token_budget
from sim.scheduler import SchedulerConfig
from sim.workload.errors import WorkloadError

RELEASES = [
    (Design.V0_V2, "0.5.4"),
    (Design.V1_ENGINE, "4ac7713"),
    (Design.V1_ENGINE, "0.11.0"),
    (Design.V1_ENGINE, "0.33.0"),
]


def _tiny(design: str = "v1-engine", **scheduler) -> dict:
    return {
        "name": "tiny",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 64, "num_cpu_blocks": 0},
        "scheduler": {"design": design, "max_model_len": 256, **scheduler},
        "workload": {
            "kind": "inline",
            "requests": [
                {"arrival_s": 0.0, "prompt_tokens": 200, "output_tokens": 4},
                {"arrival_s": 0.01, "prompt_tokens": 20, "output_tokens": 3},
            ],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }


@settings(max_examples=200, deadline=None)
@given(
    release=st.sampled_from(RELEASES),
    max_model_len=st.integers(1, 4096),
    max_num_seqs=st.integers(1, 512),
    budget=st.one_of(st.none(), st.integers(1, 8192)),
    chunked=st.booleans(),
)
def test_the_budget_is_refused_exactly_where_vllm_refuses_it(
    release, max_model_len, max_num_seqs, budget, chunked
):
    design, pin = release
    config = SchedulerConfig(max_model_len, max_num_seqs, budget, chunked)
    resolved = config.token_budget(design.api)
    vllm_refuses = (resolved < max_model_len and not chunked) or resolved < max_num_seqs
    if vllm_refuses:
        with pytest.raises(ScenarioError, match="scheduler.max_num_batched_tokens"):
            check_token_budget(design, pin, config, resolved)
    else:
        check_token_budget(design, pin, config, resolved)


def _model(heads: int, kv_heads: int) -> ModelSpec:
    return ModelSpec(
        name="m",
        num_layers=2,
        hidden_size=heads * 8,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=8,
        intermediate_size=64,
        vocab_size=100,
        max_position_embeddings=4096,
    )


@settings(max_examples=300, deadline=None)
@given(kv_heads=st.integers(1, 16), group=st.integers(1, 8), tp=st.integers(1, 64))
def test_tensor_parallel_is_refused_exactly_where_vllm_cannot_split_the_heads(kv_heads, group, tp):
    heads = kv_heads * group
    # ModelConfig.verify_with_parallel_config; QKVParallelLinear's divide(kv, tp) / (tp, kv).
    splits = heads % tp == 0 and (kv_heads % tp == 0 if tp <= kv_heads else tp % kv_heads == 0)
    if splits:
        check_tensor_parallel(_model(heads, kv_heads), tp, "0.11.0")
    else:
        with pytest.raises(ScenarioError, match="hardware.tensor_parallel_size"):
            check_tensor_parallel(_model(heads, kv_heads), tp, "0.11.0")


def test_the_v1_budget_is_no_longer_raised_silently():
    """Regression: `max_num_batched_tokens: 1` on v1-engine ran 112 steps of a larger budget
    while summary.json said 1; on v0 it ignored every request."""
    for design in ("v1-engine", "v0-v2"):
        data = _tiny(design, max_num_batched_tokens=1, enable_chunked_prefill=False)
        with pytest.raises(ScenarioError, match="smaller than max_model_len 256"):
            resolve(scenario_from_dict(data))


def test_preflight_refuses_what_resolve_refuses_without_the_workload(tmp_path):
    data = _tiny(max_num_batched_tokens=100, enable_chunked_prefill=False)
    data["workload"] = {"kind": "trace", "path": str(tmp_path / "missing.csv")}
    with pytest.raises(ScenarioError, match="max_num_batched_tokens"):
        preflight(scenario_from_dict(data))
    data["scheduler"].pop("max_num_batched_tokens")
    # The workload is not loaded, but its files are checked to exist (a sweep point on a
    # missing trace is bad input before any point runs, not an error row).
    with pytest.raises(WorkloadError, match="missing.csv: no such file"):
        preflight(scenario_from_dict(data))
    (tmp_path / "missing.csv").write_text("not read by preflight\n")
    preflight(scenario_from_dict(data))


SCENARIOS = [
    _tiny("v1-engine"),
    _tiny("v1-engine", enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=8),
    _tiny("v1-engine", vllm_version="0.11.0", max_num_batched_tokens=300),
    _tiny("v0-v2"),
    _tiny("v0-v1", enable_chunked_prefill=True, max_num_seqs=16),
    _tiny("v0-fixed", max_num_batched_tokens=256, max_num_seqs=4),
]


@pytest.mark.parametrize("data", SCENARIOS, ids=lambda d: str(d["scheduler"]))
def test_inputs_are_what_the_scheduler_and_pool_hold(data):
    resolved = resolve(scenario_from_dict(data))
    engine = Engine(resolved.engine, resolved.workload.requests, resolved.step_time)
    inputs = resolved.inputs
    for replica in engine.replicas:
        scheduler = replica.scheduler
        assert scheduler.token_budget == inputs["max_num_batched_tokens"]
        assert scheduler.config.max_model_len == inputs["max_model_len"]
        settings = inputs["settings"]
        assert scheduler.config.max_num_seqs == settings["max_num_seqs"]["value"]
        given = data["scheduler"].get("max_num_seqs")
        assert settings["max_num_seqs"]["origin"] == ("user" if given else "release default")
        assert given in (None, scheduler.config.max_num_seqs)
        pool = replica.manager.inner
        if resolved.engine.design.api == "v0":
            assert pool.num_total_gpu_blocks == inputs["num_gpu_blocks"]
            assert pool.num_total_cpu_blocks == inputs["num_cpu_blocks"]
            # Nothing is ignored for a budget smaller than max_model_len: the limit is the length.
            assert scheduler.prompt_limit == inputs["max_model_len"]
        else:
            assert pool.block_pool.num_gpu_blocks == inputs["num_gpu_blocks"]
            assert inputs["num_cpu_blocks"] == 0  # the V1 engine keeps no swap space


def test_v1_records_no_swap_space_it_does_not_have():
    """Regression: a v1-engine run on a model recorded 4 GiB worth of CPU blocks
    (`swap_space_gib`'s default) that the V1 engine never uses."""
    data = _tiny("v1-engine")
    data["model"] = "llama-3.1-8b"
    data["cache"].pop("num_cpu_blocks")
    inputs = resolve(scenario_from_dict(data)).inputs
    assert inputs["num_cpu_blocks"] == 0
    inputs_v0 = resolve(scenario_from_dict({**data, "scheduler": _tiny("v0-v2")["scheduler"]}))
    assert inputs_v0.inputs["num_cpu_blocks"] > 0  # v0 swaps into them


def test_summary_json_inputs_are_the_resolved_ones(tmp_path):
    import yaml

    data = _tiny(
        "v1-engine", enable_chunked_prefill=True, max_num_batched_tokens=32, max_num_seqs=8
    )
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["run", str(tmp_path / "s.yaml"), "--no-plots", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    written = json.loads((out / "summary.json").read_text())["inputs"]
    resolved = resolve(scenario_from_dict(data), tmp_path).inputs
    for key in ("max_num_batched_tokens", "max_model_len", "num_gpu_blocks", "num_cpu_blocks"):
        assert written[key] == resolved[key], key
    assert written["max_num_batched_tokens"] == 32


# ------------------------------------------------------------ explicit KV-cache groups
LLAMA4_GROUPS = [{"attention_chunk_size": 128}] * 3 + [{}]


def _grouped(num_gpu_blocks: int, **scheduler) -> dict:
    data = _tiny(vllm_version="0.25.1", max_num_batched_tokens=64, **scheduler)
    data["cache"] = {"block_size": 16, "num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": 0}
    data["cache"]["kv_cache_groups"] = LLAMA4_GROUPS
    return data


def test_explicit_chunked_local_groups_are_sized_as_the_release_sizes_them():
    """Startup charges a chunked-local group cdiv(min(A + T, max_model_len), bs), no "+1":
    three groups of cdiv(128 + 64, 16) = 12 plus the full group's cdiv(256, 16) = 16 = 52."""
    resolved = resolve(scenario_from_dict(_grouped(53)))
    kinds = [g["attention_chunk_size"] for g in resolved.inputs["kv_cache_groups"]]
    assert kinds == [128, 128, 128, None]
    with pytest.raises(ScenarioError, match="needs 52 blocks but only 51 are usable"):
        resolve(scenario_from_dict(_grouped(52)))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"scheduler": {"design": "v0-v2", "vllm_version": None, "max_num_batched_tokens": 256}},
            "only in the V1 engine",
        ),
        (
            {
                "model": "llama-3.1-8b",
                "hardware": {"gpu": "h100-sxm"},
                "cache": {"num_gpu_blocks": "derive"},
            },
            "give cache.num_gpu_blocks",
        ),
        ({"cache": {"sliding_window": 32}}, "drop cache.sliding_window"),
        ({"scheduler": {"vllm_version": "4ac7713"}}, "from vLLM 0.11.0 on"),
        (
            {
                "cache": {
                    "kv_cache_groups": [{"attention_chunk_size": 8}, {"sliding_window": 8}, {}]
                }
            },
            "exactly one sliding window or one chunk size",
        ),
        (
            {"cache": {"kv_cache_groups": [{"attention_chunk_size": 8, "sliding_window": 8}, {}]}},
            "not both",
        ),
    ],
    ids=["v0", "derive", "window-too", "4ac7713", "two-other-types", "both-in-one"],
)
def test_explicit_groups_refusals_name_the_field(change, message):
    data = _grouped(80)
    for section, values in change.items():
        data[section] = {**data.get(section, {}), **values} if isinstance(values, dict) else values
    with pytest.raises(ScenarioError, match=message) as excinfo:
        resolve(scenario_from_dict(data))
    assert "kv_cache_groups" in str(excinfo.value) or "not both" in message
