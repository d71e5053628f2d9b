"""The decode cohort (`sim.scheduler.fast.cohort`) changes no result, only the work per step.

Two levels: the cohort's own bookkeeping against a naive model that keeps every member's
tokens explicitly (hypothesis), and whole replays with the cohort on and off (and with the
decode fast path off, which visits and calls for every decode): the built-in scenario under
pool pressure, and small drawn cases (hypothesis, shrinkable) over every design with prefix
caching, sliding windows, chunked prefill, swapping, lookahead slots, priorities and replicas.
The manager-level comparison of the fast path is tests/scheduler/test_decode_fast_path.py.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.ci.fuzz_cases import FUZZ_STEP_TIME, sim_time_limit_s
from sim.ci.selfcheck import tables_of
from sim.engine.engine import Engine
from sim.engine.run import builtin_scenario_path, resolve, run
from sim.kv.types import TokenContent
from sim.latency.batch import BatchShape, DecodeBulk
from sim.output.results import build_result
from sim.scenario.schema import scenario_from_dict
from sim.scheduler.fast.cohort import DecodeCohort
from sim.scheduler.request import Request


def _request(request_id: int, num_tokens: int) -> Request:
    return Request.new(request_id, 0.0, TokenContent.unique(request_id, num_tokens), 10_000)


@settings(max_examples=150, deadline=None)
@given(
    window=st.one_of(st.none(), st.integers(1, 40)),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["join", "leave", "tick", "due"]),
            st.integers(0, 7),
            st.integers(2, 30),
            st.integers(1, 20),
        ),
        max_size=80,
    ),
)
def test_cohort_sums_and_tokens_match_explicit_bookkeeping(window, ops):
    """Members' implicit tokens, the context sums and the due events equal what explicit
    per-request counting gives, under any sequence of joins, leaves, ticks, event pops and
    re-filings."""
    cohort = DecodeCohort(window)
    requests = [_request(i, 5 + i) for i in range(8)]
    expected_tokens = {r.request_id: r.seq.content.num_tokens for r in requests}
    events: dict[int, int] = {}  # request id -> event length
    members: set[int] = set()
    for op, index, gap, _ in ops:
        request = requests[index]
        rid = request.request_id
        if op == "join" and rid not in members:
            event_len = expected_tokens[rid] + gap - 1
            assert cohort.join(request, event_len) == (gap > 1)
            if gap > 1:
                members.add(rid)
                events[rid] = event_len
        elif op == "leave" and rid in members:
            cohort.leave(request)
            members.discard(rid)
        elif op == "tick":
            due_now = {r for r in members if expected_tokens[r] >= events[r]}
            if due_now:
                continue  # a scheduler takes due members out before a step runs the rest
            cohort.tick(1.0)
            for member in members:
                expected_tokens[member] += 1
        elif op == "due":
            due = cohort.pop_due()
            assert {r.request_id for r in due} == {
                r for r in members if expected_tokens[r] == events[r]
            }
            for member in due:  # brought up to date in place, still members
                mid = member.request_id
                assert member.seq.content.num_tokens == expected_tokens[mid]
                if (gap + mid) % 2:
                    cohort.leave(member)
                    members.discard(mid)
                else:  # its decode ran: filed under its next event (at least one step on)
                    cohort.refile(member, expected_tokens[mid] + gap - 3)
                    events[mid] = max(expected_tokens[mid] + gap - 3, expected_tokens[mid] + 1)
        contexts = [expected_tokens[m] - 1 for m in members]
        bulk = cohort.bulk()
        assert bulk.num_seqs == len(members) == len(cohort)
        assert bulk.context_tokens == sum(contexts)
        cap = window if window is not None else 10**9
        assert bulk.windowed_context_tokens == sum(min(c, cap) for c in contexts)
    cohort.release_all()
    assert len(cohort) == 0 and cohort.bulk().context_tokens == 0
    for request in requests:
        assert request.seq.content.num_tokens == expected_tokens[request.request_id]


def test_batch_shape_bulk_reads_like_listed_decodes():
    listed = BatchShape((100, 3000, 5000), ((10, 20),))
    bulk = BatchShape((100,), ((10, 20),), DecodeBulk(2, 8000, 4096, 3000 + 4096))
    assert listed.num_decode_seqs == bulk.num_decode_seqs == 3
    assert listed.total_context_tokens == bulk.total_context_tokens == 8110
    assert listed.decode_windowed_context_sum(4096) == bulk.decode_windowed_context_sum(4096)
    with pytest.raises(ValueError, match="window 4096, not 1024"):
        bulk.decode_windowed_context_sum(1024)


CASES = [
    ("v0-v2", {}),
    ("v0-v2", {"scheduler.enable_chunked_prefill": True}),
    ("v0-v1", {"scheduler.preemption_mode": "swap"}),
    ("v0-fixed", {"engine.num_replicas": 2, "engine.router": "least_outstanding"}),
    ("v1-engine", {"scheduler.enable_chunked_prefill": True}),
    ("v1-engine", {"scheduler.enable_chunked_prefill": False, "scheduler.max_model_len": 8192}),
    # Unpinned v1-engine cases run the latest release; these keep the older pins covered and
    # 0.33.0's priority rule (the cohort is off under PRIORITY: walk and slow path compared).
    ("v1-engine", {"scheduler.enable_chunked_prefill": True, "scheduler.vllm_version": "4ac7713"}),
    ("v1-engine", {"scheduler.enable_chunked_prefill": True, "scheduler.policy": "priority"}),
]


@pytest.mark.parametrize("design,extra", CASES)
def test_decode_cohort_changes_no_result(design, extra):
    """Replays under pool pressure (preemptions, a full pool) give identical tables with the
    cohort on, with it off, and with no fast path at all."""
    overrides = {
        "workload.first_n": 300,
        "workload.rate_scale": 3,
        "scheduler.design": design,
        **extra,
    }
    path = builtin_scenario_path()
    cohort = run(path, overrides=overrides)
    walk = run(path, overrides={**overrides, "scheduler.decode_cohort": False})
    slow = run(path, overrides={**overrides, "scheduler.decode_fast_path": False})
    assert cohort.summary["num_preemptions"] > 0  # the pool is under pressure
    for name in ("requests", "steps", "violations"):
        pd.testing.assert_frame_equal(getattr(cohort, name), getattr(walk, name), check_exact=True)
        pd.testing.assert_frame_equal(getattr(cohort, name), getattr(slow, name), check_exact=True)


def test_rejoined_member_is_due_once():
    """Regression (found by `kvsim fuzz` on the V1 engine): a member that left and rejoined
    with the same event clock sits twice in that clock's bucket; `pop_due` must return it once
    (a second `leave` raised KeyError)."""
    cohort = DecodeCohort(window=None)
    request = _request(1, 10)
    assert cohort.join(request, 13)  # event at clock 3
    cohort.leave(request)
    assert cohort.join(request, 13)  # the same clock again: two entries in one bucket
    for _ in range(3):
        assert cohort.pop_due() == []
        cohort.tick(1.0)
    assert cohort.pop_due() == [request]
    cohort.leave(request)
    assert len(cohort) == 0


# ---------------------------------------------------------------- shrinkable replays
# Whole replays of small drawn cases (cache, scheduler, workload; prefix caching, sliding
# windows, chunked prefill, swap, lookahead slots, priority, replicas), each run three ways:
# fast path and cohort on, cohort off, both off. The requests and steps tables must be
# byte-identical, and the violations and summary too once repeated reports of a persisting
# corruption are dropped (`sim.ci.selfcheck.tables_of`: the full audit re-checks the pool
# after every call, and the fast path makes fewer). Hypothesis shrinks a failure.

#: The three ways to run one case: (decode_fast_path, decode_cohort).
SHORTCUTS = {"cohort": (True, True), "walk": (True, False), "slow": (False, False)}
#: Every design (v0-v1 refuses lookahead slots, as vLLM's BlockSpaceManagerV1 does).
DESIGNS = ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"]


@st.composite
def replay_cases(draw, design: str) -> tuple[dict, int]:
    """A valid scenario (as a dict) for `design` and a number of lookahead slots.

    The same constraints as `kvsim fuzz` (`sim.ci.fuzz`): on v0 a sliding window excludes
    prefix caching and chunked prefill; the V1 engine only recomputes; one max-length request
    fits the pool."""
    is_v0 = design != "v1-engine"
    block_size = draw(st.sampled_from([2, 4, 8, 16]))
    num_gpu_blocks = draw(st.integers(6, 40))
    window = draw(st.one_of(st.none(), st.integers(1, 6 * block_size)))
    caching = draw(st.booleans()) and not (is_v0 and window is not None)
    chunked = draw(st.booleans()) and not (is_v0 and window is not None)
    mode = draw(st.sampled_from(["auto", "recompute", "swap"])) if is_v0 else "recompute"
    num_cpu_blocks = 0 if mode == "recompute" else draw(st.integers(0, 2 * num_gpu_blocks))
    usable_blocks = num_gpu_blocks if is_v0 else num_gpu_blocks - 2
    max_model_len = draw(st.integers(2 * block_size, usable_blocks * block_size))
    max_num_seqs = draw(st.integers(1, 8))
    policy = draw(st.sampled_from(["fcfs", "fcfs", "priority"]))
    scheduler = {
        "design": design,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "enable_chunked_prefill": chunked,
        "policy": policy,
        "preemption_mode": mode,
    }
    if not is_v0:  # the shortcuts are for synchronous scheduling (async turns them off)
        scheduler["async_scheduling"] = False
    if chunked and draw(st.booleans()):
        low = max(max_num_seqs, block_size)
        scheduler["max_num_batched_tokens"] = draw(st.integers(low, max(low, max_model_len)))
    lookahead = 0 if design == "v0-v1" else draw(st.sampled_from([0, 0, 0, 1, 3]))
    prefix_lens = draw(st.lists(st.integers(1, max(1, max_model_len // 2)), min_size=3, max_size=3))
    requests = []
    arrival_s = 0.0
    for gap_s, prompt, output, prefix, priority in draw(
        st.lists(
            st.tuples(
                st.sampled_from([0.0, 0.002, 0.01, 0.05]),
                st.integers(1, max_model_len + block_size),
                st.integers(1, 3 * block_size),
                st.one_of(st.none(), st.integers(0, 2)),
                st.integers(0, 3),
            ),
            min_size=1,
            max_size=16,
        )
    ):
        arrival_s = round(arrival_s + gap_s, 6)
        request = {"arrival_s": arrival_s, "prompt_tokens": prompt, "output_tokens": output}
        if policy == "priority":
            request["priority"] = priority
        if prefix is not None:
            request["prefix_id"] = prefix
            request["prefix_tokens"] = min(prompt, prefix_lens[prefix])
        requests.append(request)
    data = {
        "name": "shortcut-replay",
        "model": None,
        "cache": {
            "block_size": block_size,
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": num_cpu_blocks,
            "sliding_window": window,
            "enable_prefix_caching": caching,
            "watermark": draw(st.sampled_from([0.0, 0.01, 0.1])),
        },
        "scheduler": scheduler,
        "engine": {
            "num_replicas": draw(st.sampled_from([1, 1, 2])),
            # The prefix-cache router only where it does something (V1, prefix caching):
            # kvsim refuses it elsewhere (sim.scenario.no_effect).
            "router": draw(
                st.sampled_from(
                    ["round_robin", "least_outstanding", "least_kv_usage"]
                    + (["prefix_cache_aware"] if design == "v1-engine" and caching else [])
                )
            ),
            "audit_level": "full",
            "max_sim_time_s": sim_time_limit_s(requests),
        },
        "workload": {"kind": "inline", "requests": requests},
        "step_time": FUZZ_STEP_TIME,
    }
    return data, lookahead


def replay(data: dict, lookahead: int, fast_path: bool, cohort: bool) -> tuple[dict, int]:
    """Every table as CSV text plus the summary as JSON, and the manager calls made."""
    resolved = resolve(scenario_from_dict(data, "drawn case"))
    scheduler = dataclasses.replace(
        resolved.engine.scheduler,
        num_lookahead_slots=lookahead,
        decode_fast_path=fast_path,
        decode_cohort=cohort,
    )
    config = dataclasses.replace(resolved.engine, scheduler=scheduler)
    engine = Engine(config, resolved.workload.requests, resolved.step_time)
    result = build_result(engine.run(), resolved.inputs)
    # Byte-identical requests and steps; violations without repeats (`sim.ci.selfcheck`).
    tables = tables_of(result)
    tables["dtypes"] = repr([getattr(result, n).dtypes.to_dict() for n in ("requests", "steps")])
    return tables, sum(replica.manager.num_calls for replica in engine.replicas)


def assert_shortcuts_change_nothing(data: dict, lookahead: int) -> dict[str, int]:
    runs = {name: replay(data, lookahead, *flags) for name, flags in SHORTCUTS.items()}
    expected = runs["slow"][0]
    for name in ("cohort", "walk"):
        for table, text in runs[name][0].items():
            assert text == expected[table], f"{table} differs with {name} vs slow"
    calls = {name: num_calls for name, (_, num_calls) in runs.items()}
    # Skipping a quiet decode's call can only remove calls.
    assert calls["cohort"] <= calls["slow"] and calls["walk"] <= calls["slow"], calls
    return calls


@pytest.mark.parametrize("design", DESIGNS)
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shortcuts_change_no_table_on_drawn_cases(design, data):
    scenario, lookahead = data.draw(replay_cases(design), label="case")
    assert_shortcuts_change_nothing(scenario, lookahead)


@pytest.mark.slow
@pytest.mark.parametrize("design", DESIGNS)
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_shortcuts_change_no_table_on_many_drawn_cases(design, data):
    scenario, lookahead = data.draw(replay_cases(design), label="case")
    assert_shortcuts_change_nothing(scenario, lookahead)


@pytest.mark.parametrize("design", DESIGNS)
def test_the_drawn_comparison_is_not_vacuous(design):
    """The comparison above exercises the shortcuts: on a plain case they skip calls."""
    requests = [
        {"arrival_s": 0.001 * i, "prompt_tokens": 5 + i, "output_tokens": 40} for i in range(6)
    ]
    data = {
        "name": "plain-decodes",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 40, "num_cpu_blocks": 0},
        "scheduler": {"design": design, "max_model_len": 256, "preemption_mode": "recompute"},
        "workload": {"kind": "inline", "requests": requests},
        "step_time": FUZZ_STEP_TIME,
    }
    if design == "v1-engine":  # the shortcuts are for synchronous scheduling
        data["scheduler"]["async_scheduling"] = False
    calls = assert_shortcuts_change_nothing(data, 0)
    assert calls["cohort"] < calls["slow"] and calls["walk"] < calls["slow"], calls
    # With lookahead slots the fast path is off: every decode calls the manager.
    if design != "v0-v1":
        calls = assert_shortcuts_change_nothing(data, 2)
        assert calls["cohort"] == calls["walk"] == calls["slow"], calls
