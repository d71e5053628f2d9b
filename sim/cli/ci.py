"""The `kvsim check`, `kvsim fuzz` and `kvsim shrink` commands (registered by `sim.cli.main`).

Exit status, for CI (3 is an internal error for every command, see `sim.cli.main`):

* check: 0 every expectation holds; 1 a scenario shows an unexpected violation or misses an
  expected one; 2 bad input (unreadable file, invalid scenario), one `error:` line on stderr
  per bad file. A bad file does not stop the others: every scenario that can run runs and the
  JUnit / JSON reports are written, the bad file as an errored test case; 2 wins over 1.
* fuzz: 0 nothing found; 1 at least one violation kind found; 2 bad input; 3 kvsim itself is
  wrong (not a vLLM finding): an exception escaped the simulator (traceback on stderr), or a
  case's tables changed with the decode fast path and cohort off (`sim.ci.selfcheck`).
* shrink: 0 written; 1 the input shows no such violation; 2 bad input.

Output paths (`--junit`, `--json`, `--save`, `-o`) are checked before anything runs.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from sim.files.outdir import write_text_atomic


def _cli():
    import sim.cli.main as cli  # the app module, imported late: it imports this one

    return cli


def _write(path: Path, text: str) -> None:
    try:
        write_text_atomic(path, text)
    except OSError as error:
        raise _cli().fail(f"{path}: cannot write: {error.strerror or error}") from None


def check(
    paths: Annotated[
        list[Path], typer.Argument(help="Scenario files and folders (searched for *.yaml).")
    ],
    junit: Annotated[Path | None, typer.Option("--junit", help="Write JUnit XML here.")] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the outcomes as JSON here.")
    ] = None,
) -> None:
    """Run every scenario and compare its violations with its `expect:` (exit 0 / 1 / 2)."""
    from sim.ci.check import check_paths, exit_code, outcomes_json
    from sim.ci.junit import github_annotations, in_github_actions, junit_xml
    from sim.files.outdir import check_distinct_outputs, check_output_file

    cli = _cli()
    check_distinct_outputs({"--junit": junit, "--json": json_path}, _scenario_files(paths))
    check_not_scenarios({"--junit": junit, "--json": json_path}, paths)
    for report in (junit, json_path):
        if report is not None:
            check_output_file(report)
    outcomes = check_paths(paths)
    # Expected kinds appear in the failure details below; a passing row shows what it saw.
    table = Table(title="kvsim check", header_style="bold")
    for column in ("result", "scenario", "design", "violations seen", "s"):
        table.add_column(column, justify="right" if column == "s" else "left", overflow="fold")
    for o in outcomes:
        table.add_row(
            "[green]pass[/]"
            if o.passed
            else "[bold red]ERROR[/]"
            if o.bad_input
            else "[bold red]FAIL[/]",
            o.path.name,
            o.design,
            ", ".join(o.observed_kinds) or "none",
            f"{o.duration_s:.2f}",
        )
    cli.console.print(table)
    failed = [o for o in outcomes if not o.passed and not o.bad_input]
    bad = [o for o in outcomes if o.bad_input]
    for o in failed:
        cli.console.print(
            f"[bold red]FAIL[/] {escape(o.failure_text())}", highlight=False, soft_wrap=True
        )
    passed = len(outcomes) - len(failed) - len(bad)
    cli.console.print(
        f"{passed} passed, {len(failed)} failed"
        + (f", {len(bad)} bad input (not run)" if bad else ""),
        highlight=False,
    )
    for o in bad:
        cli.fail(o.reason.removeprefix("bad input: "))  # one `error:` line each, on stderr
    if in_github_actions():
        for line in github_annotations(outcomes):
            typer.echo(line)
    if junit is not None:
        _write(junit, junit_xml(outcomes))
    if json_path is not None:
        _write(json_path, json.dumps(outcomes_json(outcomes), indent=2) + "\n")
    raise typer.Exit(exit_code(outcomes))


def check_not_scenarios(outputs: dict[str, Path | None], paths: list[Path]) -> None:
    """Refuse a report that a later `kvsim check` of the same folders would read as a scenario.

    A ``.yaml``/``.yml`` output anywhere under a folder being checked (however it is spelled:
    ``d/x.yaml``, ``/abs/d/../d/x.yaml``, through a symlinked parent) would be picked up by
    the next ``kvsim check d`` and fail it as a malformed scenario.
    """
    from sim.ci.check import SCENARIO_SUFFIXES
    from sim.files.outdir import OutputPathError

    folders = [(Path(os.path.realpath(p)), p) for p in paths if Path(p).is_dir()]
    for option, path in outputs.items():
        if path is None or Path(path).suffix not in SCENARIO_SUFFIXES:
            continue
        real = Path(os.path.realpath(path))
        for folder, given in folders:
            if real.is_relative_to(folder):
                raise OutputPathError(
                    f"{path}: {option} would write a {real.suffix} file inside {given}, a folder "
                    f"being checked, where the next `kvsim check {given}` reads it as a "
                    f"scenario; give {option} a path outside it, or another suffix (.json, .xml)"
                )


def _scenario_files(paths: list[Path]) -> list[Path]:
    """The scenario files `kvsim check PATHS` reads (a bad path is reported by the check)."""
    from sim.ci.check import collect_scenario_paths
    from sim.errors import InputError

    found: list[Path] = []
    for path in paths:
        try:
            found.extend(collect_scenario_paths([path]))
        except InputError:
            continue
    return found


def fuzz(
    design: Annotated[
        str, typer.Option("--design", help="v0-v1 | v0-v2 | v0-fixed | v1-engine")
    ] = "v0-v2",
    seed: Annotated[
        int, typer.Option("--seed", min=0, help="Master seed; case seeds derive from it.")
    ] = 0,
    budget: Annotated[
        str | None, typer.Option("--budget", help="Time budget, e.g. 60s, 2m (default 60s).")
    ] = None,
    max_cases: Annotated[
        int | None, typer.Option("--max-cases", min=1, help="Stop after this many cases.")
    ] = None,
    case: Annotated[
        int | None, typer.Option("--case-seed", min=0, help="Run only this case seed.")
    ] = None,
    save: Annotated[
        Path | None,
        typer.Option("--save", help="Write each first finding as a scenario YAML here."),
    ] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the report as JSON here.")
    ] = None,
    no_swap: Annotated[
        bool, typer.Option("--no-swap", help="Recompute preemption only (no CPU swap).")
    ] = False,
    vllm_version: Annotated[
        str | None,
        typer.Option(
            "--vllm-version",
            help="Run every case on this pin of --design (e.g. 0.33.0); no P/D cases then.",
        ),
    ] = None,
    vllm_root: Annotated[
        Path | None,
        typer.Option(
            "--vllm-root",
            help="Run vLLM's REAL block manager from this install (scripts/setup_vllm.sh) "
            "under kvsim's scheduler and auditor; implies its --vllm-version.",
        ),
    ] = None,
    hybrid: Annotated[
        bool,
        typer.Option(
            "--hybrid", help="v1-engine: every 2nd case a hybrid model (sliding + full groups)."
        ),
    ] = False,
    async_mix: Annotated[
        bool,
        typer.Option(
            "--async-mix",
            help="v1-engine: async scheduling drawn per case (release default, on, off).",
        ),
    ] = False,
    group_types: Annotated[
        bool,
        typer.Option(
            "--group-types",
            help="v1-engine, with --hybrid: hybrid cases draw cache.kv_cache_groups from every "
            "group type kvsim models on the release (sliding, chunked-local, Mamba, sink, "
            "R-SWA, circular buffer).",
        ),
    ] = False,
) -> None:
    """Run random valid workloads and cache configurations; report each violation kind found.

    Each case draws a cache, a scheduler and a workload (inline requests or multi-turn sessions); some run on 2-4 replicas behind a drawn router. On v1-engine about one case in 8 is prefill/decode disaggregated (1-2 prefill and 1-2 decode replicas, vLLM 0.11.0's NIXL flow); its findings are keyed disagg:<kind>. Its disagg:no_progress is vLLM 0.11.0's own hang (a preempted decode request at the head of the waiting queue needs more blocks than the requests parked behind it leave free), not a kvsim artefact.
    """
    from sim.ci import fuzz as fz
    from sim.files.outdir import check_distinct_outputs, check_output_dir, check_output_file
    from sim.kv.config import Design

    cli = _cli()
    try:
        design_value = Design(design)
    except ValueError:
        choices = ", ".join(d.value for d in Design)
        raise cli.fail(f"--design {design!r}: expected one of {choices}") from None
    check_distinct_outputs({"--save": save, "--json": json_path})
    if save is not None:
        check_output_dir(save)
    if json_path is not None:
        check_output_file(json_path)
    budget_s = fz.parse_budget(budget) if budget is not None else None
    if budget_s is None and max_cases is None:
        budget_s = fz.DEFAULT_BUDGET_S
    variant, root = _fuzz_variant(cli, design_value, vllm_version, vllm_root, hybrid, async_mix)
    if group_types and not hybrid:
        raise cli.fail("--group-types: give --hybrid too (it draws the layouts of hybrid cases)")
    variant = replace(variant, group_types=group_types)
    if case is not None:
        report = fz.fuzz_one_case(design_value, case, not no_swap, variant, root)
    else:
        progress = cli.LazyProgress(f"fuzzing {design_value.value}", delay_s=0.5)

        def on_case(index: int, report) -> None:
            if max_cases is not None:
                progress(index + 1, max_cases)
            else:
                progress(int(min(report.elapsed_s, budget_s)), int(budget_s))  # type: ignore[arg-type]  # a budget is set

        try:
            report = fz.fuzz(
                design_value, seed, budget_s, max_cases, on_case, not no_swap, variant, root
            )
        finally:
            progress.close()
    if save is not None:
        try:
            fz.save_findings(report, save)
        except OSError as error:
            raise cli.fail(f"{save}: cannot write: {error.strerror or error}") from None
    _print_fuzz(cli, report)
    if json_path is not None:
        _write(json_path, json.dumps(report.to_dict(), indent=2) + "\n")
    if report.kvsim_is_wrong:
        _print_kvsim_is_wrong(cli, report)
        raise typer.Exit(3)
    raise typer.Exit(1 if report.findings else 0)


def _fuzz_variant(cli, design, vllm_version, vllm_root, hybrid, async_mix):
    """The checked `CaseVariant` and install root of `kvsim fuzz`'s options (bad: exit 2)."""
    from sim.ci.fuzz_variant import CaseVariant
    from sim.kv.config import Design
    from sim.kv.pins import resolve_pin

    if (hybrid or async_mix) and design is not Design.V1_ENGINE:
        flag = "--hybrid" if hybrid else "--async-mix"
        raise cli.fail(f"{flag}: only for --design v1-engine, not {design.value}")
    root = None
    if vllm_root is not None:
        from sim.vllm_real.loader import VllmNotAvailableError, load_vllm

        try:
            install = load_vllm(vllm_root)
        except VllmNotAvailableError as error:
            raise cli.fail(f"--vllm-root {vllm_root}: {error}") from None
        if vllm_version is not None and vllm_version != install.version:
            raise cli.fail(
                f"--vllm-version {vllm_version}: --vllm-root {vllm_root} is vLLM {install.version}"
            )
        vllm_version, root = install.version, str(vllm_root)
    if vllm_version is not None:
        try:
            resolve_pin(design, vllm_version)
        except ValueError as error:
            raise cli.fail(f"--vllm-version: {error}") from None
    return CaseVariant(vllm_version, hybrid, async_mix), root


def _print_kvsim_is_wrong(cli, report) -> None:
    """An internal error or inconsistency: on stderr, never mixed up with the findings."""
    no_swap = "" if report.allow_swap else " --no-swap"
    replay = f"kvsim fuzz --design {report.design}{no_swap}{report.replay_flags} --case-seed"
    error, inconsistency = report.internal_error, report.inconsistency
    if error is not None:
        cli.err_console.print(error.traceback, highlight=False, markup=False, soft_wrap=True)
        cli.err_console.print(
            f"[bold red]kvsim internal error[/] (a bug in kvsim, not a vLLM finding) in case "
            f"{error.case_index} (case seed {error.case_seed}): {escape(error.error)}\n"
            f"  reproduce: {replay} {error.case_seed}",
            highlight=False,
            soft_wrap=True,
        )
    if inconsistency is not None:
        cli.err_console.print(
            f"[bold red]kvsim internal inconsistency[/] (a bug in kvsim, not a vLLM finding): "
            f"{report.num_inconsistent_cases} case(s) changed with the decode fast path and "
            f"cohort off; first: case {inconsistency.case_index} (case seed "
            f"{inconsistency.case_seed}), {escape(inconsistency.difference)}\n"
            f"  reproduce: {replay} {inconsistency.case_seed}",
            highlight=False,
            soft_wrap=True,
        )


def _print_fuzz(cli, report) -> None:
    summary = (
        f"kvsim fuzz {report.design}: {report.num_cases} cases"
        + (f" ({report.num_disagg_cases} disaggregated)" if report.num_disagg_cases else "")
        + f" in {report.elapsed_s:.1f} s "
        f"(stopped by {report.stopped_by}); {report.num_violating_cases} cases with violations, "
        f"{report.num_time_limited} livelocked (time cap), {report.num_fatal_errors} fatal engine errors; "
        f"{report.num_cross_checked} cross-checked with the decode shortcuts off"
    )
    cli.console.print(summary, highlight=False)
    if report.num_invalid_cases:
        cli.err_console.print(
            f"[yellow]warning:[/] {report.num_invalid_cases} generated cases were invalid; first: {report.first_invalid}",
            highlight=False,
        )
    if not report.findings:
        cli.console.print("[green]no violations found[/]")
        return
    cli.console.print(
        f"[bold red]{len(report.findings)} violation kind(s) found on {report.design}:[/]"
    )
    for kind in report.kinds:
        f = report.findings[kind]
        at = f" at t={f.time_s:.6g} s" if f.time_s is not None else ""
        cli.console.print(
            f"[red]{kind}[/]: first in case {f.case_index} (case seed {f.case_seed}){at}, "
            f"{f.count} case(s)\n  {f.message}\n"
            f"  reproduce: {f.reproduce_command(report.design, report.saved.get(kind), report.allow_swap, report.replay_flags)}",
            highlight=False,
            soft_wrap=True,
        )


def shrink(
    source: Annotated[
        Path, typer.Argument(help="A scenario file, or a run directory with its scenario.yaml.")
    ],
    out: Annotated[
        Path, typer.Option("--out", "-o", help="Where to write the minimal scenario.")
    ] = Path("minimal.yaml"),
    kind: Annotated[
        str | None, typer.Option("--kind", help="Violation kind to keep (default: the first one).")
    ] = None,
) -> None:
    """Delta-debug a violating scenario down to a minimal inline reproducer of one violation kind."""
    from sim.audit import ViolationKind
    from sim.ci.shrink import NothingToShrink, load_input
    from sim.ci.shrink import shrink as shrink_scenario
    from sim.files.outdir import check_distinct_outputs, check_output_file

    cli = _cli()
    known = [k.value for k in ViolationKind]
    if kind is not None and kind not in known:
        raise cli.fail(f"--kind {kind!r}: expected one of {', '.join(known)}")

    def progress(entry) -> None:
        cli.err_console.print(
            f"  {entry.phase:<9} {entry.num_requests:>6} requests  {entry.num_gpu_blocks:>6} GPU blocks"
            f"  {entry.num_runs:>5} runs  {entry.elapsed_s:7.1f} s",
            highlight=False,
        )

    read = source / "scenario.yaml" if source.is_dir() else source
    check_distinct_outputs({"-o": out}, [read])  # the minimal scenario never replaces its source
    check_output_file(out)
    try:
        scenario, base_dir, label = load_input(source)
        result = shrink_scenario(scenario, base_dir, kind, label, progress=progress)
    except NothingToShrink as error:
        raise cli.fail(str(error), code=cli.EXIT_FINDING) from None
    _write(out, result.to_yaml())
    cli.console.print(
        f"shrunk {label}: {result.kind} kept; {result.start_num_requests} -> "
        f"{result.final_num_requests} requests, {result.start_num_gpu_blocks} -> "
        f"{result.final_num_gpu_blocks} GPU blocks, {result.num_runs} runs in {result.elapsed_s:.1f} s\n"
        f"written to {out}; reproduce with: kvsim run {out} --no-plots",
        highlight=False,
    )


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("fuzz")(fuzz)
    app.command("shrink")(shrink)
