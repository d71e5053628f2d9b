"""Step-time bands: each model's band, the scaled wrapper, and the band in a run's summary."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim
from sim.catalog import get_gpu, get_model
from sim.latency import (
    UNKNOWN_BAND,
    BatchShape,
    LinearStepTime,
    RooflineStepTime,
    ScaledStepTime,
    StepTimeBand,
    band_of,
    scaled,
)
from sim.latency.roofline import ROOFLINE_BAND
from sim.output.results import summary_json
from tests.harness.sweep import dd1_scenario

GEMMA = get_model("gemma-2-9b")
LLAMA = get_model("llama-3.1-8b")

batches = st.builds(
    BatchShape,
    st.lists(st.integers(0, 32_768), max_size=64).map(tuple),
    st.lists(st.tuples(st.integers(0, 16_384), st.integers(1, 4096)), max_size=4).map(tuple),
)
factors = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(batch=batches)
def test_scaled_by_one_is_the_model(batch) -> None:
    roofline = RooflineStepTime(GEMMA, get_gpu("h100-sxm"), tp=2)
    assert ScaledStepTime(roofline, 1.0).predict_s(batch) == roofline.predict_s(batch)
    assert scaled(roofline, 1.0) is roofline  # no wrapper on the hot path


@settings(max_examples=200, deadline=None)
@given(batch=batches, f1=factors, f2=factors)
def test_scaled_is_monotone_in_the_factor(batch, f1, f2) -> None:
    roofline = RooflineStepTime(LLAMA, get_gpu("a100-80gb-sxm"))
    low, high = sorted((f1, f2))
    t_low = ScaledStepTime(roofline, low).predict_s(batch)
    t_high = ScaledStepTime(roofline, high).predict_s(batch)
    assert t_low <= t_high
    assert t_high == pytest.approx(high * roofline.predict_s(batch), rel=1e-12)


def test_scaled_keeps_the_window_and_the_band() -> None:
    roofline = RooflineStepTime(GEMMA, get_gpu("h100-sxm"))
    wrapped = ScaledStepTime(roofline, 1.67)
    assert roofline.decode_window == GEMMA.sliding_window is not None
    assert wrapped.decode_window == roofline.decode_window
    assert band_of(wrapped) == band_of(roofline) == ROOFLINE_BAND
    assert ScaledStepTime(LinearStepTime(0.01), 2.0).decode_window is None
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="positive"):
            ScaledStepTime(roofline, bad)


def test_roofline_band_is_wide_and_flagged() -> None:
    band = band_of(RooflineStepTime(LLAMA, get_gpu("h200")))
    # Whole steps run 20-40% fast: measured = predicted / 0.6 at worst; never faster than it.
    assert (band.low_factor, band.high_factor) == (1.0, 1.67)
    assert band.extrapolated and "unvalidated" in band.source


def test_models_without_validation_say_so() -> None:
    band = band_of(LinearStepTime(0.01))
    assert (band.low_factor, band.high_factor, band.extrapolated) == (1.0, 1.0, True)
    assert "linear" in band.source
    assert band_of(object()) == UNKNOWN_BAND
    with pytest.raises(ValueError):
        StepTimeBand(1.1, 1.5, extrapolated=False, source="low above 1")


def test_run_reports_the_band_and_the_factor() -> None:
    base = sim.run(_dd1(20))
    slow = sim.run(_dd1(20), step_time_factor=2.0)
    band = base.summary["step_time_band"]
    assert band == band_of(LinearStepTime(0.01)).as_dict()
    assert json.loads(summary_json(base))["summary"]["step_time_band"]["source"] == band["source"]
    # Every step of the D/D/1 scenario is one 10 ms prefill: doubled by the factor.
    assert (base.steps["duration_s"] == 0.01).all()
    assert (slow.steps["duration_s"] == 0.02).all()
    assert slow.inputs["step_time_factor"] == 2.0 and "step_time_factor" not in base.inputs
    assert slow.summary["step_time_band"] == band  # the band is the model's, not the what-if's


def _dd1(num_requests: int):
    from sim.scenario.schema import scenario_from_dict

    return scenario_from_dict(dd1_scenario(num_requests))
