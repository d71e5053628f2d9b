"""benchmarks/disagg_crossover.py and the P/D figures docs/workloads-and-clusters.md quotes.

A change of the step-time model moves these figures (they were stale once, after the V1
worker term); these tests fail until the docs and the script's docstring are updated."""

from __future__ import annotations

import pytest

from sim.cluster.capacity import gpus_needed
from sim.cluster.compare import Slo, max_rate_meeting_slo
from sim.scenario.schema import load_scenario
from tests.benchmarks.scripts import ROOT, load_script

crossover = load_script("disagg_crossover")

pytestmark = pytest.mark.slow

TIGHT = Slo(ttft_p99_s=1.0, tpot_p99_s=0.015)
LOOSE = Slo(ttft_p99_s=1.0, tpot_p99_s=0.05)


@pytest.fixture(scope="module")
def sweep() -> dict[str, list[dict]]:
    return crossover.sweep(1000, 4, [8.0, 12.0, 16.0, 20.0, 24.0, 28.0, 32.0, 36.0, 40.0])


def _at(rows: list[dict], rate: float) -> dict:
    return next(r for r in rows if r["rate_per_s"] == rate)


def test_tpot_p99_grows_faster_co_located_than_split(sweep):
    """12.6 / 23.8 / 57.4 ms co-located at 8 / 24 / 40 req/s; 2P+2D 11.5 / 17.7 / 27.9 ms."""
    quoted = {"4 co-located": (12.6, 23.8, 57.4), "2P+2D": (11.5, 17.7, 27.9)}
    for shape, figures in quoted.items():
        got = tuple(round(_at(sweep[shape], r)["tpot_p99_s"] * 1e3, 1) for r in (8, 24, 40))
        assert got == figures, shape


def test_kv_read_and_its_share_of_ttft(sweep):
    """280 MB and 6.3 ms per request; 6.4% of 2P+2D's TTFT at 8 req/s, 0.9% at 40."""
    low, high = _at(sweep["2P+2D"], 8), _at(sweep["2P+2D"], 40)
    assert round(low["kv_bytes_mean"] / 1e6) == 280
    assert round(low["transfer_s_mean"] * 1e3, 1) == 6.3
    assert round(low["transfer_share_of_ttft_mean"] * 100, 1) == 6.4
    assert round(high["transfer_share_of_ttft_mean"] * 100, 1) == 0.9


def test_highest_rates_meeting_each_slo(sweep):
    """Tight: 2P+2D 16, 1P+3D 16, co-located 12, 3P+1D 8. Loose: co-located 36, 2P+2D 32;
    3P+1D (tight and loose) and 1P+3D (loose) below co-located; 2P+2D's TTFT p99 1.2 s at 36."""
    tight = {shape: max_rate_meeting_slo(rows, TIGHT) for shape, rows in sweep.items()}
    loose = {shape: max_rate_meeting_slo(rows, LOOSE) for shape, rows in sweep.items()}
    assert tight == {"4 co-located": 12.0, "1P+3D": 16.0, "2P+2D": 16.0, "3P+1D": 8.0}
    assert loose["4 co-located"] == 36.0 and loose["2P+2D"] == 32.0
    assert loose["1P+3D"] < 36.0 and loose["3P+1D"] < 36.0
    assert round(_at(sweep["2P+2D"], 36)["ttft_p99_s"], 1) == 1.2


def test_tcp_read_is_half_the_ttft():
    """Over 25 GbE TCP the read is 128 ms, 48-58% of 2P+2D's TTFT at 8 and 24 req/s."""
    rows = crossover.sweep(1000, 4, [8.0, 24.0], "tcp-25g")["2P+2D"]
    assert {round(r["transfer_s_mean"] * 1e3) for r in rows} == {128}
    shares = [r["transfer_share_of_ttft_mean"] for r in rows]
    assert sorted(round(100 * s, 1) for s in shares) == [48.1, 57.9]


def test_cluster_capacity_answer_quoted_in_the_docs():
    """`kvsim cluster-capacity scenarios/pd_disagg_llama8b_h100.yaml --rate 24 --ttft-p99-s 1
    --tpot-p99-s 0.015 --routers round_robin,least_outstanding`: 7 co-located under
    least_outstanding, 8 under round_robin, 5 disaggregated (2P+3D)."""
    scenario = load_scenario(ROOT / "scenarios" / "pd_disagg_llama8b_h100.yaml")
    _, answers = gpus_needed(
        scenario, 24.0, TIGHT, max_gpus=8, routers=["round_robin", "least_outstanding"],
        workers=1,
    )  # fmt: skip
    got = {(a.mode, a.router): (a.num_gpus, a.shape) for a in answers}
    assert got[("co-located", "round_robin")][0] == 8
    assert got[("co-located", "least_outstanding")][0] == 7
    assert got[("disaggregated", "least_outstanding")] == (5, "2P+3D")
