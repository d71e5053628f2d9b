"""benchmarks/serving_sources.py: the serving accuracy per independent source, on small fake
tables whose medians are worked out by hand."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.benchmarks.scripts import load_script

sources = load_script("serving_sources")
PointErrors = sources.PointErrors
GROUPS = ("TTFT", "TPOT/ITL", "throughput")
TT143 = "https://github.com/tenstorrent/tt-inference-server/issues/143"
TT340 = "https://github.com/tenstorrent/tt-inference-server/issues/340"
PR = "https://github.com/vllm-project/vllm/pull/9668"
ISSUE = "https://github.com/vllm-project/vllm/issues/20469"


@pytest.mark.parametrize(
    ("url", "group"),
    [
        (TT143, "github.com/tenstorrent/tt-inference-server"),
        (TT340 + "#issuecomment-1", "github.com/tenstorrent/tt-inference-server"),
        (PR + "#x", "github.com/vllm-project/vllm/pull/9668"),
        (ISSUE, "github.com/vllm-project/vllm/issues/20469"),
        (
            "https://github.com/ovg-project/kvcached/blob/c41e/b/H100.md",
            "github.com/ovg-project/kvcached",
        ),
    ],
)
def test_tenstorrent_threads_are_one_source_and_vllm_threads_stay_apart(url, group):
    assert sources.source_group(url) == group


def _fake():
    return [
        PointErrors(TT143, "fit", True, {"TPOT/ITL": 0.10, "throughput": 0.02}),
        PointErrors(TT340, "held_out", True, {"TPOT/ITL": 0.30}),
        PointErrors(TT340, "fit", True, {"TPOT/ITL": 0.20, "throughput": 0.04}),
        PointErrors(PR, "fit", True, {"TTFT": 0.50, "TPOT/ITL": 0.40, "throughput": 0.60}),
        PointErrors(PR, "held_out", False, {}),
        PointErrors(ISSUE, "held_out", True, {"TTFT": 0.10, "TPOT/ITL": 0.05}),
    ]


def test_rows_group_count_sides_and_take_each_sources_median():
    rows = {r.source: r for r in sources.source_rows(_fake(), GROUPS)}
    tt = rows["github.com/tenstorrent/tt-inference-server"]
    assert (tt.points, tt.replayed, tt.sides) == (3, 3, {"fit": 2, "held_out": 1})
    assert tt.medians["TPOT/ITL"] == (3, pytest.approx(0.20))
    assert tt.medians["throughput"] == (2, pytest.approx(0.03))
    assert "TTFT" not in tt.medians
    pr = rows["github.com/vllm-project/vllm/pull/9668"]
    assert (pr.points, pr.replayed, pr.sides) == (2, 1, {"fit": 1, "held_out": 1})
    assert pr.medians["TTFT"] == (1, 0.50)


def test_the_median_over_sources_weighs_each_source_once():
    """TPOT/ITL: source medians 0.20 (tenstorrent, 3 points), 0.40, 0.05 -> 0.20; the median
    over the five points would be 0.20 too, but TTFT's two sources give 0.30 and throughput's
    three give 0.04 (0.03, 0.60, and none for #20469: two sources -> 0.315)."""
    rows = sources.source_rows(_fake(), GROUPS)
    over = sources.median_over_sources(rows, GROUPS)
    assert over["TPOT/ITL"] == (3, pytest.approx(0.20))
    assert over["TTFT"] == (2, pytest.approx(0.30))
    assert over["throughput"] == (2, pytest.approx(0.315))


def test_the_table_has_a_row_per_source_and_the_robustness_line_last():
    text = sources.source_table(_fake(), GROUPS)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 + 1
    assert lines[2].startswith(
        "| github.com/tenstorrent/tt-inference-server | 3 (3) | 2 / 1 | - | 20.0% (3)"
    )
    assert lines[-1].startswith("| median over sources (each once; robustness view")
    assert "20.0% (3)" in lines[-1] and "30.0% (2)" in lines[-1] and "31.5% (2)" in lines[-1]


@given(
    st.lists(
        st.tuples(st.sampled_from([TT143, TT340, PR, ISSUE]), st.floats(0, 5, allow_nan=False)),
        min_size=1,
        max_size=30,
    )
)
def test_one_point_per_source_gives_the_plain_median_and_any_table_lies_within_its_range(drawn):
    """Invariants: the median over sources lies within the sources' medians; with one point
    per source it is the plain median of the points."""
    points = [PointErrors(url, "fit", True, {"TPOT/ITL": e}) for url, e in drawn]
    rows = sources.source_rows(points, GROUPS)
    n, value = sources.median_over_sources(rows, GROUPS)["TPOT/ITL"]
    medians = [r.medians["TPOT/ITL"][1] for r in rows]
    assert n == len(rows) and min(medians) <= value <= max(medians)
    if len(rows) == len(points):
        assert math.isclose(value, statistics.median(e for _, e in drawn))
