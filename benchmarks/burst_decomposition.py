"""Where kvsim's predicted TTFT and TPOT go, per request, on a replayed public point.

    python benchmarks/burst_decomposition.py                   # the two burst points below
    python benchmarks/burst_decomposition.py --ids a,b         # any points of the table
    python benchmarks/burst_decomposition.py --ids a --timeline 20   # 20 rows of batch size

A diagnostic, not a model: it replays a point exactly as `serving_accuracy.py` does (same
importer, release, API server costs, test run, warm-server history) and records, on the side,
when each request of the benchmark's run reached the engine core and every token's sample time
before the API server rewrote it to the client's time. TTFT splits into four parts that add up
to it exactly (send -> client's first token):

- `intake`: send -> the API server hands the request to the scheduler (its loop's wait and
  work, the tokenizer batcher, `hand_off_s`; `sim.engine.frontend`);
- `queue`: -> the scheduler first schedules it (the engine's waiting queue);
- `prefill`: -> its first token is sampled (its prefill step or chunks, async-scheduling lag);
- `stream`: -> the client has that token (the output handler and the SSE chunk on the loop).

TPOT splits into the engine's TPOT (first to last *sampled* token over n-1) plus what the
streaming adds over the same span (`stream dTPOT`, last token's streaming delay minus the
first's, over n-1). The timeline gives the engine's running batch: per slice of the run, the
mean number of running requests, decode sequences and prefill tokens per step, and the mean
step time. Means are over the benchmark's finished requests (the test run and earlier runs are
left out). No GPU; about 10 s per point on 2 shared cores.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from serving_accuracy import load_points, replay, select  # benchmarks/ is the script's folder

from sim.engine.arrivals import EngineArrivals
from sim.engine.engine import Engine
from sim.scheduler import Request

#: The points the helper brief names: a 500-prompt burst on a small model whose TPOT kvsim
#: overpredicts ~5x, and a 1,000-prompt 128/4 burst on a 14B model.
DEFAULT_IDS = ("kvc-qwen3-0.6b-h100-rateinf", "gpustack-qwen3-14b-h100-in128-out4")


@dataclass(slots=True)
class EngineTrace:
    """What one engine run did, recorded beside it."""

    reached_s: dict[int, float] = field(default_factory=dict)
    sampled_s: dict[int, list[float]] = field(default_factory=dict)
    #: Per step: start, duration, running requests, decode sequences, prefill tokens.
    steps: list[tuple[float, float, int, int, int]] = field(default_factory=list)
    requests: dict[int, Request] = field(default_factory=dict)


@contextlib.contextmanager
def recording() -> Iterator[list[EngineTrace]]:
    """Wrap the engine's arrival and step hooks for the duration; one trace per engine made."""
    traces: dict[int, EngineTrace] = {}
    order: list[EngineTrace] = []

    def trace_of(engine: object) -> EngineTrace:
        key = id(engine)
        if key not in traces:
            traces[key] = EngineTrace()
            order.append(traces[key])
        return traces[key]

    arrive, record_step = EngineArrivals._arrive, Engine.record_step

    def _arrive(self: Any, request: Request) -> None:
        trace = trace_of(self)
        trace.reached_s[request.request_id] = self.env.now
        trace.requests[request.request_id] = request
        arrive(self, request)

    def _record_step(self: Any, replica: Any, plan: Any, shape: Any, start_s: float,
                     duration_s: float) -> None:  # fmt: skip
        trace = trace_of(self)
        for work in plan.scheduled:  # the step's new tokens, still at their sample times
            request = work.request
            times = request.token_times_s or []
            seen = trace.sampled_s.setdefault(request.request_id, [])
            seen.extend(times[len(seen) :])
        prefill = sum(chunk for _, chunk in shape.prefill_chunks)
        running = len(replica.scheduler.running)
        trace.steps.append((start_s, duration_s, running, shape.num_decode_seqs, prefill))
        record_step(self, replica, plan, shape, start_s, duration_s)

    EngineArrivals._arrive = _arrive  # type: ignore[method-assign]
    Engine.record_step = _record_step  # type: ignore[method-assign]
    try:
        yield order
    finally:
        EngineArrivals._arrive = arrive  # type: ignore[method-assign]
        Engine.record_step = record_step  # type: ignore[method-assign]


@dataclass(frozen=True, slots=True)
class Decomposition:
    """Means over the benchmark's finished requests, in milliseconds."""

    num_requests: int
    intake_ms: float
    queue_ms: float
    prefill_ms: float
    stream_ms: float
    ttft_ms: float
    engine_tpot_ms: float
    stream_dtpot_ms: float
    tpot_ms: float
    max_running: int


def decompose(trace: EngineTrace, num_prompts: int) -> Decomposition:
    """The benchmark's requests are the engine's last `num_prompts` ids (before them: the test
    run and any earlier runs on the same server)."""
    ids = sorted(trace.requests)[-num_prompts:]
    parts: dict[str, list[float]] = {k: [] for k in ("intake", "queue", "prefill", "stream",
                                                     "ttft", "etpot", "dtpot", "tpot")}  # fmt: skip
    for rid in ids:
        r = trace.requests[rid]
        client, sampled = r.token_times_s or [], trace.sampled_s.get(rid, [])
        if r.first_scheduled_s is None or not client or len(sampled) != len(client):
            continue
        send, reached = r.arrival_s, trace.reached_s[rid]
        for key, value in (("intake", reached - send), ("queue", r.first_scheduled_s - reached),
                           ("prefill", sampled[0] - r.first_scheduled_s),
                           ("stream", client[0] - sampled[0]), ("ttft", client[0] - send)):  # fmt: skip
            parts[key].append(value)
        n = len(client)
        if n > 1:
            parts["etpot"].append((sampled[-1] - sampled[0]) / (n - 1))
            lag_first, lag_last = client[0] - sampled[0], client[-1] - sampled[-1]
            parts["dtpot"].append((lag_last - lag_first) / (n - 1))
            parts["tpot"].append((client[-1] - client[0]) / (n - 1))
    mean = {k: 1e3 * statistics.fmean(v) if v else math.nan for k, v in parts.items()}
    return Decomposition(len(parts["ttft"]), mean["intake"], mean["queue"], mean["prefill"],
                         mean["stream"], mean["ttft"], mean["etpot"], mean["dtpot"], mean["tpot"],
                         max((s[2] for s in trace.steps), default=0))  # fmt: skip


def timeline(trace: EngineTrace, num_prompts: int, rows: int) -> list[str]:
    """The benchmark's run (from its first send) in `rows` equal slices of time: per slice,
    steps and their mean batch."""
    first = sorted(trace.requests)[-num_prompts]
    start = trace.requests[first].arrival_s
    steps = [s for s in trace.steps if s[0] >= start]
    if not steps:
        return []
    end = max(s[0] + s[1] for s in steps)
    width = (end - start) / rows or 1.0
    lines = ["| from s | steps | mean running | mean decode seqs | mean prefill tok | "
             "mean step ms |", "|---|---|---|---|---|---|"]  # fmt: skip
    for i in range(rows):
        lo, hi = start + i * width, start + (i + 1) * width
        inside = [s for s in steps if lo <= s[0] < hi or (i == rows - 1 and s[0] == hi)]
        if not inside:
            lines.append(f"| {lo - start:.2f} | 0 | - | - | - | - |")
            continue
        cols = [statistics.fmean(s[k] for s in inside) for k in (2, 3, 4)]
        step_ms = 1e3 * statistics.fmean(s[1] for s in inside)
        lines.append(f"| {lo - start:.2f} | {len(inside)} | {cols[0]:.0f} | {cols[1]:.0f} | "
                     f"{cols[2]:.0f} | {step_ms:.2f} |")  # fmt: skip
    return lines


def measured_line(point_measured: dict[str, float]) -> str:
    keys = ("mean_ttft_ms", "ttft_ms", "median_ttft_ms", "mean_tpot_ms", "tpot_ms",
            "median_tpot_ms", "request_throughput")  # fmt: skip
    return ", ".join(f"{k} {point_measured[k]:g}" for k in keys if k in point_measured)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", default=",".join(DEFAULT_IDS))
    parser.add_argument("--timeline", type=int, default=10, help="slices of the batch timeline")
    args = parser.parse_args(argv)
    points = select(load_points(), args.ids, None)
    table = ["| id | split | n | intake ms | queue ms | prefill ms | stream ms | TTFT ms | "
             "engine TPOT ms | stream dTPOT ms | TPOT ms | max running | measured |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    timelines: list[str] = []
    for point in points:
        with recording() as traces:
            done = replay(point)
        if done.skipped or not traces:
            table.append(f"| {point.id} | {point.split} | skipped: {done.skipped} |")
            continue
        d = decompose(traces[-1], int(point.workload["num_prompts"]))
        table.append(
            f"| {point.id} | {point.split} | {d.num_requests} | {d.intake_ms:.1f} | "
            f"{d.queue_ms:.1f} | {d.prefill_ms:.1f} | {d.stream_ms:.1f} | {d.ttft_ms:.1f} | "
            f"{d.engine_tpot_ms:.2f} | {d.stream_dtpot_ms:.2f} | {d.tpot_ms:.2f} | "
            f"{d.max_running} | {measured_line(point.measured)} |"
        )
        timelines += ["", f"{point.id}: the engine's batch over the benchmark's run", "",
                      *timeline(traces[-1], int(point.workload["num_prompts"]), args.timeline)]  # fmt: skip
    print("\n".join(table + timelines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
