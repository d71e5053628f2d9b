"""`kvsim compare-versions` (registered into `sim.cli.main.app`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

#: The table shown in the terminal (the files have every column): short headers that wrap at
#: spaces (`sim.planning.tables`); the kinds of violation are listed under the table.
COLUMNS = (
    "shown_design",
    "num_violations",
    "num_preemptions",
    "throughput_tok_per_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "kv_util_max",
    "outcome",
)
HEADERS = {
    "shown_design": "design",
    "ttft_p50_s": "TTFT p50 (s)",
    "ttft_p99_s": "TTFT p99 (s)",
    "tpot_p50_ms": "TPOT p50 (ms)",
    "outcome": "finished failed aborted",
}


def _outcome(row) -> str:
    """'19366/0/0' (finished/failed/aborted), or 'refused'."""
    if row["status"] != "ran":
        return "refused"
    return f"{row['num_finished']:.0f}/{row['num_failed']:.0f}/{row['num_aborted']:.0f}"


def _overrides(items: list[str] | None) -> dict[str, Any]:
    from sim.scenario.overrides import parse_overrides

    return parse_overrides(items)


def compare_versions(
    scenario: Annotated[Path, typer.Argument(help="Scenario YAML (its design is replaced).")],
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override KEY=VALUE for every design (repeatable)."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Output folder (default compare/<name>)."),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the table as JSON records instead.")
    ] = False,
    workers: Annotated[
        int | None,
        typer.Option("--workers", "-j", help="Local worker processes (default: CPU count)."),
    ] = None,
    plots: Annotated[
        bool, typer.Option("--plots/--no-plots", help="Save compare_versions_<name>.png.")
    ] = True,
) -> None:
    """One workload through every vLLM design kvsim models: what changes if I upgrade vLLM?"""
    from sim.cli.main import console
    from sim.files.outdir import check_output_dir
    from sim.planning import load_base
    from sim.planning.executor import write_table
    from sim.planning.tables import METRIC_HEADERS, results_table, with_ms
    from sim.planning.versions import compare_versions as run_all
    from sim.scenario.overrides import apply_overrides

    base, base_dir = load_base(scenario)
    overrides = _overrides(set_)
    if overrides:
        base = apply_overrides(base, overrides)  # a bad key fails here, before any run
    out_dir = out or Path("compare") / base.name
    from sim.scenario.schema import naming

    # The folder is made only once some variant can start (a scenario all refuse: exit 2).
    with naming(scenario):  # a resolution error names the file too
        table = run_all(
            base, workers=workers, base_dir=base_dir, before_run=lambda: check_output_dir(out_dir)
        )
    write_table(table, out_dir, "compare_versions")
    if plots:
        from sim.plots.versions import save_compare_versions_plot

        save_compare_versions_plot(table, out_dir)
    if json_out:
        records = json.loads(table.to_json(orient="records"))
        typer.echo(json.dumps({"scenario": base.name, "variants": records}, indent=2))
        return
    shown = with_ms(table, ["tpot_p50_s", "tpot_p99_s"]).assign(
        shown_design=table["variant"].str.replace("@", " "),
        outcome=[_outcome(row) for _, row in table.iterrows()],
    )
    title = f"kvsim compare-versions: {base.name}"
    view = results_table(title, shown, COLUMNS, {**METRIC_HEADERS, **HEADERS}, left=COLUMNS[:1])
    console.print(view)
    for _, row in table.iterrows():
        line = f"{row['variant']}: {row['models']}"
        if row["status"] != "ran":
            line += f"; refused: {row['reason']}"
        elif row["violation_counts"]:
            line += f"; violations: {row['violation_counts']}"
        console.print(line, highlight=False)
    console.print(f"table written to {out_dir}/compare_versions.parquet and .csv")


def register(app: typer.Typer) -> None:
    """Add `kvsim compare-versions` to the main CLI."""
    app.command("compare-versions")(compare_versions)
