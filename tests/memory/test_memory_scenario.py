"""The memory model through a scenario: hybrid layout, weight format, a GPU outside the catalog."""

import pytest

from sim.catalog import get_gpu, get_model
from sim.engine.run import resolve, run
from sim.memory.derive import derive_num_gpu_blocks
from sim.memory.terms import VllmEngine, weight_bytes
from sim.scenario.schema import ScenarioError, scenario_from_dict

REQUESTS = [{"arrival_s": 0.0, "prompt_tokens": 64, "output_tokens": 4}]
LINEAR = {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 0.0001, "per_decode_seq_s": 0.0001}}


def _scenario(**overrides) -> dict:
    data = {
        "name": "memory",
        "model": "llama-3.1-8b",
        "cache": {"num_gpu_blocks": "derive"},
        "scheduler": {"design": "v1-engine", "max_model_len": 4096},
        "workload": {"kind": "inline", "requests": REQUESTS},
        "step_time": LINEAR,
    }
    data.update(overrides)
    return data


def test_gemma2_hybrid_layout_via_scenario():
    """V1 + sliding and full layers: vLLM's hybrid block count goes to the hybrid manager,
    whose two KV-cache groups (sliding, then full) share it."""
    scenario = scenario_from_dict(_scenario(model="gemma-2-9b"))
    inputs = resolve(scenario).inputs
    memory = inputs["memory"]
    assert inputs["kv_layout"] == "hybrid"
    assert memory["num_kv_groups"] == 2 and memory["num_layers_per_block"] == 21
    settings = {name: s["value"] for name, s in inputs["settings"].items()}
    expected = derive_num_gpu_blocks(
        get_model("gemma-2-9b"), get_gpu("h100-sxm"), kv_layout="hybrid", engine="v1",
        max_num_batched_tokens=inputs["max_num_batched_tokens"],
        max_num_seqs=settings["max_num_seqs"],
        gpu_memory_utilization=settings["gpu_memory_utilization"],
        vllm_release=inputs["vllm_version"],
    )  # fmt: skip
    assert memory["num_gpu_blocks"] == expected.num_gpu_blocks
    assert inputs["num_gpu_blocks"] == expected.num_gpu_blocks  # the shared pool, not halved
    assert inputs["num_gpu_blocks"] // 2 * 16 == memory["num_kv_tokens"]  # what vLLM logs
    assert inputs["kv_cache_groups"] == [
        {"group_id": 0, "sliding_window": 4096, "num_layers": 21},
        {"group_id": 1, "sliding_window": None, "num_layers": 21},
    ]
    kv = resolve(scenario).engine.kv
    assert [g.sliding_window for g in kv.kv_cache_groups] == [4096, None]
    assert kv.num_gpu_blocks == expected.num_gpu_blocks and kv.sliding_window is None


def test_gemma2_with_an_explicit_window_keeps_one_group_of_the_reported_capacity():
    """`cache.sliding_window` set by the scenario overrides the model's layers: one group,
    and a derived pool of vLLM's reported token capacity (blocks // groups)."""
    cache = {"num_gpu_blocks": "derive", "sliding_window": None}
    inputs = resolve(scenario_from_dict(_scenario(model="gemma-2-9b", cache=cache))).inputs
    assert "kv_cache_groups" not in inputs
    assert inputs["num_gpu_blocks"] == inputs["memory"]["num_gpu_blocks"] // 2


def test_gemma2_hybrid_run_records_peak_blocks_per_group():
    """A request longer than the window: the sliding group frees what left it, so it peaks
    lower than the full group. bs=16, W=4096, a 6000-token prompt in 2048-token chunks, 4
    output tokens: chunks at C = 0, 2048, 4096 grow both tables to 128, 256, 375 blocks (at
    C = 4096 the first useful block is (4096 - 4095) // 16 = 0: nothing leaves the window).
    The first decode (C = 6000) frees blocks 0..118 ((6000 - 4095) // 16 = 119) of the sliding
    group before either table grows to 376; the last decode needs cdiv(6003, 16) = 376.
    So the sliding group peaks at 375, the full group at 376.
    """
    requests = [{"arrival_s": 0.0, "prompt_tokens": 6000, "output_tokens": 4}]
    scenario = _scenario(
        model="gemma-2-9b",
        scheduler={
            "design": "v1-engine",
            "max_model_len": 8192,
            "max_num_batched_tokens": 2048,
            # 2048-token chunks: vLLM refuses a budget below max_model_len without them.
            "enable_chunked_prefill": True,
            "vllm_version": "0.11.0",
        },
        workload={"kind": "inline", "requests": requests},
    )
    result = run(scenario_from_dict(scenario))
    assert result.inputs["max_num_batched_tokens"] == 2048
    peaks = [g["peak_blocks"] for g in result.inputs["kv_cache_groups"]]
    assert peaks == [375, 376]
    assert result.summary["num_violations"] == 0


def test_hybrid_layout_only_on_the_v1_engine_and_only_for_mixed_models():
    v0 = resolve(scenario_from_dict(_scenario(model="gemma-2-9b", scheduler={"design": "v0-v2",
                                                                            "max_model_len": 4096})))  # fmt: skip
    assert v0.inputs["kv_layout"] == "uniform" and v0.inputs["memory"]["engine"] == "v0"
    llama = resolve(scenario_from_dict(_scenario()))
    assert llama.inputs["kv_layout"] == "uniform"
    assert llama.inputs["memory"]["engine"] == VllmEngine.V1.value


def test_model_dtype_reaches_the_weight_bytes():
    fp8 = resolve(scenario_from_dict(_scenario(model_dtype="fp8"))).inputs["memory"]
    bf16 = resolve(scenario_from_dict(_scenario())).inputs["memory"]
    assert fp8["weight_format"] == "fp8"
    assert fp8["weight_bytes"] == weight_bytes(get_model("llama-3.1-8b"), "fp8")
    assert fp8["num_gpu_blocks"] > bf16["num_gpu_blocks"]


def test_unknown_model_dtype_is_a_one_line_scenario_error():
    with pytest.raises(ScenarioError, match="model_dtype: unknown model_dtype 'int3'"):
        scenario_from_dict(_scenario(model_dtype="int3"), "s.yaml")


def test_geometry_dict_gpu_in_a_scenario():
    card = {"name": "rtx-4090", "memory_gb": 24, "memory_visible_gib": 23.55,
            "hbm_bandwidth_GBps": 1008, "bf16_tflops": 165, "fp16_tflops": 165,
            "interconnect_GBps": 64}  # fmt: skip
    scenario = scenario_from_dict(_scenario(hardware={"gpu": card}))
    memory = resolve(scenario).inputs["memory"]
    assert memory["total_memory_bytes"] == int(23.55 * 2**30)
    assert memory["total_memory_source"] == "measured"


def test_bad_gpu_geometry_names_the_field():
    with pytest.raises(ScenarioError, match=r"s.yaml: hardware: .*GPU: memory_gb: Field required"):
        scenario_from_dict(
            _scenario(hardware={"gpu": {"name": "x", "hbm_bandwidth_GBps": 1}}), "s.yaml"
        )


def test_kvsim_run_prints_one_row_per_kv_group(tmp_path):
    import yaml
    from typer.testing import CliRunner

    from sim.cli.main import app

    scenario = _scenario(
        model="gemma-2-9b",
        scheduler={"design": "v1-engine", "max_model_len": 8192, "vllm_version": "0.11.0"},
    )
    path = tmp_path / "gemma.yaml"
    path.write_text(yaml.safe_dump(scenario))
    result = CliRunner().invoke(
        app,
        ["run", str(path), "--out", str(tmp_path / "out"), "--no-plots"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    # One 64-token prompt + 4 outputs needs cdiv(67, 16) = 5 blocks in each group.
    assert (
        "KV group 0" in result.output and "sliding 4096, 21 layers, peak 5 blocks" in result.output
    )
    assert "full, 21 layers, peak 5 blocks" in result.output


def test_given_blocks_for_a_hybrid_model_are_the_shared_pool():
    """`num_gpu_blocks` given = vLLM's `num_gpu_blocks_override`: the raw pool of 21-layer
    blocks that both groups share (recorded with the hybrid block geometry)."""
    cache = {"num_gpu_blocks": 1000}
    inputs = resolve(scenario_from_dict(_scenario(model="gemma-2-9b", cache=cache))).inputs
    assert inputs["num_gpu_blocks"] == 1000 and len(inputs["kv_cache_groups"]) == 2
    assert inputs["memory"]["num_layers_per_block"] == 21
    assert inputs["memory"]["num_kv_tokens"] == 1000 // 2 * 16


def test_hybrid_scenario_is_identical_with_the_decode_shortcuts_off():
    """The hybrid manager's decode fast path (and the decode cohort on top of it) skip only
    quiet decodes: a Gemma-2 run with prompts past the window, prefix hits and preemptions
    gives the same tables with both shortcuts on and off."""
    from sim.audit.v1 import AuditedV1Manager
    from sim.kv.config import KVCacheConfig, KVCacheGroupSpec, make_manager
    from sim.scheduler import SchedulerConfig
    from sim.scheduler.fast.layer import fast_path_enabled

    groups = (KVCacheGroupSpec(8), KVCacheGroupSpec(None))
    hybrid = make_manager("v1-engine", KVCacheConfig(num_gpu_blocks=9, kv_cache_groups=groups))
    config = SchedulerConfig(max_model_len=64, decode_fast_path=True)
    assert fast_path_enabled(config, AuditedV1Manager(hybrid))

    requests = [
        {
            "arrival_s": 0.01 * i,
            "prompt_tokens": 1500 + 900 * (i % 6),
            "output_tokens": 300,
            "prefix_id": 7,
            "prefix_tokens": 1024,
        }
        for i in range(16)
    ]

    def run_with(shortcuts: bool):
        scenario = _scenario(
            model="gemma-2-9b",
            cache={"num_gpu_blocks": 1000, "enable_prefix_caching": True},
            scheduler={
                "design": "v1-engine",
                "vllm_version": "0.11.0",
                "max_model_len": 8192,
                "max_num_batched_tokens": 2048,
                "enable_chunked_prefill": True,  # or vLLM refuses the budget
                "decode_fast_path": shortcuts,
                "decode_cohort": shortcuts,
            },
            workload={"kind": "inline", "requests": requests},
        )
        return run(scenario_from_dict(scenario))

    fast, slow = run_with(True), run_with(False)
    assert fast.summary["num_preemptions"] > 0
    assert fast.requests.equals(slow.requests) and fast.steps.equals(slow.steps)
    assert fast.inputs["kv_cache_groups"] == slow.inputs["kv_cache_groups"]
