"""The forms of V1's per-step worker CPU cost (`sim.latency.worker_form`) in `MeasuredStepTime`.

Form B (LAYER_LAUNCH) charges L x c of per-layer launch CPU overlapped with the GPU: a
small model's batch-1 decode, whose GPU work is shorter than its launches, pays the
difference; a GPU-bound step hides them. Form C (LAYER_LAUNCH_MIXED) charges them only on a
step with a prefill chunk. c = 0 gives the shipped form A back, float for float.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.catalog import get_gpu, get_model
from sim.latency import BatchShape, MeasuredStepTime
from sim.latency import worker_form as wf
from sim.latency.measured import shipped_coefficients
from sim.latency.measured_terms import V1_WORKER_STEP_S
from sim.latency.worker_form import GpuFloors, WorkerCpuForm, WorkerForm

ROOT = Path(__file__).resolve().parents[2]
MEASUREMENTS = ROOT / "sim/data/vllm_serving_measurements.yaml"
#: A decode at the middle of a 128-in / 128-out request (tests/latency/test_v1_worker_overhead.py).
BATCH_1 = BatchShape((192,), ())
LAUNCH_S = 100e-6


def _geometry(point_id: str) -> dict:
    """The model geometry a tenstorrent/tt-inference-server#340 point records."""
    entries = yaml.safe_load(MEASUREMENTS.read_text(encoding="utf-8"))["measurements"]
    (entry,) = [e for e in entries if e["id"] == point_id]
    return dict(entry["model"])


QWEN3_06B = _geometry("tt340-qwen3-0.6b-a100-in128-out128")  # 28 layers
QWEN3_14B = _geometry("tt340-qwen3-14b-a100-in128-out128")  # 40 layers


def _model(
    geometry: dict, form: WorkerCpuForm = WorkerCpuForm.FIXED, launch_s: float = 0.0
) -> MeasuredStepTime:
    worker = WorkerForm(form, launch_s)
    return MeasuredStepTime(get_model(geometry), get_gpu("a100-80gb-sxm"), worker=worker)


def _gpu_s(model: MeasuredStepTime, batch: BatchShape) -> float:
    parts = model.breakdown(batch)
    return sum(v for k, v in parts.items() if k not in ("launch_s", "engine_overhead_s"))


def test_the_default_form_is_the_fixed_term_and_charges_no_layer_launch():
    assert WorkerForm(WorkerCpuForm.FIXED, 0.0, None) == wf.SHIPPED_WORKER_FORM
    fixed = _model(QWEN3_06B)
    assert fixed.breakdown(BATCH_1)["launch_s"] == fixed._launch_s


def test_a_small_models_batch_1_decode_pays_the_launches_its_gpu_work_does_not_hide():
    """Qwen3-0.6B (28 layers) on an A100: 1.99 ms of kernels against 28 x 100 us = 2.8 ms of
    launches: the step pays the 0.81 ms difference on top of form A (the docstring's example)."""
    fixed, layered = _model(QWEN3_06B), _model(QWEN3_06B, WorkerCpuForm.LAYER_LAUNCH, LAUNCH_S)
    gpu_s = _gpu_s(layered, BATCH_1)
    assert gpu_s == pytest.approx(1.99e-3, abs=0.01e-3)
    extra_s = layered.predict_s(BATCH_1) - fixed.predict_s(BATCH_1)
    assert extra_s == pytest.approx(28 * LAUNCH_S - gpu_s, rel=1e-9)
    assert extra_s == pytest.approx(0.81e-3, abs=0.01e-3)


def test_a_gpu_bound_step_hides_the_launches():
    """Qwen3-14B (40 layers, ~21 ms of GPU at batch 1) hides 4 ms of launches: B equals A."""
    fixed, layered = _model(QWEN3_14B), _model(QWEN3_14B, WorkerCpuForm.LAYER_LAUNCH, LAUNCH_S)
    assert _gpu_s(layered, BATCH_1) > 40 * LAUNCH_S
    assert layered.predict_s(BATCH_1) == fixed.predict_s(BATCH_1)


def test_form_c_launches_per_layer_only_on_steps_with_a_prefill_chunk():
    """Form C follows the pins' FULL_AND_PIECEWISE: a decode-only step is one FULL graph (as
    A); a step with a chunk runs PIECEWISE and pays what its GPU work does not hide."""
    fixed = _model(QWEN3_06B)
    mixed = _model(QWEN3_06B, WorkerCpuForm.LAYER_LAUNCH_MIXED, LAUNCH_S)
    assert mixed.predict_s(BATCH_1) == fixed.predict_s(BATCH_1)
    small_chunk = BatchShape((192,), ((0, 8),))  # 9 tokens: GPU work under 2.8 ms
    assert _gpu_s(mixed, small_chunk) < 28 * LAUNCH_S
    assert mixed.predict_s(small_chunk) > fixed.predict_s(small_chunk)


def test_v0_never_takes_a_worker_form():
    worker = WorkerForm(WorkerCpuForm.LAYER_LAUNCH, LAUNCH_S, worker_step_s=1e-3)
    v0 = MeasuredStepTime(get_model(QWEN3_06B), get_gpu("a100-80gb-sxm"), engine="v0",
                          worker=worker)  # fmt: skip
    plain = MeasuredStepTime(get_model(QWEN3_06B), get_gpu("a100-80gb-sxm"), engine="v0")
    assert v0.breakdown(BATCH_1)["launch_s"] == v0._launch_s
    assert v0.predict_s(BATCH_1) == plain.predict_s(BATCH_1)


def test_a_forms_prep_time_replaces_the_coefficients_and_the_shipped_one():
    """WorkerForm.worker_step_s is P: the step's fixed overhead moves by P - 2.25 ms, as a
    coefficients file's own `worker_step_s` moves it; None keeps the shipped 2.25 ms."""
    gpu = get_gpu("a100-80gb-sxm")
    co = copy.deepcopy(shipped_coefficients())
    co["engine"]["v1"]["worker_step_s"] = 1.5e-3
    from_file = MeasuredStepTime(get_model(QWEN3_06B), gpu, coefficients=co)
    from_form = _model(QWEN3_06B).with_worker_form(WorkerForm(worker_step_s=1.5e-3))
    assert from_form.predict_s(BATCH_1) == from_file.predict_s(BATCH_1)
    shipped = _model(QWEN3_06B)
    moved_s = shipped.engine_overhead_s(BATCH_1) - from_form.engine_overhead_s(BATCH_1)
    assert moved_s == pytest.approx(V1_WORKER_STEP_S - 1.5e-3, rel=1e-9)
    overridden = MeasuredStepTime(get_model(QWEN3_06B), gpu, coefficients=co,
                                  worker=WorkerForm(worker_step_s=2e-3))  # fmt: skip
    assert overridden.engine_overhead_s(BATCH_1) > from_file.engine_overhead_s(BATCH_1)


def test_with_worker_form_is_the_model_built_with_that_form():
    layered = WorkerForm(WorkerCpuForm.LAYER_LAUNCH, LAUNCH_S)
    rebuilt = _model(QWEN3_06B).with_worker_form(layered)
    built = _model(QWEN3_06B, WorkerCpuForm.LAYER_LAUNCH, LAUNCH_S)
    for batch in (BATCH_1, BatchShape((192, 4000), ((0, 8),)), BatchShape((), ((100, 512),))):
        assert rebuilt.breakdown(batch) == built.breakdown(batch)


#: Qwen3-0.6B (28 layers) under every form and c: its 1.99 ms batch-1 decode kernels are
#: shorter than 28 x 100 us, so B and C expose launches on the drawn steps.
FORMS = {(form, c): _model(QWEN3_06B, form, c) for form in WorkerCpuForm
         for c in (0.0, 50e-6, LAUNCH_S, 150e-6)}  # fmt: skip
FIXED = _model(QWEN3_06B)
batches = st.builds(
    BatchShape,
    st.lists(st.integers(1, 8192), max_size=6).map(tuple),
    st.lists(st.tuples(st.integers(0, 4096), st.integers(1, 512)), max_size=2).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(batch=batches, key=st.sampled_from(sorted(FORMS, key=lambda k: (k[0].value, k[1]))))
def test_a_step_is_its_parts_and_never_below_the_max_of_them(batch, key):
    """breakdown sums to predict_s (==); the step is at least GPU + graph launch + overhead and
    at least L x c + graph launch + overhead where the form launches per layer; c = 0 is A."""
    (form, c), model = key, FORMS[key]
    parts = model.breakdown(batch)
    step_s = model.predict_s(batch)
    total = 0.0
    for value in parts.values():
        total += value
    assert step_s == total
    # an empty step is the fixed overhead alone; a step with tokens launches its graph(s)
    floor_s = (model._launch_s if batch.num_tokens else 0.0) + parts["engine_overhead_s"]
    assert step_s >= _gpu_s(model, batch) + floor_s - 1e-12
    if batch.num_tokens and wf.launches_per_layer(form, bool(batch.prefill_chunks)):
        assert step_s >= 28 * c + floor_s - 1e-12
    if c == 0.0:
        assert step_s == FIXED.predict_s(batch)


@settings(max_examples=60, deadline=None)
@given(
    batch=batches.filter(lambda b: b.num_decode_seqs > 0),
    more=st.integers(1, 65536),
    key=st.sampled_from(sorted(FORMS, key=lambda k: (k[0].value, k[1]))),
)
def test_the_step_is_monotone_in_gpu_work(batch, more, key):
    """More KV to read (a longer decode context) never shortens a step, in any form."""
    model = FORMS[key]
    ctx = batch.decode_context_tokens
    longer = BatchShape((ctx[0] + more, *ctx[1:]),
                        batch.prefill_chunks)  # fmt: skip
    assert _gpu_s(model, longer) >= _gpu_s(model, batch)
    assert model.predict_s(longer) >= model.predict_s(batch)


@given(
    launch_s=st.floats(0, 1e-2, allow_nan=False),
    gpu_s=st.floats(0, 1e-1, allow_nan=False),
    more_s=st.floats(0, 1e-1, allow_nan=False),
)
def test_exposed_launch_is_what_the_gpu_does_not_hide(launch_s, gpu_s, more_s):
    exposed = wf.exposed_launch_s(launch_s, gpu_s)
    assert exposed >= 0.0
    assert gpu_s + exposed == pytest.approx(max(launch_s, gpu_s), rel=1e-12, abs=1e-18)
    assert wf.exposed_launch_s(launch_s, gpu_s + more_s) <= exposed


@settings(max_examples=40, deadline=None)
@given(batch=batches)
def test_a_model_recording_its_gpu_floors_prices_every_step_the_same(batch):
    """A `GpuFloors` recorder (the form comparison's) only routes the default form's steps
    through `_launch_term_s`; the step time is the same float, and the floor is that step's
    GPU work (a lone step: its own)."""
    floors = GpuFloors()
    recording = FIXED.with_worker_form(wf.SHIPPED_WORKER_FORM, floors)
    assert recording._launch_per_step and not FIXED._launch_per_step
    assert recording.predict_s(batch) == FIXED.predict_s(batch)
    if batch.num_tokens:
        assert floors.every_step[28] == pytest.approx(_gpu_s(FIXED, batch), rel=1e-12)
        assert (28 in floors.prefill_steps) == bool(batch.prefill_chunks)


def test_the_floors_are_the_least_gpu_time_per_layer_count_and_step_kind():
    """Two models (28 and 40 layers) share one recorder: each layer count keeps its fastest
    step, and the prefill floor only steps with a chunk (a decode is faster than any of them)."""
    floors = GpuFloors()
    small = _model(QWEN3_06B).with_worker_form(wf.SHIPPED_WORKER_FORM, floors)
    large = _model(QWEN3_14B).with_worker_form(wf.SHIPPED_WORKER_FORM, floors)
    chunk, long_decode = BatchShape((192,), ((0, 512),)), BatchShape((192, 8000), ())
    for model in (small, large):
        for batch in (long_decode, chunk, BATCH_1):
            model.predict_s(batch)
    every = {28: _gpu_s(small, BATCH_1), 40: _gpu_s(large, BATCH_1)}
    assert floors.every_step == pytest.approx(every, rel=1e-12)
    prefill = {28: _gpu_s(small, chunk), 40: _gpu_s(large, chunk)}
    assert floors.prefill_steps == pytest.approx(prefill, rel=1e-12)
