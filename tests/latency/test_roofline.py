"""Roofline, linear and factory step-time models; sim never imports torch."""

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.latency import (
    BatchShape,
    Efficiencies,
    LinearStepTime,
    RooflineStepTime,
    StepTimeModel,
    make_step_time,
)
from sim.latency.batch import DecodeBulk

LLAMA = get_model("llama-3.1-8b")
DECODE_64x4K = BatchShape(decode_context_tokens=(4096,) * 64, prefill_chunks=())


def test_batch_shape_properties():
    b = BatchShape((100, 4000), ((1024, 512),))
    assert (b.num_decode_seqs, b.num_prefill_tokens, b.num_tokens) == (2, 512, 514)
    assert b.total_context_tokens == 5124


def test_worked_example_llama_64_decodes_4k_h100():
    r = RooflineStepTime(LLAMA, get_gpu("h100-sxm"))
    parts = r.breakdown(DECODE_64x4K)
    assert parts.linear_bytes == pytest.approx(15.01e9, rel=1e-3)
    assert parts.attention_bytes == pytest.approx(34.37e9, rel=1e-3)
    assert parts.linear_s == pytest.approx(5.27e-3, rel=1e-2)
    assert parts.attention_s == pytest.approx(12.07e-3, rel=1e-2)
    assert 15e-3 <= r.predict_s(DECODE_64x4K) <= 18e-3
    ideal = Efficiencies(compute=1, memory=1, attention_compute=1, overhead_s=0)
    assert RooflineStepTime(LLAMA, get_gpu("h100-sxm"), efficiencies=ideal).predict_s(
        DECODE_64x4K
    ) == pytest.approx(14.74e-3, rel=1e-3)
    assert RooflineStepTime(LLAMA, get_gpu("h200"), efficiencies=ideal).predict_s(
        DECODE_64x4K
    ) == pytest.approx(10.29e-3, rel=1e-3)


def test_prefill_2048_is_compute_bound():
    r = RooflineStepTime(LLAMA, get_gpu("h100-sxm"))
    parts = r.breakdown(BatchShape((), ((0, 2048),)))
    assert parts.linear_flops + parts.attention_flops == pytest.approx(29.7e12, rel=1e-2)
    assert parts.linear_s == pytest.approx(parts.linear_flops / (0.7 * 989e12))


def test_sliding_window_caps_kv_read():
    mistral = RooflineStepTime(get_model("mistral-7b-v0.1"), get_gpu("h100-sxm"))
    at_window = mistral.breakdown(BatchShape((4096,) * 8, ())).attention_bytes
    beyond = mistral.breakdown(BatchShape((16384,) * 8, ())).attention_bytes
    assert beyond == at_window


def test_tensor_parallel_adds_allreduce_and_splits_work():
    one = RooflineStepTime(LLAMA, get_gpu("h100-sxm")).breakdown(DECODE_64x4K)
    two = RooflineStepTime(LLAMA, get_gpu("h100-sxm"), tp=2).breakdown(DECODE_64x4K)
    assert two.allreduce_s > 0 and one.allreduce_s == 0
    assert two.linear_bytes == pytest.approx(one.linear_bytes / 2)


@settings(max_examples=60, deadline=None)
@given(
    ctx=st.lists(st.integers(1, 20000), max_size=20),
    chunks=st.lists(st.tuples(st.integers(0, 8000), st.integers(1, 2048)), max_size=3),
    grow=st.integers(1, 4096),
    model=st.sampled_from(["llama-3.1-8b", "gemma-2-9b", "mixtral-8x7b-v0.1"]),
)
def test_roofline_is_monotone(ctx, chunks, grow, model):
    r = RooflineStepTime(get_model(model), get_gpu("a100-80gb-sxm"), tp=2)
    base = BatchShape(tuple(ctx), tuple(chunks))
    t = r.predict_s(base)
    assert t > 0
    assert r.predict_s(BatchShape((*ctx, grow), tuple(chunks))) >= t  # one more decode
    if ctx:
        longer = (ctx[0] + grow, *ctx[1:])
        assert r.predict_s(BatchShape(longer, tuple(chunks))) >= t  # a longer context
    assert r.predict_s(BatchShape(tuple(ctx), (*chunks, (0, grow)))) >= t  # one more chunk
    # The per-step shortcut adds exactly the breakdown's terms.
    assert t == r.breakdown(base).total_s


@settings(max_examples=60, deadline=None)
@given(
    ctx=st.lists(st.integers(1, 9000), min_size=1, max_size=20),
    split=st.integers(0, 20),
    chunks=st.lists(st.tuples(st.integers(0, 8000), st.integers(1, 2048)), max_size=2),
)
def test_bulk_decodes_predict_like_listed_ones(ctx, split, chunks):
    """A cohort's decodes given as sums (`DecodeBulk`) time exactly like the same decodes listed."""
    r = RooflineStepTime(get_model("mistral-7b-v0.1"), get_gpu("a100-80gb-sxm"))
    window = r.decode_window
    listed, bulked = ctx[:split], ctx[split:]
    bulk = DecodeBulk(len(bulked), sum(bulked), window, sum(min(c, window) for c in bulked))
    assert r.predict_s(BatchShape(tuple(listed), tuple(chunks), bulk)) == r.predict_s(
        BatchShape(tuple(ctx), tuple(chunks))
    )


def test_linear_model_example_and_validation():
    m = LinearStepTime(5e-3, 2e-5, 1e-4, 4e-8)
    assert m.predict_s(DECODE_64x4K) == pytest.approx(5e-3 + 6.4e-3 + 64 * 4096 * 4e-8)
    with pytest.raises(ValueError, match="fixed_s"):
        LinearStepTime(-1.0)


def test_factory_builds_each_model():
    assert isinstance(make_step_time("roofline", "llama-3.1-8b", "h100-sxm"), RooflineStepTime)
    r = make_step_time({"roofline": {"memory": 0.5}}, LLAMA, "h100-sxm")
    assert r.efficiencies.memory == 0.5
    lin = make_step_time({"linear": {"fixed_s": 0.01}}, LLAMA, "h100-sxm")
    assert isinstance(lin, StepTimeModel) and lin.predict_s(DECODE_64x4K) == 0.01
    with pytest.raises(ValueError, match="exactly one"):
        make_step_time({"roofline": {}, "linear": {"fixed_s": 0.01}}, LLAMA, "h100-sxm")
    with pytest.raises(ValueError, match="invalid step_time"):
        make_step_time({"roofline": {"memroy": 0.5}}, LLAMA, "h100-sxm")


def test_import_sim_does_not_import_torch():
    code = (
        "import sys, sim, sim.latency, sim.memory, sim.catalog, sim.latency.fit; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
