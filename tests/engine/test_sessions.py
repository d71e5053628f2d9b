"""Multi-turn sessions: the workload, the engine's closed loop, the session metrics, Mooncake."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.engine.engine import Engine
from sim.engine.run import resolve, run
from sim.engine.sessions import SessionTurns
from sim.kv.types import Sequence
from sim.output.results import summary_json, write_result
from sim.scenario.schema import ScenarioError, load_scenario, scenario_from_dict
from sim.scheduler import Request, RequestState
from sim.workload import WorkloadConfig, load_workload
from sim.workload.request import UNIQUE_KEY_BASE, RequestSpec
from sim.workload.sessions import MIN_SHARED_BLOCKS, synthetic_sessions

ROOT = Path(__file__).resolve().parents[2]
CHAT = ROOT / "scenarios" / "sessions_chat_v1.yaml"
MOONCAKE = ROOT / "sim" / "data" / "traces" / "mooncake_fast25" / "conversation_trace.jsonl"
LINEAR = {"linear": {"fixed_s": 0.005, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 1e-4}}
SESSIONS = {
    "source": "synthetic",
    "num_sessions": 6,
    "arrival": {"rate_per_s": 5.0},
    "turns": {"min": 2, "max": 4},
    "first_prompt": {"kind": "uniform", "min_tokens": 20, "max_tokens": 300},
    "new_tokens": {"kind": "uniform", "max_tokens": 60},
    "output": {"kind": "uniform", "max_tokens": 40},
    "think_s": {"kind": "exponential", "mean_s": 0.05},
}


def _scenario(design="v1-engine", sessions=None, seed=3, cache=None, scheduler=None) -> dict:
    return {
        "name": f"sessions-{design}",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 400, "enable_prefix_caching": True}
        | (cache or {}),
        "scheduler": {"design": design, "max_model_len": 2048} | (scheduler or {}),
        "workload": {"kind": "sessions", "seed": seed, "sessions": SESSIONS | (sessions or {})},
        "step_time": LINEAR,
    }


def _run(data: dict):
    return run(scenario_from_dict(data, "test"))


def _specs(data: dict) -> dict[int, RequestSpec]:
    workload = load_workload(WorkloadConfig.model_validate(data["workload"]))
    return {s.request_id: s for s in workload}


# ---------------------------------------------------------------------------- the workload
@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**20),
    block_size=st.sampled_from([1, 7, 16]),
    max_turns=st.integers(1, 6),
)
def test_each_turn_prompt_extends_the_previous_context(seed, block_size, max_turns):
    """Turn k's prompt starts with turn k-1's whole finished sequence (prompt + output, as the
    engine generates it): equal token ids and equal block hashes, then new tokens of its own."""
    config = WorkloadConfig.model_validate(
        {"kind": "sessions", "sessions": SESSIONS | {"turns": {"min": 1, "max": max_turns}}}
    ).sessions
    workload = synthetic_sessions(config, seed)
    by_turn = {(s.session_id, s.turn): s for s in workload}
    assert [s.arrival_s for s in workload] == sorted(s.arrival_s for s in workload)
    for (session_id, turn), spec in by_turn.items():
        if turn == 1:
            assert spec.think_s is None and spec.prefix == ()
            continue
        before = by_turn[(session_id, turn - 1)]
        finished = Sequence.new(before.request_id, before.prompt_content())
        finished.append_tokens(before.output_tokens)
        context = finished.num_tokens
        prompt = spec.prompt_content()
        assert spec.prompt_tokens > context
        assert prompt.token_ids(0, context) == finished.content.token_ids(0, context)
        num_blocks = context // block_size
        assert prompt.block_hashes(block_size, num_blocks) == finished.content.block_hashes(
            block_size, num_blocks
        )
        # The rest is the user's new message, shared with nobody.
        assert {key for key, _, _ in prompt.span_key(context, spec.prompt_tokens)} == {
            UNIQUE_KEY_BASE + spec.request_id
        }
        # The arrival lower bound: the turn before's, plus this turn's think time.
        assert spec.arrival_s == pytest.approx(before.arrival_s + spec.think_s)


def test_same_seed_same_sessions_and_another_seed_others():
    config = WorkloadConfig.model_validate({"kind": "sessions", "sessions": SESSIONS}).sessions
    assert synthetic_sessions(config, 5).requests == synthetic_sessions(config, 5).requests
    assert synthetic_sessions(config, 5).requests != synthetic_sessions(config, 6).requests


def test_rate_scale_divides_session_starts_and_think_times():
    data = {"kind": "sessions", "seed": 2, "sessions": SESSIONS}
    base = load_workload(WorkloadConfig.model_validate(data))
    fast = load_workload(WorkloadConfig.model_validate(data | {"rate_scale": 2.0}))
    for a, b in zip(base, fast, strict=True):
        assert b.arrival_s == pytest.approx(a.arrival_s / 2)
        assert (a.think_s is None and b.think_s is None) or b.think_s == pytest.approx(
            a.think_s / 2
        )


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"sessions": {"source": "synthetic"}}, "source synthetic needs 'num_sessions'"),
        ({"sessions": SESSIONS | {"path": "x.jsonl"}}, "'path' is not for source: synthetic"),
        ({"first_n": 3}, "cut them with sessions.num_sessions"),
        ({"sessions": SESSIONS | {"turns": {"min": 3, "max": 2}}}, "max 2 < min 3"),
        (
            {"sessions": SESSIONS | {"think_s": {"kind": "lognormal", "mean_s": 1.0}}},
            "'cv' is for (and needed by) kind: lognormal",
        ),
        ({"sessions": None}, "sessions needs 'sessions'"),
    ],
)
def test_bad_sessions_config_is_one_line(change, message):
    data = _scenario()
    data["workload"] = {k: v for k, v in (data["workload"] | change).items() if v is not None}
    with pytest.raises(ScenarioError) as error:
        scenario_from_dict(data, "bad.yaml")
    assert message in str(error.value)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------- the closed loop
def _check_accounting(data: dict, result) -> None:
    """Every turn has one row; a turn arrived iff its session's earlier turns all finished
    in full, and then exactly its think time after the turn before finished."""
    specs = _specs(data)
    rows = result.requests.set_index("request_id")
    assert sorted(rows.index) == sorted(specs)
    assert rows["state"].isin(["finished", "ignored", "failed", "aborted"]).all()
    by_turn = {(s.session_id, s.turn): s for s in specs.values()}
    for spec in specs.values():
        row = rows.loc[spec.request_id]
        assert row["arrival_s"] >= spec.arrival_s - 1e-9  # the lower bound holds
        if spec.turn == 1:
            assert row["arrival_s"] == spec.arrival_s
            continue
        before = rows.loc[by_turn[(spec.session_id, spec.turn - 1)].request_id]
        completed = (
            before["state"] == "finished" and before["generated_tokens"] == (before["max_tokens"])
        )
        never = row["state"] == "aborted" and row["reason"].startswith("never arrived")
        if completed and not result.summary["stopped_early"]:
            assert not never
            assert row["arrival_s"] == pytest.approx(before["finish_s"] + spec.think_s)
        if not completed:
            assert never, (spec, row["reason"])
    sessions = result.sessions.set_index("session_id")
    assert sessions["num_turns"].sum() == len(specs)
    assert sorted(sessions.index) == sorted({s.session_id for s in specs.values()})


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    design=st.sampled_from(["v1-engine", "v0-v2", "v0-fixed"]),
    seed=st.integers(0, 2**16),
    num_gpu_blocks=st.integers(26, 200),  # one max-length request must fit (vLLM)
    max_model_len=st.sampled_from([256, 384]),
    think_mean_s=st.sampled_from([0.0, 0.02]),
    caching=st.booleans(),
)
def test_closed_loop_invariants(design, seed, num_gpu_blocks, max_model_len, think_mean_s, caching):
    data = _scenario(
        design,
        {"think_s": {"kind": "exponential", "mean_s": think_mean_s}},
        seed=seed,
        cache={"num_gpu_blocks": num_gpu_blocks, "enable_prefix_caching": caching},
        scheduler={"max_model_len": max_model_len},
    )
    _check_accounting(data, _run(data))


@pytest.mark.parametrize("design", ["v1-engine", "v0-v2"])
def test_an_ignored_turn_ends_its_session(design):
    """Turn 2's prompt (100 + 20 + 50 = 170 tokens) is longer than max_model_len 160: it is
    ignored (V1: at arrival; v0: by the scheduler) and turn 3 never arrives."""
    fixed = {"kind": "fixed"}
    data = _scenario(
        design,
        {
            "num_sessions": 1,
            "turns": {"min": 3, "max": 3},
            "first_prompt": fixed | {"value": 100},
            "new_tokens": fixed | {"value": 50},
            "output": fixed | {"value": 20},
        },
        scheduler={"max_model_len": 160},
    )
    result = _run(data)
    rows = result.requests.set_index("request_id")
    assert rows["state"].to_dict() == {0: "finished", 1: "ignored", 2: "aborted"}
    assert (
        rows.loc[2, "reason"] == "never arrived: its session ended at turn 2 (request 1, ignored)"
    )
    assert result.summary["sessions"]["num_complete_sessions"] == 0
    _check_accounting(data, result)


def test_a_turn_cut_short_by_max_model_len_ends_its_session():
    """Turn 1 (100 prompt tokens, 80 to generate) stops at max_model_len 160 with 60: turn 2's
    prompt would repeat 80 output tokens that never came, so the session ends."""
    fixed = {"kind": "fixed"}
    data = _scenario(
        "v1-engine",
        {
            "num_sessions": 1,
            "turns": {"min": 2, "max": 2},
            "first_prompt": fixed | {"value": 100},
            "new_tokens": fixed | {"value": 5},
            "output": fixed | {"value": 80},
        },
        scheduler={"max_model_len": 160},
    )
    rows = _run(data).requests.set_index("request_id")
    assert rows.loc[0, "state"] == "finished"
    assert rows.loc[0, "generated_tokens"] < rows.loc[0, "max_tokens"]
    assert rows.loc[1, "reason"].startswith("never arrived: its session ended at turn 1")


def test_session_turns_after_a_short_finish_cancels_the_rest():
    specs = [
        RequestSpec(0, 0.0, 10, 4, session_id=0, turn=1),
        RequestSpec(1, 1.0, 20, 4, session_id=0, turn=2, think_s=1.0),
        RequestSpec(2, 2.0, 30, 4, session_id=0, turn=3, think_s=1.0),
    ]
    turns = SessionTurns.of(specs)
    assert turns is not None and turns.num_pending == 2
    assert [s.request_id for s in turns.open_loop] == [0]
    first = Request.new(0, 0.0, specs[0].prompt_content(), 4)
    first.seq.append_tokens(3)
    first.finish(RequestState.FINISHED, "", 5.0)
    end = turns.after(first)
    assert end.next_turn is None
    assert [s.request_id for s in end.cancelled] == [1, 2]
    assert turns.num_pending == 0


def test_session_turns_schedule_the_next_turn_at_finish_plus_think():
    specs = [
        RequestSpec(0, 0.0, 10, 4, session_id=0, turn=1),
        RequestSpec(1, 1.5, 20, 4, session_id=0, turn=2, think_s=1.5),
    ]
    turns = SessionTurns.of(specs)
    first = Request.new(0, 0.0, specs[0].prompt_content(), 4)
    first.seq.append_tokens(4)
    first.finish(RequestState.FINISHED, "", 5.0)
    end = turns.after(first)
    assert end.next_turn is specs[1] and end.at_s == 6.5 and end.cancelled == []
    assert SessionTurns.of(specs[:1]) is None  # nothing closed-loop: the engine runs as before


def test_a_stuck_turn_is_diagnosed_and_ends_its_session():
    """vLLM #29496 (see tests/engine/test_engine.py): a chunked prompt of exactly max_model_len never
    gets its last token. Here it is turn 2 (100 + 20 + 8 = 128 tokens): the replica waits for
    turn 3, which waits for turn 2; the engine then diagnoses the stuck queue (`no_progress`)
    and turn 3 never arrives."""
    fixed = {"kind": "fixed"}
    data = _scenario(
        "v1-engine",
        {
            "num_sessions": 1,
            "turns": {"min": 3, "max": 3},
            "first_prompt": fixed | {"value": 100},
            "new_tokens": fixed | {"value": 8},
            "output": fixed | {"value": 20},
        },
        cache={"num_gpu_blocks": 16, "enable_prefix_caching": False},
        scheduler={
            "max_model_len": 128,
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 64,
            "max_num_seqs": 8,  # at most the budget, or vLLM (and kvsim) refuse to start
        },
    )
    result = _run(data)
    rows = result.requests.set_index("request_id")
    assert rows["state"].to_dict() == {0: "finished", 1: "aborted", 2: "aborted"}
    assert result.violation_kinds == {"no_progress"}
    assert (
        rows.loc[2, "reason"] == "never arrived: its session ended at turn 2 (request 1, aborted)"
    )


def test_session_ids_reach_the_router():
    """Requests carry their session and turn (a session-affinity router reads them)."""
    resolved_specs = list(_specs(_scenario()).values())
    seen = []
    resolved = resolve(scenario_from_dict(_scenario(), "t"))
    engine = Engine(resolved.engine, resolved.workload.requests, resolved.step_time)
    choose = engine._policy.choose

    def spy(request, views):
        seen.append((request.request_id, request.session_id, request.turn))
        return choose(request, views)

    engine._policy.choose = spy  # type: ignore[method-assign]
    engine.run()
    expected = {(s.request_id, s.session_id, s.turn) for s in resolved_specs}
    assert set(seen) == expected


# ---------------------------------------------------------------------------- metrics
def test_bundled_scenario_later_turns_hit_the_cache_and_only_with_caching_on():
    on = run(CHAT)
    off = run(CHAT, overrides={"cache.enable_prefix_caching": False})
    assert on.summary["num_violations"] == 0 and on.summary["states"]["finished"] > 100
    per_turn_on = on.summary["sessions"]["per_turn"]
    per_turn_off = off.summary["sessions"]["per_turn"]
    assert per_turn_on[0]["turn"] == 1 and per_turn_on[0]["prefix_hit_rate"] == 0
    assert all(t["prefix_hit_rate"] > 0.5 for t in per_turn_on[1:])
    assert all(t["prefix_hit_rate"] == 0 for t in per_turn_off)
    assert off.requests["num_prefix_hit_tokens"].sum() == 0
    # The later turns' TTFT gains from the cache, turn 1's hardly changes.
    assert per_turn_on[1]["ttft_p50_s"] < per_turn_off[1]["ttft_p50_s"]


def test_later_turns_hit_every_computed_block_of_the_previous_context():
    """With room to spare (no eviction), turn k hits every full block of turn k-1's sequence
    whose KV was computed: all but the last generated token, so floor((ctx - 1) / 16) * 16
    tokens. Example: prompt 1000 + output 200 -> ctx 1200 -> 1184 hit tokens."""
    result = run(CHAT)
    rows = result.requests.set_index("request_id")
    specs = load_workload(load_scenario(CHAT).workload, CHAT.parent)
    by_turn = {(s.session_id, s.turn): s for s in specs}
    checked = 0
    for spec in specs:
        if spec.turn > 1:
            before = by_turn[(spec.session_id, spec.turn - 1)]
            context = before.prompt_tokens + before.output_tokens
            assert rows.loc[spec.request_id, "num_prefix_hit_tokens"] == (context - 1) // 16 * 16
            checked += 1
    assert checked > 100


def test_same_seed_gives_identical_session_tables(tmp_path):
    data = _scenario(seed=11)
    first, second = _run(data), _run(data)
    pd.testing.assert_frame_equal(first.requests, second.requests)
    pd.testing.assert_frame_equal(first.sessions, second.sessions)
    write_result(first, tmp_path / "a")
    write_result(second, tmp_path / "b")
    for name in ("sessions.csv", "sessions.parquet", "summary.json", "requests.csv"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    other = _run(_scenario(seed=12))
    assert not other.sessions.equals(first.sessions)


def test_session_table_example():
    """The module docstring's example: 2 turns, arrivals 0 and 3 s, finishes 1 and 4 s."""
    from sim.output.sessions import session_summary, sessions_frame

    turns = pd.DataFrame(
        {
            "request_id": [0, 1],
            "session_id": [0, 0],
            "turn": [1, 2],
            "arrival_s": [0.0, 3.0],
            "finish_s": [1.0, 4.0],
            "ttft_s": [0.2, 0.1],
            "prompt_tokens": [100, 150],
            "num_prefix_hit_tokens": [0, 128],
            "state": ["finished", "finished"],
        }
    )
    row = sessions_frame(turns).iloc[0]
    assert (row["total_s"], row["time_per_turn_s"]) == (4.0, 2.0)
    assert row["prefix_hit_rate"] == pytest.approx(128 / 250)
    summary = session_summary(sessions_frame(turns), turns)
    assert summary["later_turns_prefix_hit_rate"] == pytest.approx(128 / 150)
    assert [t["ttft_p50_s"] for t in summary["per_turn"]] == [0.2, 0.1]
    assert json.loads(json.dumps(summary)) == summary  # plain JSON, no NaN


def test_non_session_runs_have_no_sessions_output(tmp_path):
    data = _scenario()
    data["workload"] = {
        "kind": "inline",
        "requests": [{"arrival_s": 0.0, "prompt_tokens": 40, "output_tokens": 3}],
    }
    result = _run(data)
    assert result.sessions is None and "sessions" not in result.summary
    write_result(result, tmp_path / "run")
    assert not (tmp_path / "run" / "sessions.csv").exists()
    assert "sessions" not in json.loads(summary_json(result))["summary"]


def test_summary_has_no_nan_when_nothing_finished():
    fixed = {"kind": "fixed"}
    data = _scenario(
        sessions={
            "num_sessions": 1,
            "turns": {"min": 2, "max": 2},
            "first_prompt": fixed | {"value": 300},
        },
        scheduler={"max_model_len": 256},
    )
    result = _run(data)
    assert result.summary["sessions"]["time_per_turn_p50_s"] is None
    assert math.isnan(result.sessions["time_per_turn_s"].iloc[0])
    json.loads(summary_json(result))


# ---------------------------------------------------------------------------- Mooncake
def _mooncake_rows(rows: list[dict], tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_mooncake_session_rule(tmp_path):
    """The `infer_sessions` docstring example, and one more turn."""
    rows = [
        {"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 5, 9]},
        {"timestamp": 10, "input_length": 1600, "output_length": 5, "hash_ids": [0, 5, 11, 12]},
        {"timestamp": 20, "input_length": 700, "output_length": 5, "hash_ids": [0, 7]},
        {"timestamp": 30, "input_length": 2100, "output_length": 5, "hash_ids": [0, 5, 11, 13, 14]},
    ]
    _mooncake_rows(rows, tmp_path)
    config = {"kind": "sessions", "sessions": {"source": "mooncake", "path": "trace.jsonl"}}
    workload = load_workload(WorkloadConfig.model_validate(config), tmp_path)
    # j (row 1) continues i; k (row 2) shares only block 0; row 3 extends j's full blocks
    # [0, 5, 11] (1600 // 512 = 3), the longest match, so it is turn 3.
    assert [(s.session_id, s.turn, s.think_s) for s in workload] == [
        (0, 1, None),
        (0, 2, None),
        (2, 1, None),
        (0, 3, None),
    ]
    assert [s.arrival_s for s in workload] == [0.0, 0.01, 0.02, 0.03]  # open loop


def _brute_force_parents(rows: list[dict], block_tokens: int = 512) -> list[int | None]:
    """The rule with whole id tuples (no reliance on chained ids), quadratic and plain."""
    latest: dict[tuple, int] = {}
    parents: list[int | None] = []
    for j, row in enumerate(rows):
        ids = row["hash_ids"]
        parent = None
        for k in range(len(ids), MIN_SHARED_BLOCKS - 1, -1):
            if tuple(ids[:k]) in latest:
                parent = latest[tuple(ids[:k])]
                break
        parents.append(parent)
        num_full = row["input_length"] // block_tokens
        if num_full >= MIN_SHARED_BLOCKS:
            latest[tuple(ids[:num_full])] = j
    return parents


@pytest.mark.slow
def test_mooncake_conversation_trace_sessions_and_their_figures():
    """The figures quoted in the README: 12,031 requests -> 8,056 sessions (2,012 of 2+ turns),
    3,975 follow-up turns, the longest session 43 turns; checked against a brute-force rule."""
    rows = [json.loads(line) for line in MOONCAKE.read_text().splitlines()]
    parents = _brute_force_parents(rows)
    turns: list[int] = []
    for parent in parents:
        turns.append(1 if parent is None else turns[parent] + 1)
    config = {"kind": "sessions", "sessions": {"source": "mooncake", "path": str(MOONCAKE)}}
    workload = load_workload(WorkloadConfig.model_validate(config))
    assert [s.turn for s in workload] == turns
    meta = workload.metadata["sessions"]
    sizes = pd.Series([s.session_id for s in workload]).value_counts()
    assert (len(workload), meta["num_sessions"], meta["num_follow_ups"]) == (12031, 8056, 3975)
    assert (meta["max_turn"], int((sizes > 1).sum())) == (43, 2012)
    # Why open loop: a follow-up is its parent's context plus a short new message, except 427
    # that are shorter; the gap between turns (median 126 s) mixes think and serving time.
    pairs = [(rows[p], row) for p, row in zip(parents, rows, strict=True) if p is not None]
    extra = [c["input_length"] - p["input_length"] - p["output_length"] for p, c in pairs]
    gaps_s = [(c["timestamp"] - p["timestamp"]) / 1000 for p, c in pairs]
    assert (statistics.median(extra), sum(x < 0 for x in extra)) == (26, 427)
    assert round(statistics.median(gaps_s)) == 126


def test_mooncake_sessions_run_open_loop_with_session_metrics():
    data = _scenario(cache={"num_gpu_blocks": 20000}, scheduler={"max_model_len": 131072})
    data["workload"] = {
        "kind": "sessions",
        "sessions": {"source": "mooncake", "path": str(MOONCAKE)},
        "first_n": 300,
        "rate_scale": 20.0,
    }
    result = _run(data)
    specs = load_workload(WorkloadConfig.model_validate(data["workload"]))
    rows = result.requests.set_index("request_id")
    for spec in specs:  # open loop: every request at its own (scaled) time
        assert rows.loc[spec.request_id, "arrival_s"] == spec.arrival_s
    summary = result.summary["sessions"]
    assert summary["num_turns"] == 300 and summary["per_turn"][1]["turn"] == 2
    assert summary["later_turns_prefix_hit_rate"] > summary["per_turn"][0]["prefix_hit_rate"]


# ---------------------------------------------------------------------------- fuzz
def test_fuzz_draws_sessions_cases_and_leaves_the_others_unchanged(monkeypatch):
    from sim.ci import fuzz_cases
    from sim.ci.fuzz_cases import case_seed, generate_case
    from sim.scenario.schema import scenario_to_yaml

    cases = [generate_case("v1-engine", case_seed(0, i)) for i in range(60)]
    with_sessions = [c for c in cases if c.workload.kind == "sessions"]
    assert 3 <= len(with_sessions) <= 30
    monkeypatch.setattr(fuzz_cases, "_sessions", lambda *args: None)
    for index, case in enumerate(cases):
        if case.workload.kind != "sessions":
            again = generate_case("v1-engine", case_seed(0, index))
            assert scenario_to_yaml(again) == scenario_to_yaml(case)
    for case in with_sessions[:4]:
        result = run(case)
        assert result.sessions is not None
        assert result.sessions["num_turns"].sum() == len(result.requests)


def test_pinned_fuzz_case_seeds_still_draw_their_inline_cases():
    from sim.ci.fuzz_cases import PINNED_INLINE_CASES, _sessions

    cache, scheduler = {"block_size": 16}, {"max_model_len": 256}
    for seed in PINNED_INLINE_CASES:
        assert _sessions(seed, cache, scheduler) is None, seed


def test_self_contained_scenario_makes_the_mooncake_sessions_path_absolute(tmp_path):
    """`kvsim run` saves the scenario as run (for `kvsim shrink`): the trace must still resolve."""
    from sim.engine.run import self_contained

    data = _scenario()
    data["workload"] = {"kind": "sessions", "sessions": {"source": "mooncake", "path": "t.jsonl"}}
    saved = self_contained(scenario_from_dict(data, "t"), tmp_path)
    assert saved.workload.sessions.path == str(tmp_path.resolve() / "t.jsonl")


def test_is_session_workload_agrees_with_the_requests(tmp_path):
    """Decided from the metadata, the answer is still whether any request is a session turn,
    for every kind of workload (sessions, Mooncake sessions, a trace, synthetic, inline)."""
    from sim.output.sessions import is_session_workload

    trace = tmp_path / "t.csv"
    trace.write_text("arrival_s,prompt_tokens,output_tokens\n0.0,8,2\n0.1,8,2\n")
    configs = [
        {"kind": "sessions", "sessions": SESSIONS},
        {"kind": "sessions", "sessions": {"source": "mooncake", "path": str(MOONCAKE)}},
        {"kind": "trace", "path": str(trace), "format": "canonical"},
        {"kind": "synthetic", "num_requests": 3, "arrival": {"rate_per_s": 5.0}}
        | {"lengths": {"prompt": {"kind": "fixed", "value": 8}, "output": SESSIONS["output"]}},
        {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 4, "output_tokens": 2}],
        },
    ]
    answers = []
    for config in configs:
        workload = load_workload(WorkloadConfig.model_validate(config), tmp_path)
        expected = any(spec.session_id is not None for spec in workload.requests)
        assert is_session_workload(workload) == expected, config
        answers.append(expected)
    assert answers == [True, True, False, False, False]
