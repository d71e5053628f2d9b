"""calibrate's budget: essentials first, then cheapest first until the deadline (fake clocks),
the grid shrinks to fit a slow device, and `kvsim calibrate` says what CPU numbers are."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate.budget import BudgetRun, Case, Deadline, order_cases, run_within_budget
from calibrate.grid import Ceilings, Grid, _lower_top_level, build_grid
from sim.catalog import get_model


class FakeClock:
    """A clock that moves only when a fake measurement says so."""

    def __init__(self) -> None:
        self.now_s = 100.0

    def __call__(self) -> float:
        return self.now_s


def _run(cases, budget_s, actual_over_estimate):
    clock = FakeClock()
    deadline = Deadline(budget_s, clock)
    order = []

    def measure(case: Case) -> None:
        order.append((case, clock.now_s - 100.0))
        clock.now_s += case.estimated_s * actual_over_estimate(case)

    done = run_within_budget(cases, measure, deadline)
    return done, order, clock.now_s - 100.0


def test_the_docstring_example() -> None:
    """6 essential cases estimated 1 s take 2 s each (12 s); of 1, 2, 4, 8 s estimates, 1 and 2
    run (scaled x2: 14 s, 18 s); 4 would need 8 s with 2 s left: it and 8 are skipped."""
    essential = [Case("decode:k", (i, 1), 1.0, essential=True) for i in range(6)]
    rest = [Case("gemm", (t,), float(t)) for t in (8, 2, 4, 1)]  # order given: not cheapest first
    done, order, elapsed = _run(essential + rest, 20.0, lambda c: 2.0)
    assert [c.params for c in done.run] == [c.params for c in essential] + [(1,), (2,)]
    assert [c.params for c in done.skipped] == [(4,), (8,)]
    assert elapsed == 18.0
    assert (done.measured_s, done.estimated_s) == (18.0, 9.0)


def test_essentials_run_even_after_the_deadline() -> None:
    essential = [Case("prefill", (0, c), 5.0, essential=True) for c in (16, 32, 64)]
    rest = [Case("prefill", (1024, 16), 0.1)]
    done, _, elapsed = _run(essential + rest, 1.0, lambda c: 1.0)
    assert len(done.run) == 3 and elapsed == 15.0  # a profile needs them: they always run
    assert done.skipped == rest


def test_order_is_essentials_then_cheapest_first() -> None:
    cases = [Case("a", (1,), 3.0), Case("b", (2,), 1.0, True), Case("c", (3,), 2.0)]
    assert [c.kind for c in order_cases(cases)] == ["b", "c", "a"]


estimates = st.floats(min_value=0.01, max_value=50.0)
case_lists = st.lists(st.tuples(estimates, st.booleans()), min_size=1, max_size=30)


@settings(max_examples=300, deadline=None)
@given(specs=case_lists, budget_s=st.floats(0.0, 200.0), slowdown=st.floats(0.1, 10.0))
def test_no_optional_case_starts_after_the_deadline(specs, budget_s, slowdown) -> None:
    cases = [Case("k", (i,), est, essential) for i, (est, essential) in enumerate(specs)]
    done, order, elapsed = _run(cases, budget_s, lambda c: slowdown)
    assert sorted(c.params for c in done.run + done.skipped) == [c.params for c in cases]
    assert all(c.essential for c in done.run[: sum(c.essential for c in cases)])
    assert not any(c.essential for c in done.skipped)
    for case, started_s in order:
        if not case.essential:
            assert started_s < budget_s
    # The skipped cases are the most expensive optional ones: a suffix of the order.
    if done.skipped:
        cheapest_skipped = min(c.estimated_s for c in done.skipped)
        assert all(c.estimated_s <= cheapest_skipped for c in done.run if not c.essential)


@settings(max_examples=300, deadline=None)
@given(specs=case_lists, budget_s=st.floats(0.0, 200.0))
def test_exact_estimates_never_overrun_the_budget_past_the_essentials(specs, budget_s) -> None:
    cases = [Case("k", (i,), est, essential) for i, (est, essential) in enumerate(specs)]
    done, _, elapsed = _run(cases, budget_s, lambda c: 1.0)
    essentials_s = sum(c.estimated_s for c in cases if c.essential)
    assert elapsed <= max(budget_s, essentials_s) + 1e-9


def test_eta_scales_estimates_and_is_capped_by_the_deadline() -> None:
    run = BudgetRun(measured_s=4.0, estimated_s=2.0)  # estimates run x2 slow so far
    remaining = [Case("k", (1,), 3.0), Case("k", (2,), 1.0, essential=True)]
    assert run.eta_s(remaining, left_s=100.0) == 8.0
    assert run.eta_s(remaining, left_s=5.0) == 5.0
    assert run.eta_s(remaining, left_s=-1.0) == 2.0  # the essential case still runs


def test_grid_for_an_8b_model_on_a_slow_cpu_keeps_two_levels_everywhere() -> None:
    """A 2-core CPU (4 GB/s, 50 GFLOP/s): the old grid kept the ends of every level list and was
    estimated at ~3,000 s for a 13 s budget; now the top levels come down until it fits."""
    model = get_model("llama-3.1-8b")
    cpu = Ceilings(4e9, 5e10, 40e-6)
    grid = build_grid(model, budget_s=13, ceilings=cpu, dtype_bytes=4, max_case_bytes=256 << 20)
    assert grid.estimated_s <= 13
    for levels in (grid.decode_batches, grid.decode_contexts, grid.prefill_chunks,
                   grid.prefill_priors, grid.gemm_tokens):  # fmt: skip
        assert len(levels) >= 2 and list(levels) == sorted(set(levels))
    assert any("levels capped" in note for note in grid.notes)
    roomy = build_grid(model, budget_s=13, ceilings=Ceilings(4e12, 7e14, 15e-6))
    assert roomy.gemm_tokens[-1] == 8192 and not any("capped" in n for n in roomy.notes)


def test_lower_top_level_halves_then_drops() -> None:
    grid = Grid((1, 2), (64, 128), (16, 32), (0, 64), (1, 256, 512))

    def gemm_cost(g: Grid) -> float:  # only the GEMM levels cost anything
        return float(sum(g.gemm_tokens))

    assert _lower_top_level(grid, gemm_cost).gemm_tokens == (1, 256)  # 512 // 2 <= 256: drop
    smaller = _lower_top_level(Grid((1, 2), (64, 128), (16, 32), (0, 64), (1, 256)), gemm_cost)
    assert smaller.gemm_tokens == (1, 128)
    floor = Grid((1, 2), (64, 128), (16, 32), (0, 64), (1, 2))
    assert _lower_top_level(floor, gemm_cost) is None  # nothing left to lower


def test_an_expired_deadline_still_gives_a_profile(tmp_path) -> None:
    """Deadline already passed: only the essential cases run, the fits use them, and the
    profile's notes say how many were skipped (no wall clock involved)."""
    pytest.importorskip("torch")
    from calibrate.cli import CPU_NOTE, run_calibration
    from tests.latency.test_calibrate import TINY

    profile = run_calibration(TINY, tmp_path / "p.json", 60.0, "cpu", "float32", max_num_seqs=8,
                              max_num_batched_tokens=256,
                              deadline=Deadline(0.0, lambda: 0.0))  # fmt: skip
    grid = profile.grid
    decode = {(p.params["num_seqs"], p.params["context_tokens"] / p.params["num_seqs"])
              for p in profile.decode_attention.points}  # fmt: skip
    b, c = grid["decode_batches"], grid["decode_contexts"]
    assert decode == {(x, y) for x in (b[0], b[-1]) for y in (c[0], c[-1])}
    tokens = [p.params["tokens"] for p in profile.gemms["qkv_proj"].points]
    assert tokens == [grid["gemm_tokens"][0], grid["gemm_tokens"][-1]]
    assert all([p.params["tokens"] for p in g.points] == tokens for g in profile.gemms.values())
    assert any("cases skipped at the deadline" in note for note in grid["notes"])
    assert CPU_NOTE in grid["notes"]


def test_kvsim_calibrate_says_cpu_numbers_are_plumbing(tmp_path, monkeypatch) -> None:
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    import calibrate.cli
    from calibrate.to_measured import write_coefficients
    from sim.cli.main import app

    seen = {}
    profile = _tiny_profile(tmp_path)

    def fake_run_calibration(model, out, budget_s, device, dtype, **kwargs):
        seen.update(kwargs, budget_s=budget_s, device=device)
        write_coefficients(profile, out)
        return profile

    monkeypatch.setattr(calibrate.cli, "run_calibration", fake_run_calibration)
    result = CliRunner().invoke(
        app, ["calibrate", "--device", "cpu", "--budget", "20", "-o", str(tmp_path / "x.json")]
    )
    assert result.exit_code == 0, result.output
    assert "not a GPU profile" in result.output
    assert "within about 20 s" in result.output
    assert seen["budget_s"] == 20 and isinstance(seen["deadline"], Deadline)
    assert seen["deadline"].budget_s == 20
    coefficients = tmp_path / "x.coefficients.json"
    assert f"step_time: {{measured: {{coefficients: {coefficients}}}}}" in result.output
    assert "decode kernel torch-gather-sdpa:" in result.output


def _tiny_profile(tmp_path):
    from calibrate.cli import run_calibration
    from tests.latency.test_calibrate import TINY

    return run_calibration(TINY, tmp_path / "t.json", 60.0, "cpu", "float32", max_num_seqs=4,
                           max_num_batched_tokens=64, max_context_tokens=256,
                           deadline=Deadline(0.0, lambda: 0.0))  # fmt: skip
