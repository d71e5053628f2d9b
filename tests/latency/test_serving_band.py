"""The end-to-end step-time band (`sim.latency.serving_band`): the pre-registered quantile rule,
the merge with the op-level band, and which measured models carry the widened band."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.latency import LinearStepTime, RooflineStepTime, band_of
from sim.latency.band import StepTimeBand
from sim.latency.measured import MeasuredStepTime, shipped_coefficients
from sim.latency.serving_band import (
    ServingBand,
    covered,
    quantile_factors,
    serving_band_from,
    shipped_serving_band,
    widened,
)

ratios = st.lists(st.floats(0.05, 20.0, allow_nan=False), min_size=1, max_size=60)
op_bands = st.tuples(st.floats(0.5, 1.0), st.floats(1.0, 2.0), st.booleans()).map(
    lambda t: StepTimeBand(t[0], t[1], t[2], "op")
)
LLAMA = get_model("llama-3.1-8b")
#: (model, GPU, tp, p2p) of each op band the shipped coefficients hold: A100, H100, extrapolated
SETUPS = (
    ("llama-3.1-8b", "a100-80gb-sxm", 1, True),
    ("llama-3.1-8b", "h100-sxm", 1, True),
    ("llama-3.1-8b", "h200", 1, True),
    ("mixtral-8x7b-v0.1", "a100-80gb-sxm", 2, True),
    ("llama-3.1-8b", "a100-80gb-sxm", 2, False),
)


def test_the_quantiles_are_numpys_linear_p10_p90_of_a_worked_example() -> None:
    # the module docstring's example: p10 = 0.8 + 0.4 x 0.1, p90 = 1.1 + 0.6 x 0.4
    assert quantile_factors([1.5, 0.8, 1.1, 0.9, 1.0]) == pytest.approx((0.84, 1.34))
    # every ratio above 1: p10 1.12 is clipped to 1
    assert quantile_factors([1.1, 1.2, 1.3]) == pytest.approx((1.0, 1.28))
    assert quantile_factors([0.5]) == (0.5, 1.0)


def test_no_ratio_or_a_ratio_that_is_not_positive_is_refused() -> None:
    for bad in ([], [1.0, 0.0], [1.0, -2.0], [float("nan")]):
        with pytest.raises(ValueError):
            quantile_factors(bad)


@settings(max_examples=200, deadline=None)
@given(values=ratios)
def test_the_serving_band_contains_one_and_lies_within_the_ratios(values) -> None:
    low, high = quantile_factors(values)
    assert low <= 1.0 <= high
    assert low >= min(min(values), 1.0) - 1e-12 and high <= max(max(values), 1.0) + 1e-12


@settings(max_examples=200, deadline=None)
@given(values=ratios, extreme=st.floats(20.0, 100.0))
def test_a_more_extreme_point_never_narrows_the_band(values, extreme) -> None:
    low, high = quantile_factors(values)
    assert quantile_factors([*values, extreme])[1] >= high
    assert quantile_factors([*values, 1.0 / extreme])[0] <= low


@settings(max_examples=200, deadline=None)
@given(op=op_bands, values=ratios)
def test_the_widened_band_contains_the_op_band_and_the_serving_band(op, values) -> None:
    low, high = quantile_factors(values)
    serving = ServingBand(low, high, len(values))
    band = widened(op, serving)
    assert band.low_factor <= min(op.low_factor, low) and band.low_factor in (op.low_factor, low)
    assert band.high_factor >= max(op.high_factor, high) and band.high_factor in (
        op.high_factor,
        high,
    )
    assert band.extrapolated == op.extrapolated
    assert band.source.startswith("op; widened to the end-to-end band of")
    assert covered(low, band) and covered(high, band) and covered(1.0, band)


def test_coverage_counts_both_ends() -> None:
    band = StepTimeBand(0.9, 1.2, False, "x")
    assert [covered(r, band) for r in (0.89, 0.9, 1.2, 1.21)] == [False, True, True, False]


def _committed() -> dict:
    return json.loads(resources.files("sim.data").joinpath("serving_band.json").read_text())


def test_the_committed_band_is_the_rule_applied_to_its_own_points() -> None:
    doc = _committed()
    fit = [p["ratio"] for p in doc["points"]]
    assert doc["n"] == len(fit) == len({p["id"] for p in doc["points"]})
    assert all(p["ratio"] == p["measured_ms"] / p["predicted_ms"] for p in doc["points"])
    assert (doc["low_factor"], doc["high_factor"]) == quantile_factors(fit)
    assert doc["quantile_ratios_unclipped"] == list(np.quantile(fit, doc["quantiles"]))
    assert doc["quantiles"] == [0.1, 0.9] and doc["side"] == "fit"
    check = doc["held_out_check"]
    assert check["n"] == len(check["points"])
    new_band = serving_band_from(doc)
    in_new = sum(
        covered(p["ratio"], widened(StepTimeBand(*p["op_band"], False, ""), new_band))
        for p in check["points"]
    )
    in_op = sum(
        covered(p["ratio"], StepTimeBand(*p["op_band"], False, "")) for p in check["points"]
    )
    assert (check["covered_widened_band"], check["covered_op_band"]) == (in_new, in_op)
    assert not {p["id"] for p in doc["points"]} & {p["id"] for p in check["points"]}


@pytest.mark.parametrize(("model", "gpu", "tp", "p2p"), SETUPS)
def test_the_shipped_measured_band_is_the_op_band_merged_with_the_json(model, gpu, tp, p2p) -> None:
    step = MeasuredStepTime(get_model(model), get_gpu(gpu), tp=tp, p2p=p2p)
    co = shipped_coefficients()["band"]
    op = co["extrapolated" if step.extrapolated else gpu]
    doc = _committed()
    band = step.band()
    assert band.low_factor == min(op["low_factor"], doc["low_factor"])
    assert band.high_factor == max(op["high_factor"], doc["high_factor"])
    assert band.extrapolated == step.extrapolated
    assert (step.op_band().low_factor, step.op_band().high_factor) == (
        op["low_factor"],
        op["high_factor"],
    )
    assert f"end-to-end band of {doc['n']} public vllm bench serve points" in band.source


def test_a_coefficients_file_of_the_users_own_keeps_its_band(tmp_path: Path) -> None:
    own = json.loads(json.dumps(shipped_coefficients()))  # a copy: not the shipped object
    own["band"]["h100-sxm"] = {"low_factor": 0.97, "high_factor": 1.02}
    step = MeasuredStepTime(LLAMA, get_gpu("h100-sxm"), coefficients=own)
    assert (step.band().low_factor, step.band().high_factor) == (0.97, 1.02)
    assert not step.band_widened and step.band() == step.op_band()
    del own["band"]
    bare = MeasuredStepTime(LLAMA, get_gpu("h100-sxm"), coefficients=own)
    assert (bare.band().low_factor, bare.band().high_factor) == (1.0, 1.0)
    # the shipped dict passed explicitly, and a rebuilt model, are still the shipped fit
    for shipped in (
        MeasuredStepTime(LLAMA, get_gpu("h100-sxm"), coefficients=shipped_coefficients()),
        MeasuredStepTime(LLAMA, get_gpu("h100-sxm")).with_host_staged_algbw(7.0),
    ):
        assert shipped.band_widened and shipped.band() != shipped.op_band()


def test_other_models_are_not_widened() -> None:
    serving = shipped_serving_band()
    for model in (RooflineStepTime(LLAMA, get_gpu("h100-sxm")), LinearStepTime(0.01)):
        assert "end-to-end" not in band_of(model).source
        assert band_of(model).high_factor != serving.high_factor
