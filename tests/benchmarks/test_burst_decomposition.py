"""benchmarks/burst_decomposition.py: the TTFT parts add up to the client's TTFT, the worked
numbers of a hand-made trace, and recording changes no replay."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.engine.arrivals import EngineArrivals
from sim.engine.engine import Engine
from tests.benchmarks.scripts import load_script

burst = load_script("burst_decomposition")
accuracy = load_script("serving_accuracy")


def _request(rid, send, scheduled, client):
    return SimpleNamespace(request_id=rid, arrival_s=send, first_scheduled_s=scheduled,
                           token_times_s=list(client))  # fmt: skip


def test_a_hand_made_trace_splits_as_worked_out():
    # Sent at 0, at the core at 0.010, scheduled at 0.015, first token sampled at 0.020 and
    # seen at 0.023; second sampled 0.030, seen 0.036: TTFT 23 ms = 10 + 5 + 5 + 3; engine
    # TPOT 10 ms, streaming adds (6 - 3) ms over one gap.
    trace = burst.EngineTrace()
    trace.requests[7] = _request(7, 0.0, 0.015, [0.023, 0.036])
    trace.reached_s[7] = 0.010
    trace.sampled_s[7] = [0.020, 0.030]
    trace.steps.append((0.015, 0.005, 1, 0, 100))
    d = burst.decompose(trace, 1)
    assert (d.intake_ms, d.queue_ms, d.prefill_ms, d.stream_ms) == pytest.approx((10, 5, 5, 3))
    assert d.ttft_ms == pytest.approx(23)
    assert (d.engine_tpot_ms, d.stream_dtpot_ms, d.tpot_ms) == pytest.approx((10, 3, 13))


def test_only_the_benchmarks_requests_count():
    # The engine's first id is the test run: with num_prompts 1, only id 1 is decomposed.
    trace = burst.EngineTrace()
    for rid, lag in ((0, 5.0), (1, 0.001)):
        trace.requests[rid] = _request(rid, 0.0, 0.0, [lag])
        trace.reached_s[rid] = 0.0
        trace.sampled_s[rid] = [0.0]
    d = burst.decompose(trace, 1)
    assert d.num_requests == 1 and d.ttft_ms == pytest.approx(1.0)
    assert math.isnan(d.tpot_ms)  # one token: no TPOT


times = st.floats(0.0, 10.0, allow_nan=False)


@given(st.lists(st.tuples(times, times, times, times, times), min_size=1, max_size=20))
def test_the_parts_add_up_to_the_ttft(rows):
    trace = burst.EngineTrace()
    for rid, gaps in enumerate(rows):
        send = gaps[0]
        reached = send + gaps[1]
        scheduled = reached + gaps[2]
        sampled = scheduled + gaps[3]
        trace.requests[rid] = _request(rid, send, scheduled, [sampled + gaps[4]])
        trace.reached_s[rid] = reached
        trace.sampled_s[rid] = [sampled]
    d = burst.decompose(trace, len(rows))
    parts = d.intake_ms + d.queue_ms + d.prefill_ms + d.stream_ms
    assert parts == pytest.approx(d.ttft_ms, rel=1e-9, abs=1e-6)


def test_recording_changes_no_replay_and_restores_the_hooks():
    arrive, record_step = EngineArrivals._arrive, Engine.record_step
    point = next(p for p in accuracy.load_points() if p.id == burst.DEFAULT_IDS[0])
    plain = accuracy.replay(point, max_prompts=40)
    with burst.recording() as traces:
        recorded = accuracy.replay(point, max_prompts=40)
    assert [(r.metric, r.predicted) for r in recorded.rows] == [
        (r.metric, r.predicted) for r in plain.rows
    ]
    assert (EngineArrivals._arrive, Engine.record_step) == (arrive, record_step)
    d = burst.decompose(traces[-1], 40)
    ttft = next(r.predicted for r in plain.rows if r.metric == "ttft_ms")
    assert d.num_requests == 40 and d.ttft_ms == pytest.approx(ttft, rel=1e-9)
