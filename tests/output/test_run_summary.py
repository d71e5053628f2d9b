"""What `kvsim run` prints about what ran: design with its pinned release, manager, step time."""

from __future__ import annotations

from sim.cli.main import _design_row, _manager_row, _step_time_row
from sim.kv.config import Design
from sim.plots.common import subject_of


def test_v1_design_names_its_pinned_release():
    assert Design.V1_ENGINE.upstream_at("0.33.0") == "vLLM 0.33.0 V1 engine"
    assert Design.V1_ENGINE.upstream_at("4ac7713") == "vLLM ~0.10 V1 engine @ 4ac7713"
    assert Design.V0_V2.upstream_at("0.5.4") == Design.V0_V2.upstream  # the release
    assert _design_row("v1-engine", "0.11.0") == "v1-engine = vLLM 0.11.0 V1 engine"


def test_plot_subject_names_the_pinned_release():
    inputs = {"scenario": "s", "design": "v1-engine", "vllm_version": "0.33.0"}
    assert "v1-engine = vLLM 0.33.0 V1 engine" in subject_of(inputs)
    assert "4ac7713, 0.11.0 or 0.33.0" not in subject_of(inputs)


def test_manager_row_says_which_code_ran():
    assert _manager_row({"kind": "model", "vllm_version": None, "vllm_root": None}) == (
        "kvsim's model"
    )
    real = {"kind": "real", "vllm_version": "0.5.4", "vllm_root": ".vllm/0.5.4"}
    assert _manager_row(real) == "vLLM 0.5.4 real code (.vllm/0.5.4)"


def test_step_time_row_reports_the_band_or_its_absence():
    band = {"low_factor": 0.924, "high_factor": 1.057, "extrapolated": False, "source": "x"}
    assert _step_time_row({"measured": {}}, band) == "measured (real steps x0.924-x1.057 of it)"
    unknown = {"low_factor": 1.0, "high_factor": 1.0, "extrapolated": True, "source": "none"}
    assert _step_time_row({"linear": {}}, unknown) == "linear (no validated error band)"
    wide = {"low_factor": 1.0, "high_factor": 1.67, "extrapolated": True, "source": "y"}
    assert _step_time_row({"roofline": {}}, wide).endswith("x1-x1.67 of it, extrapolated)")
