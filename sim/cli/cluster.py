"""`kvsim disagg SCENARIO`: run a disaggregated (prefill/decode) scenario and write its tables.

Writes, into `--out` (default runs/<name>): `requests.csv` (the client's view: one row per
request, TTFT from arrival to the decode side's first token, the transfer's bytes and time),
`transfers.csv`, `prefill_requests.csv`, `prefill_steps.csv`, `decode_requests.csv`,
`decode_steps.csv`, `violations.csv` (both pools, with a `pool` column) and `summary.json`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated

import typer

from sim.errors import InputError


def _clean(value):
    return None if isinstance(value, float) and math.isnan(value) else value


def _shown(value) -> str:
    """A summary value for people: 4 significant digits, a dict as key=value pairs."""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items())
    return str(value)


def _write_tables(result, staging: Path) -> dict:
    """Write a disaggregated run's tables and summary.json into `staging`; the summary."""
    import pandas as pd

    violations = pd.concat(
        [
            result.prefill.violations.assign(pool="prefill"),
            result.decode.violations.assign(pool="decode"),
        ],
        ignore_index=True,
    )
    for name, frame in (
        ("requests", result.requests),
        ("transfers", result.transfers),
        ("prefill_requests", result.prefill.requests),
        ("prefill_steps", result.prefill.steps),
        ("decode_requests", result.decode.requests),
        ("decode_steps", result.decode.steps),
        ("violations", violations),
    ):
        frame.to_csv(staging / f"{name}.csv", index=False)
    summary = {k: _clean(v) for k, v in result.summary.items()}
    (staging / "summary.json").write_text(
        json.dumps({"summary": summary, "inputs": result.inputs}, indent=2, sort_keys=True) + "\n"
    )
    return summary


def register(app: typer.Typer) -> None:
    @app.command()
    def disagg(
        scenario: Annotated[
            Path, typer.Argument(help="A scenario with cluster.mode: disaggregated.")
        ],
        out: Annotated[
            Path | None, typer.Option("--out", "-o", help="Output folder (default runs/<name>).")
        ] = None,
        json_out: Annotated[
            bool, typer.Option("--json", help="Print the summary as JSON.")
        ] = False,
    ) -> None:
        """Run prefill/decode disaggregated serving: two pools joined by a KV link."""
        from sim.cli.main import console
        from sim.cluster.run import run_disaggregated
        from sim.files.outdir import staged_folder
        from sim.scenario.schema import load_scenario, naming

        scenario_obj = load_scenario(scenario)
        out_dir = out or Path("runs") / scenario_obj.name
        # Locked and checked before the simulation (as `kvsim run`): a bad or busy -o costs
        # nothing, and a scenario error cannot hide it.
        with staged_folder(out_dir) as staging:
            with naming(scenario):  # a resolution error names the file too
                result = run_disaggregated(scenario_obj, scenario.parent)
            summary = _write_tables(result, staging)
        if json_out:
            console.print_json(json.dumps(summary, sort_keys=True))
            return
        for key, value in summary.items():
            console.print(f"{key:30} {_shown(value)}", highlight=False)
        console.print(f"outputs written to {out_dir}", highlight=False)

    @app.command("cluster-capacity")
    def cluster_capacity(
        scenario: Annotated[Path, typer.Argument(help="A scenario with a synthetic workload.")],
        rate: Annotated[float, typer.Option("--rate", help="Target arrival rate (req/s).")],
        ttft_p99_s: Annotated[float, typer.Option("--ttft-p99-s", help="TTFT p99 limit (s).")],
        tpot_p99_s: Annotated[float, typer.Option("--tpot-p99-s", help="TPOT p99 limit (s).")],
        max_gpus: Annotated[int, typer.Option("--max-gpus", help="Largest cluster tried.")] = 8,
        routers: Annotated[
            str | None,
            typer.Option(
                "--routers",
                help="Co-located routers to compare, comma-separated "
                "(default: the scenario's engine.router).",
            ),
        ] = None,
        workers: Annotated[
            int | None,
            typer.Option(
                "--workers", "-j", help="Local worker processes (default: CPU count, at most 8)."
            ),
        ] = None,
        cluster: Annotated[
            str | None,
            typer.Option(
                "--cluster",
                help="Dask scheduler address (tcp://host:8786); default: local processes.",
            ),
        ] = None,
    ) -> None:
        """How many GPUs, co-located (per router) or prefill/decode disaggregated, meet the SLO."""
        from sim.cli.main import console
        from sim.cluster.capacity import answers_frame, gpus_needed
        from sim.cluster.compare import Slo
        from sim.scenario.schema import load_scenario, naming

        for option, limit in (("--ttft-p99-s", ttft_p99_s), ("--tpot-p99-s", tpot_p99_s)):
            if not (math.isfinite(limit) and limit > 0):  # nan passes `<= 0`, then never meets
                raise InputError(f"{option} {limit}: must be a positive, finite time (s)")
        if workers is not None and workers < 1:
            raise InputError(f"--workers {workers}: must be at least 1")
        loaded = load_scenario(scenario)
        with naming(scenario):  # a resolution error names the file too
            table, answers = gpus_needed(
                loaded,
                rate,
                Slo(ttft_p99_s, tpot_p99_s),
                max_gpus,
                str(scenario.parent),
                routers=[r.strip() for r in routers.split(",")] if routers else None,
                workers=workers,
                cluster=cluster,
            )
        columns = ["num_gpus", "shape", "router", "ttft_p99_s", "tpot_p99_s"]
        columns += ["throughput_tok_per_s", "meets_slo"]
        console.print(table[columns].to_string(index=False), highlight=False, soft_wrap=True)
        answer_table = answers_frame(answers)
        answer_table["num_gpus"] = [
            f"none up to {max_gpus}" if a.num_gpus is None else str(a.num_gpus) for a in answers
        ]
        answer_table["shape"] = answer_table["shape"].fillna("-")
        console.print(answer_table.to_string(index=False), highlight=False, soft_wrap=True)
