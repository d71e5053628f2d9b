"""calibrate -> measured model: the converter and fit recover known coefficients, and a tiny CPU
calibration writes a coefficients file that `step_time: {measured: {coefficients: ...}}` runs."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from calibrate import to_measured as tm
from sim.catalog import get_gpu, get_model
from sim.latency import BatchShape, make_step_time
from sim.latency import measured_terms as terms
from sim.latency.measured import MeasuredStepTime, shipped_coefficients

H200 = get_gpu("h200")
TARGET = tm.Target("h200", H200.peak_flops("bfloat16"), H200.bandwidth_Bps,
                   H200.interconnect_GBps, catalog_gpu=True)  # fmt: skip
KNOWN = {
    "gemm": {
        "compute_efficiency": 0.72,
        "memory_efficiency": 0.88,
        "blend_exponent": 2.5,
        "launch_floor_s": 4e-6,
    },  # fmt: skip
    "decode_attention": {"call_floor_s": 1.2e-5, "per_seq_s": 3e-7, "bandwidth_efficiency": 0.8},
    "prefill_attention": {
        "call_floor_s": 9e-6,
        "query_bandwidth_efficiency": 0.2,
        "compute_efficiency": 0.45,
    },  # fmt: skip
}


def synthetic_samples(known: dict, model_name: str = "llama-3.1-8b", tp: int = 1) -> tm.Samples:
    """What a calibration on TARGET would measure if its kernels followed `known` exactly."""
    model = get_model(model_name)
    peak, bw = TARGET.peak_flops, TARGET.bandwidth_Bps
    gemm = {}
    for name, (k, n) in tm.gemm_shapes(model, tp).items():
        pts = []
        for tokens in (1, 4, 16, 64, 256, 1024, 4096, 8192):
            flops, nbytes = terms.gemm_flops_bytes(float(tokens), k, n)
            pts.append((tokens, float(terms.gemm_time_s(flops, nbytes, peak, bw, known["gemm"]))))
        gemm[name] = pts
    kv_tok = 2 * max(1, model.num_kv_heads // tp) * model.head_dim * 2
    decode = [
        (
            b,
            c,
            float(terms.decode_attention_time_s(b, b * c * kv_tok, bw, known["decode_attention"])),
        )  # fmt: skip
        for b in (1, 8, 64, 256)
        for c in (64, 1024, 8192)
    ]
    hq = max(1, model.num_attention_heads // tp)
    prefill = []
    for prior in (0, 1024, 4096):
        for chunk in (16, 128, 512, 2048):
            flops, q_bytes = terms.prefill_attention_work(hq, model.head_dim, chunk, prior + chunk)
            t = terms.prefill_attention_time_s(flops, q_bytes, peak, bw, known["prefill_attention"])
            prefill.append((prior, chunk, float(t)))
    return tm.Samples(model, tp, gemm, decode, prefill)


def test_converter_and_fit_recover_known_coefficients():
    tables = tm.to_tables(synthetic_samples(KNOWN), "h200")
    assert len(tables.gemm) == 5 * 8 and set(tables.gemm.op) >= {"attn_pre_proj", "lm_head"}
    fitted = tm.fit_terms(tables, TARGET)
    for term in ("decode_attention", "prefill_attention"):  # linear in the coefficients: exact
        for key, value in KNOWN[term].items():
            assert fitted[term][key] == pytest.approx(value, rel=2e-3), (term, key)
    for key, value in KNOWN["gemm"].items():  # a simplex search: close, not exact
        assert fitted["gemm"][key] == pytest.approx(value, rel=0.05), key
    errors = tm.in_sample_errors(tables, fitted, TARGET)
    assert max(float(np.max(np.abs(e))) for e in errors.values()) < 0.01


def test_fit_against_probed_ceilings_is_rescaled_to_the_datasheet():
    """A CPU keyed to a catalog GPU fits against its probe, then converts: same coefficients."""
    tables = tm.to_tables(synthetic_samples(KNOWN), "h200")
    # Probed ceilings 2x / 3x the datasheet: every efficiency against them stays below 1.
    probe = dataclasses.replace(TARGET, probed=(2 * TARGET.peak_flops, 3 * TARGET.bandwidth_Bps))
    fitted = tm.fit_terms(tables, probe)
    for term in ("decode_attention", "prefill_attention"):
        for key, value in KNOWN[term].items():
            assert fitted[term][key] == pytest.approx(value, rel=2e-3), (term, key)
    for key, value in KNOWN["gemm"].items():
        assert fitted["gemm"][key] == pytest.approx(value, rel=0.05), key
    errors = tm.in_sample_errors(tables, fitted, TARGET)
    assert max(float(np.max(np.abs(e))) for e in errors.values()) < 0.01


def test_fit_decode_and_prefill_without_a_bandwidth_or_compute_term():
    """Times that do not grow with the bytes or FLOPs (CPU noise) drop that column: efficiency
    1.0, where both wrote an infinite efficiency (and a CPU fit's 0.0 divided by zero later)."""
    rows = pd.DataFrame({"batch": [1, 1, 8, 8], "kv_bytes": [1e6, 1e8, 8e6, 8e8],
                         "time_s": [2e-3, 1.9e-3, 3e-3, 2.8e-3]})  # fmt: skip
    got = tm.mf.fit_decode(rows, "h200", datasheet=(1e15, 4.8e12))
    assert got["bandwidth_efficiency"] == 1.0 and got["call_floor_s"] > 0
    rows = pd.DataFrame({"q_bytes": [1e6, 1e8, 1e6, 1e8], "flops": [1e9, 1e9, 1e12, 1e12],
                         "time_s": [2e-3, 3e-3, 1.9e-3, 2.9e-3]})  # fmt: skip
    got = tm.mf.fit_prefill(rows, "h200", datasheet=(1e15, 4.8e12))
    assert got["compute_efficiency"] == 1.0 and np.isfinite(list(got.values())).all()


@settings(max_examples=15, deadline=None)
@given(
    floor_us=st.floats(1.0, 50.0),
    per_seq_ns=st.floats(0.0, 1000.0),
    efficiency=st.floats(0.05, 1.0),
    tp=st.sampled_from([1, 2, 8]),
)
def test_decode_fit_recovers_any_known_coefficients(floor_us, per_seq_ns, efficiency, tp):
    known = {**KNOWN, "decode_attention": {"call_floor_s": floor_us * 1e-6,
                                           "per_seq_s": per_seq_ns * 1e-9,
                                           "bandwidth_efficiency": efficiency}}  # fmt: skip
    tables = tm.to_tables(synthetic_samples(known, "llama-3.1-70b", tp), "h200")
    got = tm.mf.fit_decode(tables.decode, "h200", datasheet=(TARGET.peak_flops, H200.bandwidth_Bps))
    # Tolerances: the fitter rounds (floor to 1e-9 s, per sequence to 1e-10 s, efficiency to 4
    # decimals), else exact.
    assert got["call_floor_s"] == pytest.approx(floor_us * 1e-6, rel=1e-6, abs=6e-10)
    assert got["per_seq_s"] == pytest.approx(per_seq_ns * 1e-9, rel=1e-6, abs=6e-11)
    assert got["bandwidth_efficiency"] == pytest.approx(efficiency, rel=1e-6, abs=6e-5)


# Per-layer kernel times the fake timer reports (a known truth in the measured model's form):
# decode = floor + per sequence + per KV token read; prefill and GEMMs grow with their work.
FAKE_DECODE = (2e-6, 3e-7, 5e-10)  # s, s per sequence, s per context token


def _fake_kernel_times(monkeypatch):
    """Replace the wall clock of the sweep by times computed from each case's shape.

    The kernels still run (once per case: the plumbing is exercised) but the times they report
    are known, so the fit has an exact answer. Regression (CI, 2026-12-01): real CPU timings on
    a loaded 2-core runner put three of four decode cases 20-1000x off, and the test of the fit
    failed on the machine's noise, not on the code.
    """
    from calibrate import kernels as K
    from calibrate import sweep
    from calibrate.timing import Timing

    shape: dict[str, float] = {}

    def batch(context_lens, **kw):
        floor, per_seq, per_token = FAKE_DECODE
        shape["t"] = floor + per_seq * len(context_lens) + per_token * sum(context_lens)
        return real_batch(context_lens, **kw)

    def prefill(prior, chunk, **kw):
        shape["t"] = 1.5e-6 + 1e-9 * chunk * (prior + (chunk + 1) / 2)
        return real_prefill(prior, chunk, **kw)

    def gemm(tokens, k_in, n_out, **kw):
        shape["t"] = 2e-6 + 1e-12 * 2 * tokens * k_in * n_out
        return real_gemm(tokens, k_in, n_out, **kw)

    def timer(run, *, device, warmup=3, repeats=20):
        run()
        return Timing([shape["t"]] * repeats, shape["t"], None)

    real_batch, real_prefill, real_gemm = K.make_paged_batch, K.prepare_prefill, K.prepare_gemm
    monkeypatch.setattr(K, "make_paged_batch", batch)
    monkeypatch.setattr(K, "prepare_prefill", prefill)
    monkeypatch.setattr(K, "prepare_gemm", gemm)
    monkeypatch.setattr(sweep, "time_runner", timer)


def _tiny_calibration(tmp_path, gpu):
    pytest.importorskip("torch", reason="calibrate needs torch: pip install -e '.[calibrate]'")
    from calibrate.budget import Deadline
    from calibrate.cli import run_calibration
    from tests.latency.test_calibrate import TINY

    out = tmp_path / "tiny.json"
    # An expired deadline: only the essential cases run (no wall clock in the test).
    profile = run_calibration(TINY, out, 60.0, "cpu", "float32", gpu=gpu, max_num_seqs=8,
                              max_num_batched_tokens=256,
                              deadline=Deadline(0.0, lambda: 0.0))  # fmt: skip
    return TINY, profile, out


def test_cpu_calibration_writes_coefficients_the_measured_model_runs(tmp_path, monkeypatch):
    pytest.importorskip("torch", reason="calibrate needs torch: pip install -e '.[calibrate]'")
    _fake_kernel_times(monkeypatch)
    tiny, profile, out = _tiny_calibration(tmp_path, "h100-sxm")
    path = tm.coefficients_path(out)
    assert path.name == "tiny.coefficients.json"
    doc = json.loads(path.read_text())
    prov, shipped = doc["provenance"], shipped_coefficients()
    assert prov["plumbing_only"] is True and "not a GPU fit" in prov["warning"]
    assert prov["device_name"] == profile.metadata.device_name
    assert prov["torch"] == profile.metadata.torch and prov["measured_on"] == profile.metadata.date
    assert set(prov["measured"]) == set(tm.MEASURED_TERMS)
    assert {"elementwise", "allreduce", "engine", "band"} <= set(prov["carried_over"])
    entry = doc["gpus"]["h100-sxm"]
    ship = shipped["gpus"]["h100-sxm"]
    assert entry["elementwise"] == ship["elementwise"] and doc["engine"] == shipped["engine"]
    assert entry["gemm"] != ship["gemm"] and entry["decode_attention"] != ship["decode_attention"]
    assert doc["gpus"]["a100-80gb-sxm"] == shipped["gpus"]["a100-80gb-sxm"]
    assert "h100-sxm" not in doc["validation"]  # scored the shipped entry, which is replaced

    step = make_step_time({"measured": {"coefficients": str(path)}}, tiny, "h100-sxm")
    assert isinstance(step, MeasuredStepTime)
    assert step.fitted_gpu == "h100-sxm" and not step.extrapolated
    # The model built from the file predicts the timed cases it was fitted on (per layer), to
    # the fitters' 4-significant-digit rounding: a units or per-layer/per-step slip would be off
    # by orders of magnitude. The times are the fake timer's (`_fake_kernel_times`).
    layers = get_model(tiny).num_layers
    assert len(profile.decode_attention.points) >= 3
    floor, per_seq, per_token = FAKE_DECODE
    for p in profile.decode_attention.points:
        b, c = (
            int(p.params["num_seqs"]),
            int(p.params["context_tokens"]) // int(p.params["num_seqs"]),
        )
        assert p.median_s == pytest.approx(floor + per_seq * b + per_token * b * c)
        per_layer = step.breakdown(BatchShape((c,) * b, ()))["decode_attention_s"] / layers
        assert per_layer == pytest.approx(p.median_s, rel=1e-3), (b, c)
    # ... and `kvsim run` takes it through a scenario.
    from sim.engine.run import run
    from sim.scenario.schema import scenario_from_dict

    scenario = scenario_from_dict(
        {
            "model": tiny,
            "hardware": {"gpu": "h100-sxm"},
            "cache": {"num_gpu_blocks": 64, "num_cpu_blocks": 0},
            "scheduler": {
                "design": "v1-engine",
                "max_model_len": 512,
                "enable_chunked_prefill": True,
            },  # fmt: skip
            "workload": {
                "kind": "inline",
                "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 5}],
            },  # fmt: skip
            "step_time": {"measured": {"coefficients": path.name}},
        }
    )
    result = run(scenario, base_dir=tmp_path)
    assert result.summary["states"]["finished"] == 1
    assert result.steps["duration_s"].iloc[0] == pytest.approx(
        step.predict_s(BatchShape((), ((0, 100),)))
    )
    lines = tm.usage_lines(path)
    assert f"step_time: {{measured: {{coefficients: {path}}}}}" in lines[1]
    assert "of h100-sxm datasheet HBM bandwidth" in lines[2] and "not a GPU fit" in lines[-1]
    # The fake times are in the decode model's own form: its in-sample error is ~0.
    fit_line = next(line for line in lines if "in-sample fit error" in line)
    assert "decode attention 0% / 0%" in fit_line
    assert not any("warning: the decode attention fit" in line for line in lines)
    # A fit that misses its own cases (noisy timings) is flagged, naming the term.
    doc = json.loads(path.read_text())
    doc["validation"]["h100-sxm (calibrate, in-sample)"]["decode attention"]["median_abs"] = 0.9
    path.write_text(json.dumps(doc))
    flagged = [line for line in tm.usage_lines(path) if line.lstrip().startswith("warning:")]
    assert any("the decode attention fit misses its own" in line and "90%" in line
               for line in flagged), flagged  # fmt: skip


def test_cpu_calibration_without_a_gpu_is_keyed_by_the_device(tmp_path):
    _, profile, out = _tiny_calibration(tmp_path, None)
    doc = json.loads(tm.coefficients_path(out).read_text())
    name = doc["calibration"]["gpu"]
    assert name.startswith("measured-") and name not in shipped_coefficients()["gpus"]
    assert doc["gpus"][name]["datasheet"]["hbm_bandwidth_GBps"] == pytest.approx(
        profile.ceilings.copy_bandwidth_Bps / 1e9
    )
    assert "probed" in doc["provenance"]["ceilings"]
    # Redoing the fit from the saved profile (no torch needed) gives the same coefficients.
    assert tm.main([str(out)]) == 0
    again = json.loads(tm.coefficients_path(out).read_text())
    assert again == doc


def test_to_measured_needs_no_torch():
    """The converter and fit run on a machine without torch (`python -m calibrate.to_measured`)."""
    import subprocess
    import sys

    code = "import sys, calibrate.to_measured; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
