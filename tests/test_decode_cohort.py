"""The decode cohort (`sim.scheduler.cohort`) changes no result, only the work per step.

Two levels: the cohort's own bookkeeping against a naive model that keeps every member's
tokens explicitly (hypothesis), and whole replays under pool pressure with the cohort on and
off (and with the decode fast path off, which visits and calls for every decode).
"""

from __future__ import annotations

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.types import TokenContent
from sim.latency.batch import BatchShape, DecodeBulk
from sim.runner import builtin_scenario_path, run
from sim.scheduler.cohort import DecodeCohort
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
