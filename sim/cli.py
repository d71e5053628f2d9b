"""The `kvsim` command line (typer). Only this layer prints and writes files.

Every user-facing failure (bad scenario, bad trace, missing file) is one line on stderr and
exit status 2; a scenario whose expectations fail in `kvsim check` exits 1.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sim.scenario import ScenarioError
from sim.workload.errors import WorkloadError

app = typer.Typer(
    name="kvsim",
    help="Simulate an LLM-serving engine's scheduler and paged KV cache; audit block managers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=False)
err_console = Console(stderr=True)

#: Errors that are the user's input, reported as one line with exit status 2.
INPUT_ERRORS = (ScenarioError, WorkloadError, FileNotFoundError, ValueError)


@app.callback()
def _root() -> None:
    """kvsim: run scenarios, audit block managers, plan capacity."""


def fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


class LazyProgress:
    """A progress bar that appears only once a run has taken more than `delay_s` seconds."""

    def __init__(self, description: str, enabled: bool = True, delay_s: float = 1.5) -> None:
        self.description = description
        self.enabled = enabled and sys.stderr.isatty()
        self.delay_s = delay_s
        self.start = time.perf_counter()
        self._progress = None
        self._task = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            if time.perf_counter() - self.start < self.delay_s:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=total)
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.4g}"
    return str(value)


def print_summary(name: str, summary: dict, inputs: dict, out_dir: Path | None) -> None:
    table = Table(title=f"kvsim run: {name}", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    states = summary["states"]
    rows = [
        ("design", inputs.get("design")),
        ("GPU blocks", f"{inputs.get('num_gpu_blocks')} ({inputs.get('num_gpu_blocks_source')})"),
        ("sliding window (tokens)", inputs.get("sliding_window")),
        ("requests", summary["num_requests"]),
        ("  finished / ignored", f"{states['finished']} / {states['ignored']}"),
        ("  failed / aborted", f"{states['failed']} / {states['aborted']}"),
        ("violations", summary["num_violations"]),
        ("  kinds", ", ".join(summary["violation_kinds"]) or "-"),
        ("simulated time (s)", summary["simulated_s"]),
        ("steps", summary["num_steps"]),
        ("throughput (req/s)", summary["throughput_req_per_s"]),
        ("throughput (tok/s)", summary["throughput_tok_per_s"]),
        ("TTFT p50 / p99 (s)", f"{_fmt(summary['ttft_p50_s'])} / {_fmt(summary['ttft_p99_s'])}"),
        ("TPOT p50 / p99 (s)", f"{_fmt(summary['tpot_p50_s'])} / {_fmt(summary['tpot_p99_s'])}"),
        ("E2E p50 / p99 (s)", f"{_fmt(summary['e2e_p50_s'])} / {_fmt(summary['e2e_p99_s'])}"),
        ("preemptions", summary["num_preemptions"]),
        ("KV used mean / max", f"{_fmt(summary['kv_util_mean'])} / {_fmt(summary['kv_util_max'])}"),
    ]
    for metric, value in rows:
        table.add_row(metric, _fmt(value))
    console.print(table)
    if summary.get("fatal_error"):
        console.print(f"[bold red]fatal engine error:[/] {escape(summary['fatal_error'])}")
    if summary.get("stopped_early"):
        console.print(f"[yellow]run stopped early:[/] {escape(summary['stopped_early'])}")
    if out_dir is not None:
        console.print(
            f"outputs written to {out_dir}/ (requests, steps, violations as Parquet and CSV)"
        )


@app.command()
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario YAML; the built-in default if omitted.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output directory (default runs/<name>).")
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override KEY=VALUE (repeatable).")
    ] = None,
    stop: Annotated[
        bool, typer.Option("--stop", help="End the run at the first violation, as the real engine.")
    ] = False,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the summary as JSON (for machines).")
    ] = False,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Save PNG plots next to the tables.")
    ] = True,
    vllm_root: Annotated[
        Path | None,
        typer.Option(
            "--vllm-root",
            help="Run vLLM's REAL block manager from this install (scripts/setup_vllm.sh).",
        ),
    ] = None,
) -> None:
    """Run a scenario and write requests / steps / violations tables."""
    from sim.overrides import apply_overrides, parse_assignment
    from sim.results import summary_json, write_result
    from sim.runner import builtin_scenario_path, self_contained
    from sim.runner import run as run_scenario
    from sim.scenario import load_scenario, scenario_to_yaml

    path = scenario or builtin_scenario_path()
    overrides = {}
    try:
        for item in set_ or []:
            key, values = parse_assignment(item)
            overrides[key] = values[0] if len(values) == 1 else values
        if stop:
            overrides["engine.violation_policy"] = "stop"
        scenario_obj = load_scenario(path)
        if overrides:
            scenario_obj = apply_overrides(scenario_obj, overrides)
        progress = LazyProgress("simulating", enabled=not json_out)
        try:
            result = run_scenario(
                scenario_obj, base_dir=path.parent, progress=progress, vllm_root=vllm_root
            )
        finally:
            progress.close()
    except INPUT_ERRORS as error:
        raise fail(str(error).splitlines()[0]) from None
    name = result.inputs.get("scenario", "scenario")
    out_dir = out or Path("runs") / name
    write_result(result, out_dir)
    # The scenario as run (overrides applied, paths absolute): `kvsim shrink OUT_DIR` reads it.
    (out_dir / "scenario.yaml").write_text(
        scenario_to_yaml(self_contained(scenario_obj, path.parent))
    )
    if plots:
        _save_plots(result, out_dir)
    if json_out:
        typer.echo(summary_json(result))
    else:
        print_summary(name, result.summary, result.inputs, out_dir)
        _print_violations(result)
    _done_fast()


def _done_fast() -> None:
    """End the `kvsim` process now that everything is written and printed.

    A whole-trace replay leaves millions of objects that the interpreter would free one by one
    at exit (~0.3 s for the Azure trace); the OS reclaims them at once. Only in the console
    script (`main`), never when the command runs inside another program or a test, and only
    after flushing; `run` holds no other resource (no pools, no open files) at this point.
    """
    if _STANDALONE:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _print_violations(result, limit: int = 5) -> None:
    frame = result.violations
    if not len(frame):
        return
    console.print(f"[bold]first {min(limit, len(frame))} of {len(frame)} violations:[/]")
    for row in frame.head(limit).itertuples():
        console.print(
            f"  [red]{row.kind}[/] at t={_fmt(row.time_s)} s: {escape(row.message)}",
            highlight=False,
        )


def _save_plots(result, out_dir: Path) -> None:
    try:
        from sim.plots import save_run_plots
    except ImportError:
        return
    save_run_plots(result, out_dir)


def _register_optional_commands() -> None:
    """Commands that live in their own modules (check/fuzz/shrink, sweep/capacity, ...)."""
    import importlib

    for module_name in (
        "sim.ci.cli",
        "sim.planning.cli",
        "sim.plots_cli",
        "sim.calibrate_cli",
        "sim.step_cli",
        "sim.vllm_real.cli",
    ):
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if error.name is None or not module_name.startswith(error.name):
                raise
            continue
        module.register(app)


_register_optional_commands()


#: Set by `main` (the console script): the process ends when a command ends.
_STANDALONE = False


def main() -> None:
    global _STANDALONE
    _STANDALONE = True
    try:
        app()
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()


__all__ = ["app", "fail", "json", "main", "print_summary"]
