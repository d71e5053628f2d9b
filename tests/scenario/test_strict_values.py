"""Strict scenario values (`sim.scenario.fields`): types, 64 bits, finite floats, resolvable times,
steps that take time, pool routers, and `--set` given twice."""

from __future__ import annotations

import typing

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from sim.cluster.config import PoolSection, RouterName
from sim.latency import StepTimeConfig
from sim.routing import Router
from sim.scenario.fields import INT64_MAX, MAX_TIME_S, Float, Int, time_error
from sim.scenario.overrides import apply_overrides, parse_overrides
from sim.scenario.schema import ScenarioError, load_yaml, scenario_from_dict
from tests.hostile.harness import tiny


@given(st.integers(min_value=-INT64_MAX - 1, max_value=INT64_MAX))
def test_every_64_bit_integer_passes_as_itself(value: int):
    assert TypeAdapter(Int).validate_python(value) == value


@pytest.mark.parametrize("value", [True, False, 16.0, "16", INT64_MAX + 1, 2**70])
def test_an_integer_field_refuses_bools_floats_strings_and_more_than_64_bits(value):
    with pytest.raises(ValidationError):
        TypeAdapter(Int).validate_python(value)


@pytest.mark.parametrize("value", [True, "0.5", float("inf"), float("-inf"), float("nan")])
def test_a_float_field_refuses_bools_strings_and_non_finite(value):
    with pytest.raises(ValidationError):
        TypeAdapter(Float).validate_python(value)


def test_a_float_field_takes_an_integer():
    assert TypeAdapter(Float).validate_python(2) == 2.0


@pytest.mark.parametrize(
    "text, value",
    [("1e-3", 0.001), ("1.0e300", 1e300), ("-2E5", -2e5), (".5e3", 500.0), ("16", 16)],
)
def test_yaml_exponents_without_a_dot_or_sign_are_floats(text, value):
    # PyYAML (YAML 1.1) alone reads "1e-3" and "1.0e300" as strings.
    assert load_yaml(text) == value and type(load_yaml(text)) is type(value)


def test_max_time_still_resolves_a_microsecond_and_twice_it_does_not():
    assert np.spacing(MAX_TIME_S - 1) <= 1e-6 < np.spacing(2 * MAX_TIME_S)
    assert time_error("arrival_s", MAX_TIME_S) is None
    assert "arrival_s" in (time_error("arrival_s", MAX_TIME_S * 2) or "")


def test_block_size_true_is_refused_naming_block_size():
    data = load_yaml(tiny().replace("block_size: 16", "block_size: true"))
    with pytest.raises(ScenarioError, match=r"cache\.block_size: .*integer, got true"):
        scenario_from_dict(data, "s.yaml")


@pytest.mark.parametrize(
    "linear",
    [
        {"fixed_s": 0.0},
        {"fixed_s": 0.0, "per_prefill_token_s": 1e-4},  # a decode step is free
        {"fixed_s": 0.0, "per_decode_seq_s": 1e-4, "per_context_token_s": 1e-8},  # prefill
    ],
)
def test_a_linear_model_whose_step_can_take_zero_seconds_is_refused(linear):
    with pytest.raises(ValidationError, match="a step can take 0 s"):
        StepTimeConfig.model_validate({"linear": linear})


@pytest.mark.parametrize(
    "linear",
    [
        {"fixed_s": 1e-6},
        {"fixed_s": 0.0, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 1e-4},
        {"fixed_s": 0.0, "per_prefill_token_s": 1e-4, "per_context_token_s": 1e-8},
    ],
)
def test_a_linear_model_whose_every_step_takes_time_is_accepted(linear):
    StepTimeConfig.model_validate({"linear": linear})


def test_the_pool_routers_are_the_routing_package_routers():
    assert set(typing.get_args(RouterName)) == {router.value for router in Router}
    with pytest.raises(ValidationError, match="round_robin"):
        PoolSection.model_validate({"router": "bogus"})


def test_set_given_twice_is_refused_and_once_is_applied():
    with pytest.raises(ScenarioError, match="given twice"):
        parse_overrides(["cache.block_size=16", "cache.block_size=32"])
    overrides = parse_overrides(["cache.block_size=32", "scheduler.max_num_seqs=4"])
    scenario = apply_overrides(scenario_from_dict(load_yaml(tiny())), overrides)
    assert scenario.cache.block_size == 32 and scenario.scheduler.max_num_seqs == 4
