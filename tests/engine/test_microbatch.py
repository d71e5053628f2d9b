"""vLLM's micro-batching tokenizer (`sim.engine.microbatch`): batches of at most 32 within a
2 ms window, on an executor off the loop; under Python 3.11 each further prompt costs three
turns on the loop, so a busy loop closes the window after two prompts."""

from __future__ import annotations

from pathlib import Path

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engine.api_server import VLLM_API_SERVER, ApiServer
from sim.engine.engine import Engine
from sim.engine.microbatch import (
    MicrobatchTokenizer,
    TokenizerBatcher,
    WaitFor,
    microbatch_tokenizer_for,
)
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict
from sim.workload.request import RequestSpec
from tests.engine.test_frontend import SCENARIO

TOKEN_S = 1e-6
HOG_JOB_S = 0.001


def _hog(env: simpy.Environment, loop: simpy.Resource, until_s: float):
    """Other work keeping the loop busy: 1 ms jobs back to back until `until_s`."""
    while env.now < until_s:
        with loop.request() as turn:
            yield turn
            yield env.timeout(HOG_JOB_S)


def _batch(
    prompts: list[tuple[float, int]], wait_for: WaitFor, busy_until_s: float = 0.0
) -> tuple[list[float], list[int]]:
    """Prompts (submit time, tokens) through one batcher; their done times and the batch
    sizes. A hog keeps the loop busy until `busy_until_s` (it starts first)."""
    env = simpy.Environment()
    loop = simpy.Resource(env, capacity=1)
    if busy_until_s > 0:
        env.process(_hog(env, loop, busy_until_s))
    batcher = TokenizerBatcher(env, loop, MicrobatchTokenizer(wait_for=wait_for), TOKEN_S)
    done_s: list[float] = [-1.0] * len(prompts)

    def client(index: int, at_s: float, tokens: int):
        yield env.timeout(at_s)
        yield batcher.submit(tokens)
        done_s[index] = env.now

    for index, (at_s, tokens) in enumerate(prompts):
        env.process(client(index, at_s, tokens))
    env.run(until=60.0)
    return done_s, batcher.batch_sizes


def test_the_python_version_picks_the_wait() -> None:
    assert WaitFor.of_python("3.11") is WaitFor.TASK
    assert WaitFor.of_python("3.10.4") is WaitFor.TASK
    assert WaitFor.of_python("3.12") is WaitFor.INLINE
    assert WaitFor.of_python("3.13") is WaitFor.INLINE
    with pytest.raises(ValueError, match="major.minor"):
        WaitFor.of_python("three")


def test_only_the_microbatching_releases_have_a_batcher() -> None:
    assert microbatch_tokenizer_for("0.19.1", "3.11") == MicrobatchTokenizer(wait_for=WaitFor.TASK)
    assert microbatch_tokenizer_for("0.11.0", "3.12") == MicrobatchTokenizer()
    assert microbatch_tokenizer_for("0.20.0", "3.12") == MicrobatchTokenizer()
    for release in ("0.5.4", "0.25.1", "0.26.0", "0.33.0"):
        assert microbatch_tokenizer_for(release, "3.11") is None
    with pytest.raises(ValueError, match="max_batch_size"):
        MicrobatchTokenizer(max_batch_size=0)


@pytest.mark.parametrize("wait_for", list(WaitFor))
def test_on_an_idle_loop_a_batch_waits_out_its_window_then_tokenizes(wait_for: WaitFor) -> None:
    # Both prompts are queued at 0; the window stays open to 2 ms for more (turns cost nothing
    # on an idle loop), then 2,000 tokens take 2 ms on the executor: both done at 4 ms.
    done_s, sizes = _batch([(0.0, 1000), (0.0, 1000)], wait_for)
    assert sizes == [2]
    assert done_s == [pytest.approx(0.004), pytest.approx(0.004)]


def test_the_docstring_example_on_a_busy_loop() -> None:
    # Python 3.11: the second prompt's wait_for takes three turns (1, 2, 3 ms, each behind a
    # 1 ms job), the window has closed, so the batch is 2; tokenized 3-5 ms, handed back by
    # two more turns at 6 and 7 ms.
    done_s, sizes = _batch([(0.0, 1000), (0.0, 1000)], WaitFor.TASK, busy_until_s=1.0)
    assert sizes == [2]
    assert done_s == [pytest.approx(0.007), pytest.approx(0.007)]
    # Python 3.12: both at 0, the window runs out at 2 ms, two timeout turns (3, 4 ms),
    # tokenized 4-6 ms, handed back at 7 and 8 ms.
    done_s, sizes = _batch([(0.0, 1000), (0.0, 1000)], WaitFor.INLINE, busy_until_s=1.0)
    assert sizes == [2]
    assert done_s == [pytest.approx(0.008), pytest.approx(0.008)]


def test_a_backlog_on_a_busy_loop_drains_in_pairs_under_3_11_and_in_32s_under_3_12() -> None:
    backlog = [(0.0, 500)] * 40
    _, sizes = _batch(backlog, WaitFor.TASK, busy_until_s=1.0)
    assert sizes == [2] * 20
    _, sizes = _batch(backlog, WaitFor.INLINE, busy_until_s=1.0)
    assert sizes == [32, 8]
    # Idle, the 3.11 batcher's turns cost nothing: it fills its batches too.
    _, sizes = _batch(backlog, WaitFor.TASK)
    assert sizes == [32, 8]


def _engine(tokenizer: MicrobatchTokenizer | None) -> Engine:
    resolved = resolve(scenario_from_dict({**SCENARIO, "engine": {}}), Path("."))
    costs = ApiServer(request_s=0.002, prompt_token_s=1e-6, hand_off_s=0.010)
    engine = Engine(resolved.engine, [RequestSpec(0, 0.0, 1000, 1)], resolved.step_time,
                    record_token_times=True, frontend=costs, tokenizer=tokenizer)  # fmt: skip
    engine.run()
    return engine


def test_a_lone_request_waits_the_window_more_with_the_batcher() -> None:
    # Without: parse 0-2 ms, tokenize 2-3 ms on the loop, hand-off to 13 ms. With: parse, the
    # batch's window (2-4 ms), tokenize 4-5 ms off the loop, hand-off to 15 ms.
    plain, batched = _engine(None), _engine(MicrobatchTokenizer(wait_for=WaitFor.TASK))
    assert plain.token_times_s is not None and batched.token_times_s is not None
    assert batched.token_times_s[0][0] - plain.token_times_s[0][0] == pytest.approx(0.002)


_prompts = st.lists(
    st.tuples(st.sampled_from([0.0, 0.0005, 0.001, 0.003, 0.01]), st.integers(1, 2000)),
    min_size=1,
    max_size=80,
)


@settings(max_examples=40, deadline=None)
@given(_prompts, st.sampled_from(list(WaitFor)), st.sampled_from([0.0, 0.02, 1.0]))
def test_every_prompt_is_tokenized_once_in_order_and_the_run_repeats(
    prompts: list[tuple[float, int]], wait_for: WaitFor, busy_until_s: float
) -> None:
    prompts = sorted(prompts, key=lambda p: p[0])
    done_s, sizes = _batch(prompts, wait_for, busy_until_s)
    assert all(t >= at for t, (at, _) in zip(done_s, prompts, strict=True))  # every one done
    assert sum(sizes) == len(prompts) and max(sizes) <= 32
    assert done_s == sorted(done_s)  # FIFO: one queue, one batch at a time
    assert _batch(prompts, wait_for, busy_until_s) == (done_s, sizes)


def test_a_burst_stays_a_burst_the_loop_is_idle_when_the_batcher_collects() -> None:
    """docs/accuracy.md, kvcached's burst: the FIFO loop parses the whole burst before the
    batcher's first turn, and then nothing streams yet, so even under Python 3.11 its turns
    cost nothing and it fills batches of 32 (the measured server admitted ~125 a second)."""
    resolved = resolve(scenario_from_dict({**SCENARIO, "engine": {}}), Path("."))
    burst = [RequestSpec(i, 0.0, 512, 4) for i in range(100)]
    engine = Engine(resolved.engine, burst, resolved.step_time, record_token_times=True,
                    frontend=VLLM_API_SERVER, tokenizer=MicrobatchTokenizer(wait_for=WaitFor.TASK))  # fmt: skip
    engine.run()
    assert engine.frontend is not None
    assert engine.frontend._batchers[0].batch_sizes == [32, 32, 32, 4]


def _steady(wait_for: WaitFor) -> tuple[list[int], float]:
    """300 prompts of 512 tokens sent at 150 a second, 128 tokens out each, on 4 ms steps:
    once ~100 stream, the loop is busy; the batch sizes and the mean TTFT."""
    scheduler = {**SCENARIO["scheduler"], "max_num_seqs": 256}
    step = {"linear": {"fixed_s": 0.004, "per_prefill_token_s": 1e-6}}
    scenario = {**SCENARIO, "engine": {}, "scheduler": scheduler, "step_time": step}
    resolved = resolve(scenario_from_dict(scenario), Path("."))
    specs = [RequestSpec(i, i / 150, 512, 128) for i in range(300)]
    engine = Engine(resolved.engine, specs, resolved.step_time, record_token_times=True,
                    frontend=VLLM_API_SERVER, tokenizer=MicrobatchTokenizer(wait_for=wait_for))  # fmt: skip
    engine.run()
    assert engine.frontend is not None and engine.token_times_s is not None
    ttft_s = [engine.token_times_s[s.request_id][0] - s.arrival_s for s in specs]
    return engine.frontend._batchers[0].batch_sizes, sum(ttft_s) / len(ttft_s)


def test_a_loop_busy_streaming_pairs_the_prompts_under_3_11_and_admits_them_later() -> None:
    """docs/accuracy.md: in the pair regime the 3.11 batcher is the server's intake limit."""
    task_sizes, task_ttft_s = _steady(WaitFor.TASK)
    inline_sizes, inline_ttft_s = _steady(WaitFor.INLINE)
    assert sum(task_sizes) == sum(inline_sizes) == 300
    assert len(task_sizes) / 300 > 0.48  # two prompts a batch (or one)
    assert len(task_sizes) > len(inline_sizes)
    assert task_ttft_s > 2 * inline_ttft_s
