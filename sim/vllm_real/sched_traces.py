"""Trace windows for the scheduler lockstep: a few consecutive requests of a real trace, scaled
down to a small engine, as `sched_workloads.Workload`s.

A window keeps the trace's order, arrival gaps (one engine step per `STEP_S` seconds, the
order of a decode step) and prefix structure (Mooncake's shared hash blocks stay shared); token
counts are divided by `TOKEN_SCALE` so a window runs in tens of steps on a pool of tens of
blocks. Arrival times are the trace's own plus a microsecond per position in the window: a
real frontend stamps each arrival at receipt, while a trace logs them to the millisecond, and
equal (priority, arrival) pairs are what vLLM 0.11.0's PRIORITY queue cannot order
(`sched_lockstep.RealRaised`; the random workloads keep such ties on purpose).

Example: Mooncake request 5 (4,834 prompt tokens, first 512-token block shared as key 0, 173
outputs) becomes a 151-token prompt whose first 16 tokens are key 0, and 21 outputs
(173 // 8).
"""

from __future__ import annotations

import random
from pathlib import Path

from sim.vllm_real.sched_case import RequestSpec, SchedCase
from sim.vllm_real.sched_workloads import Workload
from sim.workload.loaders import load_trace
from sim.workload.request import RequestSpec as TraceRequest

#: The bundled trace with shared prefixes (Mooncake FAST'25 conversation trace).
DEFAULT_TRACE = (
    Path(__file__).resolve().parents[1] / "data/traces/mooncake_fast25/conversation_trace.jsonl"
)
#: Prompt tokens are divided by this, output tokens by `OUTPUT_SCALE` (capped at MAX_OUTPUT).
TOKEN_SCALE = 32
OUTPUT_SCALE = 8
MAX_OUTPUT = 48
#: Seconds of trace time per engine step.
STEP_S = 0.02
MAX_MODEL_LEN = 512


def _scaled(request: TraceRequest) -> tuple[tuple[int, int], ...]:
    """The prompt's segments, each divided by TOKEN_SCALE, clipped to MAX_MODEL_LEN - 1."""
    segments = [(seg.key, seg.num_tokens // TOKEN_SCALE) for seg in request.prefix]
    rest = (request.prompt_tokens - request.num_prefix_tokens) // TOKEN_SCALE
    segments.append((request.unique_key, max(rest, 1 if not request.prefix else 0)))
    out, total = [], 0
    for key, num in segments:
        num = min(num, MAX_MODEL_LEN - 1 - total)
        if num > 0:
            out.append((key, num))
            total += num
    return tuple(out) if out else ((request.unique_key, 1),)


def trace_windows(num_windows: int, seed: int = 0, path: Path = DEFAULT_TRACE) -> list[Workload]:
    """`num_windows` random windows of 4-10 consecutive requests of the trace at `path`."""
    requests = load_trace(Path(path)).requests
    rng = random.Random(seed)
    workloads = []
    for _ in range(num_windows):
        size = rng.randint(4, 10)
        start = rng.randrange(max(1, len(requests) - size))
        window = requests[start : start + size]
        t0 = window[0].arrival_s
        chunked = rng.random() < 0.8
        max_num_seqs = rng.randint(2, 8)
        min_blocks = MAX_MODEL_LEN // 16 + 1
        case = SchedCase(
            num_blocks=min_blocks + rng.randint(0, min_blocks),
            block_size=16,
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=rng.choice([32, 64, 128, 256]) if chunked else MAX_MODEL_LEN,
            enable_chunked_prefill=chunked,
            enable_prefix_caching=rng.random() < 0.7,
            sliding_window=rng.choice([None, None, None, 64]),
            policy=rng.choice(["fcfs", "priority"]),
        )
        specs = tuple(
            RequestSpec(
                request_id=index,
                prompt=_scaled(request),
                output_len=max(1, min(request.output_tokens // OUTPUT_SCALE, MAX_OUTPUT)),
                arrival_step=min(int((request.arrival_s - t0) / STEP_S), 200),
                # The frontend stamps arrivals at receipt, never equal; a trace logs them to
                # the millisecond (Mooncake: often equal). Keep its order, break the ties.
                arrival_s=request.arrival_s + index * 1e-6,
                priority=request.priority,
            )
            for index, request in enumerate(window)
        )
        workloads.append(Workload(case, specs))
    return workloads
