"""The API server in front of the engine core (`sim.engine.frontend`): its costs delay each
request's arrival at the scheduler and each token's time as the client sees it, one loop shared
by inputs and outputs; with zero costs it changes nothing."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.engine import Engine
from sim.engine.frontend import VLLM_API_SERVER, ApiServer
from sim.output.results import requests_frame
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict
from sim.workload.request import RequestSpec

FIXED_S, PER_TOKEN_S = 0.01, 0.0001
SCENARIO = {
    "name": "frontend",
    "model": None,
    "cache": {"block_size": 16, "num_gpu_blocks": 4096},
    "scheduler": {
        "design": "v1-engine",
        "max_num_seqs": 64,
        "max_num_batched_tokens": 4096,
        "max_model_len": 4096,
        "decode_fast_path": False,
        "decode_cohort": False,
    },  # fmt: skip
    "workload": {
        "kind": "inline",
        "requests": [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}],
    },
    "step_time": {"linear": {"fixed_s": FIXED_S, "per_prefill_token_s": PER_TOKEN_S}},
}


def _run(specs: list[RequestSpec], **kwargs) -> Engine:
    resolved = resolve(scenario_from_dict(SCENARIO), Path("."))
    engine = Engine(resolved.engine, specs, resolved.step_time, record_token_times=True, **kwargs)
    engine.run()
    return engine


def _table(engine: Engine) -> pd.DataFrame:
    return requests_frame(engine.records).set_index("request_id")


def test_the_docstring_example_two_prompts_queue_for_the_loop_not_the_hand_off() -> None:
    costs = ApiServer(request_s=0.020, prompt_token_s=5e-6, hand_off_s=0.010)
    assert costs.input_s(1000) == pytest.approx(0.025)
    engine = _run([RequestSpec(0, 0.0, 1000, 1), RequestSpec(1, 0.0, 1000, 1)], frontend=costs)
    times = engine.token_times_s
    assert times is not None
    # Request 0 reaches the scheduler at 35 ms and prefills alone (10 ms + 1,000 x 0.1 ms);
    # request 1 reaches it at 60 ms, during that step, and prefills after it.
    first_end = 0.035 + FIXED_S + 1000 * PER_TOKEN_S
    assert times[0] == [pytest.approx(first_end)]
    assert times[1] == [pytest.approx(first_end + FIXED_S + 1000 * PER_TOKEN_S)]
    table = _table(engine)
    assert list(table.arrival_s) == [0.0, 0.0]  # the client's send time, as vLLM's client times


def test_output_work_delays_what_the_client_sees_not_the_engine() -> None:
    spec = [RequestSpec(0, 0.0, 100, 5)]
    plain = _run(spec)
    costs = ApiServer(output_batch_s=0.001, output_token_s=0.002)
    streamed = _run(spec, frontend=costs)
    assert plain.token_times_s is not None and streamed.token_times_s is not None
    # One token per step, each step's output batch costs 3 ms of loop time after the step.
    assert streamed.token_times_s[0] == pytest.approx([t + 0.003 for t in plain.token_times_s[0]])
    # The engine's own record (finish) is the sample time, not the delivery.
    assert _table(streamed).finish_s[0] == pytest.approx(plain.token_times_s[0][-1])


def test_a_concurrency_slot_frees_when_the_client_has_the_last_token() -> None:
    specs = [RequestSpec(0, 0.0, 32, 3), RequestSpec(1, 0.0, 32, 3)]
    costs = ApiServer(output_token_s=0.004)
    engine = _run(specs, max_concurrency=1, frontend=costs)
    assert engine.token_times_s is not None
    last_seen = engine.token_times_s[0][-1]
    assert _table(engine).arrival_s[1] == pytest.approx(last_seen)
    assert _table(engine).finish_s[0] < last_seen


def test_bad_costs_are_refused() -> None:
    for name in ("request_s", "prompt_token_s", "output_batch_s", "output_token_s", "hand_off_s"):
        with pytest.raises(ValueError, match=name):
            ApiServer(**{name: -1e-3})
        with pytest.raises(ValueError, match=name):
            ApiServer(**{name: math.nan})
    with pytest.raises(ValueError, match="record_token_times"):
        resolved = resolve(scenario_from_dict(SCENARIO), Path("."))
        Engine(resolved.engine, [RequestSpec(0, 0.0, 8, 1)], resolved.step_time,
               frontend=VLLM_API_SERVER)  # fmt: skip


_specs = st.lists(
    st.tuples(
        st.floats(0.0, 0.5, allow_nan=False),
        st.integers(1, 600),
        st.integers(1, 12),
    ),
    min_size=1,
    max_size=12,
)
_costs = st.builds(
    ApiServer,
    request_s=st.sampled_from([0.0, 0.001, 0.01]),
    prompt_token_s=st.sampled_from([0.0, 1e-6, 1e-5]),
    output_batch_s=st.sampled_from([0.0, 0.0005]),
    output_token_s=st.sampled_from([0.0, 2e-5, 1e-3]),
    hand_off_s=st.sampled_from([0.0, 0.02]),
)


@settings(max_examples=30, deadline=None)
@given(raw=_specs, costs=_costs, cap=st.sampled_from([None, 1, 3]))
def test_every_request_ends_and_no_token_reaches_the_client_before_it_is_sampled(
    raw, costs, cap
) -> None:
    specs = [RequestSpec(i, t, p, o) for i, (t, p, o) in enumerate(sorted(raw))]
    engine = _run(specs, frontend=costs, max_concurrency=cap)
    table = _table(engine)
    assert (table.state == "finished").all() and len(table) == len(specs)
    assert engine.token_times_s is not None
    for spec in specs:
        seen = engine.token_times_s[spec.request_id]
        assert len(seen) == spec.output_tokens
        assert seen == sorted(seen)
        assert seen[-1] >= table.finish_s[spec.request_id] - 1e-12
        assert seen[0] - table.arrival_s[spec.request_id] >= costs.input_s(spec.prompt_tokens)


@settings(max_examples=20, deadline=None)
@given(raw=_specs, cap=st.sampled_from([None, 2]))
def test_a_free_api_server_changes_nothing(raw, cap) -> None:
    specs = [RequestSpec(i, t, p, o) for i, (t, p, o) in enumerate(sorted(raw))]
    plain = _run(specs, max_concurrency=cap)
    free = _run(specs, max_concurrency=cap, frontend=ApiServer())
    assert free.token_times_s == plain.token_times_s
    pd.testing.assert_frame_equal(_table(free), _table(plain))


def test_a_closed_loop_turn_also_waits_for_the_api_server() -> None:
    specs = [
        RequestSpec(0, 0.0, 10, 4, session_id=0, turn=1),
        RequestSpec(1, 1.0, 20, 4, session_id=0, turn=2, think_s=1.0),
    ]
    costs = ApiServer(request_s=0.05)
    plain, served = _run(specs), _run(specs, frontend=costs)
    assert (_table(served).state == "finished").all()
    assert plain.token_times_s is not None and served.token_times_s is not None
    # Each turn's first token comes 50 ms later; the second turn also starts 50 ms later
    # (the first one ended later), so its tokens are 100 ms behind.
    assert served.token_times_s[0][0] == pytest.approx(plain.token_times_s[0][0] + 0.05)
    assert served.token_times_s[1][0] == pytest.approx(plain.token_times_s[1][0] + 0.10)
