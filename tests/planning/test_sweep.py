"""Sweeps: --set parsing, grid expansion, keys, resuming, failures, local and Dask executors."""

from __future__ import annotations

import json

import pandas as pd
import pytest
from typer.testing import CliRunner

import sim
from sim.planning.executor import CACHE_FILE
from sim.planning.grid import build_points, expand_grid, parse_sets, scenario_key
from sim.scenario.schema import ScenarioError, scenario_from_dict
from tests.harness.sweep import dd1_scenario

STABLE = ["point", "key", "workload.rate_scale", "ttft_p99_s", "num_finished", "error"]


def test_parse_sets_values_are_yaml_scalars() -> None:
    axes = parse_sets(
        [
            "scheduler.max_num_seqs=128,256",
            "hardware.gpu=h100-sxm,h200",
            "cache.enable_prefix_caching=true",
        ]
    )
    assert axes == {
        "scheduler.max_num_seqs": [128, 256],
        "hardware.gpu": ["h100-sxm", "h200"],
        "cache.enable_prefix_caching": [True],
    }


@pytest.mark.parametrize(
    ("items", "needle"),
    [(["a.b=1", "a.b=2"], "given twice"), (["novalue"], "KEY=VALUE"), (["x=1,1"], "repeated")],
)
def test_parse_sets_errors(items, needle) -> None:
    with pytest.raises(ScenarioError, match=needle):
        expand_grid(parse_sets(items))


def test_grid_is_the_product_last_axis_fastest() -> None:
    grid = expand_grid({"a": [1, 2], "b": ["x", "y", "z"]})
    assert grid == [{"a": a, "b": b} for a in (1, 2) for b in ("x", "y", "z")]
    assert expand_grid({}) == [{}]


@pytest.mark.parametrize(
    ("item", "key"),
    [
        ("scheduler.max_num_sex=8", "max_num_sex"),
        ("scheduler.max_num_seqs=8,foo", "scheduler.max_num_seqs"),
        ("nosuch.section=1", "nosuch"),
    ],
)
def test_bad_keys_and_values_name_the_key(item, key) -> None:
    scenario = scenario_from_dict(dd1_scenario(4))
    with pytest.raises(ScenarioError, match=key):
        build_points(scenario, parse_sets([item]))


def test_keys_hash_the_resolved_scenario() -> None:
    scenario = scenario_from_dict(dd1_scenario(4))
    points = build_points(scenario, {"scheduler.max_num_seqs": [1, 2], "description": ["a", "b"]})
    keys = [p.key for p in points]
    assert keys[0] == keys[1] != keys[2] == keys[3]  # the description does not change the run
    # An explicit default is the same simulation as an omitted one.
    data = dd1_scenario(4)
    assert scenario_key(data) == scenario_key({**data, "engine": {"num_replicas": 1}})


def test_sweep_rows_in_grid_order_and_deterministic() -> None:
    grid = {"workload.rate_scale": [4, 1, 2]}
    first = sim.sweep(dd1_scenario(50), grid, workers=1)
    again = sim.sweep(dd1_scenario(50), grid, workers=1)
    assert list(first["workload.rate_scale"]) == [4, 1, 2]
    pd.testing.assert_frame_equal(first.drop(columns="wall_s"), again.drop(columns="wall_s"))
    # D/D/1 at 50 req/s: no queueing, TTFT is the 10 ms step; at 200 req/s the queue grows.
    assert first.loc[1, "ttft_p99_s"] == pytest.approx(0.01)
    assert first.loc[0, "ttft_p99_s"] > 0.1
    assert first.loc[1, "offered_rate_req_per_s"] == pytest.approx(50.0)


def _trace_scenario(tmp_path) -> dict:
    trace = tmp_path / "tiny.csv"
    trace.write_text(
        "arrival_s,prompt_tokens,output_tokens\n" + "".join(f"{i * 0.05},8,2\n" for i in range(20))
    )
    data = dd1_scenario(1)
    data["workload"] = {"kind": "trace", "path": "tiny.csv", "format": "canonical"}
    (tmp_path / "scenario.yaml").write_text(json.dumps(data))
    return data


def test_failed_point_is_reported_and_resume_skips_done_points(tmp_path) -> None:
    _trace_scenario(tmp_path)
    # A point that fails only when it runs: its trace exists but a row is malformed (a missing
    # trace is refused before any point runs: tests/hostile/cases_noop.py).
    (tmp_path / "broken.csv").write_text("arrival_s,prompt_tokens,output_tokens\n0.0,0,2\n")
    out = tmp_path / "out"
    grid = {"workload.path": ["tiny.csv", "broken.csv"], "workload.rate_scale": [1, 2]}
    seen = []
    table = sim.sweep(
        tmp_path / "scenario.yaml", grid, out_dir=out, workers=1, on_row=lambda r, c: seen.append(c)
    )
    assert seen == [False] * 4
    assert table["error"].isna().tolist() == [True, True, False, False]
    assert "broken.csv" in table.loc[2, "error"]
    assert (out / "sweep.parquet").exists() and (out / "sweep.csv").exists()
    assert len((out / CACHE_FILE).read_text().splitlines()) == 4
    # Re-run with one more rate: the two good points are reused, failures and new points run.
    grid["workload.rate_scale"] = [1, 2, 4]
    seen.clear()
    again = sim.sweep(
        tmp_path / "scenario.yaml", grid, out_dir=out, workers=1, on_row=lambda r, c: seen.append(c)
    )
    assert sorted(seen) == [False] * 4 + [True] * 2
    assert list(again["point"]) == list(range(6))
    pd.testing.assert_frame_equal(
        again.loc[[0, 1], ["key", "ttft_p99_s", "num_finished"]].reset_index(drop=True),
        table.loc[[0, 1], ["key", "ttft_p99_s", "num_finished"]].reset_index(drop=True),
    )


def test_local_processes_match_in_process(tmp_path) -> None:
    grid = {"workload.rate_scale": [1, 3]}
    serial = sim.sweep(dd1_scenario(40), grid, workers=1)
    parallel = sim.sweep(dd1_scenario(40), grid, workers=2)
    pd.testing.assert_frame_equal(serial[STABLE], parallel[STABLE])


def test_dask_local_cluster_matches_local() -> None:
    distributed = pytest.importorskip("distributed")
    grid = {"workload.rate_scale": [1, 2, 3, 4]}
    local = sim.sweep(dd1_scenario(40), grid, workers=1)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_dask = sim.sweep(dd1_scenario(40), grid, cluster=client)
        by_address = sim.sweep(
            dd1_scenario(40), {"workload.rate_scale": [5]}, cluster=cluster.scheduler_address
        )
    pd.testing.assert_frame_equal(local[STABLE], on_dask[STABLE])
    assert by_address["error"].isna().all()


def test_cli_sweep_writes_table_and_names_bad_key(tmp_path) -> None:
    from sim.cli.main import app

    (tmp_path / "s.yaml").write_text(json.dumps(dd1_scenario(20)))
    runner = CliRunner()
    bad = runner.invoke(
        app,
        [
            "sweep",
            str(tmp_path / "s.yaml"),
            "--set",
            "scheduler.max_num_sex=1,2",
            "-o",
            str(tmp_path / "o"),
        ],
    )
    assert bad.exit_code == 2 and "max_num_sex" in bad.output
    ok = runner.invoke(
        app,
        [
            "sweep",
            str(tmp_path / "s.yaml"),
            "--set",
            "workload.rate_scale=1,2",
            "-o",
            str(tmp_path / "o"),
            "-j",
            "1",
        ],
    )
    assert ok.exit_code == 0, ok.output
    table = pd.read_parquet(tmp_path / "o" / "sweep.parquet")
    assert list(table["workload.rate_scale"]) == [1, 2]
    assert (tmp_path / "o" / "throughput_latency.png").stat().st_size > 1000
