"""`kvsim import-vllm`, `kvsim bench serve`, `kvsim compare-bench` at the command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli.main import app

runner = CliRunner()
LINE = "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 32 --port 8001"


def _imported(tmp_path: Path) -> Path:
    path = tmp_path / "llama.yaml"
    result = runner.invoke(app, ["import-vllm", LINE, "--gpu", "h100-sxm", "-o", str(path)])
    assert result.exit_code == 0, result.output
    return path


def test_import_then_bench_then_compare(tmp_path: Path) -> None:
    scenario = _imported(tmp_path)
    args = ["bench", "serve", str(scenario), "--num-prompts", "20", "--request-rate", "10",
            "--random-input-len", "256", "--random-output-len", "16", "--save-result",
            "--save-detailed", "--result-dir", str(tmp_path), "--result-filename", "p.json"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "============ Serving Benchmark Result ============" in result.output
    assert "Request rate configured (RPS):           10.00" in result.output
    saved = json.loads((tmp_path / "p.json").read_text())
    assert saved["completed"] == 20 and saved["num_prompts"] == 20
    assert saved["total_input_tokens"] == 20 * 256 - 20  # the BOS the server adds is not counted
    assert all(len(itl) == 15 for itl in saved["itls"])
    block = saved["kvsim"]
    assert block["design"] == "v1-engine" and block["vllm_version"] == "0.33.0"
    low, high = block["band"]["mean_tpot_ms"]
    assert low <= saved["mean_tpot_ms"] <= high and low < high
    compared = runner.invoke(
        app, ["compare-bench", str(tmp_path / "p.json"), str(tmp_path / "p.json")]
    )
    assert compared.exit_code == 0, compared.output
    assert "mean_ttft_ms" in compared.output and "+0.0%" in compared.output


#: The pins between 0.11.0 and 0.33.0, with the `gpu_memory_utilization` each release defaults
#: to (docs/vllm-defaults.md: 0.9 on 0.19.1, 0.92 from 0.20.0; checked against each release's
#: create_engine_config by `kvsim verify --defaults`).
IN_BETWEEN_PINS = {"0.19.1": "0.9", "0.20.0": "0.92", "0.25.1": "0.92", "0.26.0": "0.92"}
PIN_LINE = ("vllm serve meta-llama/Llama-3.1-8B-Instruct --max_num_seqs=16 --port 8001 "
            "--no-enable-prefix-caching --disable-log-stats")  # fmt: skip


def _bench_blocks(tmp_path: Path, line: str, version: str, name: str) -> dict:
    scenario = tmp_path / f"{name}.yaml"
    result = runner.invoke(app, ["import-vllm", line, "--gpu", "h100-sxm", "--vllm-version",
                                 version, "-o", str(scenario)])  # fmt: skip
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["bench", "serve", str(scenario), "--num-prompts", "6",
                                 "--random-input-len", "128", "--random-output-len", "8",
                                 "--no-band", "--save-result", "--result-dir", str(tmp_path),
                                 "--result-filename", f"{name}.json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    return json.loads((tmp_path / f"{name}.json").read_text())


@pytest.mark.parametrize("version", sorted(IN_BETWEEN_PINS))
def test_a_line_imported_under_an_in_between_pin_runs_on_that_releases_defaults(
    tmp_path: Path, version: str
) -> None:
    """`import-vllm --vllm-version V` parses the line with V's own options and pins the scenario
    to V; `bench serve` runs it on V's defaults: the KV pool is the one the release's default
    memory utilization gives (the same line with that utilization written out)."""
    saved = _bench_blocks(tmp_path, PIN_LINE, version, "default")
    assert saved["completed"] == 6 and saved["kvsim"]["vllm_version"] == version
    utilization = IN_BETWEEN_PINS[version]
    stated = _bench_blocks(
        tmp_path, f"{PIN_LINE} --gpu-memory-utilization {utilization}", version, "stated"
    )
    assert saved["kvsim"]["num_gpu_blocks"] == stated["kvsim"]["num_gpu_blocks"]
    other = "0.92" if utilization == "0.9" else "0.9"
    differs = _bench_blocks(
        tmp_path, f"{PIN_LINE} --gpu-memory-utilization {other}", version, "other"
    )
    assert differs["kvsim"]["num_gpu_blocks"] != saved["kvsim"]["num_gpu_blocks"]


def test_the_default_result_file_name_is_vllms(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scenario = _imported(tmp_path)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["bench", "serve", str(scenario), "--num-prompts", "4",
                                 "--max-concurrency", "2", "--save-result", "--no-band"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (saved,) = tmp_path.glob("openai-infqps-concurrency2-llama-3.1-8b-*.json")
    assert "itls" not in json.loads(saved.read_text())  # per-request lists need --save-detailed


def test_import_prints_the_scenario_without_an_output() -> None:
    result = runner.invoke(app, ["import-vllm", LINE, "--gpu", "h100-sxm"])
    assert result.exit_code == 0
    assert "max_num_seqs: 32" in result.output and "port" not in result.output.split("workload")[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["import-vllm", "vllm serve llama-3.1-8b --enforce-eager", "--gpu", "h100-sxm"],
            "--enforce-eager",
        ),
        (
            ["import-vllm", "vllm serve llama-3.1-8b --nope", "--gpu", "h100-sxm"],
            "unrecognized arguments",
        ),
        (
            [
                "import-vllm",
                "vllm serve llama-3.1-8b",
                "--gpu",
                "h100-sxm",
                "--vllm-version",
                "0.9",
            ],
            "0.11.0, 0.19.1, 0.20.0, 0.25.1, 0.26.0, 0.33.0 only",
        ),
        (["compare-bench", "missing.json", "missing.json"], "missing.json: no such file"),
    ],  # fmt: skip
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--dataset-name", "sonnet"], "no sonnet dataset"),
        (["--dataset-name", "sharegpt"], "needs --dataset-path"),
        (["--dataset-name", "hf"], "kvsim takes random"),
        (["--random-range-ratio", "1.5"], "must be in [0, 1)"),
        (["--percentile-metrics", "ttft,bogus"], "unknown metric 'bogus'"),
        (["--goodput", "ttft=5"], "KEY:VALUE"),
        (["--burstiness", "0"], "must be positive"),
        (["--max-concurrency", "0"], "greater than 0"),
        (["--backend", "tgi"], "--backend 'tgi'"),
    ],  # fmt: skip
)
def test_bench_serve_bad_options_exit_2(tmp_path: Path, extra: list[str], message: str) -> None:
    scenario = _imported(tmp_path)
    result = runner.invoke(app, ["bench", "serve", str(scenario), "--num-prompts", "4", *extra])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


def _chat_vs_completions_ttft_ms(tmp_path: Path, line: str, version: str) -> dict[str, float]:
    scenario = tmp_path / f"s-{version}.yaml"
    result = runner.invoke(app, ["import-vllm", line, "--gpu", "h100-sxm", "--vllm-version",
                                 version, "-o", str(scenario)])  # fmt: skip
    assert result.exit_code == 0, result.output
    ttft = {}
    for backend in ("openai", "openai-chat"):
        name = f"{version}-{backend}.json"
        result = runner.invoke(app, ["bench", "serve", str(scenario), "--backend", backend,
                                     "--num-prompts", "20", "--random-input-len", "128",
                                     "--random-output-len", "4", "--no-band", "--save-result",
                                     "--result-dir", str(tmp_path), "--result-filename", name])  # fmt: skip
        assert result.exit_code == 0, result.output
        saved = json.loads((tmp_path / name).read_text())
        assert saved["backend"] == backend
        ttft[backend] = saved["mean_ttft_ms"]
    return ttft


@pytest.mark.parametrize(
    ("model", "version", "pays"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "0.11.0", True),
        ("meta-llama/Llama-3.1-8B-Instruct", "0.19.1", False),
        ("openai/gpt-oss-20b", "0.11.0", False),
    ],
)
def test_backend_openai_chat_pays_the_template_parse_only_where_vllm_does(
    tmp_path: Path, model: str, version: str, pays: bool
) -> None:
    """`--backend openai-chat`: on pin 0.11.0 a Jinja-template model's burst of 20 waits for 20
    parses of 7 ms on the loop (the mean TTFT grows by at least the mean wait, 73.5 ms); on
    0.19.1 (cached) and for gpt-oss (harmony) the chat run is the completions run."""
    ttft = _chat_vs_completions_ttft_ms(tmp_path, f"vllm serve {model}", version)
    if pays:
        assert ttft["openai-chat"] - ttft["openai"] >= 7.0 * (20 + 1) / 2
    else:
        assert ttft["openai-chat"] == ttft["openai"]


def test_sharegpt_from_a_lengths_file_and_json_refused(tmp_path: Path) -> None:
    scenario = _imported(tmp_path)
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n100,20\n50,5\n")
    args = ["bench", "serve", str(scenario), "--dataset-name", "sharegpt", "--num-prompts", "5",
            "--no-band", "--dataset-path"]  # fmt: skip
    result = runner.invoke(app, [*args, str(lengths)])
    assert result.exit_code == 0, result.output
    assert "Successful requests:                     5" in result.output
    conversations = tmp_path / "ShareGPT.json"
    conversations.write_text("[]")
    refused = runner.invoke(app, [*args, str(conversations)])
    assert refused.exit_code == 2 and "sim.workload.sharegpt_vllm" in refused.output


def test_no_api_server_gives_the_engine_cores_view_and_the_file_says_which(tmp_path: Path) -> None:
    """With the API server (the default) a lone request's TTFT carries its intake, hand-off and first token's streaming
    (`sim.engine.frontend`); `--no-api-server` drops them, and the kvsim block records the costs
    used (null without)."""
    from sim.engine.api_server import VLLM_API_SERVER

    scenario = _imported(tmp_path)
    ttft = {}
    for flag in ("--api-server", "--no-api-server"):
        name = f"{flag.strip('-')}.json"
        result = runner.invoke(app, ["bench", "serve", str(scenario), "--num-prompts", "1",
                                     "--random-input-len", "512", "--random-output-len", "4",
                                     "--no-band", "--save-result", "--result-dir", str(tmp_path),
                                     "--result-filename", name, flag])  # fmt: skip
        assert result.exit_code == 0, result.output
        saved = json.loads((tmp_path / name).read_text())
        ttft[flag] = saved["mean_ttft_ms"]
        if flag == "--no-api-server":
            assert saved["kvsim"]["api_server"] is None
        else:
            assert saved["kvsim"]["api_server"]["hand_off_s"] == VLLM_API_SERVER.hand_off_s
    costs = VLLM_API_SERVER
    added_ms = 1e3 * (costs.input_s(512) + costs.hand_off_s + costs.lone_stream_s(1))
    assert ttft["--api-server"] - ttft["--no-api-server"] == pytest.approx(added_ms, rel=1e-6)


def test_import_vllm_takes_a_line_or_a_log_not_both(tmp_path: Path) -> None:
    log = Path(__file__).resolve().parents[2] / "examples" / "vllm_bench" / "server_startup.log"
    both = runner.invoke(app, ["import-vllm", LINE, "--from-log", str(log), "--gpu", "h100-sxm"])
    neither = runner.invoke(app, ["import-vllm", "--gpu", "h100-sxm"])
    for result in (both, neither):
        assert result.exit_code == 2, result.output
        assert "give a vllm serve command line or --from-log LOG" in result.output
    missing = runner.invoke(app, ["import-vllm", "--from-log", str(tmp_path / "x.log"),
                                  "--gpu", "h100-sxm"])  # fmt: skip
    assert missing.exit_code == 2 and "x.log: no such file" in missing.output
    made = runner.invoke(app, ["import-vllm", "--from-log", str(log), "--gpu", "h100-sxm"])
    assert made.exit_code == 0, made.output
    assert "vllm_version: 0.19.1" in made.output and "max_num_seqs: 128" in made.output
