"""The benchmark client in front of the engine (`sim.engine.client`): the concurrency cap and
per-token times, and that neither changes a table when off."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.engine import Engine
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict
from sim.workload.request import RequestSpec

SCENARIO = {
    "name": "client",
    "model": None,
    "cache": {"block_size": 16, "num_gpu_blocks": 4096},
    "scheduler": {
        "design": "v1-engine",
        "max_num_seqs": 64,
        "max_model_len": 4096,
        "decode_fast_path": False,
        "decode_cohort": False,
    },  # fmt: skip
    "workload": {
        "kind": "inline",
        "requests": [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}],
    },
    "step_time": {"linear": {"fixed_s": 0.01, "per_prefill_token_s": 0.0001}},
}


def _run(specs: list[RequestSpec], **kwargs) -> Engine:
    resolved = resolve(scenario_from_dict(SCENARIO), Path("."))
    engine = Engine(resolved.engine, specs, resolved.step_time, **kwargs)
    engine.run()
    return engine


def _requests(engine: Engine) -> pd.DataFrame:
    from sim.output.results import requests_frame

    return requests_frame(engine.records)


def test_the_docstring_example_cap_two_of_three_due_at_zero() -> None:
    specs = [RequestSpec(i, 0.0, 32, 100) for i in range(3)]
    engine = _run(specs, max_concurrency=2)
    table = _requests(engine).set_index("request_id")
    assert list(table.arrival_s[[0, 1]]) == [0.0, 0.0]
    first_done = min(table.finish_s[[0, 1]])
    assert table.arrival_s[2] == first_done
    assert engine.client is not None and engine.client.queue_s[2] == first_done


@settings(max_examples=25, deadline=None)
@given(
    cap=st.integers(1, 6),
    gaps=st.lists(st.floats(0, 0.5), min_size=1, max_size=25),
    outputs=st.lists(st.integers(1, 40), min_size=25, max_size=25),
)
def test_never_more_in_flight_than_the_cap_and_sent_in_order(cap, gaps, outputs) -> None:
    due, t = [], 0.0
    for gap in gaps:
        t += gap
        due.append(t)
    specs = [RequestSpec(i, d, 20, outputs[i]) for i, d in enumerate(due)]
    engine = _run(specs, max_concurrency=cap)
    table = _requests(engine).sort_values("request_id")
    assert (table.state == "finished").all()
    sent = table.arrival_s.to_numpy()
    assert (sent[1:] >= sent[:-1]).all()  # FIFO: sent in the order they were due
    assert (sent >= pd.Series(due).to_numpy()).all()
    for t_sent in sent:  # at each send, the requests in flight (sent, not finished) <= cap
        in_flight = ((table.arrival_s <= t_sent) & (table.finish_s > t_sent)).sum()
        assert in_flight <= cap
    assert engine.client is not None
    assert engine.client.queue_s == {i: sent[i] - due[i] for i in range(len(due))}


def test_token_times_one_per_token_and_the_tables_unchanged() -> None:
    specs = [RequestSpec(i, i * 0.003, 50 + 7 * i, 1 + (i * 5) % 23) for i in range(30)]
    plain = _run(specs)
    timed = _run(specs, record_token_times=True)
    pd.testing.assert_frame_equal(_requests(plain), _requests(timed))
    assert plain.token_times_s is None and timed.token_times_s is not None
    for row in _requests(timed).itertuples():
        times = timed.token_times_s[row.request_id]
        assert len(times) == row.generated_tokens
        assert times[0] == row.first_token_s and times == sorted(times)


def test_an_uncapped_engine_has_no_client() -> None:
    assert _run([RequestSpec(0, 0.0, 10, 2)]).client is None
