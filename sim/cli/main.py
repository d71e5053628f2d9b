"""The `kvsim` command line (typer). Only this layer prints and writes files.

Every command ends with the exit status of `sim.cli.exits` (0 done, 1 a finding, 2 bad input,
3 a kvsim bug, 130 interrupted), decided in one place, `KvsimGroup.invoke`. `kvsim run` is
here; what it prints is `sim.output.terminal`; the other commands live in their own modules and
register themselves (`_register_optional_commands`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from sim.cli.exits import (
    EXIT_BAD_INPUT,
    EXIT_BROKEN_PIPE,
    EXIT_FINDING,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    INPUT_ERRORS,
    KvsimGroup,
    console,
    err_console,
    fail,
    stdout_gone,
)
from sim.output.terminal import (
    LazyProgress,
    _design_row,
    _manager_row,
    _step_time_row,
    next_steps,
    print_summary,
    print_violations,
)

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
    from sim.engine.run import builtin_scenario_path
    from sim.files.outdir import folder_lock
    from sim.output.results import summary_json
    from sim.scenario.overrides import apply_overrides, parse_overrides
    from sim.scenario.schema import load_scenario

    path = scenario or builtin_scenario_path()
    overrides = parse_overrides(set_)
    if stop or stop_any:
        overrides["engine.violation_policy"] = "stop_any" if stop_any else "stop"
    scenario_obj = load_scenario(path)
    if overrides:
        scenario_obj = apply_overrides(scenario_obj, overrides)
    out_dir = out or Path("runs") / scenario_obj.name
    # Held from the output check to the commit: a second run into out_dir is refused (exit 2).
    with folder_lock(out_dir):
        result = _run_staged(scenario_obj, path, out_dir, vllm_root, plots, not json_out)
    name = result.inputs.get("scenario", "scenario")
    if json_out:
        typer.echo(summary_json(result))
    else:
        print_summary(name, result.summary, result.inputs, out_dir)
        print_violations(result)
    _done_fast()


def _run_staged(scenario_obj, path: Path, out_dir: Path, vllm_root, plots: bool, show: bool):
    """Simulate into a staging folder that becomes `out_dir` whole (`sim.files.outdir`)."""
    from sim.engine.run import run as run_scenario
    from sim.engine.run import self_contained
    from sim.files.outdir import commit_staging, discard_staging, start_staging
    from sim.output.results import write_tables
    from sim.scenario.schema import naming, scenario_to_yaml

    # The output folder is checked (and its temporary sibling made) before the simulation, so
    # a bad -o costs nothing; the run's files appear at out_dir only once all are written.
    staging = start_staging(out_dir)
    try:
        progress = LazyProgress("simulating", enabled=show)
        try:
            with naming(path):  # a resolution error names the file too
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
    return result


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
            stdout_gone()
            os._exit(EXIT_BROKEN_PIPE)
        sys.stderr.flush()
        os._exit(0)


def _save_plots(result, out_dir: Path) -> None:
    try:
        from sim.plots.run import save_run_plots
    except ImportError:
        return
    save_run_plots(result, out_dir)


def _register_optional_commands() -> None:
    """Commands that live in their own modules (check/fuzz/shrink, sweep/capacity, ...)."""
    import importlib

    for module_name in (
        "sim.cli.ci",
        "sim.cli.planning",
        "sim.cli.versions",
        "sim.cli.plot",
        "sim.cli.calibrate",
        "sim.cli.step",
        "sim.cli.verify",
        "sim.cli.cluster",
        "sim.cli.bench",
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


#: The public names, and those that moved to `sim.cli.exits` / `sim.output.terminal` but are still
#: imported from here (by the command modules and tests).
__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FINDING",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "INPUT_ERRORS",
    "KvsimGroup",
    "LazyProgress",
    "_design_row",
    "_manager_row",
    "_step_time_row",
    "app",
    "console",
    "err_console",
    "fail",
    "main",
    "next_steps",
    "print_summary",
]
