"""`kvsim bench serve SCENARIO`: `vllm bench serve`'s workload through kvsim, its result out.

The scenario says the server (`kvsim import-vllm` writes one from a `vllm serve` line); the
options say the workload as `vllm bench serve` (0.33.0) takes it: the dataset's lengths and
shared prefixes (`sim.vllm_bench.datasets`), the send times (`sim.vllm_bench.arrivals`), the
client's concurrency cap (`sim.engine.client`). The scenario's own workload is replaced. The
engine records every output token's time (decode fast path and cohort off: same results) and
`sim.vllm_bench.metrics` turns the requests into vLLM's result. The run is repeated at the two
ends of the step-time model's band (`step_time_factor`), and the `kvsim` block of the result
holds, per metric, the value at each end: where a measurement should fall.

What the client side leaves out: network and HTTP/detokenizer time (vLLM's client measures
from send to each streamed chunk; kvsim from arrival to each sampled token).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from sim.engine.api_server import ApiServer
from sim.engine.chat_template import Endpoint, chat_template_s
from sim.engine.engine import Engine
from sim.engine.microbatch import DEFAULT_SERVER_PYTHON, microbatch_tokenizer_for
from sim.errors import InputError
from sim.kv.types import Segment
from sim.latency import StepTimeModel, band_of, scaled
from sim.output.results import build_result
from sim.scenario.overrides import apply_overrides
from sim.scenario.resolve import ResolvedRun, resolve
from sim.scenario.schema import Scenario
from sim.vllm_bench.arrivals import send_times
from sim.vllm_bench.client_loop import client_stamped
from sim.vllm_bench.datasets import (
    DATASETS,
    BenchRequest,
    DatasetError,
    prefix_repetition_dataset,
    random_dataset,
    sharegpt_dataset,
)
from sim.vllm_bench.metrics import BenchSettings, RequestOutcome, benchmark_result
from sim.vllm_bench.server_history import lay_out_runs
from sim.workload.request import PREFIX_KEY_BASE, UNIQUE_KEY_BASE, RequestSpec

#: The metrics whose band the `kvsim` block reports (the summary ones).
BAND_KEYS = ("duration", "request_throughput", "output_throughput", "total_token_throughput")


@dataclass(frozen=True, slots=True)
class WorkloadOptions:
    """`vllm bench serve`'s dataset options (0.33.0 defaults, datasets.py L1579-1936)."""

    dataset_name: str = "random"
    dataset_path: Path | None = None
    num_prompts: int = 1000
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: str = "0.0"
    random_prefix_len: int = 0
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    seed: int = 0
    #: Tokens the server's tokenizer adds to a prompt (kvsim's own option: BOS for Llama).
    num_special_tokens: int = 1


def sample_requests(options: WorkloadOptions) -> list[BenchRequest]:
    """The dataset's prompts, in the order the benchmark sends them."""
    name = options.dataset_name
    if name not in DATASETS:
        raise DatasetError(f"--dataset-name {name}: kvsim takes {', '.join(DATASETS)}")
    if options.num_prompts < 1:
        raise DatasetError(f"--num-prompts {options.num_prompts}: must be at least 1")
    if name in ("random", "prefix_repetition") and options.dataset_path is not None:
        raise DatasetError(f"--dataset-path is not for --dataset-name {name} (vLLM refuses it)")
    if name == "sonnet":
        raise DatasetError(
            "--dataset-name sonnet: vLLM 0.33.0's bench serve has no sonnet dataset (and its "
            "prompts need the model's tokenizer); use sharegpt with a lengths file, or random"
        )
    if name == "sharegpt":
        if options.dataset_path is None:
            raise DatasetError("--dataset-name sharegpt needs --dataset-path (a lengths file)")
        return sharegpt_dataset(
            options.dataset_path, num_prompts=options.num_prompts, seed=options.seed
        )
    if name == "prefix_repetition":
        return prefix_repetition_dataset(
            num_prompts=options.num_prompts,
            prefix_len=options.prefix_repetition_prefix_len,
            suffix_len=options.prefix_repetition_suffix_len,
            num_prefixes=options.prefix_repetition_num_prefixes,
            output_len=options.prefix_repetition_output_len,
            seed=options.seed,
            num_special_tokens=options.num_special_tokens,
        )
    return random_dataset(
        num_prompts=options.num_prompts,
        input_len=options.random_input_len,
        output_len=options.random_output_len,
        range_ratio=options.random_range_ratio,
        prefix_len=options.random_prefix_len,
        seed=options.seed,
        num_special_tokens=options.num_special_tokens,
    )


def request_specs(requests: Sequence[BenchRequest], times_s: Sequence[float]) -> list[RequestSpec]:
    """One spec per prompt: its server-side tokens; the special tokens and the prefix are one
    shared leading segment (every prompt starts with the same BOS and, per prefix id, the same
    prefix tokens)."""
    specs = []
    for i, (req, t) in enumerate(zip(requests, times_s, strict=True)):
        prefix: tuple[Segment, ...] = ()
        if req.prefix_id is not None:
            shared = req.num_special_tokens + req.prefix_len
            prefix = (Segment(PREFIX_KEY_BASE + req.prefix_id, shared),)
        specs.append(RequestSpec(i, t, req.server_prompt_tokens, req.output_len, prefix=prefix))
    return specs


@dataclass(slots=True)
class Simulated:
    """One simulation of the benchmark: the requests table, token times and client waits."""

    requests: pd.DataFrame
    token_times_s: dict[int, list[float]]
    queue_s: dict[int, float]
    summary: dict[str, Any]
    inputs: dict[str, Any]


def prepared(scenario: Scenario, base_dir: Path) -> ResolvedRun:
    """The scenario resolved for the benchmark: its workload set aside (one stand-in request,
    never run) and the decode fast path and cohort off so every token is visited."""
    stand_in = {
        "kind": "inline",
        "requests": [{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}],
    }
    scenario = apply_overrides(
        scenario,
        {
            "workload": stand_in,
            "scheduler.decode_fast_path": False,
            "scheduler.decode_cohort": False,
        },
        source="kvsim bench serve",
    )
    return resolve(scenario, base_dir)


def simulate(
    resolved: ResolvedRun,
    specs: Sequence[RequestSpec],
    max_concurrency: int | None,
    step_time_factor: float = 1.0,
    frontend: ApiServer | None = None,
    server_python: str = DEFAULT_SERVER_PYTHON,
    endpoint: Endpoint = Endpoint.COMPLETIONS,
) -> Simulated:
    """`specs` through the engine (and `frontend`, with the pinned release's tokenizer
    batcher on a `server_python` server, `sim.engine.microbatch`, and the chat template's
    parse where `endpoint`, the pin and the model call for it, `sim.engine.chat_template`)."""
    tokenizer = None
    if frontend is not None:
        release = str(resolved.inputs["vllm_version"])
        tokenizer = microbatch_tokenizer_for(release, server_python)
        template_s = chat_template_s(release, endpoint, model_name(resolved.scenario.model))
        frontend = replace(frontend, chat_template_s=template_s)
    engine = Engine(
        resolved.engine,
        specs,
        scaled(resolved.step_time, step_time_factor),
        max_concurrency=max_concurrency,
        record_token_times=True,
        frontend=frontend,
        tokenizer=tokenizer,
    )
    records = engine.run()
    result = build_result(
        records, resolved.inputs, step_time_band=band_of(resolved.step_time).as_dict()
    )
    assert engine.token_times_s is not None
    queue = engine.client.queue_s if engine.client is not None else {}
    return Simulated(result.requests, engine.token_times_s, queue, result.summary, resolved.inputs)


def model_name(model: str | dict[str, Any] | None) -> str:
    """A scenario's model as a name: the catalog name, or a geometry's `name` ("" if none)."""
    if isinstance(model, dict):
        return str(model.get("name", ""))
    return model or ""


def with_test_run(specs: Sequence[RequestSpec]) -> tuple[RequestSpec, list[RequestSpec]]:
    """`vllm bench serve`'s initial single-prompt test run, then the benchmark's requests.

    Before the main run the client sends the first request's prompt and output length once
    and waits for it to finish (`benchmark`, serve.py L875-921 @0.33.0, L508-548 @0.11.0, when
    `--ready-check-timeout-sec` > 0, the default 600). The server keeps that prompt's blocks
    in its prefix cache, so the first benchmark request's prompt hits them: with one prompt,
    its TTFT is a partial prefill. Returns the test request (id 0, at 0 s) and the benchmark's
    (ids + 1, arrival times to be offset by the test's end), the first of them made of the
    test's tokens (its unique remainder keyed as the test's).
    """
    first = specs[0]
    shared = sum(seg.num_tokens for seg in first.prefix)
    tokens = first.prefix + (Segment(UNIQUE_KEY_BASE + 0, first.prompt_tokens - shared),)
    test = replace(first, request_id=0, arrival_s=0.0, prefix=first.prefix)
    main = [replace(s, request_id=s.request_id + 1) for s in specs]
    main[0] = replace(main[0], prefix=tokens)
    return test, main


def simulate_bench(
    resolved: ResolvedRun,
    specs: Sequence[RequestSpec],
    settings: BenchSettings,
    step_time_factor: float = 1.0,
    earlier: Sequence[Sequence[RequestSpec]] = (),
) -> Simulated:
    """The benchmark as the client runs it: the test run first where it is on (its end is the
    benchmark's time 0), then `specs`; the result holds the benchmark's requests only.
    `earlier`: runs the same server took before, oldest first (`sim.vllm_bench.server_history`)."""
    cap = settings.max_concurrency
    server = partial(simulate, resolved, step_time_factor=step_time_factor,
                     frontend=settings.frontend, server_python=settings.server_python,
                     endpoint=settings.endpoint)  # fmt: skip
    if earlier and specs:
        test_run = settings.ready_check_timeout_sec > 0
        laid, first_id, start_s = lay_out_runs([*earlier, specs], test_run)
        return _client_view(_run_from(server(laid, cap), first_id, start_s), settings)
    if settings.ready_check_timeout_sec <= 0 or not specs:
        return _client_view(server(specs, cap), settings)
    test, main = with_test_run(specs)
    start_s = client_end_s(server([test], None), 0)
    main = [replace(s, arrival_s=s.arrival_s + start_s) for s in main]
    return _client_view(_run_from(server([test, *main], cap), 1, start_s), settings)


def _client_view(sim: Simulated, settings: BenchSettings) -> Simulated:
    """The benchmark's token times as its client stamps them (`sim.vllm_bench.client_loop`;
    unchanged while the loop is free)."""
    if settings.client_loop.free:
        return sim
    stamped = client_stamped(sim.token_times_s, settings.client_loop)
    return replace(sim, token_times_s=stamped)


def client_end_s(sim: Simulated, request_id: int) -> float:
    """When the client saw request `request_id` end: its last token (which the API server
    may deliver after the engine finished it), else the engine's end."""
    times = sim.token_times_s.get(request_id)
    row = sim.requests[sim.requests["request_id"] == request_id].iloc[0]
    return float(times[-1]) if times else float(row["finish_s"])


def _run_from(sim: Simulated, first_id: int, start_s: float) -> Simulated:
    """`sim`'s requests from id `first_id` on (the benchmark's; before it: test and earlier
    runs), ids back to 0.., times from the benchmark's start (`start_s`)."""
    earlier = sim.requests[sim.requests["request_id"] < first_id]
    if len(earlier) and not (earlier["finish_s"] <= start_s).all():
        raise AssertionError(f"an earlier run's request was still running at {start_s} s")
    requests = sim.requests[sim.requests["request_id"] >= first_id].copy()
    requests["request_id"] -= first_id
    for column in ("arrival_s", "finish_s"):
        requests[column] -= start_s
    requests = requests.reset_index(drop=True)
    tokens = {rid - first_id: [t - start_s for t in ts]
              for rid, ts in sim.token_times_s.items() if rid >= first_id}  # fmt: skip
    queue = {rid - first_id: q for rid, q in sim.queue_s.items() if rid >= first_id}
    return Simulated(requests, tokens, queue, sim.summary, sim.inputs)


def outcomes(
    sim: Simulated, requests: Sequence[BenchRequest]
) -> tuple[list[RequestOutcome], float]:
    """What the client saw per request, and the benchmark's duration (the last end)."""
    out: list[RequestOutcome] = []
    ends = []
    for row in sim.requests.itertuples(index=False):
        rid = int(row.request_id)
        req = requests[rid]
        queue = sim.queue_s.get(rid, 0.0)
        end = row.finish_s if not math.isnan(row.finish_s) else row.arrival_s
        ends.append(end)
        if row.state != "finished":
            out.append(RequestOutcome(False, req.input_len, start_time=row.arrival_s,
                                      client_queue_time=queue, error=f"{row.state}: {row.reason}"))  # fmt: skip
            continue
        times = sim.token_times_s.get(rid, [])
        if len(times) != row.generated_tokens:
            raise InputError(
                f"request {rid}: {len(times)} token times for {row.generated_tokens} tokens; "
                "kvsim bench serve needs the V1 engine (scheduler.design: v1-engine)"
            )
        itl = tuple(b - a for a, b in zip(times, times[1:], strict=False))
        # The client's end is its last token (the engine's end, without an API server).
        ends[-1] = end = times[-1] if times else end
        out.append(RequestOutcome(True, req.input_len, int(row.generated_tokens),
                                  times[0] - row.arrival_s, itl, end - row.arrival_s,
                                  row.arrival_s, queue))  # fmt: skip
    return out, max(ends) if ends else 0.0


@dataclass(slots=True)
class BenchRun:
    """The benchmark's result dict and printed lines, with the band-end results."""

    result: dict[str, Any]
    lines: list[str]
    band: dict[str, Any] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    inputs: dict[str, Any] = field(default_factory=dict)


def run_bench(
    scenario: Scenario,
    base_dir: Path,
    workload: WorkloadOptions,
    settings: BenchSettings,
    *,
    band: bool = True,
    earlier_runs: Sequence[int] = (),
    adapt_step_time: Callable[[StepTimeModel], StepTimeModel] | None = None,
) -> BenchRun:
    """Simulate the benchmark (and, with `band`, again at the step-time band's two ends).
    `earlier_runs`: the `--num-prompts` of the runs the same server took before this one,
    oldest first, with the same dataset options (`sim.vllm_bench.server_history`).
    `adapt_step_time`: the scenario's step-time model is replaced by what it returns for it
    (e.g. another worker form of the same model, `MeasuredStepTime.with_worker_form`)."""
    requests = sample_requests(workload)
    if settings.max_concurrency is not None and settings.max_concurrency < 1:
        raise InputError(f"--max-concurrency {settings.max_concurrency}: must be greater than 0")
    specs = _specs(requests, workload, settings)
    earlier = [
        _specs(sample_requests(replace(workload, num_prompts=n)), workload, settings)
        for n in earlier_runs
    ]
    resolved = prepared(scenario, base_dir)
    if adapt_step_time is not None:
        resolved = replace(resolved, step_time=adapt_step_time(resolved.step_time))
    nominal = simulate_bench(resolved, specs, settings, earlier=earlier)
    result, lines = benchmark_result(*outcomes(nominal, requests), settings)
    ends: dict[str, Any] = {}
    step_band = band_of(resolved.step_time)
    if band and (step_band.low_factor, step_band.high_factor) != (1.0, 1.0):
        for label, factor in (("low", step_band.low_factor), ("high", step_band.high_factor)):
            sim = simulate_bench(resolved, specs, settings, factor, earlier=earlier)
            ends[label], _ = benchmark_result(*outcomes(sim, requests), settings)
    return BenchRun(result, lines, ends, nominal.summary, nominal.inputs)


def _specs(
    requests: Sequence[BenchRequest], workload: WorkloadOptions, settings: BenchSettings
) -> list[RequestSpec]:
    times = send_times(len(requests), request_rate=settings.request_rate,
                       burstiness=settings.burstiness, seed=workload.seed)  # fmt: skip
    return request_specs(requests, times)


def metric_band(run: BenchRun) -> dict[str, list[float]]:
    """Per scalar metric, [lowest, highest] over the nominal run and the band's two ends."""
    out: dict[str, list[float]] = {}
    for key, value in run.result.items():
        if not isinstance(value, int | float) or isinstance(value, bool) or value is None:
            continue
        values = [value] + [
            end[key] for end in run.band.values() if isinstance(end.get(key), int | float)
        ]
        out[key] = [float(min(values)), float(max(values))]
    return out
