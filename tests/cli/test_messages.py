"""Messages name the cause in the user's words (issue 20, section 6): focused unit tests."""

from __future__ import annotations

import pytest

from sim.cluster.capacity import ROUTERS, check_routers
from sim.errors import InputError
from sim.scenario.overrides import apply_overrides, assignment_at_fault
from sim.scenario.schema import ScenarioError, naming, scenario_from_dict
from tests.hostile.harness import tiny


def _tiny() -> dict:
    from sim.scenario.schema import load_yaml

    return load_yaml(tiny())


def test_check_routers_names_the_unknown_and_the_repeat():
    assert check_routers(["round_robin", "least_kv_usage"]) == ["round_robin", "least_kv_usage"]
    with pytest.raises(InputError, match=r"unknown router 'bogus' \(known: round_robin,") as e:
        check_routers(["bogus", "round_robin"])
    assert "distinct" not in str(e.value)
    with pytest.raises(InputError, match="round_robin is given twice; give distinct names"):
        check_routers(["round_robin", "round_robin"])
    with pytest.raises(InputError, match="an empty name"):
        check_routers(["round_robin", ""])
    assert len(ROUTERS) == 5


def test_assignment_at_fault_is_the_one_that_set_the_field():
    overrides = {"cache.block_size": 4, "bogus.key": 1, "scheduler.design": "x"}
    assert assignment_at_fault(overrides, "bogus") == "--set bogus.key=1"
    assert assignment_at_fault(overrides, "scheduler.design") == "--set scheduler.design=x"
    assert assignment_at_fault(overrides, "cache") == "--set cache.block_size=4"
    assert assignment_at_fault({"a": True}, "a") == "--set a=true"
    assert assignment_at_fault(overrides, "workload") == "--set"


def test_apply_overrides_names_the_assignment():
    scenario = scenario_from_dict(_tiny())
    with pytest.raises(ScenarioError, match=r"^--set engine\.router=bogus: engine\.router: "):
        apply_overrides(scenario, {"cache.block_size": 8, "engine.router": "bogus"})
    with pytest.raises(ScenarioError, match=r"^--compare k=1: unknown key 'k'"):
        apply_overrides(scenario, {"k": 1}, source="--compare k=1")


@pytest.mark.parametrize(
    ("violations", "fragment"),
    [
        (["bogus"], "unknown violation kind 'bogus'; none, any or of: admission_"),
        ("nonee", "unknown violation kind 'nonee'"),
        ({"leaked_blocks": 1}, "expected none, any or a list of violation kinds"),
        ([3], "unknown violation kind 3"),
        (["freed_while_inflight"], "did you mean 'freed_while_in_flight'?"),
    ],
)
def test_expect_names_an_unknown_kind_and_lists_the_known(violations, fragment):
    data = {**_tiny(), "expect": {"violations": violations}}
    with pytest.raises(ScenarioError, match="expect.violations: ") as error:
        scenario_from_dict(data, "s.yaml")
    assert fragment in str(error.value)


def test_expect_still_takes_none_any_and_kinds():
    for violations in ("none", "any", ["leaked_blocks", "admission_undercount"]):
        scenario_from_dict({**_tiny(), "expect": {"violations": violations}})


def test_unknown_gpu_is_hardware_gpu_and_block_size_true_is_block_size():
    data = {**_tiny(), "hardware": {"gpu": "bogus"}}
    with pytest.raises(ScenarioError, match=r"^s\.yaml: hardware\.gpu: unknown GPU 'bogus'"):
        scenario_from_dict(data, "s.yaml")
    data = {**_tiny(), "cache": {**_tiny()["cache"], "block_size": True}}
    with pytest.raises(ScenarioError, match=r"^s\.yaml: cache\.block_size: "):
        scenario_from_dict(data, "s.yaml")


def test_naming_prefixes_the_file_once():
    with pytest.raises(ScenarioError, match=r"^s\.yaml: model: x$"), naming("s.yaml"):
        raise ScenarioError("model: x")
    with pytest.raises(ScenarioError, match=r"^s\.yaml: model: x$"), naming("s.yaml"):
        raise ScenarioError("s.yaml: model: x")
    # not a ScenarioError (a trace's own error names its file): left as it was
    with pytest.raises(InputError, match=r"^trace\.csv:3"), naming("s.yaml"):
        raise InputError("trace.csv:3: bad row")
    # an option's error is about the command line: left as it was
    with pytest.raises(ScenarioError, match=r"^--set a=1: x$"), naming("s.yaml"):
        raise ScenarioError("--set a=1: x")
