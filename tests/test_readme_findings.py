"""The trace figures README.md quotes under "What kvsim has found so far" (slow tier).

Each replays the whole Azure conversation trace (19,366 requests), a few seconds per replay.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sim

SCENARIO = Path(__file__).resolve().parent.parent / "scenarios" / "mistral_azure_conv_swa.yaml"
pytestmark = pytest.mark.slow


def test_readme_7470_figures_on_the_azure_trace() -> None:
    result = sim.run(SCENARIO)
    kinds = result.violations["kind"].value_counts()
    assert result.summary["num_requests"] == 19_366
    assert int((result.requests["prompt_tokens"] > 258 * 16).sum()) == 225
    assert kinds["admission_undercount"] == 67
    assert kinds["admission_overtake"] == 166
    undercounts = result.violations[result.violations["kind"] == "admission_undercount"]
    assert int(undercounts["time_s"].min()) == 396


@pytest.mark.parametrize(
    ("vllm_version", "num_gpu_blocks", "num_preemptions"),
    [
        ("4ac7713", 2048, 16_940),
        ("4ac7713", 4096, 9_569),
        ("0.33.0", 2048, 3_189),
        ("0.33.0", 4096, 2_020),
    ],
)
def test_readme_v1_engine_preemptions_on_the_azure_trace(
    vllm_version, num_gpu_blocks, num_preemptions
) -> None:
    overrides = {
        "scheduler.design": "v1-engine",
        "scheduler.enable_chunked_prefill": True,
        "scheduler.vllm_version": vllm_version,
        "cache.num_gpu_blocks": num_gpu_blocks,
        "expect.violations": "any",
    }
    result = sim.run(SCENARIO, overrides=overrides)
    assert result.summary["num_preemptions"] == num_preemptions
    assert result.summary["states"]["finished"] == 19_366


def test_readme_compare_versions_on_the_azure_trace() -> None:
    """The `kvsim compare-versions` table README quotes (chunked prefill, 2,048 blocks)."""
    table = sim.compare_versions(
        SCENARIO, overrides={"scheduler.enable_chunked_prefill": True}
    ).set_index("variant")
    # vLLM 0.5.4 refuses chunked prefill with a sliding window on BlockSpaceManagerV1
    # (arg_utils.py:L855-860), and so does kvsim: a row that says why, not numbers.
    assert table.loc["v0-v1", "status"] != "ok"
    assert "refuses chunked prefill" in table.loc["v0-v1", "reason"]
    table = table.drop("v0-v1")
    preemptions = table["num_preemptions"].astype(int).to_dict()
    assert preemptions == {
        "v0-v2": 772,
        "v0-v2@0.5.4+7380": 794,
        "v0-fixed": 796,
        "v1-engine@4ac7713": 16_940,
        "v1-engine@0.11.0": 16_940,
        "v1-engine@0.33.0": 3_189,
    }
    # The 0.5.4 release (v0-v2's default) also raises IndexError (#7371) at the last chunk of
    # a chunked prompt that ends on a block boundary: 920 `manager_error`s, 991 requests fail.
    assert table.loc["v0-v2", "violation_counts"] == (
        "admission_overtake×159, admission_undercount×71, leaked_blocks×71, manager_error×920, "
        "watermark×22"
    )
    assert table.loc["v0-v2", "num_failed"] == 991
    assert table.loc["v0-v2@0.5.4+7380", "violation_counts"] == (
        "admission_overtake×161, admission_undercount×68, leaked_blocks×68, watermark×19"
    )
    assert table.loc["v0-v2@0.5.4+7380", "num_failed"] == 68
    assert table["num_violations"].drop(["v0-v2", "v0-v2@0.5.4+7380"]).eq(0).all()
    assert table["num_finished"].drop(["v0-v2", "v0-v2@0.5.4+7380"]).eq(19_366).all()
    ttft_p50_s = table["ttft_p50_s"].round().astype(int).to_dict()
    assert (ttft_p50_s["v1-engine@4ac7713"], ttft_p50_s["v1-engine@0.33.0"]) == (1_759, 553)
    throughput = table["throughput_tok_per_s"].round().astype(int).to_dict()
    assert (throughput["v1-engine@4ac7713"], throughput["v1-engine@0.33.0"]) == (663, 964)
