"""Liveness: the diagnosis recorded as a `no_progress` violation when a queue can never move.

The engine (`sim.engine.engine`) detects two ways a replica stops making progress:

* **stalled**: nothing runs, every arrival is in, and no waiting (or swapped) request can be
  admitted, so the scheduler would return an empty batch forever;
* **livelock**: step after step preempts and readmits without running a single token.

The real engine would hang in both (an engine loop that never finishes its requests). kvsim
aborts what is left, so every request still ends in one terminal state, and records one
`no_progress` violation whose message says what waits, what holds the blocks and why nothing
can be admitted.

A stall vLLM 0.11.0's V1 scheduler shares with kvsim: requests whose async KV load (a P/D
read, a CPU-offload load) has completed wait holding their blocks, and the only running
request needs one more block, preempts itself and heads the queue needing more blocks than
are free. Only running requests are preempted (`v1/core/sched/scheduler.py` L255-286 @0.11.0)
and the waiting loop stops at the head (L481-483), so the requests behind it never run and
never free theirs (the P/D case is checked against vLLM in `tests/test_vllm_pd_deadlock.py`,
the offloading one in `tests/test_kv_offload.py`, `STALL_ROWS`).

Worked example (vLLM 0.5.4 v0-V2, bs=16, G=10 blocks, window 256 tokens so M=18 > G): a first
request decodes, which creates the null block; it finishes. Request 1 (160 tokens) needs
cdiv(160, 16) = 10 blocks, but the null block holds 1 of the 10 for good::

    no progress (stalled): nothing running and no waiting request can be admitted.
    Waiting 1: request 1 needs 10 blocks (160 tokens). Holding: no running request,
    no swapped request; 1 block held by no request (a null block, or leaked); 9 free
    (0 of them cached). Why: the head of the queue, request 1, needs 10 blocks (+0
    watermark) but at most 9 can ever be free while nothing else runs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from sim.kv.types import cdiv

#: Requests named in a diagnosis (the rest are counted): a message stays one readable line.
MAX_NAMED = 5


class Stall(enum.Enum):
    """How the engine found a queue that can never move."""

    STALLED = "stalled"
    LIVELOCK = "livelock"


@dataclass(frozen=True, slots=True)
class NoProgress:
    """A diagnosis: the head of the queue, what it needs, and the message."""

    head_request_id: int | None
    needed_blocks: int | None
    free_blocks: int
    message: str


def _needed_blocks(manager: Any, request: Any) -> int:
    """Blocks the admission check asks for `request` (the v0 managers' own count; else its
    whole table, cdiv(tokens, block_size), which is what a full-fit gate counts)."""
    admission_blocks = getattr(manager, "admission_blocks", None)
    if admission_blocks is not None:
        try:
            return int(admission_blocks(request.group))
        except Exception:  # noqa: BLE001 - a real-vLLM adapter may not answer; fall back
            pass
    return cdiv(request.seq.num_tokens, manager.block_size)


def _named(items: list[str], total: int) -> str:
    shown = ", ".join(items[:MAX_NAMED])
    more = total - min(total, MAX_NAMED)
    return shown + (f" and {more} more" if more else "")


def diagnose(scheduler: Any, manager: Any, stall: Stall, num_empty_steps: int = 0) -> NoProgress:
    """What waits, what holds the blocks, and why nothing can be admitted, in one message.

    `scheduler` is a `V0Scheduler` or `V1Scheduler` (its `waiting`, `running` and, for v0,
    `swapped` queues); `manager` the audited block manager (`pool_stats`, `num_seq_blocks`).
    """
    getattr(scheduler, "materialize", lambda: None)()  # the decode cohort back into `running`
    stats = manager.pool_stats()
    waiting = list(scheduler.waiting)
    running = list(scheduler.running)
    swapped = list(getattr(scheduler, "swapped", ()))
    needs = [(r.request_id, _needed_blocks(manager, r), r.seq.num_tokens) for r in waiting]
    held = [(r.request_id, manager.num_seq_blocks(r.seq.seq_id)) for r in running]
    # Waiting requests that already hold blocks: V1 requests parked for a KV transfer
    # (WAITING_FOR_REMOTE_KVS: allocated, then waiting for the read, `sim.kv_connector`).
    parked = [(r.request_id, n) for r in waiting if (n := manager.num_seq_blocks(r.seq.seq_id)) > 0]
    num_held_by_running = sum(n for _, n in held)
    num_unowned = stats.num_held - num_held_by_running - sum(n for _, n in parked)
    watermark = getattr(manager, "watermark_blocks", 0) or 0

    if stall is Stall.STALLED and running:
        head = "the running requests are scheduled no tokens and nothing else can be admitted"
    elif stall is Stall.STALLED:
        head = "nothing running and no waiting request can be admitted"
    else:
        head = f"{num_empty_steps} steps preempted and readmitted without running anything"
    parts = [f"no progress ({stall.value}): {head}.", _waiting_text(needs)]
    holding = _holding_text(running, held, swapped, parked)
    if num_unowned > 0:
        holding += f"; {num_unowned} block(s) held by no request (a null block, or leaked)"
    holding += f"; {stats.num_free} free ({stats.num_evictable} of them cached)."
    parts.append(holding)
    head_id, head_needed = (needs[0][0], needs[0][1]) if needs else (None, None)
    can_ever_free = stats.num_free + num_held_by_running
    why = _why_text(stall, running, swapped, head_id, head_needed, can_ever_free, watermark, parked)
    if why is not None:
        parts.append(why)
    return NoProgress(head_id, head_needed, stats.num_free, " ".join(parts))


def _waiting_text(needs: list[tuple[int, int, int]]) -> str:
    """The waiting requests and the blocks each needs ((id, blocks, tokens) each)."""
    if not needs:
        return "Waiting: none."
    named = [f"request {i} needs {n} blocks ({t} tokens)" for i, n, t in needs]
    return f"Waiting {len(needs)}: " + _named(named, len(needs)) + "."


def _holding_text(
    running: list[Any],
    held: list[tuple[int, int]],
    swapped: list[Any],
    parked: list[tuple[int, int]],
) -> str:
    """Who holds the blocks: running requests, swapped ones, and requests waiting for KV."""
    if held:
        running_text = _named(
            [
                f"request {r.request_id} holds {n} ({r.seq.num_computed_tokens} of "
                f"{r.seq.num_tokens} tokens computed)"
                for r, (_, n) in zip(running, held, strict=True)
            ],
            len(held),
        )
    else:
        running_text = "no running request"
    if swapped:
        swapped_ids = _named([str(r.request_id) for r in swapped], len(swapped))
        swapped_text = f"{len(swapped)} swapped to CPU (requests {swapped_ids})"
    else:
        swapped_text = "no swapped request"
    holding = "Holding: " + running_text + ", " + swapped_text
    if parked:
        holding += "; waiting for their KV: " + _named(
            [f"request {i} holds {n}" for i, n in parked], len(parked)
        )
    return holding


def _why_text(
    stall: Stall,
    running: list[Any],
    swapped: list[Any],
    head_id: int | None,
    head_needed: int | None,
    can_ever_free: int,
    watermark: int,
    parked: list[tuple[int, int]],
) -> str | None:
    """Why nothing progresses, where the queues say it (None: they do not)."""
    if stall is Stall.STALLED and running:
        return (
            "Why: the scheduler gives each running request 0 new tokens (e.g. a prompt of "
            "max_model_len tokens capped at max_model_len - 1 computed, vLLM #29496), so it "
            "never finishes and never frees its blocks."
        )
    if stall is Stall.STALLED and head_needed is not None:
        # Parked requests free nothing: they wait behind the head for their own turn.
        return (
            f"Why: the head of the queue, request {head_id}, needs {head_needed} blocks "
            f"(+{watermark} watermark) but at most {can_ever_free} can ever be free while "
            "nothing else runs"
            + (" (the requests waiting for their KV keep theirs)." if parked else ".")
        )
    if stall is Stall.STALLED and swapped:
        return "Why: no swapped request can be swapped back in."
    if stall is Stall.LIVELOCK:
        return (
            "Why: each step admits work that preempts the running requests before any token runs."
        )
    return None
