"""`kvsim sweep` and `kvsim capacity` (registered into `sim.cli.main.app`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sim.latency.band import StepTimeBand

_CLUSTER = typer.Option(
    "--cluster", help="Dask scheduler address (tcp://host:8786); default: local processes."
)
_WORKERS = typer.Option(
    "--workers", "-j", help="Local worker processes (default: CPU count, at most 8)."
)


def _progress(description: str, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sim.cli.main import err_console

    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=err_console,
        transient=True,
    )
    task = progress.add_task(description, total=total, note="")
    return progress, task


def sweep(
    scenario: Annotated[Path, typer.Argument(help="Base scenario YAML.")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Axis KEY=V1,V2,... (repeatable; the grid is their product)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="Output folder (default sweeps/<name>); re-running resumes."
        ),
    ] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
    workers: Annotated[int | None, _WORKERS] = None,
    fresh: Annotated[
        bool, typer.Option("--fresh", help="Ignore points already done in the output folder.")
    ] = False,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Save throughput-vs-latency PNG.")
    ] = True,
) -> None:
    """Run a grid of scenario variants; one summary row per point (Parquet + CSV)."""

    from sim.cli.main import console, err_console
    from sim.files.outdir import check_output_dir
    from sim.planning import load_base
    from sim.planning.executor import run_points, write_table
    from sim.planning.grid import build_points, parse_sets
    from sim.planning.tables import METRIC_HEADERS, legend, results_table, with_ms
    from sim.scenario.schema import naming

    check_workers(workers)
    base, base_dir = load_base(scenario)
    axes = parse_sets(set_)
    with naming(scenario):  # a resolution error names the file too
        points = build_points(base, axes, base_dir)
    out_dir = out or Path("sweeps") / base.name
    check_output_dir(out_dir)  # before any point runs
    progress, task = _progress("sweep", len(points))
    counts = {"failed": 0, "cached": 0}

    def on_row(row, cached) -> None:
        counts["cached"] += cached
        counts["failed"] += row.get("error") is not None
        note = f"{counts['cached']} cached, {counts['failed']} failed"
        progress.update(task, advance=1, note=note)

    with progress:
        table = run_points(
            points,
            out_dir=out_dir,
            workers=workers,
            cluster=cluster,
            resume=not fresh,
            on_row=on_row,
        )
    write_table(table, out_dir, "sweep")
    if plots:
        from sim.plots.run import save_sweep_plots

        save_sweep_plots(table, out_dir)
    settings = list(axes)
    columns = [
        *settings,
        "throughput_tok_per_s",
        "ttft_p99_ms",
        "tpot_p99_ms",
        "e2e_p99_ms",
        "num_preemptions",
        "num_violations",
        "kv_util_max",
    ]
    title = f"kvsim sweep: {base.name} ({len(points)} points, {counts['cached']} reused)"
    shown = with_ms(table[table["error"].isna()], ["ttft_p99_s", "tpot_p99_s", "e2e_p99_s"])
    view = results_table(title, shown, columns, METRIC_HEADERS)
    console.print(view)
    if legend(settings):
        console.print(legend(settings), highlight=False)
    failed = table[table["error"].notna()]
    for _, row in failed.iterrows():
        settings_text = ", ".join(f"{k}={row[k]}" for k in settings)
        err_console.print(
            f"[red]point {row['point']} failed[/] ({settings_text}): {row['error']}",
            highlight=False,
        )
    console.print(f"table written to {out_dir}/sweep.parquet and sweep.csv")
    if len(points) and len(failed) == len(points):
        raise typer.Exit(1)


def capacity(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML (its workload is rate-scaled).")],
    slo: Annotated[
        list[str],
        typer.Option(
            "--slo", help="METRIC=DURATION, e.g. ttft_p99=2s, tpot_p99=100ms (repeatable)."
        ),
    ],
    target_rate: Annotated[
        float | None,
        typer.Option("--target-rate", help="Requests/s to serve: how many replicas?"),
    ] = None,
    seeds: Annotated[
        str | None,
        typer.Option(
            "--seeds",
            help="Comma-separated seeds to repeat over (synthetic workloads; default: the "
            "scenario's own seed).",
        ),
    ] = None,
    compare: Annotated[
        list[str] | None,
        typer.Option("--compare", help="KEY=V1,V2: one table row per value (repeatable)."),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override KEY=VALUE for every run (repeatable)."),
    ] = None,
    tolerance: Annotated[
        float,
        typer.Option("--tolerance", help="Relative tolerance of the bisection on the rate."),
    ] = 0.05,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Output folder (default capacity/<name>)."),
    ] = None,
    cluster: Annotated[str | None, _CLUSTER] = None,
    workers: Annotated[int | None, _WORKERS] = None,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Save the capacity frontier and band PNGs.")
    ] = True,
    band_ends: Annotated[
        bool,
        typer.Option(
            "--band/--no-band",
            help="Also search at the step-time band's fast and slow ends (up to 3x the runs).",
        ),
    ] = True,
    step_time_band: Annotated[
        str | None,
        typer.Option(
            "--step-time-band",
            help="LOW,HIGH step-time factors to use instead of the model's band, e.g. 0.9,1.3.",
        ),
    ] = None,
) -> None:
    """Highest request rate one replica sustains within the SLOs (bisection on the rate).

    Reported at the central step time with the seed interval, and at the fast and slow ends of
    the step-time model's error band (`--no-band` skips those)."""
    from sim.cli.main import console
    from sim.files.outdir import check_output_dir
    from sim.planning import load_base
    from sim.planning.capacity import as_slos, capacity_search, parse_seeds, write_capacity
    from sim.planning.grid import parse_sets
    from sim.planning.tables import capacity_view
    from sim.scenario.overrides import parse_overrides

    slos = as_slos(slo)
    seed_list = parse_seeds(seeds) if seeds is not None else None
    check_workers(workers)
    axes = parse_sets(compare, option="--compare")
    overrides = parse_overrides(set_)
    if step_time_band is not None and not band_ends:
        from sim.planning.capacity import SloError

        raise SloError(
            "--step-time-band sets the band's ends, which --no-band skips; give one of them"
        )
    band = _parse_band(step_time_band)
    base, base_dir = load_base(scenario)
    out_dir = out or Path("capacity") / base.name
    # Searches per step-time factor; `on_total` sets the real count (up to 3 factors).
    num_tasks = max(1, math.prod(len(v) for v in axes.values())) * len(seed_list or [0])
    progress, task = _progress("capacity searches", num_tasks)
    from sim.scenario.schema import naming

    def start(total: int) -> None:
        # Called once every option is checked and before any probe runs: only then is the
        # output folder checked and made, so a refused option leaves no empty folder.
        check_output_dir(out_dir)
        progress.update(task, total=total)

    with progress, naming(scenario):  # a resolution error names the file too
        table, probes = capacity_search(
            base,
            slos,
            target_rate=target_rate,
            seeds=seed_list,
            compare=axes,
            overrides=overrides,
            tolerance=tolerance,
            workers=workers,
            cluster=cluster,
            base_dir=base_dir,
            on_result=lambda i, res: progress.update(task, advance=1),
            on_total=start,
            band=band,
            band_ends=band_ends,
        )
    write_capacity(table, probes, out_dir)
    if plots:
        from sim.plots.run import save_capacity_plots

        save_capacity_plots(table, probes, out_dir)
    view, notes = capacity_view(table, base.name, tolerance, target_rate)
    console.print(view)
    for note in notes:
        console.print(note, highlight=False)
    replicates = list(dict.fromkeys(probes["replicate_label"]))
    if len(replicates) > 1:  # which seed each run drew from (workload.seed when it is pinned)
        console.print(f"replicates: {', '.join(replicates)}", highlight=False)
    console.print(
        f"tables written to {out_dir}/capacity.parquet and probes.parquet (every probe run)"
    )


def _parse_band(text: str | None) -> StepTimeBand | None:
    """'0.9,1.3' -> StepTimeBand(0.9, 1.3, ...); None -> None (the model's own band)."""
    from sim.latency.band import StepTimeBand
    from sim.planning.capacity import SloError

    if text is None:
        return None
    low, _, high = text.partition(",")
    wrong = f"--step-time-band {text!r}: expected LOW,HIGH finite factors with 0 < LOW <= 1 <= HIGH"
    try:
        factors = float(low), float(high)
    except ValueError:
        raise SloError(wrong) from None
    if not all(math.isfinite(f) for f in factors):  # x inf: every probe's step never ends
        raise SloError(wrong)
    try:
        return StepTimeBand(*factors, extrapolated=False, source=f"--step-time-band {text}")
    except ValueError:
        raise SloError(wrong) from None


def check_workers(workers: int | None) -> None:
    """`-j 0` or `-j -2` would silently mean the default (or one process): refuse them."""
    from sim.errors import InputError

    if workers is not None and workers < 1:
        raise InputError(f"--workers {workers}: must be at least 1")


def register(app: typer.Typer) -> None:
    """Add `kvsim sweep` and `kvsim capacity` to the main CLI."""
    app.command()(sweep)
    app.command()(capacity)
