"""A V1 scenario on a catalog model with per-layer types gets its release's groups and block
size (`sim.scenario.catalog_layout`); explicit groups win; what kvsim does not model is refused
in one line (exit 2 at the command line)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim.catalog import get_gpu, get_model
from sim.engine.run import resolve, run
from sim.memory.derive import derive_num_gpu_blocks
from sim.scenario.schema import ScenarioError, scenario_from_dict

ROOT = Path(__file__).resolve().parents[2]
LINEAR = {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001, "per_decode_seq_s": 0.0001}}


def _scenario(model: str, version: str = "0.33.0", cache: dict | None = None, **scheduler):
    return {
        "name": "catalog-layout",
        "model": model,
        "hardware": {"gpu": "h100-sxm"},
        "cache": cache or {"num_gpu_blocks": 2000, "enable_prefix_caching": False},
        "scheduler": {"design": "v1-engine", "vllm_version": version, "max_model_len": 8192,
                      **scheduler},
        "workload": {"kind": "inline", "requests": [
            {"arrival_s": 0.0, "prompt_tokens": 3000, "output_tokens": 8},
            {"arrival_s": 0.0, "prompt_tokens": 700, "output_tokens": 8}]},
        "step_time": LINEAR,
    }  # fmt: skip


def test_a_mamba_hybrid_gets_its_releases_groups_and_block_size():
    resolved = resolve(scenario_from_dict(_scenario("qwen3-next-80b-a3b")))
    kv = resolved.engine.kv
    assert kv.block_size == 544  # raised from 16 so a page holds a state
    assert [g.mamba for g in kv.kv_cache_groups] == [True, True, True, False]
    rows = resolved.inputs["kv_cache_groups"]
    assert [row["num_layers"] for row in rows] == [12, 12, 12, 12]
    assert resolved.inputs["hybrid_pool"]["mamba_padding_bytes"] == 16_384
    # One 8,192-token request: 3 state blocks + cdiv(8,192, 544) = 16 attention blocks.
    assert resolved.inputs["startup_blocks_per_request"] == 19


def test_llama4_layout_differs_by_release():
    cache = {"num_gpu_blocks": 3000}  # 0.19.1 charges an 8,192-token request 4 x 512 blocks
    old = resolve(scenario_from_dict(_scenario("llama-4-scout-17b-16e", "0.11.0", cache)))
    new = resolve(scenario_from_dict(_scenario("llama-4-scout-17b-16e", "0.19.1", cache)))
    # One full group is the plain uniform pool (no hybrid groups: a KV connector accepts it).
    assert old.engine.kv.kv_cache_groups == () and old.inputs["kv_layout"] == "uniform"
    assert old.inputs["kv_cache_groups"][0]["num_layers"] == 48
    assert [g.attention_chunk_size for g in new.engine.kv.kv_cache_groups] == [8192] * 3 + [None]


def test_scout_derives_a_pool_with_its_vision_tower_in_the_weights():
    """Llama-4-Scout on 4 H100s: the weight term is the text model's 107,769,861,120 and the
    vision tower's 871,932,416 parameters in bf16, split over the ranks (`sim.catalog_params`);
    one H100 has no room, said in one line."""
    data = _scenario("llama-4-scout-17b-16e", cache={"num_gpu_blocks": "derive"})
    data["hardware"]["tensor_parallel_size"] = 4
    inputs = resolve(scenario_from_dict(data)).inputs
    memory = inputs["memory"]
    assert memory["weight_bytes"] == (107_769_861_120 + 871_932_416) * 2 // 4
    assert inputs["num_gpu_blocks"] > 0
    data["hardware"]["tensor_parallel_size"] = 1
    with pytest.raises(ScenarioError, match="no memory left for KV-cache blocks"):
        resolve(scenario_from_dict(data))


def test_explicit_groups_win_over_the_catalog_layout():
    cache = {"num_gpu_blocks": 2000, "enable_prefix_caching": False,
             "kv_cache_groups": [{"mamba": True}, {}]}  # fmt: skip
    resolved = resolve(scenario_from_dict(_scenario("qwen3-next-80b-a3b", cache=cache)))
    assert resolved.engine.kv.block_size == 16 and len(resolved.engine.kv.kv_cache_groups) == 2
    assert "hybrid_pool" not in resolved.inputs


def test_a_derived_pool_is_recut_into_the_releases_blocks():
    """Gemma-3-27B on 0.33.0: the memory left after the weights, divided by 7 groups' blocks of
    10 layers x 16 tokens x 2 x 16 heads x 128 x 2 B."""
    cache = {"num_gpu_blocks": "derive"}
    inputs = resolve(scenario_from_dict(_scenario("gemma-3-27b", cache=cache))).inputs
    memory = inputs["memory"]
    assert (memory["num_layers_per_block"], memory["num_kv_groups"]) == (10, 7)
    assert memory["block_bytes"] == 10 * 16 * 2 * 16 * 128 * 2
    assert inputs["num_gpu_blocks"] == memory["available_kv_bytes"] // memory["block_bytes"]
    # The available bytes are those of the usual derivation (weights, activation, non-torch).
    budget = derive_num_gpu_blocks(
        get_model("gemma-3-27b"), get_gpu("h100-sxm"), engine="v1", kv_layout="hybrid",
        gpu_memory_utilization=0.92, max_num_batched_tokens=8192, max_num_seqs=1024,
        vllm_release="0.33.0",  # its profiling run's sampler (sim.memory.sampler_release)
    )  # fmt: skip
    assert memory["available_kv_bytes"] == budget.available_kv_bytes


@pytest.mark.parametrize(
    ("model", "version", "cache", "scheduler", "message"),
    [
        ("nemotron-h-8b", "4ac7713", None, {}, "model: 'nemotron-h-8b' has Mamba layers"),
        ("llama-4-scout-17b-16e", "4ac7713", None, {}, "has chunked-local attention layers"),
        ("gemma-3-27b", "0.5.4", None, {"design": "v0-v2"}, "V1 engine only"),
        ("gemma-3-27b", "0.33.0", {"num_gpu_blocks": 2000, "sliding_window": 512}, {},
         "cache.sliding_window: 'gemma-3-27b' sets each layer's type"),
    ],
)  # fmt: skip
def test_what_is_not_modelled_is_refused_in_one_line(model, version, cache, scheduler, message):
    data = _scenario(model, version, cache)
    data["scheduler"].update(scheduler)
    with pytest.raises(ScenarioError, match=message) as info:
        resolve(scenario_from_dict(data))
    assert "\n" not in str(info.value)


def test_the_refusal_exits_2_at_the_command_line(tmp_path):
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump(_scenario("qwen3-next-80b-a3b", "4ac7713")))
    out = subprocess.run(
        [sys.executable, "-m", "sim.cli", "run", str(path), "--out", str(tmp_path / "out")],
        capture_output=True, text=True, cwd=ROOT, check=False,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    (line,) = out.stderr.strip().splitlines()
    assert "old.yaml" in line and "'qwen3-next-80b-a3b' has Mamba layers" in line


def test_the_example_scenario_runs_clean():
    """scenarios/qwen3_next_v1.yaml: every request finishes, no violation, and each Mamba
    group's peak is the most requests running at once (one state block each)."""
    result = run(ROOT / "scenarios" / "qwen3_next_v1.yaml")
    summary = result.summary
    assert summary["states"]["finished"] == 120 and summary["num_violations"] == 0
    peaks = [g["peak_blocks"] for g in result.inputs["kv_cache_groups"]]
    assert peaks[0] == peaks[1] == peaks[2] <= 64 < peaks[3]
