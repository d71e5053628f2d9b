"""`kvsim import-vllm`, `kvsim bench serve` and `kvsim compare-bench`: `vllm serve` in,
`vllm bench serve` out (`sim.vllm_bench`).

    kvsim import-vllm "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 64" \\
        --gpu h100-sxm -o llama.yaml
    kvsim bench serve llama.yaml --num-prompts 200 --request-rate 8 --save-result
    kvsim compare-bench openai-8.0qps-llama-3.1-8b-*.json measured.json
"""

from __future__ import annotations

import dataclasses
import json
import math
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer

bench_app = typer.Typer(help="vllm bench serve, simulated.", no_args_is_help=True)


def import_vllm_command(
    gpu: Annotated[str, typer.Option(help="The GPU it runs on (a kvsim catalog name).")],
    line: Annotated[
        str | None,
        typer.Argument(help='The command line, quoted: "vllm serve MODEL ..."'),
    ] = None,
    from_log: Annotated[
        Path | None,
        typer.Option(
            "--from-log",
            help="Instead of a command line: the server's startup log (its 'non-default args' "
            "line; the release it names picks the pin unless --vllm-version says).",
        ),
    ] = None,
    vllm_version: Annotated[
        str | None,
        typer.Option(
            help="The vLLM release whose options and defaults apply: 0.11.0, 0.19.1, 0.20.0, "
            "0.25.1, 0.26.0 or 0.33.0 (default 0.33.0, or the log's release's pin)."
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the scenario here (default: stdout).")
    ] = None,
    allow_unmodelled: Annotated[
        str, typer.Option(help="Comma-separated options kvsim does not model, simulated without.")
    ] = "",
) -> None:
    """Turn a `vllm serve` command line, or a server's startup log, into a scenario that sets
    only what the server was started with."""
    from sim.errors import InputError
    from sim.files.outdir import check_output_file, write_text_atomic
    from sim.vllm_bench.importer import import_serve_line, import_server_log

    if (line is None) == (from_log is None):
        raise InputError("kvsim import-vllm: give a vllm serve command line or --from-log LOG")
    if out is not None:
        check_output_file(out)
    allowed = allow_unmodelled.split(",")
    if from_log is not None:
        text = import_server_log(from_log, gpu=gpu, version=vllm_version, allow_unmodelled=allowed)
    else:
        assert line is not None
        text = import_serve_line(
            line, gpu=gpu, version=vllm_version or "0.33.0", allow_unmodelled=allowed
        )
    if out is None:
        typer.echo(text, nl=False)
        return
    write_text_atomic(out, text)
    typer.echo(f"wrote {out}")


@bench_app.command("serve")
def bench_serve_command(
    scenario: Annotated[Path, typer.Argument(help="The server: a scenario (kvsim import-vllm).")],
    dataset_name: str = typer.Option(
        "random", help="random, sharegpt, sonnet or prefix_repetition"
    ),
    backend: str = typer.Option(
        "openai", help="openai or vllm: /v1/completions; openai-chat: /v1/chat/completions."
    ),
    dataset_path: Path | None = typer.Option(
        None, help="sharegpt: a lengths CSV (python -m sim.workload.sharegpt_vllm)"
    ),
    num_prompts: int = typer.Option(1000, help="Number of prompts."),
    random_input_len: int = typer.Option(1024),
    random_output_len: int = typer.Option(128),
    random_range_ratio: str = typer.Option("0.0", help='A number or {"input": a, "output": b}.'),
    random_prefix_len: int = typer.Option(0),
    prefix_repetition_prefix_len: int = typer.Option(256),
    prefix_repetition_suffix_len: int = typer.Option(256),
    prefix_repetition_num_prefixes: int = typer.Option(10),
    prefix_repetition_output_len: int = typer.Option(128),
    request_rate: float = typer.Option(math.inf, help="Requests per second; inf: all at 0."),
    burstiness: float = typer.Option(1.0, help="Gamma shape of the gaps (1: Poisson)."),
    max_concurrency: int | None = typer.Option(None, help="At most this many requests in flight."),
    seed: int = typer.Option(0),
    percentile_metrics: str | None = typer.Option(None, help="Default ttft,tpot,itl."),
    metric_percentiles: str = typer.Option("99"),
    goodput: list[str] | None = typer.Option(None, help="KEY:MS (repeatable; ttft, tpot, e2el)."),
    save_result: bool = typer.Option(False, "--save-result", help="Write the result JSON."),
    save_detailed: bool = typer.Option(False, "--save-detailed", help="With per-request lists."),
    result_dir: Path | None = typer.Option(None),
    result_filename: str | None = typer.Option(None),
    num_special_tokens: int = typer.Option(
        1, help="kvsim: tokens the server's tokenizer adds (BOS)."
    ),
    band: bool = typer.Option(
        True, "--band/--no-band", help="kvsim: also run at the step-time band's ends."
    ),
    ready_check_timeout_sec: int = typer.Option(
        600, help="> 0: the initial single-prompt test run first (its prompt stays cached)."
    ),
    api_server: bool = typer.Option(
        True,
        "--api-server/--no-api-server",
        help="kvsim: time requests and tokens through vLLM's API server (sim.engine.frontend); "
        "off: the engine core's view.",
    ),
) -> None:
    """Simulate `vllm bench serve` against the scenario's server; print vLLM's result block."""
    from sim.engine.api_server import VLLM_API_SERVER
    from sim.engine.chat_template import endpoint_of_backend
    from sim.files.outdir import check_output_file, write_text_atomic
    from sim.scenario.schema import load_scenario, naming
    from sim.vllm_bench.bench import WorkloadOptions, metric_band, run_bench
    from sim.vllm_bench.metrics import BenchSettings, parse_goodput, result_json

    slos = parse_goodput([p for item in goodput or () for p in item.replace(",", " ").split()])
    settings = BenchSettings(request_rate, burstiness, max_concurrency, percentile_metrics,
                             metric_percentiles, slos, save_detailed,
                             ready_check_timeout_sec,
                             VLLM_API_SERVER if api_server else None,
                             endpoint=endpoint_of_backend(backend))  # fmt: skip
    settings.selected_metrics, settings.percentiles  # noqa: B018 - bad values refused before the run
    workload = WorkloadOptions(
        dataset_name, dataset_path, num_prompts, random_input_len, random_output_len,
        random_range_ratio, random_prefix_len, prefix_repetition_prefix_len,
        prefix_repetition_suffix_len, prefix_repetition_num_prefixes,
        prefix_repetition_output_len, seed, num_special_tokens,
    )  # fmt: skip
    scenario_obj = load_scenario(scenario)
    model_id = _model_id(scenario_obj.model)
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    target = (
        _result_path(settings, backend, model_id, date, result_dir, result_filename)
        if save_result
        else None
    )
    if target is not None:
        check_output_file(target)
    with naming(scenario):
        run = run_bench(scenario_obj, scenario.parent, workload, settings, band=band)
    typer.echo("\n".join(run.lines))
    if target is None:
        return
    out = result_json(run.result, settings, date=date, model_id=model_id, num_prompts=num_prompts,
                      backend=backend)  # fmt: skip
    out["kvsim"] = {
        "note": "predicted by kvsim (a simulation), not measured on a GPU",
        "scenario": scenario_obj.name,
        "scenario_file": str(scenario),
        "design": scenario_obj.scheduler.design.value,
        "vllm_version": scenario_obj.scheduler.resolved_vllm_version,
        "gpu": scenario_obj.hardware.gpu,
        "step_time_band": run.summary.get("step_time_band"),
        "band": metric_band(run),
        "workload": {
            k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(workload).items()
        },  # fmt: skip
        "num_gpu_blocks": run.inputs.get("num_gpu_blocks"),
        "api_server": {
            **dataclasses.asdict(settings.frontend),
            "api_server_count": scenario_obj.engine.api_server_count,
            "stream_interval": scenario_obj.engine.stream_interval,
        }
        if settings.frontend
        else None,
    }
    write_text_atomic(target, json.dumps(out, default=_jsonable))
    typer.echo(f"wrote {target}")


def _jsonable(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON: {type(value).__name__}")


def _model_id(model: Any) -> str:
    from sim.vllm_bench.bench import model_name

    return model_name(model) or "model"


def _result_path(
    settings, backend: str, model_id: str, date: str, folder: Path | None, name: str | None
) -> Path:
    """vLLM's `compute_result_filename` (serve.py L1594-1635), label = the backend."""
    concurrency = (
        f"-concurrency{settings.max_concurrency}" if settings.max_concurrency is not None else ""
    )
    default = (
        f"{backend}-{settings.request_rate}qps{concurrency}-{model_id.split('/')[-1]}-{date}.json"
    )
    path = Path(name or default)
    return folder / path if folder is not None else path


def compare_bench_command(
    predicted: Annotated[Path, typer.Argument(help="kvsim's result JSON (kvsim bench serve).")],
    measured: Annotated[Path, typer.Argument(help="A measured vllm bench serve result JSON.")],
) -> None:
    """The two results side by side: error per metric, and whether the measurement is in band."""
    from sim.vllm_bench.compare import compare, read_result, render

    rows = compare(read_result(predicted), read_result(measured))
    typer.echo("\n".join(render(rows, predicted, measured)))


def register(app: typer.Typer) -> None:
    """Add `kvsim import-vllm`, `kvsim bench serve` and `kvsim compare-bench`."""
    app.command("import-vllm")(import_vllm_command)
    app.add_typer(bench_app, name="bench")
    app.command("compare-bench")(compare_bench_command)
