"""The committed H200 calibration (sim/data/calibrations/h200-llama-3.1-8b-bf16/): its coefficient
files are what `calibrate.to_measured` derives from its profiles, the table docs/accuracy.md
quotes is what benchmarks/h200_calibration.py prints, and the catalog's H200 visible memory is
the one that machine reported."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from calibrate.to_measured import coefficients_doc
from sim.catalog import get_gpu
from sim.latency.profile import load_profile
from tests.benchmarks.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DIR = ROOT / "sim/data/calibrations/h200-llama-3.1-8b-bf16"


def _script():
    return load_script("h200_calibration")


@pytest.mark.parametrize("run", ["run1", "run2", "run3"])
def test_committed_coefficients_are_derived_from_the_committed_profile(run):
    profile_path = DIR / f"{run}.json"
    committed = json.loads((DIR / f"{run}.coefficients.json").read_text())
    derived = coefficients_doc(load_profile(profile_path), profile_path)
    assert committed == json.loads(json.dumps(derived))
    assert committed["provenance"]["device_name"] == "NVIDIA H200"
    assert committed["provenance"]["plumbing_only"] is False


def test_only_run3_is_timed_behind_the_run_ahead_hold():
    timings = {
        run: load_profile(DIR / f"{run}.json").metadata.timing for run in ("run1", "run2", "run3")
    }
    assert timings == {"run1": None, "run2": None, "run3": "run-ahead"}


def test_accuracy_doc_quotes_the_benchmark_table_verbatim():
    doc = (ROOT / "docs/accuracy.md").read_text()
    quoted = re.search(
        r"<!-- h200-calibration:begin -->\n```text\n(.*?)\n```\n<!-- h200-calibration:end -->",
        doc,
        re.S,
    )
    assert quoted, "docs/accuracy.md lost its H200 calibration table"
    script = _script()
    assert quoted.group(1) == script.tables_text(script.load_runs())


def test_the_launch_bound_defect_shows_in_run1_and_not_in_run3():
    """The regression the run-ahead hold fixed, in the data: a 1-token o_proj GEMM (33.6 MB of
    weights, ~8 us of H200 HBM time) read over 3x longer when each launch was timed."""

    def one_token_o_proj_s(run: str) -> float:
        points = load_profile(DIR / f"{run}.json").gemms["o_proj"].points
        return next(p.median_s for p in points if p.params["tokens"] == 1)

    assert one_token_o_proj_s("run1") > 2 * one_token_o_proj_s("run3")
    assert one_token_o_proj_s("run3") < 20e-6


def test_catalog_h200_visible_memory_is_what_the_machine_reported():
    info = (DIR / "device_info.txt").read_text()
    total_bytes = int(re.search(r"mem_get_info total_bytes (\d+)", info).group(1))
    assert get_gpu("h200").memory_visible_gib == pytest.approx(total_bytes / 2**30, abs=0.005)
