"""`import-vllm`: the scenario sets what the line sets, refuses what kvsim cannot simulate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sim.errors import InputError
from sim.scenario.schema import scenario_from_dict
from sim.vllm_bench.importer import human_readable_int, import_serve_line
from sim.vllm_bench.models import scenario_model


def _imported(line: str, **kwargs) -> dict:
    return yaml.safe_load(import_serve_line(line, gpu=kwargs.pop("gpu", "h100-sxm"), **kwargs))


def test_only_what_the_line_sets_is_written() -> None:
    data = _imported("vllm serve llama-3.1-8b --port 8001 --served-model-name x")
    assert "cache" not in data
    assert data["scheduler"] == {"design": "v1-engine", "vllm_version": "0.33.0"}
    assert data["hardware"] == {"gpu": "h100-sxm"}
    # Validated as a scenario: the unset fields are left to resolution (release defaults).
    scenario = scenario_from_dict(data)
    assert scenario.scheduler.model_fields_set == {"design", "vllm_version"}


def test_modelled_options_map_to_their_fields() -> None:
    line = ("vllm serve llama-3.1-8b --max-num-seqs 64 --max-num-batched-tokens 8k "
            "--no-enable-prefix-caching --enable-chunked-prefill --gpu-memory-utilization 0.85 "
            "--block-size 32 --max-model-len 16K -tp 2 --kv-cache-dtype fp8 "
            "--scheduling-policy priority --quantization fp8")  # fmt: skip
    data = _imported(line)
    assert data["scheduler"] == {
        "design": "v1-engine", "vllm_version": "0.33.0", "max_num_seqs": 64,
        "max_num_batched_tokens": 8000, "enable_chunked_prefill": True,
        "max_model_len": 16384, "policy": "priority",
    }  # fmt: skip
    assert data["cache"] == {"enable_prefix_caching": False, "gpu_memory_utilization": 0.85,
                             "block_size": 32, "kv_cache_dtype": "fp8"}  # fmt: skip
    assert data["hardware"] == {"gpu": "h100-sxm", "tensor_parallel_size": 2}
    assert data["model_dtype"] == "fp8"


def test_max_model_len_auto_is_left_to_the_release() -> None:
    assert "scheduler" in _imported("vllm serve llama-3.1-8b --max-model-len auto")
    assert (
        "max_model_len" not in _imported("vllm serve llama-3.1-8b --max-model-len -1")["scheduler"]
    )


@pytest.mark.parametrize(
    ("text", "value"), [("1k", 1000), ("2K", 2048), ("25.6k", 25600), ("77", 77)]
)
def test_human_readable_ints_as_vllm_reads_them(text: str, value: int) -> None:
    assert human_readable_int(text) == value


def test_an_unmodelled_option_is_refused_naming_it_unless_allowed() -> None:
    with pytest.raises(InputError, match=r"^--enforce-eager: .*--allow-unmodelled enforce-eager"):
        import_serve_line("vllm serve llama-3.1-8b --enforce-eager", gpu="h100-sxm")
    data = _imported("vllm serve llama-3.1-8b --enforce-eager -pp 1",
                     allow_unmodelled=["enforce-eager", "pipeline-parallel-size"])  # fmt: skip
    assert "simulated without: --enforce-eager, -pp" in data["description"]


def test_speculative_decoding_is_refused_even_when_allowed() -> None:
    line = """vllm serve llama-3.1-8b --speculative-config '{"method": "ngram"}'"""
    with pytest.raises(InputError, match="speculative decoding"):
        import_serve_line(line, gpu="h100-sxm", allow_unmodelled=["speculative-config"])


def test_async_scheduling_maps_to_the_scheduler_field() -> None:
    data = _imported("vllm serve llama-3.1-8b --no-async-scheduling")
    assert data["scheduler"]["async_scheduling"] is False


def test_values_kvsim_cannot_take_are_one_line_errors() -> None:
    with pytest.raises(InputError, match="--kv-cache-dtype fp8_inc: kvsim models"):
        import_serve_line("vllm serve llama-3.1-8b --kv-cache-dtype fp8_inc", gpu="h100-sxm")
    with pytest.raises(InputError, match="--gpu: unknown GPU"):
        import_serve_line("vllm serve llama-3.1-8b", gpu="a100")
    with pytest.raises(InputError, match="gpu_memory_utilization"):
        import_serve_line("vllm serve llama-3.1-8b --gpu-memory-utilization 1.5", gpu="h100-sxm")


@pytest.mark.parametrize(
    ("name", "catalog"),
    [
        ("meta-llama/Llama-3.1-8B", "llama-3.1-8b"),
        ("META-LLAMA/Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("mistralai/Mistral-7B-v0.1", "mistral-7b-v0.1"),
        ("google/gemma-2-9b-it", "gemma-2-9b"),
        ("llama-2-7b", "llama-2-7b"),
    ],  # fmt: skip
)
def test_catalog_names_and_the_hugging_face_ids_it_knows(name: str, catalog: str) -> None:
    assert scenario_model(name) == catalog


def test_a_local_folder_with_a_config_json_becomes_a_geometry(tmp_path: Path) -> None:
    from sim.catalog import get_model
    from sim.vllm_real.defaults_grid import hf_config

    for name in ("llama-3.1-8b", "mistral-7b-v0.1", "gemma-2-9b", "mixtral-8x7b-v0.1"):
        spec = get_model(name)
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(hf_config(spec)))
        geometry = get_model(scenario_model(str(folder)))
        same = {"source", "name"}
        assert geometry.model_dump(exclude=same) == spec.model_dump(exclude=same)


def test_an_unknown_model_is_refused_without_network() -> None:
    with pytest.raises(InputError, match="not a kvsim catalog name"):
        scenario_model("someone/unknown-model")


def test_the_router_gemm_option_new_in_0_26_0_is_refused_by_name_and_unknown_before() -> None:
    """0.26.0's `--enable-bf16x3-router-gemm` picks an experimental MoE router kernel (its
    `vllm/config/kernel.py` KernelConfig): a speed change kvsim does not model, so refused by
    name; 0.25.1's parser has no such option, so the line is not a 0.25.1 line."""
    line = "vllm serve llama-3.1-8b --enable-bf16x3-router-gemm"
    with pytest.raises(InputError, match=r"^--enable-bf16x3-router-gemm: changes scheduling"):
        import_serve_line(line, gpu="h100-sxm", version="0.26.0")
    with pytest.raises(InputError, match="unrecognized arguments: --enable-bf16x3-router-gemm"):
        import_serve_line(line, gpu="h100-sxm", version="0.25.1")


@pytest.mark.parametrize("version", ["0.19.1", "0.20.0", "0.25.1", "0.26.0"])
def test_each_in_between_release_parses_with_its_own_spellings(version: str) -> None:
    """The releases before 0.33.0 spell prefix caching off `--no-enable-prefix-caching` only;
    0.33.0's `--disable-prefix-caching` is not theirs (their parser refuses it)."""
    data = _imported("vllm serve llama-3.1-8b --no-enable-prefix-caching -tp 2", version=version)
    assert data["cache"] == {"enable_prefix_caching": False}
    assert data["scheduler"]["vllm_version"] == version
    with pytest.raises(InputError, match="unrecognized arguments: --disable-prefix-caching"):
        import_serve_line(
            "vllm serve llama-3.1-8b --disable-prefix-caching", gpu="h100-sxm", version=version
        )
    assert _imported("vllm serve llama-3.1-8b --disable-prefix-caching")["cache"] == {
        "enable_prefix_caching": False
    }


def test_skip_tokenizer_init_is_refused_since_kvsim_models_a_tokenizing_api_server() -> None:
    """Regression: `--skip-tokenizer-init` passed as "no effect" after `sim.engine.frontend`
    made the API server's tokenizing part of what kvsim times."""
    for version in ("0.19.1", "0.33.0"):
        with pytest.raises(InputError, match="^--skip-tokenizer-init: changes scheduling"):
            import_serve_line(
                "vllm serve llama-3.1-8b --skip-tokenizer-init", gpu="h100-sxm", version=version
            )


def test_api_server_count_and_stream_interval_reach_the_scenario() -> None:
    """`--api-server-count` and `--stream-interval` set the API server model's loops and hold
    (`sim.engine.frontend`); 0.11.0 has no `--stream-interval` and refuses it by name."""
    line = "vllm serve llama-3.1-8b --api-server-count 4 --stream-interval 8"
    data = yaml.safe_load(import_serve_line(line, gpu="h100-sxm", version="0.33.0"))
    assert data["engine"] == {"api_server_count": 4, "stream_interval": 8}
    with pytest.raises(InputError, match="--stream-interval"):
        import_serve_line(line, gpu="h100-sxm", version="0.11.0")


@pytest.mark.parametrize(
    "option",
    [
        "--max-num-scheduled-tokens 4096",  # 0.26.0 config/scheduler.py: a per-step token cap
        "--prefix-match-unit 32",  # 0.26.0 config/cache.py: where a prefix-cache hit may end
        "--prefill-schedule-interval 2",  # 0.25.1: admit prefills every N steps (DP)
    ],
)
def test_scheduling_options_added_between_0_20_and_0_26_are_refused_by_name(option: str) -> None:
    """Options that appeared after 0.20.0 and change what the scheduler or the prefix cache does:
    refused naming them under 0.26.0, not passed as "no effect"."""
    typed = option.split()[0]
    with pytest.raises(InputError, match=f"^{typed}: changes scheduling, memory or speed"):
        import_serve_line(f"vllm serve llama-3.1-8b {option}", gpu="h100-sxm", version="0.26.0")
