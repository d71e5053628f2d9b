"""`kvsim plot RUN_DIR`: PNG plots of a run, a sweep or a capacity search written earlier."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def plot(
        run_dir: Annotated[
            Path, typer.Argument(help="A folder written by kvsim run / sweep / capacity.")
        ],
    ) -> None:
        """Save PNG plots (KV timeline, queues, latency CDFs, sweep or capacity frontier)."""
        from sim.cli.main import console
        from sim.plots.run import save_dir_plots

        paths = save_dir_plots(run_dir)
        for path in paths:
            console.print(f"wrote {path}", highlight=False)
