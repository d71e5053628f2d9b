"""A scenario's unset engine settings take its pinned release's defaults
(`sim.scenario.release_defaults`); what the user set is kept; summary.json and `kvsim run`
say which is which."""

from __future__ import annotations

import json

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.catalog import get_gpu, get_model
from sim.cli.main import app
from sim.kv.pins import VllmPin
from sim.scenario.release_defaults import (
    SCENARIO_FIELDS,
    apply_release_defaults,
    changes_since_previous,
    previous_table,
)
from sim.scenario.resolve import resolve
from sim.scenario.schema import ScenarioError, load_scenario, scenario_from_dict
from sim.scenario.vllm_defaults import UsageContext, UserFlags, resolve_defaults

PINS = {
    "v1-engine": ["4ac7713", "0.11.0", "0.33.0"],
    "v0-v2": ["0.5.4", "0.5.4+7380"],
    "v0-v1": ["0.5.4"],
    "v0-fixed": ["0.5.4"],
}


def _data(design: str = "v1-engine", pin: str | None = None, gpu: str = "h100-sxm", **sched):
    scheduler = {"design": design, **sched}
    if pin is not None:
        scheduler["vllm_version"] = pin
    return {
        "name": "defaults",
        "model": "llama-3.1-8b",
        "hardware": {"gpu": gpu},
        "cache": {"num_gpu_blocks": 10000},
        "scheduler": scheduler,
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4}],
        },
    }


def _values(scenario) -> dict:
    return {
        name: getattr(getattr(scenario, section), field)
        for name, (section, field) in SCENARIO_FIELDS.items()
    }


@pytest.mark.parametrize(
    ("pin", "gpu", "expected"),
    [
        # Worked examples of sim.scenario.vllm_defaults (its tables are verified against each
        # release's own EngineArgs by tests/vllm_real/test_vllm_defaults_lockstep.py).
        ("0.33.0", "h100-sxm", (1024, 8192, True, True, 0.92, True)),
        ("0.33.0", "a100-80gb-sxm", (256, 2048, True, True, 0.92, True)),
        ("0.11.0", "h100-sxm", (1024, 8192, True, True, 0.9, False)),
    ],
)
def test_an_unset_v1_scenario_runs_the_release_defaults(pin, gpu, expected):
    applied = apply_release_defaults(scenario_from_dict(_data(pin=pin, gpu=gpu))).scenario
    s, c = applied.scheduler, applied.cache
    assert (
        s.max_num_seqs,
        s.max_num_batched_tokens,
        s.enable_chunked_prefill,
        c.enable_prefix_caching,
        c.gpu_memory_utilization,
        s.async_scheduling,
    ) == expected
    assert s.max_model_len == 131072 and c.block_size == 16


def test_v054_chunks_a_long_context_model_by_default_with_its_512_token_budget():
    """0.5.4 arg_utils.py L746-773: max_model_len > 32K turns chunked prefill on."""
    applied = apply_release_defaults(scenario_from_dict(_data("v0-v2"))).scenario
    assert applied.scheduler.enable_chunked_prefill is True
    assert applied.scheduler.max_num_batched_tokens == 512
    assert applied.scheduler.max_num_seqs == 256
    assert applied.cache.enable_prefix_caching is False
    short = apply_release_defaults(scenario_from_dict(_data("v0-v2", max_model_len=8192)))
    assert short.scenario.scheduler.enable_chunked_prefill is False
    assert short.scenario.scheduler.max_num_batched_tokens == 8192


_pins = st.sampled_from([(d, p) for d, ps in PINS.items() for p in ps])


@settings(max_examples=60, deadline=None)
@given(
    release=_pins,
    gpu=st.sampled_from(["h100-sxm", "a100-80gb-sxm", "l4", "h200"]),
    max_num_seqs=st.one_of(st.none(), st.integers(1, 2048)),
    budget=st.one_of(st.none(), st.integers(1, 20000)),
    chunked=st.one_of(st.none(), st.booleans()),
    prefix=st.one_of(st.none(), st.booleans()),
    utilization=st.one_of(st.none(), st.floats(0.5, 0.95)),
    max_model_len=st.one_of(st.none(), st.integers(256, 131072)),
    entry=st.sampled_from(list(UsageContext)),
)
def test_the_scenario_runs_what_the_release_resolves_and_applying_twice_changes_nothing(
    release, gpu, max_num_seqs, budget, chunked, prefix, utilization, max_model_len, entry
):
    design, pin = release
    given_sched = {
        k: v
        for k, v in {
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": budget,
            "enable_chunked_prefill": chunked,
            "max_model_len": max_model_len,
        }.items()
        if v is not None
    }
    data = _data(design, pin, gpu, **given_sched)
    data["engine"] = {"entry_point": entry.value}
    if prefix is not None and not (prefix and design != "v1-engine"):
        data["cache"]["enable_prefix_caching"] = prefix
    if utilization is not None:
        data["cache"]["gpu_memory_utilization"] = utilization
    scenario = scenario_from_dict(data)
    flags = UserFlags(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        enable_chunked_prefill=chunked,
        enable_prefix_caching=data["cache"].get("enable_prefix_caching"),
        gpu_memory_utilization=utilization,
        max_model_len=max_model_len,
    )
    try:
        release_says = resolve_defaults(
            pin, get_model("llama-3.1-8b"), get_gpu(gpu), usage=entry, flags=flags
        )
    except ValueError:
        with pytest.raises(ScenarioError):
            apply_release_defaults(scenario)
        return
    settled = apply_release_defaults(scenario)
    assert _values(settled.scenario) == {
        name: getattr(release_says, name).value for name in SCENARIO_FIELDS
    }
    for section, field in SCENARIO_FIELDS.values():  # what the user set is kept...
        given_value = getattr(getattr(scenario, section), field)
        if given_value is not None and f"{section}.{field}" not in settled.overridden:
            assert getattr(getattr(settled.scenario, section), field) == given_value
    again = apply_release_defaults(settled.scenario)
    assert _values(again.scenario) == _values(settled.scenario)
    assert again.overridden == ()


def test_0_11_0_chunks_whatever_the_user_says_and_says_so():
    data = _data(pin="0.11.0", enable_chunked_prefill=False)
    resolved = resolve(scenario_from_dict(data))
    assert resolved.engine.scheduler.enable_chunked_prefill is True
    assert resolved.inputs["settings_overridden"] == ["scheduler.enable_chunked_prefill"]
    assert "L1547-1548" in resolved.inputs["settings"]["enable_chunked_prefill"]["rule"]
    latest = resolve(scenario_from_dict(_data(pin="0.33.0", enable_chunked_prefill=False)))
    assert latest.engine.scheduler.enable_chunked_prefill is False
    assert latest.inputs["settings_overridden"] == []


def test_a_model_free_scenario_takes_the_gpu_and_entry_point_rules():
    data = _data(max_model_len=512)
    data["model"] = None
    data["step_time"] = {"linear": {"fixed_s": 0.01}}
    applied = apply_release_defaults(scenario_from_dict(data)).scenario
    # H100, API server: 1024 sequences; min(1024 x 512, 8192) tokens.
    assert applied.scheduler.max_num_seqs == 1024
    assert applied.scheduler.max_num_batched_tokens == 8192
    data["engine"] = {"entry_point": "llm_class"}
    llm = apply_release_defaults(scenario_from_dict(data)).scenario
    assert llm.scheduler.max_num_batched_tokens == 16384  # the LLM class's H100 budget
    data["scheduler"]["max_num_seqs"] = 4
    small = apply_release_defaults(scenario_from_dict(data)).scenario
    assert small.scheduler.max_num_batched_tokens == 4 * 512  # at most max_num_seqs x length


@pytest.mark.parametrize(
    ("data", "field"),
    [
        (_data(max_model_len=200000), "scheduler.max_model_len"),
        (
            _data(enable_chunked_prefill=False, max_num_batched_tokens=1000),
            "scheduler.max_num_batched_tokens",
        ),
    ],
)
def test_a_release_refusal_names_the_scenario_field(data, field):
    with pytest.raises(ScenarioError, match=f"^{field}: "):
        apply_release_defaults(scenario_from_dict(data))


def test_async_scheduling_on_a_v0_design_is_refused_naming_the_field():
    with pytest.raises(ScenarioError, match="async_scheduling: the v0-v2 design"):
        scenario_from_dict(_data("v0-v2", async_scheduling=True))
    v0 = apply_release_defaults(scenario_from_dict(_data("v0-v2", async_scheduling=False)))
    assert v0.scenario.scheduler.async_scheduling is False  # what a v0 engine does anyway


def test_cpu_offload_runs_synchronously_where_the_release_would_run_async_and_says_so():
    data = _data(pin="0.33.0")
    data["cache"]["cpu_offload_gib"] = 4
    settled = apply_release_defaults(scenario_from_dict(data))
    assert settled.scenario.scheduler.async_scheduling is False
    recorded = settled.record()["async_scheduling"]
    assert recorded["value"] is False and recorded["origin"] == "kvsim (not modelled)"
    assert "CPU offloading connector" in settled.not_modelled["async_scheduling"]
    data["scheduler"]["async_scheduling"] = True  # asked for: refused when the engine is built
    asked = apply_release_defaults(scenario_from_dict(data))
    assert asked.scenario.scheduler.async_scheduling is True and not asked.not_modelled


def test_changes_since_the_previous_release_table():
    assert [previous_table(p) for p in ("0.5.4", "4ac7713", "0.11.0", "0.33.0")] == [
        None,
        VllmPin.V0_5_4,
        VllmPin.V0_5_4,
        VllmPin.V0_11_0,
    ]
    scenario = scenario_from_dict(_data(pin="0.33.0"))
    changed = changes_since_previous(scenario, apply_release_defaults(scenario))
    assert changed["previous"] == "0.11.0"
    assert changed["changes"] == [
        "gpu_memory_utilization 0.92 (was 0.9)",
        "async_scheduling True (was False)",
    ]
    pinned = scenario_from_dict(
        {**_data(pin="0.33.0"), "cache": {"num_gpu_blocks": 10000, "gpu_memory_utilization": 0.9}}
    )
    assert changes_since_previous(pinned, apply_release_defaults(pinned))["changes"] == [
        "async_scheduling True (was False)"
    ]


def test_summary_json_records_each_value_and_origin_and_run_prints_what_changed(tmp_path):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(_data(pin="0.33.0", max_num_seqs=64)))
    out = tmp_path / "out"
    result = CliRunner().invoke(
        app, ["run", str(tmp_path / "s.yaml"), "--no-plots", "-o", str(out)]
    )
    assert result.exit_code == 0, result.output
    written = json.loads((out / "summary.json").read_text())["inputs"]["settings"]
    assert written["max_num_seqs"] == {"value": 64, "origin": "user", "rule": "set by the user"}
    assert written["max_num_batched_tokens"]["value"] == 8192
    assert written["max_num_batched_tokens"]["origin"] == "release default"
    assert "arg_utils.py" in written["max_num_batched_tokens"]["rule"]
    said = " ".join(result.output.split())
    assert "vLLM 0.33.0 defaults that differ from 0.11.0's:" in said
    assert "async_scheduling True (was False)" in said
    # The scenario.yaml the run wrote is the user's (origins kept), pinned to its release:
    # it resolves to the same settings.
    rerun = yaml.safe_load((out / "scenario.yaml").read_text())
    assert "max_num_batched_tokens" not in rerun["scheduler"]
    again = resolve(load_scenario(out / "scenario.yaml"), out).inputs["settings"]
    assert json.loads(json.dumps(again)) == written
