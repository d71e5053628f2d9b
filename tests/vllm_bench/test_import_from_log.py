"""`kvsim import-vllm --from-log`: a server's startup log ("non-default args") as a scenario."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sim.errors import InputError
from sim.vllm_bench.flags import nearest_release
from sim.vllm_bench.importer import import_serve_line, import_server_log
from sim.vllm_bench.server_log import log_release, read_serve_settings

#: Lines shaped as vLLM prints them (written for this test).
BANNER_0_17 = "(APIServer pid=1) INFO 03-10 15:49:42 [utils.py:302]  ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.17.0\n"
HEADER_0_19 = (
    "(APIServer pid=5) INFO 11-03 05:51:44 [api_server.py:1839] vLLM API server version 0.19.0\n"
)


def _settings_line(args: str) -> str:
    return f"(APIServer pid=5) INFO 11-03 05:51:44 [utils.py:233] non-default args: {{{args}}}\n"


def _log(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "serve.log"
    path.write_text("INFO 11-03 05:51:41 [__init__.py:216] Automatically detected platform cuda.\n"
                    + "".join(lines), encoding="utf-8")  # fmt: skip
    return path


def _fields(text: str) -> dict:
    data = yaml.safe_load(text)
    data.pop("description")
    return data


@pytest.mark.parametrize(
    ("logged", "line"),
    [
        ("'max_num_seqs': 64, 'port': 8001, 'served_model_name': ['m']",
         "--max-num-seqs 64 --port 8001 --served-model-name m"),
        ("'max_model_len': 8192, 'max_num_batched_tokens': 4096, 'enable_prefix_caching': False, "
         "'gpu_memory_utilization': 0.85, 'kv_cache_dtype': 'fp8_e4m3', 'tensor_parallel_size': 2",
         "--max-model-len 8192 --max-num-batched-tokens 4096 --no-enable-prefix-caching "
         "--gpu-memory-utilization 0.85 --kv-cache-dtype fp8_e4m3 -tp 2"),
        ("'async_scheduling': True, 'stream_interval': 4, 'api_server_count': 2",
         "--async-scheduling --stream-interval 4 --api-server-count 2"),
    ],
)  # fmt: skip
def test_a_logged_server_is_the_scenario_of_its_command_line(
    tmp_path: Path, logged: str, line: str
) -> None:
    """The settings line, read from a log, sets what the same options on a `vllm serve` line
    set (the two paths share only the importer's field table)."""
    model = "meta-llama/Llama-3.1-8B-Instruct"
    path = _log(tmp_path, HEADER_0_19,
                _settings_line(f"'model_tag': '{model}', 'model': '{model}', {logged}"))  # fmt: skip
    from_log = import_server_log(path, gpu="h100-sxm")
    from_line = import_serve_line(f"vllm serve {model} {line}", gpu="h100-sxm", version="0.19.1")
    assert _fields(from_log) == _fields(from_line)
    assert "vLLM 0.19.0, pin 0.19.1" in yaml.safe_load(from_log)["description"]


def test_the_logged_release_picks_the_pin_below_it_and_the_flag_overrides(tmp_path: Path) -> None:
    path = _log(tmp_path, BANNER_0_17, _settings_line("'model_tag': 'meta-llama/Llama-3.1-8B'"))
    assert log_release(path.read_text(encoding="utf-8")) == "0.17.0"
    assert (
        yaml.safe_load(import_server_log(path, gpu="a100-80gb-sxm"))["scheduler"]["vllm_version"]
        == nearest_release("0.17.0")
        == "0.11.0"
    )
    chosen = import_server_log(path, gpu="a100-80gb-sxm", version="0.33.0")
    assert yaml.safe_load(chosen)["scheduler"]["vllm_version"] == "0.33.0"


def test_the_last_settings_line_is_the_server_that_ran(tmp_path: Path) -> None:
    path = _log(tmp_path, HEADER_0_19, _settings_line("'model_tag': 'meta-llama/Llama-3.1-8B', "
                "'max_num_seqs': 8"), _settings_line("'model_tag': 'meta-llama/Llama-3.1-8B', "
                "'max_num_seqs': 32"))  # fmt: skip
    settings = read_serve_settings(path)
    assert (settings.values["max_num_seqs"], settings.line) == (32, 4)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ((HEADER_0_19,), "serve.log: no 'non-default args: {...}' line"),
        ((_settings_line("'model_tag': 'm', 'lora_modules': [LoRAModulePath(name='a')]"),),
         "serve.log:2: non-default args: a value kvsim cannot read"),
        ((_settings_line("'model_tag': 'meta-llama/Llama-3.1-8B', 'enforce_eager': True"),),
         "serve.log:2: non-default args: --enforce-eager: changes scheduling"),
        ((_settings_line("'port': 8000"),), "serve.log:2: non-default args: no model"),
        ((_settings_line("'model_tag': 'meta-llama/Llama-3.1-8B', 'max_num_seqs': 'many'"),),
         "serve.log:2: non-default args: --max-num-seqs many: invalid literal"),
    ],
)  # fmt: skip
def test_a_log_kvsim_cannot_read_is_bad_input_naming_file_and_line(
    tmp_path: Path, lines: tuple[str, ...], message: str
) -> None:
    path = _log(tmp_path, *lines)
    with pytest.raises(InputError) as raised:
        import_server_log(path, gpu="h100-sxm")
    assert str(raised.value).startswith(str(tmp_path / message.split(":")[0])), raised.value
    assert message.split("serve.log", 1)[1] in str(raised.value), raised.value
    assert "\n" not in str(raised.value)
