"""Session-level metrics of a multi-turn workload (`sim.workload.sessions`), from the requests.

The `sessions` table has one row per session:

* ``num_turns`` (the session's turns in the workload), ``num_finished`` (turns that finished);
* ``start_s`` (turn 1's arrival), ``end_s`` (the last turn's end), ``total_s`` = end - start;
* ``time_per_turn_s`` = total_s / num_finished (think times included: the pace of the
  conversation as its user sees it);
* ``prompt_tokens``, ``prefix_hit_tokens`` and ``prefix_hit_rate`` = hits / prompt tokens, over
  its finished turns.

The summary (``summary["sessions"]``) gives counts, medians of the above and, per turn index,
the TTFT median and the prefix-cache hit rate (sum of ``num_prefix_hit_tokens`` / sum of
``prompt_tokens`` over the finished requests of that turn).

Example: a session of 2 turns, arrivals 0 s and 3 s, finishes 1 s and 4 s, prompts 100 and 150
tokens with 0 and 128 hit tokens -> total_s 4, time_per_turn_s 2, prefix_hit_rate 128 / 250.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sim.workload.request import Workload

if TYPE_CHECKING:  # pandas loads with the first session table, not with `sim.engine.run`
    import pandas as pd

SESSION_COLUMNS = [
    "session_id",
    "num_turns",
    "num_finished",
    "start_s",
    "end_s",
    "total_s",
    "time_per_turn_s",
    "prompt_tokens",
    "prefix_hit_tokens",
    "prefix_hit_rate",
]


def is_session_workload(workload: Workload) -> bool:
    """Whether `workload` has session turns (then the run gets a sessions table).

    Decided from the metadata where it can be, without iterating the requests (a streamed
    trace, `sim.workload.trace_stream`, would be read once more just to answer): the two loaders
    that make turns, `synthetic_sessions` (format "sessions") and `infer_sessions` (a "sessions"
    record), give every request a session, so a non-empty workload of theirs has turns. Requests
    held in memory (inline, or built by hand) are asked directly; a streamed or lazily drawn
    workload (a trace, a synthetic draw) has no loader that gives it turns.
    """
    meta = workload.metadata
    if meta.get("format") == "sessions" or "sessions" in meta:
        return len(workload) > 0
    if isinstance(workload.requests, list | tuple):
        return any(spec.session_id is not None for spec in workload.requests)
    return False


def turns_frame(workload: Workload, requests: pd.DataFrame) -> pd.DataFrame:
    """The requests of session turns, with their ``session_id`` and ``turn``, by request id."""
    import pandas as pd

    specs = [s for s in workload.requests if s.session_id is not None]
    ids = pd.DataFrame(
        {
            "request_id": np.array([s.request_id for s in specs], dtype=np.int64),
            "session_id": np.array([s.session_id for s in specs], dtype=np.int64),
            "turn": np.array([s.turn for s in specs], dtype=np.int64),
        }
    )
    turns = ids.merge(requests, on="request_id", how="left", validate="one_to_one")
    return turns.sort_values("request_id", kind="stable").reset_index(drop=True)


def sessions_frame(turns: pd.DataFrame) -> pd.DataFrame:
    """One row per session (see the module docstring), sorted by session id."""
    import pandas as pd

    done = turns["state"] == "finished"
    frame = turns.assign(
        finished=done.astype(np.int64),
        hit=turns["num_prefix_hit_tokens"].where(done, 0),
        prompt=turns["prompt_tokens"].where(done, 0),
    )
    grouped = frame.groupby("session_id", sort=True)
    out = pd.DataFrame(
        {
            "num_turns": grouped["turn"].size().astype(np.int64),
            "num_finished": grouped["finished"].sum().astype(np.int64),
            "start_s": grouped["arrival_s"].min(),
            "end_s": grouped["finish_s"].max(),
            "prompt_tokens": grouped["prompt"].sum().astype(np.int64),
            "prefix_hit_tokens": grouped["hit"].sum().astype(np.int64),
        }
    ).reset_index()
    out["total_s"] = out["end_s"] - out["start_s"]
    out["time_per_turn_s"] = out["total_s"] / out["num_finished"].where(out["num_finished"] > 0)
    out["prefix_hit_rate"] = out["prefix_hit_tokens"] / out["prompt_tokens"].where(
        out["prompt_tokens"] > 0
    )
    return out[SESSION_COLUMNS]


def _median(series: pd.Series) -> float | None:
    values = series.dropna().to_numpy()
    return float(np.median(values)) if len(values) else None


def per_turn(turns: pd.DataFrame) -> list[dict]:
    """Per turn index: requests, finished, TTFT median and the pooled prefix-cache hit rate."""
    rows = []
    for turn, group in turns.groupby("turn", sort=True):
        done = group[group["state"] == "finished"]
        prompt_tokens = int(done["prompt_tokens"].sum())
        hit_tokens = int(done["num_prefix_hit_tokens"].sum())
        rows.append(
            {
                "turn": int(turn),
                "num_requests": int(len(group)),
                "num_finished": int(len(done)),
                "ttft_p50_s": _median(done["ttft_s"]),
                "prefix_hit_rate": hit_tokens / prompt_tokens if prompt_tokens else None,
            }
        )
    return rows


def session_summary(sessions: pd.DataFrame, turns: pd.DataFrame) -> dict:
    """``summary["sessions"]``: counts, medians and the per-turn list (no NaN: None)."""
    complete = sessions["num_finished"] == sessions["num_turns"]
    later = turns[(turns["turn"] > 1) & (turns["state"] == "finished")]
    later_prompt = int(later["prompt_tokens"].sum())
    summary = {
        "num_sessions": int(len(sessions)),
        "num_turns": int(len(turns)),
        "num_complete_sessions": int(complete.sum()),
        "turns_per_session_max": int(sessions["num_turns"].max()) if len(sessions) else 0,
        "total_p50_s": _median(sessions["total_s"]),
        "time_per_turn_p50_s": _median(sessions["time_per_turn_s"]),
        "later_turns_prefix_hit_rate": (
            int(later["num_prefix_hit_tokens"].sum()) / later_prompt if later_prompt else None
        ),
        "per_turn": per_turn(turns),
    }
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in summary.items()}


def session_tables(workload: Workload, requests: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """The `sessions` table and its summary for a session workload's requests table."""
    turns = turns_frame(workload, requests)
    sessions = sessions_frame(turns)
    return sessions, session_summary(sessions, turns)
