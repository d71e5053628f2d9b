"""`kvsim sweep` and `kvsim capacity` (registered into `sim.cli.app`)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

_CLUSTER = typer.Option(
    "--cluster", help="Dask scheduler address (tcp://host:8786); default: local processes."
)
_WORKERS = typer.Option(
    "--workers", "-j", help="Local worker processes (default: CPU count, at most 8)."
)


_HEADERS = {
    "throughput_tok_per_s": "tok/s",
    "ttft_p99_s": "TTFT p99 (s)",
    "tpot_p99_s": "TPOT p99 (s)",
    "e2e_p99_s": "E2E p99 (s)",
    "num_preemptions": "preempt",
    "num_violations": "violations",
    "kv_util_max": "KV used max",
}


def _progress(description: str, total: int):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from sim.cli import err_console

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


def _fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


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
    from rich.table import Table

    from sim.cli import INPUT_ERRORS, console, err_console, fail
    from sim.planning import load_base
    from sim.planning.executor import run_points, write_table
    from sim.planning.grid import build_points, parse_sets

    try:
        base, base_dir = load_base(scenario)
        axes = parse_sets(set_)
        points = build_points(base, axes, base_dir)
    except INPUT_ERRORS as error:
        raise fail(str(error).splitlines()[0]) from None
    out_dir = out or Path("sweeps") / base.name
    progress, task = _progress("sweep", len(points))
    counts = {"failed": 0, "cached": 0}

    def on_row(row, cached) -> None:
        counts["cached"] += cached
        counts["failed"] += row.get("error") is not None
        note = f"{counts['cached']} cached, {counts['failed']} failed"
        progress.update(task, advance=1, note=note)

    try:
        with progress:
            table = run_points(
                points,
                out_dir=out_dir,
                workers=workers,
                cluster=cluster,
                resume=not fresh,
                on_row=on_row,
            )
    except (OSError, ValueError, TimeoutError) as error:
        raise fail(f"sweep: {str(error).splitlines()[0]}") from None
    write_table(table, out_dir, "sweep")
    if plots:
        from sim.plots import save_sweep_plots

        save_sweep_plots(table, out_dir)
    settings = list(axes)
    view = Table(
        title=f"kvsim sweep: {base.name} ({len(points)} points, {counts['cached']} reused)"
    )
    columns = [
        *settings,
        "throughput_tok_per_s",
        "ttft_p99_s",
        "tpot_p99_s",
        "e2e_p99_s",
        "num_preemptions",
        "num_violations",
        "kv_util_max",
    ]
    for column in columns:
        view.add_column(_HEADERS.get(column, column.rpartition(".")[2]), justify="right")
    for _, row in table[table["error"].isna()].iterrows():
        view.add_row(*(_fmt(row[c]) for c in columns))
    console.print(view)
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
        str,
        typer.Option("--seeds", help="Comma-separated seeds to repeat over (synthetic workloads)."),
    ] = "0",
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
        bool, typer.Option("--plots/--no-plots", help="Save the capacity-frontier PNG.")
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
    from rich.table import Table

    from sim.cli import INPUT_ERRORS, console, fail
    from sim.overrides import parse_assignment
    from sim.planning import load_base
    from sim.planning.capacity import as_slos, capacity_search, write_capacity
    from sim.planning.grid import parse_sets

    try:
        slos = as_slos(slo)
        seed_list = [int(s) for s in seeds.split(",") if s.strip()]
        axes = parse_sets(compare)
        overrides = {}
        for item in set_ or []:
            key, values = parse_assignment(item)
            overrides[key] = values[0] if len(values) == 1 else values
        base, base_dir = load_base(scenario)
        band = _parse_band(step_time_band)
    except INPUT_ERRORS as error:
        raise fail(str(error).splitlines()[0]) from None
    num_tasks = max(1, math.prod(len(v) for v in axes.values())) * len(seed_list)
    progress, task = _progress("capacity searches", num_tasks)
    try:
        with progress:
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
                on_total=lambda n: progress.update(task, total=n),
                band=band,
                band_ends=band_ends,
            )
    except INPUT_ERRORS as error:
        raise fail(str(error).splitlines()[0]) from None
    out_dir = out or Path("capacity") / base.name
    write_capacity(table, probes, out_dir)
    if plots:
        from sim.plots import save_capacity_plots

        save_capacity_plots(table, probes, out_dir)
    view = Table(
        title=f"kvsim capacity: {base.name} ({table['slos'].iloc[0]}; tolerance {tolerance:g})"
    )
    columns = [
        "config",
        "capacity_rate_req_per_s",
        "capacity_ci_low",
        "capacity_ci_high",
        "step_time_band",
        "num_replicates",
        "status",
    ]
    if target_rate is not None:
        columns[6:6] = ["replicas_needed", "replicas_needed_at_mean", "replicas_needed_slow_step"]
    if not band_ends:
        columns = [c for c in columns if "step" not in c]
    view_table = table.assign(
        step_time_band=[
            f"{_fmt(slow)} - {_fmt(fast)}"
            for slow, fast in zip(
                table["capacity_slow_step_req_per_s"],
                table["capacity_fast_step_req_per_s"],
                strict=True,
            )
        ]
    )
    headers = {
        "config": "configuration",
        "capacity_rate_req_per_s": "req/s per replica",
        "capacity_ci_low": "95% CI low",
        "capacity_ci_high": "95% CI high",
        "step_time_band": "at slow - fast step time",
        "num_replicates": "runs",
        "replicas_needed": f"replicas for {_fmt(target_rate)} req/s (worst run)",
        "replicas_needed_at_mean": "(at mean)",
        "replicas_needed_slow_step": "(worst run, slow step)",
    }
    for column in columns:
        view.add_column(
            headers.get(column, column),
            justify="left" if column in ("config", "status") else "right",
        )
    for _, row in view_table.iterrows():
        view.add_row(*(_fmt(row[c]) if c != "config" else (row[c] or base.name) for c in columns))
    console.print(view)
    for _, row in table.drop_duplicates("step_time_band_source").iterrows():
        console.print(
            f"step-time band x{row['step_time_low_factor']:g} (fast) to "
            f"x{row['step_time_high_factor']:g} (slow)"
            f"{', extrapolated' if row['step_time_band_extrapolated'] else ''}: "
            f"{row['step_time_band_source']}"
        )
    console.print(
        f"tables written to {out_dir}/capacity.parquet and probes.parquet (every probe run)"
    )


def _parse_band(text: str | None):
    """'0.9,1.3' -> StepTimeBand(0.9, 1.3, ...); None -> None (the model's own band)."""
    from sim.latency.band import StepTimeBand
    from sim.scenario import ScenarioError

    if text is None:
        return None
    low, sep, high = text.partition(",")
    try:
        return StepTimeBand(
            float(low), float(high), extrapolated=False, source=f"--step-time-band {text}"
        )
    except ValueError:
        raise ScenarioError(
            f"--step-time-band {text!r}: expected LOW,HIGH factors with 0 < LOW <= 1 <= HIGH"
        ) from None


def register(app: typer.Typer) -> None:
    """Add `kvsim sweep` and `kvsim capacity` to the main CLI."""
    app.command()(sweep)
    app.command()(capacity)
