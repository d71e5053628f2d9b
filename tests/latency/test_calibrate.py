"""calibrate/: kernels agree with float64, a tiny CPU calibration feeds the simulator."""

import json

import pytest

# The calibration kernels need torch (the `calibrate` extra); without it this module skips,
# with the reason shown by `-ra`, instead of failing collection.
torch = pytest.importorskip(
    "torch", reason="torch is not installed: pip install -e '.[calibrate]' to run these tests"
)

from calibrate import kernels as K  # noqa: E402 - needs torch, imported only when present
from calibrate.cli import match_gpu, run_calibration  # noqa: E402
from calibrate.grid import Ceilings, build_grid  # noqa: E402
from calibrate.reference import (  # noqa: E402
    decode_reference,
    gemm_reference,
    max_rel_error,
    prefill_reference,
)
from calibrate.report import summarize, write_report  # noqa: E402
from sim.catalog import get_model  # noqa: E402
from sim.latency import BatchShape, CalibratedStepTime, make_step_time  # noqa: E402
from sim.latency.calibrated import PiecewiseLinear  # noqa: E402
from sim.latency.fit import fit_linear, refit  # noqa: E402
from sim.latency.profile import load_profile  # noqa: E402

TINY = dict(name="tiny", num_layers=2, hidden_size=64, num_attention_heads=4, num_kv_heads=2,
            head_dim=16, intermediate_size=128, vocab_size=256, max_position_embeddings=1024)  # fmt: skip


@pytest.mark.parametrize("name", ["torch-gather-sdpa", "flex-paged"])
def test_decode_kernels_match_float64_reference(name):
    prepare = K.decode_kernels("cpu")[name]
    if isinstance(prepare, str):
        pytest.skip(prepare)
    lens = [1, 5, 16, 33]  # partial last blocks, a single token
    b = K.make_paged_batch(lens, block_size=8, num_q_heads=8, num_kv_heads=2, head_dim=16,
                           dtype=torch.float32, device="cpu")  # fmt: skip
    ref = decode_reference(b.q, b.k_cache, b.v_cache, b.block_table, lens)
    assert max_rel_error(prepare(b)(), ref) < 1e-5


@pytest.mark.parametrize(("prior", "chunk"), [(0, 9), (7, 5)])
def test_prefill_and_gemm_match_float64_reference(prior, chunk):
    run, (q, k, v) = K.prepare_prefill(prior, chunk, num_q_heads=4, num_kv_heads=2, head_dim=8,
                                       dtype=torch.float32, device="cpu")  # fmt: skip
    assert max_rel_error(run(), prefill_reference(q, k, v)) < 1e-5
    run, (x, w) = K.prepare_gemm(chunk, 32, 48, dtype=torch.float32, device="cpu")
    assert max_rel_error(run(), gemm_reference(x, w)) < 1e-5


def test_fit_recovers_known_coefficients():
    rows = [[1.0, n, c] for n in (1, 4, 16) for c in (64 * n, 1024 * n)]
    y = [2e-5 + 1e-6 * r[1] + 3e-9 * r[2] for r in rows]
    fit = fit_linear(rows, y, ["1", "num_seqs", "context_tokens"])
    assert fit.coefficients == pytest.approx([2e-5, 1e-6, 3e-9], rel=1e-6)
    assert fit.residual_max_rel < 1e-9
    # A negative slope is dropped rather than kept (no negative time outside the grid).
    fit = fit_linear([[1.0, 1.0], [1.0, 2.0]], [2.0, 1.0], ["1", "tokens"])
    assert min(fit.coefficients) >= 0


def test_piecewise_linear_extrapolates_from_end_segments():
    f = PiecewiseLinear([1, 64, 4096], [1e-3, 1e-3, 8e-3])
    assert f(32) == 1e-3 and f(4096) == 8e-3
    assert f(8192) > 8e-3 and f(0) == pytest.approx(1e-3)


def test_grid_is_sized_by_budget():
    model = get_model("llama-3.1-8b")
    ceilings = Ceilings(4e12, 7e14, 15e-6)
    big = build_grid(model, budget_s=420, ceilings=ceilings)
    small = build_grid(model, budget_s=20, ceilings=ceilings)
    assert big.estimated_s <= 420 and small.estimated_s <= 20
    assert len(small.decode_contexts) <= len(big.decode_contexts)
    assert small.decode_contexts[0] == 64 and small.gemm_tokens[0] == 1


def test_tiny_cpu_calibration_feeds_the_simulator(tmp_path):
    out = tmp_path / "tiny.json"
    # The grid is estimated at well under a second; the budget is a deadline too, so leave room
    # for a busy machine (the budget logic has its own tests with a fake clock).
    profile = run_calibration(TINY, out, 120.0, "cpu", "float32", max_num_seqs=8,
                              max_num_batched_tokens=256, report_dir=tmp_path)  # fmt: skip
    assert profile.metadata.device == "cpu" and profile.metadata.torch == torch.__version__
    assert all(err < 1e-5 for err in profile.checks.values())
    assert all(len(p.samples_s) == profile.grid["repeats"] for p in profile.decode_attention.points)
    loaded = load_profile(out)
    assert loaded == profile
    model = make_step_time({"calibrated": str(out)}, TINY, "h100-sxm")
    assert isinstance(model, CalibratedStepTime)
    # Positive and finite, but no ordering between batch sizes: the GEMM curve interpolates raw
    # CPU timings, and on a loaded machine one slow sample can make a 2-token step read slower
    # than a 136-token one (CI saw 32 ms vs 1 ms). Ordering on clean timings is a GPU check.
    small = model.predict_s(BatchShape((64,) * 2, ()))
    large = model.predict_s(BatchShape((512,) * 8, ((0, 128),)))
    assert all(0 < t < 10.0 for t in (small, large))
    assert refit(loaded).decode_attention.fit == loaded.decode_attention.fit
    assert (tmp_path / "tiny.md").exists() and (tmp_path / "tiny.png").stat().st_size > 1000
    summary = summarize(loaded)
    assert summary["decode_bw_frac_copy_median"] > 0 and summary["gemm_TFLOPs_max"] > 0
    write_report(loaded, tmp_path / "again")
    # ... and `kvsim run` consumes it through a scenario's `step_time: {calibrated: PROFILE}`.
    from sim.engine.run import run
    from sim.scenario.schema import scenario_from_dict

    scenario = scenario_from_dict(
        {
            "model": TINY,
            "cache": {"num_gpu_blocks": 64, "num_cpu_blocks": 0},
            "scheduler": {
                "design": "v1-engine",
                "max_model_len": 512,
                "enable_chunked_prefill": True,
            },
            "workload": {
                "kind": "inline",
                "requests": [
                    {"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 5},
                    {"arrival_s": 0.001, "prompt_tokens": 40, "output_tokens": 3},
                ],
            },  # fmt: skip
            "step_time": {"calibrated": out.name},
        }
    )
    result = run(scenario, base_dir=tmp_path)
    assert result.summary["states"]["finished"] == 2
    assert result.steps["duration_s"].iloc[0] == pytest.approx(
        model.predict_s(BatchShape((), ((0, 100),)))
    )


def _profile_doc(tmp_path):
    out = tmp_path / "p.json"
    run_calibration(TINY, out, 2.0, "cpu", "float32", max_num_seqs=4, max_num_batched_tokens=64,
                    max_context_tokens=256)  # fmt: skip
    return json.loads(out.read_text())


def test_malformed_profile_gives_a_clear_error(tmp_path):
    doc = _profile_doc(tmp_path)
    bad = tmp_path / "bad.json"

    def error_for(text: str) -> str:
        bad.write_text(text)
        with pytest.raises(ValueError) as exc:
            load_profile(bad)
        assert str(bad) in str(exc.value)
        return str(exc.value)

    assert "not valid JSON" in error_for("{")
    assert "schema_version 2" in error_for(json.dumps({**doc, "schema_version": 2}))
    no_fit = {**doc, "decode_attention": {**doc["decode_attention"]}}
    del no_fit["decode_attention"]["fit"]
    assert "decode_attention.fit" in error_for(json.dumps(no_fit))
    assert "'kind'" in error_for(json.dumps({**doc, "kind": "pickle"}))
    extra = {**doc, "metadata": {**doc["metadata"], "gpu": "x"}}
    assert "metadata.gpu" in error_for(json.dumps(extra))
    with pytest.raises(ValueError, match="cannot read"):
        load_profile(tmp_path / "missing.json")


def test_profile_for_another_model_is_refused(tmp_path):
    _profile_doc(tmp_path)
    with pytest.raises(ValueError, match="is for tiny"):
        make_step_time({"calibrated": str(tmp_path / "p.json")}, "llama-3.1-8b", "h100-sxm")


def test_match_gpu_names():
    assert match_gpu("NVIDIA H200").name == "h200"
    assert match_gpu("NVIDIA H100 80GB HBM3").name == "h100-sxm"
    assert match_gpu("NVIDIA H100 PCIe").name == "h100-pcie"
    assert match_gpu("Some CPU") is None


def test_alternative_decode_kernel_failing_mid_sweep_is_skipped_h200_flex_no_valid_choices(
    tmp_path, monkeypatch
):
    """Regression (H200, torch 2.11, 2026-12-04): FlexAttention passed its small-shape check,
    then inductor raised NoValidChoicesError at a 32,768-token pool and the whole calibration
    died with a traceback. An alternative kernel's failure is now recorded and skipped; the
    primary kernel's is still raised."""
    from calibrate import sweep

    real = K.decode_kernels("cpu")

    def flaky(batch):
        if len(set(batch.context_lens)) == 1 and sum(batch.context_lens) >= 512:  # not the check
            raise RuntimeError("NoValidChoicesError: No choices to select\nsecond line")
        return real["torch-gather-sdpa"](batch)

    monkeypatch.setattr(sweep.K, "decode_kernels", lambda device: {**real, "flaky": flaky})
    out = tmp_path / "tiny.json"
    profile = run_calibration(TINY, out, 120.0, "cpu", "float32", max_num_seqs=8,
                              max_num_batched_tokens=256,
                              decode_kernels=["torch-gather-sdpa", "flaky"])  # fmt: skip
    assert "flaky" not in profile.alternative_decode
    reason = profile.skipped["flaky"]
    assert reason.startswith("failed at ") and "NoValidChoicesError" in reason
    assert "\n" not in reason
    assert profile.decode_attention.points  # the primary kernel's cases were all timed

    monkeypatch.setattr(
        sweep.K, "decode_kernels", lambda device: {**real, "torch-gather-sdpa": flaky}
    )
    with pytest.raises(RuntimeError, match="NoValidChoicesError"):
        run_calibration(TINY, tmp_path / "t2.json", 120.0, "cpu", "float32", max_num_seqs=8,
                        max_num_batched_tokens=256)  # fmt: skip
