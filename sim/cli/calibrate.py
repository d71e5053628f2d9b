"""`kvsim calibrate`: time real kernels with PyTorch and fit a step-time profile.

torch is imported only when the command runs (it lives in the optional `calibrate` extra:
`pip install -e '.[calibrate]'`), so `import sim` and every other command stay torch-free.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer


def calibrate(
    model: Annotated[
        str, typer.Option("--model", help="Catalog model name, e.g. llama-3.1-8b.")
    ] = "llama-3.1-8b",
    out: Annotated[Path, typer.Option("--out", "-o", help="Profile JSON to write.")] = Path(
        "profile.json"
    ),
    budget: Annotated[
        float, typer.Option("--budget", help="Seconds the timing sweep may take.")
    ] = 300.0,
    device: Annotated[
        str, typer.Option("--device", help="cpu or cuda (default: cuda when present).")
    ] = "auto",
    dtype: Annotated[str, typer.Option("--dtype", help="float32, float16 or bfloat16.")] = "auto",
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu",
            help="Catalog GPU for the report's datasheet ratios; with --from-bench --from-log "
            "and no --scenario, the GPU the logged server ran on.",
        ),
    ] = None,
    tp: Annotated[
        int, typer.Option("--tp", help="Tensor-parallel size the geometry is split by.")
    ] = 1,
    block_size: Annotated[int, typer.Option("--block-size")] = 16,
    report_dir: Annotated[
        Path | None, typer.Option("--report-dir", help="Write the report (table + plot) here.")
    ] = None,
    from_bench: Annotated[
        list[Path] | None,
        typer.Option(
            "--from-bench",
            help="A measured `vllm bench serve --save-result` JSON (repeat for several): fit "
            "the measured step time to them instead of timing kernels (no torch, no GPU).",
        ),
    ] = None,
    scenario: Annotated[
        Path | None,
        typer.Option(
            "--scenario",
            help="--from-bench: the server the results came from (or --from-log with --gpu: "
            "the server as its startup log says it was started).",
        ),
    ] = None,
    from_log: Annotated[
        Path | None,
        typer.Option(
            "--from-log",
            help="--from-bench: the server's startup log; its 'GPU KV cache size' replaces "
            "the scenario's pool (and, without --scenario, its 'non-default args' are the "
            "scenario).",
        ),
    ] = None,
    dataset_name: Annotated[str, typer.Option(help="--from-bench: the results' dataset.")] = (
        "random"
    ),
    random_input_len: Annotated[
        int, typer.Option(help="--from-bench: as vllm bench serve.")
    ] = 1024,
    random_output_len: Annotated[
        int, typer.Option(help="--from-bench: as vllm bench serve.")
    ] = 128,
    random_range_ratio: Annotated[str, typer.Option(help="--from-bench: as vllm bench serve.")] = (
        "0.0"
    ),
    random_prefix_len: Annotated[int, typer.Option(help="--from-bench: as vllm bench serve.")] = 0,
    seed: Annotated[int, typer.Option(help="--from-bench: as vllm bench serve.")] = 0,
    num_special_tokens: Annotated[
        int, typer.Option(help="--from-bench: tokens the server's tokenizer adds (BOS).")
    ] = 1,
    per_term: Annotated[
        bool,
        typer.Option(
            "--per-term",
            help="--from-bench: fit the compute-bound GPU terms (prefill) and the others "
            "(decode) with a factor each, instead of one GPU factor.",
        ),
    ] = False,
) -> None:
    """Sweep paged-attention and GEMM kernels on this machine and fit a profile for `kvsim run`,
    plus the measured model's coefficients refitted from the same timings (PROFILE.coefficients.json).

    `--budget` is honoured: timing stops at the deadline (started here, before torch loads)
    and the fits use the cases measured so far."""
    from calibrate.budget import Deadline
    from sim.cli.main import console, fail
    from sim.errors import InputError
    from sim.files.outdir import check_output_dir, check_output_file

    if from_bench:
        workload = dict(dataset_name=dataset_name, random_input_len=random_input_len,
                        random_output_len=random_output_len,
                        random_range_ratio=random_range_ratio,
                        random_prefix_len=random_prefix_len, seed=seed,
                        num_special_tokens=num_special_tokens)  # fmt: skip
        out_file = out if out != Path("profile.json") else Path("bench.coefficients.json")
        _from_bench(from_bench, scenario, out_file, workload, from_log, gpu, per_term)
        return
    if not math.isfinite(budget) or budget <= 0:  # -1 or 0 s would time nothing
        raise InputError(f"--budget {budget:g}: must be a positive number of seconds")
    deadline = Deadline(budget)
    _check_catalog_names(model, gpu)  # before the timing sweep, which takes minutes

    try:
        import torch
    except ImportError:
        raise fail("kvsim calibrate needs torch: pip install -e '.[calibrate]'") from None
    from calibrate.cli import run_calibration

    check_output_file(out)  # before the timing sweep, which takes minutes
    if report_dir is not None:
        check_output_dir(report_dir)

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    if device == "cpu":
        from calibrate.cli import CPU_NOTE

        console.print(f"[yellow]note:[/] {CPU_NOTE}", highlight=False, soft_wrap=True)
    console.print(
        f"calibrating {model} on {device} ({dtype}) within about {budget:g} s plus the fit",
        highlight=False,
    )
    profile = run_calibration(
        model,
        out,
        budget,
        device,
        dtype,
        tp=tp,
        block_size=block_size,
        gpu=gpu,
        report_dir=report_dir or out.parent,
        progress=True,
        deadline=deadline,
    )
    console.print(
        f"profile for {profile.model.name} on {device} ({dtype}) written to {out} "
        f"in {profile.metadata.wall_s:g} s",
        highlight=False,
    )
    for note in profile.grid.get("notes", []):
        console.print(f"note: {note}", highlight=False, soft_wrap=True)
    console.print(f"use it with: step_time: {{calibrated: {out}}}", highlight=False)
    from calibrate.to_measured import coefficients_path, usage_lines

    for line in usage_lines(coefficients_path(out)):
        console.print(line, highlight=False, soft_wrap=True, markup=False)


def _bench_scenario(scenario: Path | None, log: Path | None, gpu: str | None) -> tuple:
    """The server the results came from: `--scenario`, or the one `log`'s "non-default args"
    describe on `gpu` (`sim.vllm_bench.importer.import_server_log`), and the path that names
    it (the log's, for messages, relative files and the provenance)."""
    import yaml

    from sim.errors import InputError
    from sim.scenario.schema import load_scenario, scenario_from_dict
    from sim.vllm_bench.importer import import_server_log

    if scenario is not None:
        return load_scenario(scenario), scenario
    if log is None or gpu is None:
        raise InputError(
            "--from-bench needs --scenario (the server the results came from), or --from-log "
            "SERVER_LOG with --gpu G (the server as its startup log says it was started)"
        )
    text = import_server_log(log, gpu=gpu)
    return scenario_from_dict(yaml.safe_load(text), str(log)), log


def _from_bench(
    files: list[Path],
    scenario: Path | None,
    out: Path,
    workload: dict,
    log: Path | None,
    gpu: str | None = None,
    per_term: bool = False,
) -> None:
    """`kvsim calibrate --from-bench`: fit, print the comparison, write the coefficients."""
    import json

    from sim.cli.main import console
    from sim.files.outdir import check_output_file, write_text_atomic
    from sim.scenario.schema import naming
    from sim.vllm_bench.bench import WorkloadOptions
    from sim.vllm_bench.bench_files import read_bench_file
    from sim.vllm_bench.calibrate import fit_from_bench
    from sim.vllm_bench.calibrate_output import coefficients_document, report_lines
    from sim.vllm_bench.log_pool import apply_server_log
    from sim.vllm_bench.server_log import read_server_log

    scenario_obj, scenario = _bench_scenario(scenario, log, gpu)
    check_output_file(out)
    options = WorkloadOptions(**workload)
    bench_files = [read_bench_file(path, options) for path in files]
    console.print(f"fitting the measured step time of {scenario} to {len(files)} result(s)",
                  highlight=False)  # fmt: skip
    pool = None
    with naming(scenario):
        if log is not None:
            scenario_obj, pool = apply_server_log(scenario_obj, scenario.parent,
                                                  read_server_log(log))  # fmt: skip
            console.print(f"KV pool from {log}: {pool['num_gpu_blocks']} blocks (kvsim would "
                          f"derive {pool['kvsim_num_gpu_blocks']})", highlight=False)  # fmt: skip
        fit = fit_from_bench(scenario_obj, scenario.parent, bench_files, per_term=per_term)
        doc = coefficients_document(fit, scenario_obj, scenario.parent, scenario, pool)
    for line in report_lines(fit):
        console.print(line, highlight=False, soft_wrap=True, markup=False)
    write_text_atomic(out, json.dumps(doc, indent=1) + "\n")
    console.print(f"wrote {out}; use it with: step_time: {{measured: {{coefficients: {out}}}}}",
                  highlight=False, markup=False)  # fmt: skip


def _check_catalog_names(model: str, gpu: str | None) -> None:
    """`--model` and `--gpu` name catalog entries; a miss names the option typed (it used to
    surface after the timing sweep, as "unknown GPU ..." with no option)."""
    from sim.catalog import CatalogError, get_gpu, get_model
    from sim.errors import InputError

    for option, name, lookup in (("--model", model, get_model), ("--gpu", gpu, get_gpu)):
        if name is None:
            continue
        try:
            lookup(name)
        except CatalogError as error:
            raise InputError(f"{option} {name!r}: {error}") from None


def register(app: typer.Typer) -> None:
    app.command()(calibrate)
