"""Cluster capacity per (mode, router), and the parallel grid (sim/cluster/capacity.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from typer.testing import CliRunner

from sim.cli.main import app
from sim.cluster.capacity import ROUTERS, answers_frame, gpus_needed
from sim.cluster.compare import Slo
from sim.errors import InputError
from sim.scenario.schema import Scenario, scenario_from_dict, scenario_to_yaml


def _scenario(num_requests: int = 60) -> Scenario:
    """At 40 req/s, 60 requests: one replica misses the TTFT p99 of 0.5 s, two meet it."""
    return scenario_from_dict(
        {
            "name": "ccap",
            "model": "llama-3.1-8b",
            "cache": {"block_size": 16, "num_gpu_blocks": 200, "num_cpu_blocks": 0},
            "scheduler": {
                "design": "v1-engine",
                "vllm_version": "0.11.0",
                "max_model_len": 2048,
                "enable_chunked_prefill": True,
            },
            "workload": {
                "kind": "synthetic",
                "num_requests": num_requests,
                "seed": 3,
                "arrival": {"process": "poisson", "rate_per_s": 1.0},
                "lengths": {
                    "prompt": {"kind": "uniform", "min_tokens": 100, "max_tokens": 400},
                    "output": {"kind": "uniform", "min_tokens": 10, "max_tokens": 40},
                },
            },
            "step_time": {
                "linear": {"fixed_s": 0.01, "per_prefill_token_s": 5e-5, "per_decode_seq_s": 1e-4}
            },
        }
    )


SLO = Slo(ttft_p99_s=0.5, tpot_p99_s=0.03)
TWO_ROUTERS = ["round_robin", "least_outstanding"]


def test_one_answer_per_mode_and_router_each_the_smallest_passing_count():
    table, answers = gpus_needed(_scenario(), 40.0, SLO, max_gpus=4, routers=TWO_ROUTERS, workers=1)
    assert [(a.mode, a.router) for a in answers] == [
        ("co-located", "round_robin"),
        ("co-located", "least_outstanding"),
        ("disaggregated", "round_robin"),
    ]
    for answer in answers:
        rows = table[(table["mode"] == answer.mode) & (table["router"] == answer.router)]
        passing = rows[rows["meets_slo"]]
        if answer.num_gpus is None:
            assert passing.empty
            continue
        assert answer.num_gpus == passing["num_gpus"].min()
        assert answer.shape in set(passing["shape"])
        assert not rows[rows["num_gpus"] < answer.num_gpus]["meets_slo"].any()
        # Nothing of that (mode, router) ran past its answer.
        assert rows["num_gpus"].max() == answer.num_gpus
    # Each co-located router was tried at every count up to its answer.
    for router in TWO_ROUTERS:
        co = table[(table["mode"] == "co-located") & (table["router"] == router)]
        assert list(co["num_gpus"]) == list(range(1, len(co) + 1))
    # The load is more than one replica serves within the SLO.
    assert all(a.num_gpus is None or a.num_gpus >= 2 for a in answers)
    frame = answers_frame(answers)
    assert list(frame.columns) == ["mode", "router", "num_gpus", "shape"]
    assert len(frame) == 3


def test_parallel_grid_gives_the_sequential_table():
    scenario = _scenario()
    one, answers_one = gpus_needed(scenario, 40.0, SLO, max_gpus=3, routers=TWO_ROUTERS, workers=1)
    two, answers_two = gpus_needed(scenario, 40.0, SLO, max_gpus=3, routers=TWO_ROUTERS, workers=2)
    assert len(one) >= 4  # more than one shape per count: the parallel path really ran
    pd.testing.assert_frame_equal(one, two)
    assert answers_one == answers_two


@pytest.mark.parametrize("routers", [["nearest"], ["round_robin", "round_robin"]])
def test_unknown_or_repeated_router_is_input_error(routers):
    with pytest.raises(InputError, match="--routers"):
        gpus_needed(_scenario(), 10.0, SLO, max_gpus=1, routers=routers, workers=1)


def test_routers_match_the_scenario_schema():
    for router in ROUTERS:
        assert scenario_from_dict({**_dump(), "engine": {"router": router}}).engine.router == router


def _dump() -> dict:
    return _scenario().model_dump(mode="json", exclude_unset=True)


def test_cli_prints_the_answer_per_mode_and_router(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(scenario_to_yaml(_scenario(num_requests=20)))
    cli = CliRunner()
    args = ["cluster-capacity", str(path), "--rate", "40", "--ttft-p99-s", "0.5"]
    args += ["--tpot-p99-s", "0.03", "--max-gpus", "2", "-j", "1"]
    result = cli.invoke(app, [*args, "--routers", "round_robin,least_kv_usage"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.split()[:2] == ["co-located", "least_kv_usage"] for line in lines)
    assert any(line.split()[:2] == ["disaggregated", "round_robin"] for line in lines)
    refused = cli.invoke(app, [*args, "--routers", "nearest"])
    assert refused.exit_code == 2
    assert "--routers nearest" in refused.output
