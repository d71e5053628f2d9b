"""The `kvsim` command line (typer). Only this layer prints and writes files.

Exit status, the same for every command:

* 0: done (for `check`: every expectation held; `fuzz`: nothing found);
* 1: a finding: a `check` expectation failed, `fuzz` found a violation, `shrink` found no
  such violation, `verify` found a divergence, every `sweep` point failed;
* 2: bad input: a scenario, `--set`, trace, profile, option value or output path that is
  wrong; one line on stderr naming the file, line and field (`sim.errors.InputError`);
* 3: an internal error, i.e. a bug in kvsim: its traceback on stderr;
* 130: interrupted (Ctrl-C); `kvsim run` says what was (not) written.

All of this is decided in one place, `KvsimGroup.invoke`: commands raise `InputError` for bad
input and never catch `ValueError` or `Exception` to make it look like input.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from typer.core import TyperGroup
from typer.exceptions import TyperException

from sim.errors import InputError, one_line

EXIT_FINDING = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130
#: The reader of stdout went away (`kvsim ... | head`): 128 + SIGPIPE, as a shell reports it.
EXIT_BROKEN_PIPE = 141


class _Console(Console):
    """rich's Console, but a closed pipe exits 141 (rich's default, 1, means "a finding" here)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError  # KvsimGroup.invoke: exit EXIT_BROKEN_PIPE, quietly


console = _Console(stderr=False)
err_console = Console(stderr=True)

#: Errors that are the user's input, reported as one line with exit status 2.
INPUT_ERRORS = (InputError,)


def fail(message: str, code: int = EXIT_BAD_INPUT) -> typer.Exit:
    """Print `error: MESSAGE` (one line, at most `sim.errors.MAX_ERROR_CHARS`) and exit `code`."""
    err_console.print(
        f"[bold red]error:[/] {escape(one_line(message))}", highlight=False, soft_wrap=True
    )
    return typer.Exit(code)


class KvsimGroup(TyperGroup):
    """Maps what a command raises to the exit status (see the module docstring)."""

    def invoke(self, ctx: Any) -> Any:  # typer's (vendored click) Context
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, TyperException):  # typer's own: usage errors exit 2
            raise
        except InputError as error:
            raise fail(str(error)) from None
        except KeyboardInterrupt:
            err_console.print("interrupted", highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            _stdout_gone()
            raise typer.Exit(EXIT_BROKEN_PIPE) from None
        except Exception:  # noqa: BLE001 - anything else is a kvsim bug: show all of it
            traceback.print_exc(file=sys.stderr)
            err_console.print(
                "[bold red]internal error:[/] this is a bug in kvsim, not in your input; "
                "please report it with the traceback above",
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(EXIT_INTERNAL) from None


app = typer.Typer(
    name="kvsim",
    help="Simulate an LLM-serving engine's scheduler and paged KV cache; audit block managers.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=KvsimGroup,
)


@app.callback()
def _root() -> None:
    """kvsim: run scenarios, audit block managers, plan capacity."""


class LazyProgress:
    """A progress bar that appears only once a run has taken more than `delay_s` seconds."""

    def __init__(self, description: str, enabled: bool = True, delay_s: float = 1.5) -> None:
        self.description = description
        self.enabled = enabled and sys.stderr.isatty()
        self.delay_s = delay_s
        self.start = time.perf_counter()
        self._progress: Any = None  # a rich Progress, made on first need
        self._task: Any = None

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


def _kv_group_rows(groups: list[dict] | None) -> list[tuple[str, str]]:
    """One row per hybrid KV-cache group: "sliding 4096, 21 layers, peak 375 blocks"."""
    rows = []
    for group in groups or []:
        window = group["sliding_window"]
        kind = "full" if window is None else f"sliding {window}"
        peak = group.get("peak_blocks")
        text = f"{kind}, {group['num_layers']} layers"
        if peak is not None:
            text += f", peak {peak} blocks"
        rows.append((f"  KV group {group['group_id']}", text))
    return rows


def print_summary(name: str, summary: dict, inputs: dict, out_dir: Path | None) -> None:
    table = Table(title=f"kvsim run: {name}", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    states = summary["states"]
    rows = [
        ("design", _design_row(inputs.get("design"), inputs.get("vllm_version"))),
        ("block manager", _manager_row(inputs.get("block_manager"))),
        ("step time", _step_time_row(inputs.get("step_time"), summary.get("step_time_band"))),
        ("GPU blocks", f"{inputs.get('num_gpu_blocks')} ({inputs.get('num_gpu_blocks_source')})"),
        ("sliding window (tokens)", inputs.get("sliding_window")),
        *_kv_group_rows(inputs.get("kv_cache_groups")),
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
    for line in next_steps(summary, out_dir):
        console.print(line, highlight=False, soft_wrap=True)


def _design_row(design: str | None, vllm_version: str | None = None) -> str | None:
    """'v0-v2' -> 'v0-v2 = vLLM 0.5.4 v0, BlockSpaceManagerV2': which vLLM it models."""
    from sim.kv.config import Design

    try:
        return f"{design} = {Design(design).upstream_at(vllm_version)}"
    except ValueError:
        return design


def _manager_row(manager: dict | None) -> str:
    """Which block manager ran: kvsim's model, or vLLM's real code (`--vllm-root`)."""
    if not manager or manager.get("kind") != "real":
        return "kvsim's model"
    return f"vLLM {manager.get('vllm_version')} real code ({manager.get('vllm_root')})"


def _step_time_row(step_time: dict | None, band: dict | None) -> str:
    """'measured, x0.92-x1.06 of it' : the step-time model and how sure it is.

    Example: ({"measured": {}}, {"low_factor": 0.924, "high_factor": 1.057, ...}) ->
    "measured (real steps x0.924-x1.057 of it)"; an unvalidated band says so.
    """
    name = next(iter(step_time), "?") if step_time else "?"
    if not band:
        return name
    low, high = band.get("low_factor"), band.get("high_factor")
    if low == high == 1.0:
        return f"{name} (no validated error band)"
    extrapolated = ", extrapolated" if band.get("extrapolated") else ""
    return f"{name} (real steps x{low:g}-x{high:g} of it{extrapolated})"


def next_steps(summary: dict, out_dir: Path | None) -> list[str]:
    """What to run after a run that found violations: shrink one kind, then check it in CI.

    Example (kinds admission_undercount and leaked_blocks, outputs in runs/x)::

        next: shrink it to a minimal reproducer, then keep that as a CI check:
          kvsim shrink runs/x -o runs/x/minimal.yaml --kind admission_undercount
          kvsim check runs/x/minimal.yaml
        (one kind per shrink; the others: leaked_blocks)
    """
    kinds = list(summary.get("violation_kinds") or [])
    if not kinds:
        return []
    source = str(out_dir) if out_dir is not None else "SCENARIO.yaml"
    minimal = str(out_dir / "minimal.yaml") if out_dir is not None else "minimal.yaml"
    lines = [
        "[bold]next:[/] shrink it to a minimal reproducer, then keep that as a CI check "
        "(its expect: lists the kinds it shows; check exits 1 when that changes):",
        f"  kvsim shrink {escape(source)} -o {escape(minimal)} --kind {kinds[0]}",
        f"  kvsim check {escape(minimal)}",
    ]
    if len(kinds) > 1:
        lines.append(f"(one kind per shrink; the others: {', '.join(kinds[1:])})")
    return lines


@app.command()
def run(
    scenario: Annotated[
        Path | None, typer.Argument(help="Scenario YAML; the built-in default if omitted.")
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out",
            "-o",
            help="Output folder (default runs/<name>); a new run replaces an earlier one whole.",
        ),
    ] = None,
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override KEY=VALUE (repeatable).")
    ] = None,
    stop: Annotated[
        bool,
        typer.Option(
            "--stop",
            help="End the run where the real engine would raise (an allocation that ran dry, "
            "a double free, ...); silent violations such as admission_overtake are recorded "
            "and the run goes on, as in the real engine.",
        ),
    ] = False,
    stop_any: Annotated[
        bool,
        typer.Option(
            "--stop-at-first-violation",
            help="End the run at the first violation of any kind (overrides --stop).",
        ),
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
    from sim.outdir import commit_staging, discard_staging, start_staging
    from sim.overrides import apply_overrides, parse_assignment
    from sim.results import summary_json, write_tables
    from sim.runner import builtin_scenario_path, self_contained
    from sim.runner import run as run_scenario
    from sim.scenario import load_scenario, scenario_to_yaml

    path = scenario or builtin_scenario_path()
    overrides = {}
    for item in set_ or []:
        key, values = parse_assignment(item)
        overrides[key] = values[0] if len(values) == 1 else values
    if stop or stop_any:
        overrides["engine.violation_policy"] = "stop_any" if stop_any else "stop"
    scenario_obj = load_scenario(path)
    if overrides:
        scenario_obj = apply_overrides(scenario_obj, overrides)
    out_dir = out or Path("runs") / scenario_obj.name
    # The output folder is checked (and its temporary sibling made) before the simulation, so
    # a bad -o costs nothing; the run's files appear at out_dir only once all are written.
    staging = start_staging(out_dir)
    try:
        progress = LazyProgress("simulating", enabled=not json_out)
        try:
            result = run_scenario(
                scenario_obj,
                base_dir=path.parent,
                progress=progress,
                vllm_root=vllm_root,
                tables_dir=staging,  # requests and steps stream there as the run goes
            )
        finally:
            progress.close()
        write_tables(result, staging)
        # The scenario as run (overrides applied, paths absolute): `kvsim shrink OUT_DIR` reads it.
        (staging / "scenario.yaml").write_text(
            scenario_to_yaml(self_contained(scenario_obj, path.parent))
        )
        if plots:
            _save_plots(result, staging)
        commit_staging(staging, out_dir)
    except KeyboardInterrupt:
        if staging.exists():
            discard_staging(staging)
            said = f"nothing was written; {out_dir} is as it was before this run"
        else:  # the new run had already taken its place
            said = f"{out_dir} holds this run, complete"
        err_console.print(f"interrupted: {escape(said)}", highlight=False, soft_wrap=True)
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except BaseException:
        discard_staging(staging)
        raise
    name = result.inputs.get("scenario", "scenario")
    if json_out:
        typer.echo(summary_json(result))
    else:
        print_summary(name, result.summary, result.inputs, out_dir)
        _print_violations(result)
    _done_fast()


def _stdout_gone() -> None:
    """The reader closed the pipe: nothing more can be shown, and that is not a kvsim bug.

    stdout is pointed at /dev/null so that the interpreter's own final flush does not raise
    again (the recipe in Python's `signal` documentation, "Note on SIGPIPE").
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _done_fast() -> None:
    """End the `kvsim` process now that everything is written and printed.

    A whole-trace replay leaves millions of objects that the interpreter would free one by one
    at exit (~0.3 s for the Azure trace); the OS reclaims them at once. Only in the console
    script (`main`), never when the command runs inside another program or a test, and only
    after flushing; `run` holds no other resource (no pools, no open files) at this point.
    """
    if _STANDALONE:
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_gone()
            os._exit(EXIT_BROKEN_PIPE)
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
        "sim.planning.versions_cli",
        "sim.plots_cli",
        "sim.calibrate_cli",
        "sim.step_cli",
        "sim.vllm_real.cli",
        "sim.cluster.cli",
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
    except KeyboardInterrupt:  # between commands' own handling, e.g. while importing
        err_console.print("interrupted")
        sys.exit(EXIT_INTERRUPTED)


if __name__ == "__main__":
    main()


__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FINDING",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "INPUT_ERRORS",
    "KvsimGroup",
    "app",
    "fail",
    "json",
    "main",
    "print_summary",
]
