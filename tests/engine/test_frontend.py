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

from sim.engine.api_server import VLLM_API_SERVER, ApiServer
from sim.engine.engine import Engine
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


def _run(specs: list[RequestSpec], engine: dict | None = None, **kwargs) -> Engine:
    resolved = resolve(scenario_from_dict({**SCENARIO, "engine": engine or {}}), Path("."))
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
    # Parses at 0-20 and 20-40 ms, tokenizations at 40-45 and 45-50 ms: request 0 reaches the
    # scheduler at 55 ms and prefills alone (10 ms + 1,000 x 0.1 ms); request 1 reaches it at
    # 60 ms, during that step, and prefills after it.
    first_end = 0.055 + FIXED_S + 1000 * PER_TOKEN_S
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
    names = ("request_s", "prompt_token_s", "output_batch_s", "output_token_s", "hand_off_s",
             "output_chunk_s")  # fmt: skip
    for name in names:
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
    output_chunk_s=st.sampled_from([0.0, 1e-4, 3e-3]),
)
_servers = st.fixed_dictionaries(
    {"api_server_count": st.integers(1, 3), "stream_interval": st.sampled_from([1, 2, 5])}
)


@settings(max_examples=40, deadline=None)
@given(raw=_specs, costs=_costs, cap=st.sampled_from([None, 1, 3]), servers=_servers)
def test_every_request_ends_and_no_token_reaches_the_client_before_it_is_sampled(
    raw, costs, cap, servers
) -> None:
    specs = [RequestSpec(i, t, p, o) for i, (t, p, o) in enumerate(sorted(raw))]
    sampled = _run(specs, max_concurrency=cap, engine=servers).token_times_s
    engine = _run(specs, frontend=costs, max_concurrency=cap, engine=servers)
    table = _table(engine)
    assert (table.state == "finished").all() and len(table) == len(specs)
    assert engine.token_times_s is not None
    for spec in specs:
        seen = engine.token_times_s[spec.request_id]
        assert len(seen) == spec.output_tokens
        assert seen == sorted(seen)
        assert seen[-1] >= table.finish_s[spec.request_id] - 1e-12
        assert seen[0] - table.arrival_s[spec.request_id] >= costs.input_s(spec.prompt_tokens)
        if cap is None and costs.request_s == costs.prompt_token_s == costs.hand_off_s == 0:
            # Same schedule as without the API server: no token is seen before it is sampled.
            assert sampled is not None
            assert all(s >= t - 1e-12 for s, t in zip(seen, sampled[spec.request_id], strict=True))


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


def _decoders(num: int, output_tokens: int) -> list[RequestSpec]:
    return [RequestSpec(i, 0.0, 1, output_tokens) for i in range(num)]


def _delays(plain: Engine, served: Engine, token: int) -> list[float]:
    assert plain.token_times_s is not None and served.token_times_s is not None
    return sorted(
        served.token_times_s[i][token] - plain.token_times_s[i][token] for i in plain.token_times_s
    )


def test_the_docstring_streaming_example_a_chunk_per_request_per_step() -> None:
    """64 decoders, 10 ms steps, 100 us a chunk: 6.4 ms of chunks fit in a step, so each
    step's token of the k-th request in the batch goes out k x 100 us after it is sampled."""
    specs = _decoders(64, 5)
    plain = _run(specs)
    served = _run(specs, frontend=ApiServer(output_chunk_s=1e-4))
    for token in range(5):
        assert _delays(plain, served, token) == pytest.approx([k * 1e-4 for k in range(1, 65)])


def test_two_api_servers_halve_each_loops_chunk_queue() -> None:
    specs = _decoders(64, 3)
    plain = _run(specs)
    served = _run(specs, frontend=ApiServer(output_chunk_s=1e-4), engine={"api_server_count": 2})
    # Requests alternate between the loops: 32 chunks each, the k-th out after k x 100 us.
    expected = sorted(k * 1e-4 for k in range(1, 33) for _ in range(2))
    assert _delays(plain, served, 2) == pytest.approx(expected)


def test_chunks_merge_when_the_loop_falls_behind_the_engine() -> None:
    """1 ms a chunk, 64 decoders, 10 ms steps: one round of chunks takes 64 ms, six steps'
    tokens. Without merging the loop would need 64 x 20 x 1 ms = 1.28 s after the start; with
    `RequestOutputCollector` merging, each waiting chunk absorbs the steps that come while it
    waits, and the client has every token within about two rounds of the last sample."""
    specs = _decoders(64, 20)
    plain = _run(specs)
    served = _run(specs, frontend=ApiServer(output_chunk_s=1e-3))
    assert plain.token_times_s is not None and served.token_times_s is not None
    last_sample = max(times[-1] for times in plain.token_times_s.values())
    last_seen = max(times[-1] for times in served.token_times_s.values())
    assert last_sample < last_seen < last_sample + 2 * 64e-3 + 1e-9
    chunks = sum(len(set(times)) for times in served.token_times_s.values())
    assert chunks < 64 * 20 / 3  # tokens went out several to a chunk


def test_stream_interval_holds_tokens_until_that_many_accumulate() -> None:
    """`--stream-interval 4`, 10 tokens: the first goes at once, then tokens 2-5 with the 5th,
    6-9 with the 9th, and the 10th (the last) at once."""
    spec = [RequestSpec(0, 0.0, 8, 10)]
    plain = _run(spec)
    held = _run(spec, frontend=ApiServer(), engine={"stream_interval": 4})
    assert plain.token_times_s is not None and held.token_times_s is not None
    sampled = plain.token_times_s[0]
    assert held.token_times_s[0] == pytest.approx(
        [sampled[0], *[sampled[4]] * 4, *[sampled[8]] * 4, sampled[9]]
    )


def test_held_tokens_of_an_aborted_request_still_reach_the_client() -> None:
    """Regression: a request aborted or failed while `--stream-interval` held some of its
    tokens kept them (and its concurrency slot) forever: no later step streams it. Here the
    time limit aborts it, with a free API server (nothing runs after the run's end)."""
    specs = [RequestSpec(0, 0.0, 8, 400), RequestSpec(1, 0.0, 8, 4)]
    engine = _run(
        specs, frontend=ApiServer(), max_concurrency=1,
        engine={"stream_interval": 64, "max_sim_time_s": 1.0},
    )  # fmt: skip
    table = _table(engine)
    assert table.state[0] == "aborted"
    assert engine.frontend is not None and engine.token_times_s is not None
    sampled = len(engine.token_times_s[0])
    assert 64 < sampled < 400 and sampled % 64 != 0  # it was holding tokens when it ended
    assert engine.frontend.delivered_tokens(0) == sampled


def test_frontend_keeps_no_bookkeeping_for_finished_requests() -> None:
    """Regression: the API server kept six dict entries per request for the whole run, so a
    long `kvsim bench serve` grew with every request served. Once the client has a request's
    last token only its delivered count stays (read by `delivered_tokens`)."""
    specs = [RequestSpec(i, 0.01 * i, 32, 16) for i in range(40)]
    engine = _run(specs, frontend=VLLM_API_SERVER, engine={"api_server_count": 2})
    loop = engine.frontend
    assert loop is not None and engine.token_times_s is not None
    assert (_table(engine).state == "finished").all()
    for table in (loop._server_of, loop._taken, loop._emitted, loop._handling, loop._handled):
        assert table == {}
    assert loop._waiting_chunk == {}
    assert all(loop.delivered_tokens(i) == len(engine.token_times_s[i]) == 16 for i in range(40))


def test_a_burst_is_parsed_whole_before_any_token_streams() -> None:
    """Every request of a burst is ready on the loop at 0 s, ahead of any output work, so the
    FIFO loop parses all of them before the first token reaches the client (docs/accuracy.md,
    kvcached's burst: vLLM's requests become ready as the client sends them)."""
    num = 100
    burst = [RequestSpec(i, 0.0, 512, 4) for i in range(num)]
    engine = _run(burst, frontend=VLLM_API_SERVER)
    assert engine.token_times_s is not None
    first_token_s = min(times[0] for times in engine.token_times_s.values())
    assert first_token_s >= num * VLLM_API_SERVER.request_s
