"""`kvsim compare-versions` / `sim.compare_versions`: one workload through every pinned design."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

import sim
from sim.cli.main import app
from sim.planning.versions import CORRECTED, variants, violation_counts

runner = CliRunner()
LABELS = [
    "v0-v1",
    "v0-v2",
    "v0-v2@0.5.4+7380",
    "v0-fixed",
    "v1-engine@4ac7713",
    "v1-engine@0.11.0",
    "v1-engine@0.19.1",
    "v1-engine@0.20.0",
    "v1-engine@0.25.1",
    "v1-engine@0.26.0",
    "v1-engine@0.33.0",
]


def _scenario(requests: list[dict], **sections) -> dict:
    data = {
        "name": "cmp",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 64, "num_cpu_blocks": 0},
        "scheduler": {"design": "v0-v2", "max_model_len": 800},
        "workload": {"kind": "inline", "requests": requests},
        "step_time": {
            "linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001, "per_decode_seq_s": 0.0001}
        },
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value}
    return data


def _thrash() -> dict:
    """12 long prompts (38-40 blocks each) into 63 usable blocks, 128-token chunks: admitted on
    their first chunk they preempt each other (V1 4ac7713, 0.11.0); 0.33.0 gates on the whole
    prompt (the same workload as tests/kv/test_v1_releases.py). Prefix caching off, as in
    every design compared (the V1 releases' default is on: a preempted prompt's cached blocks
    then make its recompute cheap, 13 preemptions instead of 50+ at 4ac7713)."""
    requests = [
        {"arrival_s": 0.001 * i, "prompt_tokens": 600 + 16 * (i % 3), "output_tokens": 32}
        for i in range(12)
    ]
    return _scenario(
        requests,
        # max_num_seqs at most the budget, or vLLM (and kvsim) refuse to start; 12 requests
        # never reach 16 running.
        scheduler={
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 128,
            "max_num_seqs": 16,
        },
        cache={"enable_prefix_caching": False},
    )


def _null_block_hang() -> dict:
    """v0-V2's null block strands a 10-block prompt in a 10-block pool (README finding); the V1
    engine's startup check refuses the pool (block 0 is its null block)."""
    requests = [
        {"arrival_s": 0.0, "prompt_tokens": 16, "output_tokens": 4},
        {"arrival_s": 1.0, "prompt_tokens": 160, "output_tokens": 4},
    ]
    return _scenario(
        requests,
        cache={"num_gpu_blocks": 10, "sliding_window": 256},
        scheduler={"max_model_len": 160},
    )


def test_variants_are_every_pinned_design_in_order():
    assert [v.label for v in variants()] == LABELS
    models = {v.label: v.models for v in variants()}
    assert models["v0-fixed"] == CORRECTED
    assert models["v0-v2"] == "vLLM 0.5.4 v0, BlockSpaceManagerV2"
    assert models["v0-v2@0.5.4+7380"] == "vLLM 0.5.4 + #7380 v0, BlockSpaceManagerV2"
    assert models["v1-engine@0.33.0"] == "vLLM 0.33.0 V1 engine"
    assert models["v1-engine@4ac7713"] == "vLLM ~0.10 V1 engine @ 4ac7713"


def test_violation_counts_by_kind_in_name_order():
    import pandas as pd

    kinds = pd.Series(["watermark", "admission_undercount", "watermark"])
    assert violation_counts(kinds) == "admission_undercount×1, watermark×2"
    assert violation_counts(pd.Series([], dtype=str)) == ""


def test_the_thrash_disappears_on_the_latest_release():
    """What a user upgrading vLLM sees: the same workload, the first-chunk thrash at
    4ac7713 and 0.11.0, none at 0.33.0; each row is what `sim.run` gives for that design."""
    table = sim.compare_versions(_thrash(), workers=1).set_index("variant")
    assert list(table.index) == LABELS
    assert (table["status"] == "ran").all()
    old, v011, new = (table.loc[f"v1-engine@{v}"] for v in ("4ac7713", "0.11.0", "0.33.0"))
    assert old["num_preemptions"] >= 50
    assert v011["num_preemptions"] == old["num_preemptions"]
    assert new["num_preemptions"] == 0
    assert new["ttft_p99_s"] < old["ttft_p99_s"]
    overrides = {"scheduler.design": "v1-engine", "scheduler.vllm_version": "4ac7713"}
    direct = sim.run(sim.scenario_from_dict(_thrash()), overrides=overrides).summary
    for column in ("num_preemptions", "throughput_tok_per_s", "ttft_p99_s", "kv_util_max"):
        assert old[column] == pytest.approx(direct[column]), column
    assert (table["num_finished"] == 12).all()


def test_a_refused_design_is_a_row_saying_why_and_a_hang_is_no_progress():
    table = sim.compare_versions(_null_block_hang(), workers=1).set_index("variant")
    assert list(table.index) == LABELS
    for label in LABELS[4:]:
        assert table.loc[label, "status"] == "refused"
        assert "vLLM would refuse to start" in table.loc[label, "reason"]
        assert table.loc[label, "num_finished"] != table.loc[label, "num_finished"]  # NaN
    v2 = table.loc["v0-v2"]
    assert v2["status"] == "ran"
    assert v2["violation_counts"] == "no_progress×1"
    assert (v2["num_finished"], v2["num_aborted"]) == (1, 1)
    assert table.loc["v0-v1", "num_finished"] == 2  # v0-V1 has no null block: no hang


def test_overrides_apply_to_every_design_and_a_v1_pin_does_not_block_v0():
    data = _null_block_hang()
    data["scheduler"] |= {"design": "v1-engine", "vllm_version": "0.11.0"}
    table = sim.compare_versions(data, overrides={"cache.num_gpu_blocks": 12}, workers=1)
    assert (table["status"] == "ran").all()
    assert (table["num_gpu_blocks"] == 12).all()
    # Every row names the exact version it ran: a v0 variant without a pin ran the release.
    assert table["vllm_version"].tolist() == [
        "0.5.4",
        "0.5.4",
        "0.5.4+7380",
        "0.5.4",
        "4ac7713",
        "0.11.0",
        "0.19.1",
        "0.20.0",
        "0.25.1",
        "0.26.0",
        "0.33.0",
    ]


def test_cli_table_json_files_and_figure(tmp_path):
    source = tmp_path / "hang.yaml"
    source.write_text(yaml.safe_dump(_null_block_hang()))
    out = tmp_path / "cmp"
    result = runner.invoke(app, ["compare-versions", str(source), "-o", str(out), "-j", "1"])
    assert result.exit_code == 0, result.output
    assert "kvsim compare-versions: cmp" in result.output
    assert "v0-v2: vLLM 0.5.4 v0, BlockSpaceManagerV2; violations: no_progress×1" in result.output
    assert "v0-fixed: kvsim's corrected design" in result.output
    assert "v1-engine@0.33.0: vLLM 0.33.0 V1 engine; refused: " in result.output
    assert {p.name for p in out.iterdir()} == {
        "compare_versions.parquet",
        "compare_versions.csv",
        "compare_versions_cmp.png",
    }
    result = runner.invoke(
        app,
        ["compare-versions", str(source), "-o", str(out), "-j", "1", "--json", "--no-plots"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["scenario"] == "cmp"
    assert [r["variant"] for r in report["variants"]] == LABELS
    assert report["variants"][1]["violation_counts"] == "no_progress×1"


def test_cli_bad_set_key_is_exit_2(tmp_path):
    source = tmp_path / "hang.yaml"
    source.write_text(yaml.safe_dump(_null_block_hang()))
    result = runner.invoke(
        app, ["compare-versions", str(source), "--set", "cache.no_such_key=1", "-o", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "no_such_key" in result.output


def test_figure_marks_refused_designs():
    from sim.plots.versions import compare_versions_figure

    table = sim.compare_versions(_null_block_hang(), workers=1)
    fig = compare_versions_figure(table)
    assert len(fig.axes) == 6
    texts = [t.get_text().strip() for ax in fig.axes for t in ax.texts]
    assert texts.count("refused") == 7 * 6  # seven V1 pins on each of the six panels
    assert "scenario cmp" in fig._suptitle.get_text()


def test_latency_panels_say_they_count_finished_requests_and_name_the_shortfall():
    """Regression: a variant that failed requests showed latency bars over the survivors only,
    with nothing saying so; it read as a fast design."""
    import pandas as pd

    from sim.plots.versions import PANELS, compare_versions_figure

    metrics = {column: 1.0 for _, columns, _ in PANELS for column in columns}
    table = pd.DataFrame(
        [
            {"variant": "v0-v2", "status": "ran", "num_requests": 1500, "num_finished": 1480},
            {"variant": "v0-fixed", "status": "ran", "num_requests": 1500, "num_finished": 1500},
        ]
    ).assign(scenario="cmp", **metrics)
    fig = compare_versions_figure(table)
    ticks = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert ticks == ["v0-v2 (1,480/1,500 finished)", "v0-fixed"]
    titles = [ax.get_title() for ax in fig.axes]
    assert [t for t in titles if "TTFT" in t or "TPOT" in t] == [
        "TTFT p50 / p99 (s), finished requests",
        "TPOT p50 / p99 (ms), finished requests",
    ]
    assert "latency over the requests that finished" in fig._suptitle.get_text().replace("\n", " ")


def test_hybrid_async_upgrade_readme_finding():
    """README ("Upgrading a hybrid model across the V1 releases"): Gemma-2 under async
    scheduling frees blocks in flight on every pin before 0.26.0 (vllm PR #47728) and never
    after; TTFT p99 falls from 16.0 s to 13.2 s at 0.19.1 (its in-place Triton sampler leaves
    20,678 blocks, not 20,108) and 12.5 s at 0.20.0 (gpu_memory_utilization 0.92 less the CUDA-graph
    estimate: 21,093)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    table = sim.compare_versions(
        root / "scenarios" / "gemma2_hybrid_v1.yaml",
        overrides={"scheduler.async_scheduling": True},
        workers=1,
    ).set_index("variant")
    counts = {v: table.loc[f"v1-engine@{v}", "violation_counts"] for v in PINS_V1}
    assert counts == {
        "4ac7713": "freed_while_in_flight×52",
        "0.11.0": "freed_while_in_flight×52",
        "0.19.1": "freed_while_in_flight×50",
        "0.20.0": "freed_while_in_flight×50",
        "0.25.1": "freed_while_in_flight×50",
        "0.26.0": "",
        "0.33.0": "",
    }
    ttft = {v: round(table.loc[f"v1-engine@{v}", "ttft_p99_s"], 1) for v in PINS_V1}
    assert {ttft[v] for v in PINS_V1[:2]} == {16.0} and ttft["0.19.1"] == 13.2
    assert {ttft[v] for v in PINS_V1[3:6]} == {12.5} and ttft["0.33.0"] == 12.4
    pins = ("0.11.0", "0.19.1", "0.20.0")
    assert {v: table.loc[f"v1-engine@{v}", "num_gpu_blocks"] for v in pins} == {
        "0.11.0": 20_108, "0.19.1": 20_678, "0.20.0": 21_093}  # fmt: skip
    peaks = {v: table.loc[f"v1-engine@{v}", "peak_used_blocks"] for v in pins}
    # each run fills its whole pool but at most one block
    assert peaks == {"0.11.0": 20_107, "0.19.1": 20_677, "0.20.0": 21_093}
    readme = (root / "README.md").read_text(encoding="utf-8")
    readme = " ".join(readme.split())
    assert "52 times on 4ac7713" in readme and "falls from 16.0 s (up to 0.11.0)" in readme
    assert (
        "gives 20,678 blocks, not 20,108" in readme
        and "less its CUDA-graph estimate, gives 21,093" in readme
    )
    assert "12.5 s from 0.20.0 (12.4 s on 0.33.0" in readme
    assert "to 13.2 s on 0.19.1" in readme


PINS_V1 = ["4ac7713", "0.11.0", "0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"]
