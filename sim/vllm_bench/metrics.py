"""`vllm bench serve`'s metrics, result block and result JSON, from per-request outcomes.

Mirrors 0.33.0 `vllm/benchmarks/serve.py`: `calculate_metrics` (L602-812: TPOT per request
is `(latency - ttft) / (output_len - 1)` for outputs longer than one token; ITLs of all
requests pooled; numpy mean / median / std / `percentile`; goodput counts the requests within
every SLO; the peak output tokens per second and concurrent requests by one-second buckets),
the printed block and the result dict of `benchmark` (L1210-1500: `process_one_metric` adds
`mean_/median_/std_/p<P>_<metric>_ms` for each of `--percentile-metrics`, `P` written as
`str(int(p))` when whole), and the keys `main_async` adds (L2295-2322), with the per-request
lists dropped unless `--save-detailed` (L2412-2427). `tests/vllm_bench/test_result_keys.py`
diffs these keys against the ones read from the release's source.

What a simulated request lacks: `generated_texts` are empty strings (kvsim has no text), and
`start_times` are seconds from the benchmark's start (vLLM's are `time.perf_counter()`
readings; only differences mean anything in either).

Example: a request sent at 0 whose 3 tokens come at 0.1, 0.15, 0.2 s has TTFT 100 ms, ITLs
[50, 50] ms, TPOT (0.2 - 0.1) / 2 = 50 ms and E2EL 200 ms.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sim.engine.api_server import VLLM_API_SERVER, ApiServer
from sim.engine.chat_template import Endpoint
from sim.engine.microbatch import DEFAULT_SERVER_PYTHON
from sim.errors import InputError
from sim.vllm_bench.client_loop import VLLM_BENCH_CLIENT, ClientLoop

#: `--percentile-metrics` names (serve.py L1848-1857) and the default for generation.
METRICS = ("ttft", "tpot", "itl", "e2el")
#: With --max-concurrency, two more a user may name (serve.py L1445-1458).
QUEUE_METRICS = ("client_queue_time", "e2el_including_client_queue")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
_HEADERS = {
    "ttft": ("TTFT", "Time to First Token"),
    "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
    "itl": ("ITL", "Inter-token Latency"),
    "e2el": ("E2EL", "End-to-end Latency"),
    "client_queue_time": ("Client Queue Time", "Client-side Queueing"),
    "e2el_including_client_queue": (
        "E2EL incl. Client Queue",
        "Queue-inclusive End-to-end Latency",
    ),
}
#: Dropped from the result unless `--save-detailed` (serve.py L2413-2423).
DETAILED_FIELDS = ("input_lens", "output_lens", "start_times", "ttfts", "itls",
                   "generated_texts", "errors", "server_queue_times", "server_ttfts")  # fmt: skip


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request as the benchmark client saw it (vLLM's `RequestFuncOutput`), in seconds."""

    success: bool
    prompt_len: int
    output_tokens: int = 0
    ttft: float = 0.0
    itl: tuple[float, ...] = ()
    latency: float = 0.0
    start_time: float = 0.0
    client_queue_time: float = 0.0
    error: str = ""


@dataclass(frozen=True, slots=True)
class BenchSettings:
    """The options that shape the result (names as `vllm bench serve`'s)."""

    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    percentile_metrics: str | None = None
    metric_percentiles: str = "99"
    goodput: dict[str, float] = field(default_factory=dict)
    save_detailed: bool = False
    #: > 0: the initial single-prompt test run comes first (`sim.vllm_bench.bench.with_test_run`)
    ready_check_timeout_sec: int = 600
    #: The API server's costs (`sim.engine.frontend`); None: none (the engine core's view).
    frontend: ApiServer | None = VLLM_API_SERVER
    #: The server's Python (major.minor): how the release's tokenizer batcher collects a batch
    #: (`sim.engine.microbatch.WaitFor`); vLLM's container image's where a source is silent.
    server_python: str = DEFAULT_SERVER_PYTHON
    #: The client's own loop (`sim.vllm_bench.client_loop`): when it stamps each chunk;
    #: free by default (no sourced per-chunk cost).
    client_loop: ClientLoop = VLLM_BENCH_CLIENT
    #: The endpoint `--backend` sends to (`sim.engine.chat_template`): chat requests pay the
    #: chat template's parse on the pins that re-parse it.
    endpoint: Endpoint = Endpoint.COMPLETIONS

    @property
    def selected_metrics(self) -> list[str]:
        names = (self.percentile_metrics or DEFAULT_PERCENTILE_METRICS).split(",")
        for name in names:
            if name not in (*METRICS, *QUEUE_METRICS):
                known = ", ".join((*METRICS, *QUEUE_METRICS))
                raise InputError(f"--percentile-metrics: unknown metric {name!r}; known: {known}")
        return names

    @property
    def percentiles(self) -> list[float]:
        try:
            values = [float(p) for p in self.metric_percentiles.split(",")]
        except ValueError:
            raise InputError(
                f"--metric-percentiles {self.metric_percentiles}: give numbers like 50,90,99"
            ) from None
        if not all(0 <= p <= 100 for p in values):
            raise InputError(
                f"--metric-percentiles {self.metric_percentiles}: each must be in [0, 100]"
            )
        return values


def parse_goodput(pairs: Sequence[str] | None) -> dict[str, float]:
    """`--goodput ttft:500 tpot:50` -> {"ttft": 500.0, "tpot": 50.0} (ms; serve.py L1514-1549)."""
    slos: dict[str, float] = {}
    for pair in pairs or ():
        name, sep, value = pair.partition(":")
        try:
            number = float(value) if sep else math.nan
        except ValueError:
            number = math.nan
        if math.isnan(number):
            raise InputError(f"--goodput {pair}: give KEY:VALUE pairs, the value in milliseconds")
        if name not in ("ttft", "tpot", "e2el"):
            raise InputError(f"--goodput {pair}: the metric must be ttft, tpot or e2el")
        if number < 0:
            raise InputError(f"--goodput {pair}: the value must be non-negative")
        slos[name] = number
    return slos


def _stats(values: Sequence[float], percentiles: list[float]) -> tuple[float, float, float, list]:
    data = list(values) or [0.0]  # vLLM's `values or 0`: an empty list reads as 0
    mean, median, std = (float(f(data)) * 1000 for f in (np.mean, np.median, np.std))
    return mean, median, std, [(p, float(np.percentile(data, p)) * 1000) for p in percentiles]


def _peaks(outcomes: Sequence[RequestOutcome]) -> tuple[float, int]:
    """Peak output tokens in a one-second bucket, and the peak concurrent requests (L700-750)."""
    done = [o for o in outcomes if o.success]
    if not done:
        return 0.0, 0
    start = min(o.start_time for o in done)
    end = max(o.start_time + o.latency for o in done)
    buckets = int(np.ceil(end - start)) + 1
    tokens, concurrent = np.zeros(buckets), np.zeros(buckets)
    for o in done:
        t = o.start_time + o.ttft
        times = [t]
        for gap in o.itl:
            t += gap
            times.append(t)
        for token_time in times:
            bucket = int(token_time - start)
            if 0 <= bucket < buckets:
                tokens[bucket] += 1
        for second in range(int(o.start_time - start), int(o.start_time + o.latency - start) + 1):
            concurrent[second] += 1
    return float(np.max(tokens)), int(np.max(concurrent))


def benchmark_result(
    outcomes: Sequence[RequestOutcome], duration_s: float, settings: BenchSettings
) -> tuple[dict[str, Any], list[str]]:
    """vLLM's result dict (without `main_async`'s keys) and the printed block's lines."""
    done = [o for o in outcomes if o.success]
    output_lens = [o.output_tokens if o.success else 0 for o in outcomes]
    total_input = sum(o.prompt_len for o in done)
    total_output = sum(output_lens)
    ttfts = [o.ttft for o in done]
    e2els = [o.latency for o in done]
    itls = [gap for o in done for gap in o.itl]
    all_tpots = [
        (o.latency - o.ttft) / (o.output_tokens - 1) if o.output_tokens > 1 else 0.0 for o in done
    ]
    tpots = [t for o, t in zip(done, all_tpots, strict=True) if o.output_tokens > 1]
    good = _good(settings.goodput, ttfts, all_tpots, e2els)
    peak_tokens, peak_concurrent = _peaks(outcomes)
    result: dict[str, Any] = {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(outcomes) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "request_goodput": good / duration_s if settings.goodput else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "input_lens": [o.prompt_len for o in outcomes],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outcomes],
        "itls": [list(o.itl) for o in outcomes],
        "latencies": [o.latency for o in outcomes],
        "start_times": [o.start_time for o in outcomes],
        "queue_times": [o.client_queue_time for o in outcomes],
        "generated_texts": ["" for _ in outcomes],
        "errors": [o.error for o in outcomes],
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_concurrent,
        "rtfx": 0.0,
    }
    lines = _head_lines(result, settings)
    series: dict[str, list[float]] = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}
    for name in METRICS:
        if name in settings.selected_metrics:
            lines += _metric(result, name, series[name], settings.percentiles)
    if settings.max_concurrency is not None:  # printed only when asked for by name, as in vLLM
        series["client_queue_time"] = [o.client_queue_time for o in done]
        if not math.isinf(settings.request_rate):
            series["e2el_including_client_queue"] = [o.latency + o.client_queue_time for o in done]
    for name in QUEUE_METRICS:
        if name in settings.selected_metrics and name in series:
            lines += _metric(result, name, series[name], settings.percentiles)
    lines.append("=" * 50)
    return result, lines


def _good(slos: dict[str, float], ttfts: list, tpots: list, e2els: list) -> int:
    if not slos:
        return 0
    columns = [
        (v, slos[k] / 1000)
        for k, v in (("ttft", ttfts), ("tpot", tpots), ("e2el", e2els))
        if k in slos
    ]
    return sum(
        all(value <= slo for (_, slo), value in zip(columns, row, strict=True))
        for row in zip(*(c for c, _ in columns), strict=True)
    )


def _head_lines(result: dict[str, Any], settings: BenchSettings) -> list[str]:
    row = "{:<40} {:<10}".format
    num = "{:<40} {:<10.2f}".format
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]
    lines += [
        row("Successful requests:", result["completed"]),
        row("Failed requests:", result["failed"]),
    ]
    if settings.max_concurrency is not None:
        lines.append(row("Maximum request concurrency:", settings.max_concurrency))
    if not math.isinf(settings.request_rate):
        lines.append(num("Request rate configured (RPS):", settings.request_rate))
    lines += [
        num("Benchmark duration (s):", result["duration"]),
        row("Total input tokens:", result["total_input_tokens"]),
        row("Total generated tokens:", result["total_output_tokens"]),
        num("Request throughput (req/s):", result["request_throughput"]),
    ]
    if settings.goodput:
        lines.append(num("Request goodput (req/s):", result["request_goodput"]))
    lines += [
        num("Output token throughput (tok/s):", result["output_throughput"]),
        num("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"]),
        num("Peak concurrent requests:", result["max_concurrent_requests"]),
        num("Total token throughput (tok/s):", result["total_token_throughput"]),
    ]
    return lines


def _metric(
    result: dict[str, Any], name: str, values: list[float], percentiles: list[float]
) -> list[str]:
    short, header = _HEADERS[name]
    mean, median, std, pcts = _stats(values, percentiles)
    num = "{:<40} {:<10.2f}".format
    lines = ["{s:{c}^{n}}".format(s=header, n=50, c="-")]
    lines += [num(f"Mean {short} (ms):", mean), num(f"Median {short} (ms):", median)]
    result[f"mean_{name}_ms"], result[f"median_{name}_ms"], result[f"std_{name}_ms"] = (
        mean,
        median,
        std,
    )
    for p, value in pcts:
        word = str(int(p)) if int(p) == p else str(p)
        lines.append(num(f"P{word} {short} (ms):", value))
        result[f"p{word}_{name}_ms"] = value
    return lines


def result_json(
    benchmark: dict[str, Any],
    settings: BenchSettings,
    *,
    date: str,
    model_id: str,
    num_prompts: int,
    backend: str = "openai",
) -> dict[str, Any]:
    """`main_async`'s result: its own keys first, then the benchmark's (L2295-2323)."""
    head: dict[str, Any] = {
        "date": date,
        "endpoint_type": backend,
        "backend": backend,
        "label": None,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": num_prompts,
        "request_rate": settings.request_rate if settings.request_rate < math.inf else "inf",
        "burstiness": settings.burstiness,
        "max_concurrency": settings.max_concurrency,
    }
    out = {**head, **benchmark}
    if not settings.save_detailed:
        for name in DETAILED_FIELDS:
            out.pop(name, None)
    return out
