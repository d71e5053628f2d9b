"""sim/data/serving_band.json is what benchmarks/serving_band.py computes from the serving
measurements as they stand: the same points (cheap, default tier), the same numbers (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.data.split import load_split_entries
from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = ROOT / "sim" / "data" / "serving_band.json"
#: The TPOT/ITL keys a source may give (benchmarks/serving_accuracy.py's group, spelled out
#: here so that a change to the group is seen too).
TPOT_ITL_KEYS = {"mean_tpot_ms", "median_tpot_ms", "tpot_ms", "median_itl_ms", "mean_itl_ms"}
REPLAYABLE_DATASETS = {"random", "prefix_repetition"}


def _ids(side: str) -> set[str]:
    """The YAML entries of `side` with a TPOT/ITL measurement and a replayable dataset."""
    return {
        str(e["id"])
        for e in load_split_entries("vllm_serving_measurements.yaml", "measurements")
        if e["split"] == side
        and TPOT_ITL_KEYS & set(e.get("measured") or {})
        and (e.get("workload") or {}).get("dataset", "random") in REPLAYABLE_DATASETS
    }


def test_the_committed_points_are_the_yamls_tpot_itl_points() -> None:
    # adding, removing or moving a point without `serving_band.py --write` fails here
    doc = json.loads(COMMITTED.read_text())
    assert {p["id"] for p in doc["points"]} == _ids("fit")
    assert {p["id"] for p in doc["held_out_check"]["points"]} == _ids("held_out")
    assert doc["n"] == len(_ids("fit"))
    script = load_script("serving_band")
    points = script.acc.load_points()
    assert {p.id for p in script.band_points(points, "fit")} == _ids("fit")


@pytest.mark.slow
def test_rerunning_the_script_reproduces_the_committed_json() -> None:
    script = load_script("serving_band")
    committed = json.loads(COMMITTED.read_text())
    committed.pop("date")
    assert script.document(script.acc.load_points()) == committed


def test_the_docs_quote_the_committed_band_and_check() -> None:
    doc = json.loads(COMMITTED.read_text())
    check = doc["held_out_check"]
    text = (ROOT / "docs" / "accuracy.md").read_text()
    quoted = [
        f"x{doc['low_factor']:.3f}-x{doc['high_factor']:.3f}",
        f"The {doc['n']} fit ratios' p10 is {doc['low_factor']:.3f}",
        f"**{check['covered_widened_band']} of {check['n']} "
        f"({check['coverage_widened_band']:.1%})**",
        f"**{check['covered_op_band']} of {check['n']} ({check['coverage_op_band']:.1%})**",
    ]
    for phrase in quoted:
        assert phrase in " ".join(text.split()), phrase
