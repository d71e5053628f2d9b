"""notebooks/capacity_planning.ipynb executes cleanly (nbclient).

The per-cell timeout only stops a hung kernel; how long it takes is measured by
benchmarks/ci_speed.py, not asserted here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "capacity_planning.ipynb"


def test_capacity_planning_notebook_runs() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,  # per cell: generous, a loaded 2-core runner is slow; only a hang should trip it
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    errors = [
        o
        for c in notebook.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "error"
    ]
    assert not errors
    images = [
        o
        for c in notebook.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "image/png" in o.get("data", {})
    ]
    assert len(images) >= 6  # timeline, queues, CDFs, throughput-latency, frontier, band
