"""docs/accuracy.md's "At a glance" table: every figure is the one its own section's source
gives, and "met" follows from the figure and the target.

Sources: the serving summary block (itself checked verbatim against a replay of every point in
tests/benchmarks/test_serving_accuracy.py), the startup-log comparison (sim.memory.validation)
and the committed end-to-end band (sim/data/serving_band.json, checked against the YAML in
tests/benchmarks/test_serving_band.py).
"""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "accuracy.md"


def _block(marker: str) -> str:
    found = re.search(
        rf"<!-- {marker}:begin -->\n(.*?)\n<!-- {marker}:end -->", DOC.read_text(), re.S
    )
    assert found, f"docs/accuracy.md lost its {marker} block"
    return found.group(1)


def _glance() -> dict[str, list[str]]:
    rows = [line.strip("|").split("|") for line in _block("accuracy-glance").splitlines()[2:]]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def _held_out_serving() -> dict[str, str]:
    """The serving summary's held-out row: metric name -> "12.6% (29)"."""
    lines = _block("serving-accuracy").splitlines()
    row = next(line for line in lines if line.startswith("| held_out"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    return dict(zip(("TTFT", "TPOT/ITL", "throughput"), cells[1:4], strict=True))


def _percent(cell: str) -> float:
    return float(re.match(r"([\d.]+)%", cell).group(1))


@pytest.mark.parametrize(
    ("row", "metric"),
    [
        ("serving TTFT, median abs error", "TTFT"),
        ("serving TPOT/ITL, median abs error", "TPOT/ITL"),
        ("serving throughput, median abs error", "throughput"),
    ],
)
def test_the_serving_rows_are_the_summary_blocks_held_out_row(row, metric):
    assert _glance()[row][0] == _held_out_serving()[metric]


def test_the_kv_pool_row_is_the_startup_logs_comparison():
    from sim.memory.validation import Split, compare_all

    held = [c for c in compare_all() if c.split is Split.HELD_OUT and c.log.release >= (0, 11)]
    median = statistics.median(abs(c.after_error) for c in held)
    cell = _glance()["KV pool, vLLM >= 0.11 startup logs, median abs error"][0]
    assert cell == f"{100 * median:.1f}% ({len(held)})"


def test_the_band_row_is_the_committed_end_to_end_band_and_its_held_out_check():
    band = json.loads((ROOT / "sim/data/serving_band.json").read_text())
    check = band["held_out_check"]
    row = f"held-out TPOT/ITL inside the step-time band x{band['low_factor']:.3f}-x{band['high_factor']:.3f}"
    assert row in _glance()
    assert _glance()[row][0] == f"{100 * check['coverage_widened_band']:.1f}% ({check['n']})"


def test_met_says_whether_each_figure_is_within_its_target():
    for name, (figure, target, met) in _glance().items():
        bound = _percent(re.search(r"[\d.]+%", target).group(0))
        within = _percent(figure) >= bound if "nominal" in target else _percent(figure) <= bound
        assert met == ("yes" if within else "no"), name
