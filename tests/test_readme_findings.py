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
