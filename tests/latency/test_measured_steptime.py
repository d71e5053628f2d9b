"""The measured-efficiency step-time model: held-out measurements, invariants, band, catalog."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import ModelSpec, _gpus, _models, get_gpu, get_model
from sim.latency import BatchShape, MeasuredStepTime, make_step_time
from sim.latency import measured_terms as terms
from sim.latency.band import band_of
from sim.latency.batch import DecodeBulk
from sim.latency.measured import TERM_NAMES, shipped_coefficients
from sim.latency.measured_fit import fit_gemm, relative_lstsq

DATA = Path(__file__).resolve().parents[1] / "data" / "vidur"
A100 = get_gpu("a100-80gb-sxm")
#: Meta-Llama-3-70B as Vidur profiled it; vocab 1 because the extract leaves out the logits GEMM.
LLAMA3_70B = ModelSpec(
    name="Meta-Llama-3-70B",
    num_layers=80,
    hidden_size=8192,
    num_attention_heads=64,
    num_kv_heads=8,
    head_dim=128,
    intermediate_size=28672,
    vocab_size=1,
    max_position_embeddings=8192,
)


def _step(row) -> BatchShape:
    chunks = ((int(row.prefill_prior), int(row.prefill_chunk)),) if row.prefill_chunk else ()
    return BatchShape((int(row.decode_context),) * int(row.num_decodes), chunks)


def test_held_out_measured_steps_fall_in_the_band():
    """Whole steps held out of the fit: ~80% inside the reported band (its p10-p90)."""
    model = MeasuredStepTime(LLAMA3_70B, A100, tp=2, engine="v0")
    band = model.band()
    steps = pd.read_csv(DATA / "steps.csv")
    ratios = []
    for row in steps.itertuples():
        batch = _step(row)
        predicted = model.predict_s(batch) - model.breakdown(batch)["lm_head_s"]
        ratios.append(row.measured_s / predicted)
    ratios = np.array(ratios)
    inside = (ratios >= band.low_factor) & (ratios <= band.high_factor)
    assert len(ratios) >= 30
    assert inside.mean() >= 0.7, sorted(ratios)
    assert np.median(np.abs(ratios - 1)) <= 0.05


def test_held_out_gemm_rows_within_reported_p90():
    """GEMM rows held out of the fit: the shipped validation p90 covers >= 80% of them."""
    co = shipped_coefficients()
    rows = pd.read_csv(DATA / "gemm.csv")
    errors = []
    for row in rows.itertuples():
        c, gpu = co["gpus"][row.gpu], get_gpu(row.gpu)
        flops = 2.0 * row.tokens * row.k_times_n
        pred = terms.gemm_time_s(
            flops, row.bytes, gpu.bf16_tflops * 1e12, gpu.bandwidth_Bps, c["gemm"]
        )
        p90 = co["validation"][row.gpu]["GEMM"]["p90_abs"]
        errors.append(abs(pred / row.time_s - 1) <= p90)
    assert np.mean(errors) >= 0.8


def test_fit_recovers_known_gemm_coefficients():
    """Rows made from known coefficients are fitted back (the fit is not just a lookup)."""
    truth = {
        "compute_efficiency": 0.7,
        "memory_efficiency": 0.8,
        "blend_exponent": 2.5,
        "launch_floor_s": 6e-6,
    }
    tokens = np.repeat(np.arange(1, 8193, 64.0), 2)
    k = np.tile([4096.0, 8192.0], len(tokens) // 2)
    flops, nbytes = terms.gemm_flops_bytes(tokens, k, 14336.0)
    time_s = terms.gemm_time_s(flops, nbytes, 312e12, 2039e9, truth)
    rows = pd.DataFrame({"flops": flops, "bytes": nbytes, "time_s": time_s})
    fitted = fit_gemm(rows, "a100-80gb-sxm")
    for name, value in truth.items():
        assert fitted[name] == pytest.approx(value, rel=0.05), name


def test_relative_lstsq_drops_negative_costs():
    x = np.column_stack([np.ones(4), [1.0, 2.0, 3.0, 4.0]])
    y = 2.0 * x[:, 1]  # no fixed cost: the intercept must not go negative
    beta = relative_lstsq(x, y)
    assert beta[0] >= 0 and beta[1] == pytest.approx(2.0, rel=1e-6)


# -- invariants -------------------------------------------------------------------------------
CATALOG = sorted(_models())
GPUS = sorted(_gpus())
contexts = st.lists(st.integers(1, 32_768), max_size=12)
chunks = st.lists(st.tuples(st.integers(0, 16_384), st.integers(1, 4096)), max_size=3)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(CATALOG),
    st.sampled_from(GPUS),
    st.sampled_from([1, 2, 4, 8]),
    contexts,
    chunks,
    st.integers(1, 2048),
)
def test_more_tokens_or_context_is_never_faster(model, gpu, tp, ctx, pre, extra):
    m = make_step_time(None, model, gpu, tp=tp)
    base = m.predict_s(BatchShape(tuple(ctx), tuple(pre)))
    # one more decode
    assert m.predict_s(BatchShape((*ctx, extra), tuple(pre))) >= base
    if ctx:  # a longer decode context
        longer = (ctx[0] + extra, *ctx[1:])
        assert m.predict_s(BatchShape(longer, tuple(pre))) >= base
    if pre:  # a bigger chunk, and more prior context
        (prior, chunk), rest = pre[0], pre[1:]
        assert m.predict_s(BatchShape(tuple(ctx), ((prior, chunk + extra), *rest))) >= base
        assert m.predict_s(BatchShape(tuple(ctx), ((prior + extra, chunk), *rest))) >= base


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(CATALOG), contexts.filter(bool), st.integers(0, 40))
def test_bulk_decodes_cost_what_listed_decodes_cost(model, ctx, num_listed):
    m = make_step_time(None, model, "h100-sxm")
    window = m.decode_window
    listed, bulk = ctx[:num_listed], ctx[num_listed:]
    windowed = sum(min(c, window) if window else c for c in bulk)
    as_bulk = BatchShape(tuple(listed), (), bulk=DecodeBulk(len(bulk), sum(bulk), window, windowed))
    assert m.predict_s(as_bulk) == pytest.approx(m.predict_s(BatchShape(tuple(ctx), ())))


def test_every_catalog_model_and_gpu_predicts_a_finite_positive_time():
    batch = BatchShape((100, 4000), ((1024, 512),))
    for gpu in GPUS:
        for model in CATALOG:
            for tp in (1, 2, 8):
                m = make_step_time(None, model, gpu, tp=tp)
                t = m.predict_s(batch)
                assert math.isfinite(t) and t > 0, (gpu, model, tp)
                parts = m.breakdown(batch)
                assert set(parts) == set(TERM_NAMES)
                assert sum(parts.values()) == pytest.approx(t)


def test_extrapolated_flag_for_gpus_and_moe_outside_the_fit():
    fitted = set(shipped_coefficients()["gpus"])
    assert fitted == {"a100-80gb-sxm", "h100-sxm"}
    for gpu in GPUS:
        band = band_of(make_step_time(None, "llama-3.1-8b", gpu))
        assert band.extrapolated is (gpu not in fitted), gpu
    assert band_of(make_step_time(None, "mixtral-8x7b-v0.1", "h100-sxm")).extrapolated


def test_band_is_sane_and_extrapolation_is_no_narrower():
    for gpu in GPUS:
        band = band_of(make_step_time(None, "llama-3.1-8b", gpu))
        assert 0.5 < band.low_factor <= 1.0 <= band.high_factor < 2.0
    a100 = band_of(make_step_time(None, "llama-3.1-8b", "a100-80gb-sxm"))
    l40s = band_of(make_step_time(None, "llama-3.1-8b", "l40s"))
    assert l40s.low_factor <= a100.low_factor and l40s.high_factor >= a100.high_factor


def test_measured_is_the_default_and_engine_generation_picks_the_overhead():
    batch = BatchShape((2048,) * 64, ())
    default = make_step_time(None, "llama-3.1-8b", "h100-sxm")
    assert isinstance(default, MeasuredStepTime) and default.engine == "v1"
    v0 = make_step_time(None, "llama-3.1-8b", "h100-sxm", engine="v0")
    # each generation its own fitted overhead, V1's plus its model runner's term; since that
    # term's refit to 2.25 ms, V1's is the larger at 64 sequences (4.20 ms against 3.93 ms)
    engines = shipped_coefficients()["engine"]
    for model, engine, extra_s in ((v0, "v0", 0.0), (default, "v1", terms.V1_WORKER_STEP_S)):
        expected_s = terms.engine_overhead_s(64, engines[engine]) + extra_s
        assert model.breakdown(batch)["engine_overhead_s"] == pytest.approx(expected_s, rel=1e-9)
    assert default.breakdown(batch)["engine_overhead_s"] == pytest.approx(4.20e-3, abs=0.005e-3)
    assert v0.breakdown(batch)["engine_overhead_s"] == pytest.approx(3.93e-3, abs=0.005e-3)
    chosen = make_step_time({"measured": {"engine": "v0"}}, "llama-3.1-8b", "h100-sxm")
    assert chosen.engine == "v0"  # the config wins over the scheduler's generation


def test_newer_gpu_is_faster_and_tp_splits_the_work():
    batch = BatchShape((4096,) * 64, ((0, 512),))
    a100 = make_step_time(None, "llama-3.1-70b", "a100-80gb-sxm", tp=4).predict_s(batch)
    h100 = make_step_time(None, "llama-3.1-70b", "h100-sxm", tp=4).predict_s(batch)
    h200 = make_step_time(None, "llama-3.1-70b", "h200", tp=4).predict_s(batch)
    assert h200 < h100 < a100
    tp2 = make_step_time(None, "llama-3.1-70b", "h100-sxm", tp=2).predict_s(batch)
    assert h100 < tp2


def test_prefill_attention_matches_its_term_formula():
    """The folded constants in the model equal the documented formula for one chunk."""
    model = get_model("llama-3.1-8b")
    m = MeasuredStepTime(model, get_gpu("h100-sxm"))
    c = shipped_coefficients()["gpus"]["h100-sxm"]["prefill_attention"]
    flops, q_bytes = terms.prefill_attention_work(32, 128, 700, 1300 + 700)
    per_layer = terms.prefill_attention_time_s(flops, q_bytes, 989e12, 3350e9, c)
    got = m.breakdown(BatchShape((), ((1300, 700),)))["prefill_attention_s"]
    assert got == pytest.approx(model.num_layers * per_layer)


@pytest.mark.parametrize("design, engine", [("v0-v2", "v0"), ("v1-engine", "v1")])
def test_a_scenario_without_step_time_runs_the_measured_model(design, engine):
    """The runner's default is `measured`, with the overhead of the scheduler's generation."""
    from sim.engine.run import run
    from sim.scenario.schema import scenario_from_dict

    scenario = scenario_from_dict(
        {
            "model": "llama-3.1-8b",
            "hardware": {"gpu": "h100-sxm"},
            "cache": {"block_size": 16, "num_gpu_blocks": 64},
            "scheduler": {"design": design, "max_model_len": 256},
            "workload": {
                "kind": "inline",
                "requests": [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 3}],
            },
        }
    )
    result = run(scenario)
    assert result.inputs["step_time"] == {"measured": {}}
    first = result.steps.sort_values("start_s").iloc[0]
    model = MeasuredStepTime(get_model("llama-3.1-8b"), get_gpu("h100-sxm"), engine=engine)
    expected = model.predict_s(BatchShape((), ((0, 100),)))
    assert first["duration_s"] == pytest.approx(expected)


def test_worked_examples_in_the_docstrings():
    """The arithmetic quoted in measured_terms and measured stays true."""
    c = {
        "compute_efficiency": 0.75,
        "memory_efficiency": 0.85,
        "blend_exponent": 3.0,
        "launch_floor_s": 6e-6,
    }
    flops, nbytes = terms.gemm_flops_bytes(256, 4096, 22016)
    assert terms.gemm_time_s(flops, nbytes, 312e12, 2039e9, c) == pytest.approx(214.6e-6, rel=1e-3)
    m = make_step_time(None, "llama-3.1-8b", "h100-sxm")
    parts = m.breakdown(BatchShape((4096,) * 64, ()))
    assert sum(parts.values()) == pytest.approx(24.7e-3, rel=0.01)
    assert parts["engine_overhead_s"] == pytest.approx(4.20e-3, rel=0.01)
    # sim/latency/overlap.py: async, the step is max(GPU 20.54 ms, CPU 4.20 ms)
    assert sum(parts.values()) - parts["engine_overhead_s"] == pytest.approx(20.54e-3, abs=5e-6)
    assert parts["decode_attention_s"] == pytest.approx(13.83e-3, rel=0.01)
    assert parts["gemm_s"] == pytest.approx(5.70e-3, rel=0.01)


def test_measured_coefficients_path_is_relative_to_the_scenario(tmp_path):
    """A refit (same layout as the shipped JSON) is picked up from beside the scenario."""
    import json

    from sim.engine.run import run

    refit = shipped_coefficients() | {
        "engine": {
            g: {"fixed_s": 0.5, "per_seq_s": 0.0, "graph_launch_s": 0.0} for g in ("v0", "v1")
        }
    }
    (tmp_path / "refit.json").write_text(json.dumps(refit))
    (tmp_path / "s.yaml").write_text(
        "model: llama-3.1-8b\n"
        "cache: {block_size: 16, num_gpu_blocks: 64}\n"
        # synchronous: the engine term is charged whole (async hides it behind the GPU)
        "scheduler: {design: v1-engine, max_model_len: 256, async_scheduling: false}\n"
        "workload: {kind: inline, requests: [{arrival_s: 0, prompt_tokens: 10, output_tokens: 2}]}\n"
        "step_time: {measured: {coefficients: refit.json}}\n"
    )
    result = run(tmp_path / "s.yaml")
    assert (result.steps.duration_s > 0.5).all()


# ------------------------------------------------------- predict_s from precomputed shape terms
@st.composite
def _shapes(draw, window: int | None) -> BatchShape:
    """A step of listed decodes, prefill chunks and maybe a cohort bulk summed for `window`."""
    contexts = tuple(draw(st.lists(st.integers(0, 20_000), max_size=12)))
    chunks = tuple(
        draw(st.lists(st.tuples(st.integers(0, 20_000), st.integers(1, 9_000)), max_size=4))
    )
    bulk = None
    if draw(st.booleans()):
        members = draw(st.lists(st.integers(1, 20_000), min_size=1, max_size=300))
        cap = window if window is not None else 10**12
        bulk = DecodeBulk(len(members), sum(members), window, sum(min(c, cap) for c in members))
    return BatchShape(contexts, chunks, bulk)


@settings(max_examples=300, deadline=None)
@given(
    model_name=st.sampled_from(CATALOG),
    gpu_name=st.sampled_from(GPUS),
    tp=st.sampled_from([1, 2, 4, 8]),
    engine=st.sampled_from(["v0", "v1"]),
    data=st.data(),
)
def test_predict_s_is_the_terms_added_left_to_right(model_name, gpu_name, tp, engine, data):
    """The precomputed per-shape terms give exactly (==) the terms of `breakdown` added left to
    right, for every catalog model (sliding-window, hybrid, MoE) and GPU, on the same model
    object before and after its caches fill, and on a fresh one."""
    model = get_model(model_name)
    predictor = MeasuredStepTime(model, get_gpu(gpu_name), tp=tp, engine=engine)
    shapes = data.draw(st.lists(_shapes(model.sliding_window), min_size=1, max_size=8))
    shapes.append(shapes[0])  # the cached path after the first computation
    for batch in shapes:
        expected = 0.0
        for term in predictor._terms(batch):  # noqa: SLF001 - the reference order
            expected += term
        assert predictor.predict_s(batch) == expected
        fresh = MeasuredStepTime(model, get_gpu(gpu_name), tp=tp, engine=engine)
        assert fresh.predict_s(batch) == expected
        if sys.version_info < (3, 12):  # 3.12's sum compensates; 3.11's adds left to right
            assert sum(predictor._terms(batch)) == expected  # noqa: SLF001
