"""Multi-turn sessions: synthetic closed-loop conversations and sessions inferred from Mooncake.

A session is a conversation: turn k's prompt is the whole previous context (turn k-1's prompt
and its generated output) plus new user tokens. The previous context is written as content
segments (`sim.workload.request`): turn k-1's prompt segments, then its output under the key the
engine generates it with (``-(request_id + 1)``), so turn k's prompt has the same tokens as turn
k-1's finished sequence and prefix caching hits every full block of it.

Worked example (one session, first prompt 100, new tokens 20, outputs 30, request ids 0, 1)::

    turn 1: id 0, prompt 100 = Segment(U + 0, 100)                     (U = UNIQUE_KEY_BASE)
    turn 2: id 1, prompt 150 = Segment(U + 0, 100), Segment(-1, 30),   the context: 130 tokens
                               Segment(U + 1, 20)                      the new user tokens

With block size 16 the context holds 8 full blocks (128 tokens), so turn 2 can hit 128 of its
150 prompt tokens; the last 2 context tokens sit in turn 1's partial block, which is not cached.

Synthetic sessions are closed loop: turn 1 arrives at the session's start, turn k > 1 arrives
`think_s` after turn k-1 finished (`RequestSpec.think_s`; the engine schedules it). A turn that
does not finish normally (ignored, failed, aborted, or cut short of its output tokens) ends its
session: its later turns never arrive (`sim.engine.engine`).

Mooncake sessions (`infer_sessions`) keep the trace's arrival times (open loop): the trace has
arrivals but no finish times, so a think time cannot be told apart from the original service
time, and some follow-ups are shorter than their parent's prompt plus output.

On the bundled conversation trace (`sim/data/traces/mooncake_fast25/conversation_trace.jsonl`)
the rule gives: 12,031 requests -> 8,056 sessions, 2,012 of them with 2+ turns (5,987
requests), 3,975 follow-up turns, the longest session 43 turns. A follow-up's prompt exceeds
its parent's prompt plus output by a median of 26 tokens (the user's new message), but 427 of
the 3,975 are shorter than that (the output was not kept whole), and the gap between turns is a
median 126 s (think time and the original serving time together). The follow-ups share only
their parent's full 512-token blocks: the trace's ids do not say which of their tokens repeat
the parent's output.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from sim.kv.types import Segment
from sim.workload.config import SessionsConfig, ThinkTimeDist
from sim.workload.request import RequestSpec, Workload
from sim.workload.synthetic import arrival_times, sample_lengths, stream

#: Stream labels (see `sim.workload.synthetic.stream`), apart from the synthetic kind's 0..2.
_START, _TURNS, _FIRST, _NEW, _OUTPUT, _THINK = 10, 11, 12, 13, 14, 15
#: A Mooncake follow-up must extend at least this many full blocks of its parent: block 0 is a
#: system prompt that almost every request of the conversation trace shares.
MIN_SHARED_BLOCKS = 2


def think_times_s(dist: ThinkTimeDist, num: int, rng: np.random.Generator) -> np.ndarray:
    """`num` think times in seconds (float64, >= 0).

    Lognormal with mean m and cv c: sigma**2 = ln(1 + c**2), mu = ln(m) - sigma**2 / 2.
    Example: m 5 s, c 1 -> sigma 0.833, mu 1.263; median exp(mu) = 3.54 s.
    """
    if dist.kind == "fixed":
        return np.full(num, dist.mean_s)
    if dist.kind == "exponential":
        return rng.exponential(dist.mean_s, num) if dist.mean_s > 0 else np.zeros(num)
    assert dist.cv is not None  # config validation
    sigma2 = np.log1p(dist.cv**2)
    return rng.lognormal(np.log(dist.mean_s) - sigma2 / 2, np.sqrt(sigma2), num)


def synthetic_sessions(config: SessionsConfig, seed: int) -> Workload:
    """Seeded closed-loop sessions; request ids are session-major (session 0's turns first).

    Each quantity has its own stream, so changing e.g. the think times moves nothing else.
    """
    assert config.num_sessions and config.arrival and config.turns  # config validation
    assert config.first_prompt and config.new_tokens and config.output and config.think_s
    num_sessions = config.num_sessions
    starts_s = arrival_times(num_sessions, config.arrival, stream(seed, _START))
    num_turns = stream(seed, _TURNS).integers(config.turns.min, config.turns.max + 1, num_sessions)
    total = int(num_turns.sum())
    here = Path(".")  # no trace-backed distributions (config validation)
    first = sample_lengths(
        config.first_prompt, num_sessions, stream(seed, _FIRST), column="first", base_dir=here
    )
    new = sample_lengths(config.new_tokens, total, stream(seed, _NEW), column="new", base_dir=here)
    output = sample_lengths(
        config.output, total, stream(seed, _OUTPUT), column="output", base_dir=here
    )
    think = think_times_s(config.think_s, total, stream(seed, _THINK))
    specs: list[RequestSpec] = []
    for session_id in range(num_sessions):
        context: tuple[Segment, ...] = ()
        earliest_s = float(starts_s[session_id])
        for turn in range(1, int(num_turns[session_id]) + 1):
            request_id = len(specs)
            new_tokens = int(first[session_id] if turn == 1 else new[request_id])
            think_s = None if turn == 1 else float(think[request_id])
            earliest_s += think_s or 0.0
            spec = RequestSpec(
                request_id,
                earliest_s,
                sum(seg.num_tokens for seg in context) + new_tokens,
                int(output[request_id]),
                prefix=context,
                session_id=session_id,
                turn=turn,
                think_s=think_s,
            )
            specs.append(spec)
            # The next turn's context: this prompt, then this turn's output as generated.
            context = (
                *spec.prompt_content().segments,
                Segment(-(request_id + 1), spec.output_tokens),
            )
    specs.sort(key=lambda s: (s.arrival_s, s.request_id))
    meta = {
        "format": "sessions",
        "source": "synthetic",
        "num_rows": total,
        "num_sessions": num_sessions,
    }
    return Workload(specs, "synthetic sessions", meta)


def infer_sessions(workload: Workload, block_tokens: int) -> Workload:
    """Group a Mooncake workload's requests into sessions by their ``hash_ids`` chains.

    Rule: request j continues request i (its parent) when i arrived before j and i's full
    blocks (its first ``prompt_tokens // block_tokens`` hash ids, at least `MIN_SHARED_BLOCKS`)
    are the first ids of j; of several such i, the one with the most full blocks, then the
    latest. A request without a parent starts a session (its id is the session id); a follow-up
    has its parent's session and turn + 1. Hash ids are chained (an id names its block and all
    before it), so a prefix is found by its last id alone.

    Example (block 512): i has 1100 tokens, ids [0, 5, 9] -> full blocks [0, 5]; j with ids
    [0, 5, 11, 12] continues i (turn 2); k with ids [0, 7] starts a session of its own.
    Arrival times are kept (open loop, see the module docstring).
    """
    prefix_to_index: dict[tuple[int, int], int] = {}
    session_ids: list[int] = []
    turns: list[int] = []
    for index, spec in enumerate(workload.requests):
        ids = [seg.key for seg in spec.prefix]
        parent = None
        for k in range(len(ids), MIN_SHARED_BLOCKS - 1, -1):
            parent = prefix_to_index.get((k, ids[k - 1]))
            if parent is not None:
                break
        if parent is None:
            session_ids.append(spec.request_id)
            turns.append(1)
        else:
            session_ids.append(session_ids[parent])
            turns.append(turns[parent] + 1)
        num_full = spec.prompt_tokens // block_tokens
        if num_full >= MIN_SHARED_BLOCKS and len(ids) >= num_full:
            prefix_to_index[(num_full, ids[num_full - 1])] = index
    specs = [
        dataclasses.replace(spec, session_id=session, turn=turn)
        for spec, session, turn in zip(workload.requests, session_ids, turns, strict=True)
    ]
    meta = {
        **workload.metadata,
        "sessions": {
            "rule": "hash_ids chains",
            "min_shared_blocks": MIN_SHARED_BLOCKS,
            "num_sessions": len(set(session_ids)),
            "num_follow_ups": sum(t > 1 for t in turns),
            "max_turn": max(turns, default=0),
        },
    }
    return Workload(specs, workload.source, meta)
