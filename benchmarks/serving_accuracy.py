"""kvsim's `vllm bench serve` prediction against public real-vLLM serving measurements.

    python benchmarks/serving_accuracy.py                     # every point, then the summary
    python benchmarks/serving_accuracy.py --limit 4           # the first 4 points (sorted by id)
    python benchmarks/serving_accuracy.py --ids a,b --detail  # two points, every metric compared
    python benchmarks/serving_accuracy.py --fit-p2p           # refit the no-P2P all-reduce bandwidth
    python benchmarks/serving_accuracy.py --fit-frontend      # refit the API server's costs
    python benchmarks/serving_accuracy.py --fit-overhead      # refit V1's per-step worker CPU
    python benchmarks/serving_accuracy.py --fit-overhead --forms  # and compare its forms

The measurements are `sim/data/vllm_serving_measurements.yaml` (each with its source URL). Each
replayable point goes through the same path as the CLI: its `vllm serve` line becomes a scenario
with `kvsim import-vllm`'s importer (`sim.vllm_bench.importer.import_serve_line`), and its
workload runs through `kvsim bench serve`'s simulation (`sim.vllm_bench.bench.run_bench`, the
nominal step time, no band). `sim.vllm_bench.compare.compare` puts the predicted result beside
the measured keys. A point runs under the release kvsim pins nearest at or below its measured
version, by major.minor (0.19.0 -> 0.19.1, 0.22 -> 0.20.0, 0.30 -> 0.26.0; pins 0.11.0, 0.19.1,
0.20.0, 0.25.1, 0.26.0, 0.33.0), and under 0.11.0 when older than every pin or when the source
only implies an era (the `kvsim` column). A point kvsim cannot replay (a dataset it has no
lengths for, a model or GPU outside the catalog, a flag the importer refuses) is listed with the
reason, never dropped. A point whose source logs earlier runs on the same `vllm serve` process
(`server_history: {num_prompts: [...]}`, oldest first, same dataset options and seed) replays
them on the same engine first: their prompts warm its prefix cache
(`sim.vllm_bench.server_history`). A point whose source names the server's Python
(`server_python: "3.11"`) runs its release's tokenizer batcher under that Python's
`asyncio.wait_for` (`sim.engine.microbatch`; 3.12 where the source is silent).

The summary is the median |error| per metric group, on all replayed points and on each half
(each entry's recorded `split`, `sim.data.split.assign_split`'s rule): TTFT (mean, else
median, else the source's unnamed TTFT), TPOT/ITL (mean TPOT, else median TPOT, else unnamed
TPOT, else median/mean ITL) and throughput (output tok/s, else req/s); then, per half, the
objective `--fit-frontend` minimises on the fit half (`frontend_score`). No GPU needed; 65-85 s on 2 shared cores (the
warm servers' earlier runs add about 30 s: 54 s before them, 85 s after, same machine).
A second table gives the same medians per independent source, and their median over sources,
each source weighing once (`serving_sources.py`: a robustness view, not the headline).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from serving_sources import PointErrors, source_table  # benchmarks/ is the script's folder

from sim.data.split import load_split_entries
from sim.engine.api_server import VLLM_API_SERVER, ApiServer
from sim.engine.chat_template import Endpoint
from sim.engine.microbatch import DEFAULT_SERVER_PYTHON
from sim.errors import InputError
from sim.latency import StepTimeModel
from sim.latency.measured import MeasuredStepTime
from sim.latency.worker_form import WorkerForm
from sim.scenario.schema import scenario_from_dict
from sim.vllm_bench.bench import WorkloadOptions, run_bench
from sim.vllm_bench.client_loop import VLLM_BENCH_CLIENT, ClientLoop
from sim.vllm_bench.compare import MetricRow, compare
from sim.vllm_bench.importer import import_serve_line
from sim.vllm_bench.metrics import BenchSettings

DATA_FILE = "vllm_serving_measurements.yaml"
#: Datasets kvsim bench serve samples without a lengths file.
REPLAYABLE_DATASETS = ("random", "prefix_repetition")
#: Metric groups of the summary: the keys tried in order for each point.
GROUPS: dict[str, tuple[str, ...]] = {
    "TTFT": ("mean_ttft_ms", "median_ttft_ms", "ttft_ms"),
    "TPOT/ITL": ("mean_tpot_ms", "median_tpot_ms", "tpot_ms", "median_itl_ms", "mean_itl_ms"),
    "throughput": ("output_throughput", "request_throughput"),
}
#: A source's unnamed statistic -> the predicted key it is compared with.
UNNAMED = {"ttft_ms": "mean_ttft_ms", "tpot_ms": "mean_tpot_ms"}


@dataclass(frozen=True, slots=True)
class Point:
    """One measurement as the YAML gives it, with its side of the split."""

    raw: dict[str, Any]
    split: str

    @property
    def id(self) -> str:
        return str(self.raw["id"])

    @property
    def workload(self) -> dict[str, Any]:
        return dict(self.raw.get("workload") or {})

    @property
    def measured(self) -> dict[str, float]:
        return {k: float(v) for k, v in (self.raw.get("measured") or {}).items()}

    @property
    def endpoint(self) -> Endpoint:
        """The endpoint the client sent to (`endpoint: completions | chat`, checked on load)."""
        return Endpoint(self.raw["endpoint"])

    @property
    def model_name(self) -> str:
        model = self.raw["model"]
        return str(model["name"] if isinstance(model, dict) else model)


@dataclass(slots=True)
class Replay:
    """A point's replay: the compared rows, or why there are none."""

    point: Point
    release: str = ""
    rows: list[MetricRow] = field(default_factory=list)
    skipped: str = ""
    note: str = ""
    seconds: float = 0.0

    def row(self, key: str) -> MetricRow | None:
        return next((r for r in self.rows if r.metric == key), None)

    def group(self, name: str) -> tuple[str, MetricRow] | None:
        """The first key of the group the source measured, with its compared row."""
        for key in GROUPS[name]:
            row = self.row(key)
            if row is not None:
                return key, row
        return None


def load_points(path: Path | None = None) -> list[Point]:
    """Every measurement, sorted by id, on the side of the split its entry records (`split:
    fit | held_out`, chosen by `sim.data.split.assign_split` when the entry was added)."""
    entries = load_split_entries(DATA_FILE, "measurements", path)
    for row, entry in enumerate(entries, 1):
        check_endpoint(entry, (path or Path(DATA_FILE)).name, row)
    return [Point(e, str(e["split"])) for e in sorted(entries, key=lambda e: e["id"])]


def check_endpoint(entry: dict[str, Any], file_name: str, row: int) -> None:
    """An entry's `endpoint` must read completions or chat (the client's `--backend`: openai
    or vllm -> completions, openai-chat -> chat; the default backend where a source is silent,
    with `endpoint` in `assumed`)."""
    value = entry.get("endpoint")
    known = [e.value for e in Endpoint]
    if value not in known:
        raise InputError(
            f"{file_name}: entry {row} ({entry.get('id')}): field endpoint {value!r}: must be "
            + ", ".join(known)
        )


def kvsim_release(version: str) -> str:
    """The kvsim pin a measured release runs under (`sim.vllm_bench.flags.nearest_release`)."""
    from sim.vllm_bench.flags import nearest_release

    return nearest_release(version)


def serve_line(point: Point, placeholder_model: str) -> str:
    """The source's `vllm serve` line with the model replaced by one the importer resolves
    (environment assignments dropped), plus `serve_flags_assumed`."""
    words = shlex.split(str(point.raw["vllm_serve"]))
    while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
        words.pop(0)  # VLLM_USE_V1=1 ...: an environment assignment, not an option
    if words[:2] != ["vllm", "serve"] or len(words) < 3:
        raise InputError(f"{point.id}: vllm_serve must read 'vllm serve MODEL ...'")
    words[2] = placeholder_model
    tp = int(point.raw.get("tp", 1))
    stated_tp = {"-tp", "--tensor-parallel-size"} & set(words) or any(
        w.startswith("--tensor-parallel-size=") for w in words
    )
    if tp > 1 and not stated_tp:
        words += ["--tensor-parallel-size", str(tp)]
    words += shlex.split(str(point.raw.get("serve_flags_assumed") or ""))
    return shlex.join(words)


def scenario_for(point: Point, release: str) -> Any:
    """The point's server as a scenario, built by `kvsim import-vllm`'s importer."""
    model = point.raw["model"]
    placeholder = model if isinstance(model, str) else "llama-3.1-8b"
    text = import_serve_line(
        serve_line(point, placeholder),
        gpu=str(point.raw["gpu"]),
        version=release,
        allow_unmodelled=[str(u) for u in point.raw.get("unmodelled") or ()],
    )
    data = yaml.safe_load(text)
    if isinstance(model, dict):  # a geometry outside the catalog, as `model:` accepts it
        data["model"] = dict(model)
        data["name"] = f"{model['name']}-{point.raw['gpu']}"
    if point.raw.get("model_dtype"):
        data["model_dtype"] = point.raw["model_dtype"]
    if point.raw.get("p2p") is False:  # the source's log: custom all-reduce off, no peer access
        data["hardware"]["p2p"] = False
    data["name"] = point.id
    return scenario_from_dict(data, f"{DATA_FILE}: {point.id}")


def workload_options(point: Point) -> tuple[WorkloadOptions, BenchSettings]:
    w = point.workload
    options = WorkloadOptions(
        dataset_name=str(w.get("dataset", "random")),
        num_prompts=int(w["num_prompts"]),
        random_input_len=int(w.get("input_len", 1024)),
        random_output_len=int(w.get("output_len", 128)),
        random_range_ratio=str(w.get("random_range_ratio", 0.0)),
        random_prefix_len=int(w.get("random_prefix_len", 0)),
        seed=int(w.get("seed", 0)),
        num_special_tokens=int(w.get("num_special_tokens", 1)),
    )
    rate = w.get("request_rate", "inf")
    concurrency = w.get("max_concurrency")
    settings = BenchSettings(
        request_rate=math.inf if str(rate) == "inf" else float(rate),
        burstiness=float(w.get("burstiness", 1.0)),
        max_concurrency=None if concurrency is None else int(concurrency),
        percentile_metrics="ttft,tpot,itl,e2el",
        metric_percentiles="99",
    )
    return options, settings


def why_not_replayable(point: Point) -> str:
    dataset = point.workload.get("dataset", "random")
    if dataset not in REPLAYABLE_DATASETS:
        return (
            f"dataset {dataset}: its prompt lengths need the model's tokenizer; kvsim bench serve "
            "takes them as a lengths file, which this table does not carry"
        )
    if not point.measured:
        return "no measured metric"
    return ""


#: What a replay does to the scenario's step-time model (`run_bench`'s `adapt_step_time`):
#: e.g. benchmarks/worker_forms.py's worker form (where a replay takes None: the model as the
#: scenario builds it).
AdaptStepTime = Callable[[StepTimeModel], StepTimeModel]


def replay(
    point: Point,
    max_prompts: int | None = None,
    frontend: ApiServer | None = VLLM_API_SERVER,
    client_loop: ClientLoop = VLLM_BENCH_CLIENT,
    adapt_step_time: AdaptStepTime | None = None,
) -> Replay:
    """Simulate the point's benchmark (through `frontend`, the API server; None: none; and
    `client_loop`, the client's own loop, `sim.vllm_bench.client_loop`; with its step-time
    model passed through `adapt_step_time`) and compare it with what the source measured."""
    out = Replay(point, release=kvsim_release(str(point.raw.get("vllm_version", ""))))
    out.skipped = why_not_replayable(point)
    if out.skipped:
        return out
    started = time.perf_counter()
    try:
        scenario = scenario_for(point, out.release)
        options, settings = workload_options(point)
        python = str(point.raw.get("server_python") or DEFAULT_SERVER_PYTHON)
        settings = dataclasses.replace(
            settings,
            frontend=frontend,
            server_python=python,
            client_loop=client_loop,
            endpoint=point.endpoint,
        )
        if max_prompts is not None and options.num_prompts > max_prompts:
            out.note = f"shortened to {max_prompts} of {options.num_prompts} prompts"
            options = WorkloadOptions(**{**_fields(options), "num_prompts": max_prompts})
        earlier = [int(n) for n in (point.raw.get("server_history") or {}).get("num_prompts", ())]
        run = run_bench(scenario, Path.cwd(), options, settings, band=False,
                        earlier_runs=earlier, adapt_step_time=adapt_step_time)  # fmt: skip
    except InputError as error:
        out.skipped = f"kvsim refuses it: {error}"
        return out
    measured = dict(point.measured)
    for unnamed, key in UNNAMED.items():
        if unnamed in measured and key not in measured:
            measured[key] = measured.pop(unnamed)
    out.rows = compare(run.result, measured)
    out.rows = [_renamed(r, point.measured) for r in out.rows]
    out.seconds = time.perf_counter() - started
    return out


def _fields(options: WorkloadOptions) -> dict[str, Any]:
    return {name: getattr(options, name) for name in WorkloadOptions.__dataclass_fields__}


def _renamed(row: MetricRow, measured: dict[str, float]) -> MetricRow:
    """A row compared against a source's unnamed statistic keeps the source's key."""
    for unnamed, key in UNNAMED.items():
        if row.metric == key and unnamed in measured and key not in measured:
            return MetricRow(unnamed, row.predicted, row.measured, row.band)
    return row


def _num(x: float) -> str:
    if x == 0 or abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"


def _err(x: float) -> str:
    if not math.isfinite(x):
        return "inf"
    return f"{x:+.0%}" if abs(x) >= 10 else f"{x:+.1%}"


def workload_label(point: Point) -> str:
    w = point.workload
    if w.get("dataset", "random") != "random":
        text = f"{w.get('dataset')} n={w.get('num_prompts')}"
    else:
        text = f"random {w.get('input_len')}/{w.get('output_len')} n={w.get('num_prompts')}"
        if w.get("random_prefix_len"):
            text += f" prefix={w['random_prefix_len']}"
    text += f" rate={w.get('request_rate', 'inf')}"
    if w.get("max_concurrency") is not None:
        text += f" c={w['max_concurrency']}"
    return text


def table(replays: list[Replay]) -> str:
    head = "| id | model | gpu | tp | vLLM | kvsim | workload | split |"
    rule = "|---|---|---|---|---|---|---|---|"
    for name in GROUPS:
        head += f" {name} metric | {name} predicted | {name} measured | {name} error |"
        rule += "---|---|---|---|"
    lines = [head, rule]
    for r in replays:
        p = r.point
        version = str(p.raw.get("vllm_version", "")).split(" ")[0]
        cells = [p.id, p.model_name, str(p.raw["gpu"]), str(p.raw.get("tp", 1)), version,
                 r.release, workload_label(p), p.split]  # fmt: skip
        for name in GROUPS:
            found = r.group(name) if not r.skipped else None
            if found is None:
                cells += ["-", "-", "-", "-"]
                continue
            key, row = found
            cells += [key, _num(row.predicted), _num(row.measured), _err(row.error)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(replays: list[Replay]) -> str:
    lines = ["| id | metric | predicted | measured | error |", "|---|---|---|---|---|"]
    for r in replays:
        for row in r.rows:
            lines.append(
                f"| {r.point.id} | {row.metric} | {_num(row.predicted)} | "
                f"{_num(row.measured)} | {_err(row.error)} |"
            )
    return "\n".join(lines)


def median_abs_errors(replays: list[Replay]) -> dict[str, tuple[int, float]]:
    """Per group: (points, median |error|) over the replays that measured it."""
    out: dict[str, tuple[int, float]] = {}
    for name in GROUPS:
        errors = [abs(found[1].error) for r in replays if (found := r.group(name)) is not None]
        out[name] = (len(errors), statistics.median(errors) if errors else math.nan)
    return out


def summary(replays: list[Replay]) -> str:
    done = [r for r in replays if not r.skipped]
    held = [r for r in done if r.point.split == "held_out"]
    lines = ["| points | " + " | ".join(f"{g} median abs error (n)" for g in GROUPS) + " |",
             "|---|" + "---|" * len(GROUPS)]  # fmt: skip
    fit = [r for r in done if r.point.split == "fit"]
    for label, subset in (("all", done), ("fit", fit), ("held_out", held)):
        stats = median_abs_errors(subset)
        cells = [f"{stats[g][1]:.1%} ({stats[g][0]})" if stats[g][0] else "-" for g in GROUPS]
        lines.append(f"| {label} ({len(subset)}) | " + " | ".join(cells) + " |")
    scores = {label: log_score(subset) for label, subset in (("fit", fit), ("held_out", held))}
    shown = ", ".join(f"{k} {v:.4f}" if math.isfinite(v) else f"{k} -" for k, v in scores.items())
    lines += ["", f"The API server fit's objective (`frontend_score`): {shown}."]
    return "\n".join(lines)


def sources_summary(replays: list[Replay]) -> str:
    """The per-source table (`serving_sources.source_table`) of these replays."""
    points = []
    for r in replays:
        found = {g: r.group(g) for g in GROUPS} if not r.skipped else {}
        errors = {g: abs(f[1].error) for g, f in found.items() if f is not None}
        points.append(PointErrors(str(r.point.raw["source"]), r.point.split, not r.skipped, errors))
    return source_table(points, tuple(GROUPS))


def not_replayed(replays: list[Replay]) -> list[str]:
    return [f"- {r.point.id}: {r.skipped}" for r in replays if r.skipped]


def select(points: list[Point], ids: str | None, limit: int | None) -> list[Point]:
    if ids:
        wanted = [i.strip() for i in ids.split(",") if i.strip()]
        known = {p.id for p in points}
        missing = [i for i in wanted if i not in known]
        if missing:
            raise SystemExit(f"--ids: unknown id(s) {', '.join(missing)}")
        points = [p for p in points if p.id in wanted]
    return points[:limit] if limit is not None else points


#: The grid `fit_host_staged_algbw` searches (GB/s), around the fitted 6.5.
HOST_STAGED_GRID_GBPS = (5.5, 6.0, 6.5, 7.0, 7.5)


@dataclass(frozen=True, slots=True)
class StepTimeCandidate:
    """A fit's candidate for one of the measured step-time model's fitted constants, given to
    every replay of the fit as its `adapt_step_time` (None: the shipped value; nothing in
    `sim` is patched). A measured model is rebuilt with it; another model is kept (only the
    measured model has these terms, and a `p2p: false` scenario requires it).

    `host_staged_algbw_GBps`: the all-reduce bandwidth at TP 2 without peer access
    (`sim.latency.interconnect.HOST_STAGED_ALGBW_GBPS`); `v1_worker_step_s`: the V1 model
    runner's per-step CPU time, P of the shipped worker form A
    (`sim.latency.measured_terms.V1_WORKER_STEP_S`, `sim.latency.worker_form`). Example:
    StepTimeCandidate(host_staged_algbw_GBps=7.0) replays a TP-2 point without peer access
    with its all-reduces at 7 GB/s instead of 6.5.
    """

    host_staged_algbw_GBps: float | None = None
    v1_worker_step_s: float | None = None

    def __call__(self, model: StepTimeModel) -> StepTimeModel:
        if not isinstance(model, MeasuredStepTime):
            return model
        if self.host_staged_algbw_GBps is not None:
            model = model.with_host_staged_algbw(self.host_staged_algbw_GBps)
        if self.v1_worker_step_s is not None:
            model = model.with_worker_form(WorkerForm(worker_step_s=self.v1_worker_step_s))
        return model


def fit_host_staged_algbw(
    points: list[Point], grid_GBps: tuple[float, ...] = HOST_STAGED_GRID_GBPS
) -> tuple[float, dict[float, float]]:
    """The all-reduce bandwidth without peer access (`sim.latency.interconnect`) that the FIT
    half of the `p2p: false` points asks for: the grid value with the smallest median |error|
    over their TTFT, TPOT/ITL and throughput. Returns (best, median |error| per value).
    The held-out half is not read."""
    fit = [p for p in points if p.raw.get("p2p") is False and p.split == "fit"]
    candidates = {bw: StepTimeCandidate(host_staged_algbw_GBps=bw) for bw in grid_GBps}
    return _grid_search(candidates, fit, GROUPS)


def _fit_score(
    fit: list[Point], groups: Iterable[str], adapt_step_time: AdaptStepTime | None = None
) -> float:
    """The median |error| over the metric `groups` of `fit`'s replays (`replay`'s
    `adapt_step_time`)."""
    errors = []
    for point in fit:
        done = replay(point, adapt_step_time=adapt_step_time)
        for group in groups:
            got = done.group(group)
            if got is not None:
                errors.append(abs(got[1].error))
    return statistics.median(errors)


def _grid_search(
    candidates: dict[float, StepTimeCandidate], fit: list[Point], groups: Iterable[str]
) -> tuple[float, dict[float, float]]:
    """Replay `fit` under each grid value's candidate in turn and score the value by the median
    |error| over the metric `groups`; the best value (ties: the smaller) and every score."""
    scores = {value: _fit_score(fit, groups, candidate) for value, candidate in candidates.items()}
    return min(scores, key=lambda v: (scores[v], v)), scores


#: The grid `fit_v1_worker_step` searches (seconds): 0 to 2.5 ms by 0.25 ms, each value the
#: float its decimal literal gives (9 * 0.25e-3 is 0.0022500000000000003, not 2.25e-3), so the
#: fit's choice can be shipped as written and compared with `==`.
V1_WORKER_GRID_S = tuple(round(i * 0.25e-3, 9) for i in range(11))


def overhead_fit_points(points: list[Point]) -> list[Point]:
    """The points `fit_v1_worker_step` reads: the FIT half's replayable points of a dense model
    (an MoE model's GPU terms are refitted separately and would bias a CPU term) not launched
    with `--enforce-eager` (no CUDA graphs: each kernel launches from Python, a cost this term
    does not describe)."""
    from sim.catalog import get_model

    return [
        p
        for p in points
        if p.split == "fit"
        and not why_not_replayable(p)
        and not get_model(p.raw["model"]).is_moe
        and "enforce_eager" not in (p.raw.get("unmodelled") or ())
    ]


def fit_v1_worker_step(
    points: list[Point], grid_s: tuple[float, ...] = V1_WORKER_GRID_S
) -> tuple[float, dict[float, float]]:
    """The V1 model runner's per-step CPU time (`sim.latency.measured_terms.V1_WORKER_STEP_S`)
    that the fit half asks for: the grid value with the smallest median |TPOT/ITL error| over
    `overhead_fit_points` (ties: the smaller value). Returns (best, median |error| per value).
    The held-out half is not read."""
    fit = overhead_fit_points(points)
    candidates = {value: StepTimeCandidate(v1_worker_step_s=value) for value in grid_s}
    return _grid_search(candidates, fit, ("TPOT/ITL",))


#: The grids `fit_frontend` searches, one `ApiServer` field at a time (seconds). Streaming is
#: bounded by a measurement: one API server has streamed 12,850 output tokens/s (vllm PR
#: #12287, https://github.com/vllm-project/vllm/pull/12287, Llama-3.2-1B on an A100, before
#: that PR's speed-ups), so a token's loop work, its detokenization plus its own chunk, is at
#: most 1 / 12,850 s = 78 us (`MAX_STREAM_TOKEN_S`; candidates above it are skipped).
FRONTEND_GRIDS: dict[str, tuple[float, ...]] = {
    "hand_off_s": (0.0, 0.010, 0.015, 0.020, 0.025, 0.030),
    "request_s": (0.0, 0.001, 0.002, 0.004, 0.008),
    "output_token_s": (0.0, 10e-6, 20e-6, 40e-6, 75e-6),
    "output_chunk_s": (0.0, 10e-6, 20e-6, 40e-6, 75e-6),
}
MAX_STREAM_TOKEN_S = 78e-6


def log_error(row: MetricRow) -> float:
    """|ln(predicted / measured)|: the same weight for over- and under-prediction by a factor
    (example: 2 ms predicted against 1 ms, or 1 ms against 2 ms, both ln 2 = 0.693); a value
    that is not positive on either side scores inf."""
    if row.predicted <= 0 or row.measured <= 0:
        return math.inf
    return abs(math.log(row.predicted / row.measured))


def frontend_score(points: list[Point], frontend: ApiServer) -> float:
    """`fit_frontend`'s objective on `points` through `frontend`: per metric group (TTFT,
    TPOT/ITL, throughput), the MEAN over the points that measured it of |ln(predicted /
    measured)| (`log_error`), then the mean of the three groups' means.

    Pre-registered (2026-12-05, before the refit that adopted `VLLM_API_SERVER`'s costs ran)
    in place of the mean of the three groups' MEDIAN |error|: a median does not see the points
    beyond it, and that objective's optimum on the fit half was no API server at all (every
    fitted cost 0), which scored better while missing the fit half's own light-load TTFTs by
    -38% to -79% (dennislee22's lone request, kvcached at 16 req/s, vllm #9668). The mean sees
    every point, and the log ratio weighs a miss by a factor the same either way (a relative
    error is at most -100% below and unbounded above). Example: TTFT log errors 0.1 and 0.3
    (mean 0.2), TPOT/ITL 0.05 (0.05), throughput 0.02 and 0.04 (0.03): score (0.2 + 0.05 +
    0.03) / 3 = 0.0933."""
    return log_score([replay(point, frontend=frontend) for point in points])


def log_score(replays: list[Replay]) -> float:
    """`frontend_score` of replays already run: per group the mean `log_error` over the
    replays that measured it, then the mean over the groups (NaN where none measured any)."""
    means = []
    for name in GROUPS:
        errors = [log_error(found[1]) for r in replays if (found := r.group(name)) is not None]
        if errors:
            means.append(statistics.fmean(errors))
    return statistics.fmean(means) if means else math.nan


def frontend_fit_points(points: list[Point]) -> list[Point]:
    """The points `fit_frontend` reads: every replayable point of the FIT half."""
    return [p for p in points if p.split == "fit" and not why_not_replayable(p)]


def fit_frontend(
    points: list[Point],
    start: ApiServer = VLLM_API_SERVER,
    max_rounds: int = 4,
    echo: Callable[[str], None] | None = None,
) -> tuple[ApiServer, list[str]]:
    """The API server's costs (`sim.engine.frontend`) that the FIT half asks for: coordinate
    descent from `start` over `FRONTEND_GRIDS`, each field in turn set to its grid value with
    the smallest `frontend_score` (ties: the smaller value), until a pass changes nothing (at
    most `max_rounds`), so the result is a local optimum along every grid. `prompt_token_s`
    and `output_batch_s` stay as `start` has them (sourced, not fitted). A candidate already
    scored (the current value of each field, and every candidate of the confirming pass) is
    not replayed again: a replay is deterministic, so its score is the same. Returns the result
    and one line per evaluation and pass (each also given to `echo`, as it comes). The
    held-out half is not read."""
    fit = frontend_fit_points(points)
    best, log, scored = start, [], {}

    def say(line: str) -> None:
        log.append(line)
        if echo is not None:
            echo(line)

    def score(candidate: ApiServer) -> float:
        if candidate not in scored:
            scored[candidate] = frontend_score(fit, candidate)
        return scored[candidate]

    say(f"start: {score(start):.4f} at {start}")
    for number in range(1, max_rounds + 1):
        before = best
        for name, grid in FRONTEND_GRIDS.items():
            scores = {}
            for value in grid:
                candidate = dataclasses.replace(best, **{name: value})
                if candidate.output_token_s + candidate.output_chunk_s > MAX_STREAM_TOKEN_S:
                    continue
                scores[value] = score(candidate)
                say(f"{name}={value:g}: {scores[value]:.4f}")
            best = dataclasses.replace(best, **{name: min(scores, key=lambda v: (scores[v], v))})
        say(f"pass {number}: {score(best):.4f} at {best}")
        if best == before:
            break
    return best, log


def main(argv: list[str] | None = None, adapt_step_time: AdaptStepTime | None = None) -> int:
    """The command line; `adapt_step_time` goes to every replay of the table (`replay`)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="only the first N points")
    parser.add_argument("--ids", default=None, help="comma-separated point ids")
    parser.add_argument("--max-prompts", type=int, default=None,
                        help="shorten longer runs to this many prompts (noted per point)")  # fmt: skip
    parser.add_argument("--detail", action="store_true", help="also every compared metric")
    parser.add_argument("--fit-p2p", action="store_true",
                        help="refit the all-reduce bandwidth without peer access on the fit "
                        "half of the p2p: false points, print it and exit")  # fmt: skip
    parser.add_argument("--fit-frontend", action="store_true",
                        help="refit the API server's costs on the fit half, print them and exit")  # fmt: skip
    parser.add_argument("--fit-overhead", action="store_true",
                        help="refit the V1 model runner's per-step CPU time on the fit half's "
                        "dense points, print it and exit")  # fmt: skip
    parser.add_argument("--forms", action="store_true",
                        help="with --fit-overhead: fit every form of the term "
                        "(sim.latency.worker_form; benchmarks/worker_forms.py) and apply the "
                        "pre-registered rule")  # fmt: skip
    parser.add_argument("--no-api-server", action="store_true",
                        help="replay without the API server (the engine core's view)")  # fmt: skip
    args = parser.parse_args(argv)
    started = time.perf_counter()
    if args.fit_frontend:
        costs, _ = fit_frontend(load_points(), echo=lambda line: print(line, flush=True))
        print(f"best: {costs} (sim.engine.api_server.VLLM_API_SERVER)")
        return 0
    if args.fit_p2p:
        best, scores = fit_host_staged_algbw(load_points())
        for bw, err in scores.items():
            print(f"{bw:5.1f} GB/s: median |error| {100 * err:.1f}% on the fit half")
        print(f"best: {best} GB/s (sim.latency.interconnect.HOST_STAGED_ALGBW_GBPS)")
        return 0
    if args.fit_overhead and args.forms:
        import worker_forms  # benchmarks/, beside this script

        print(worker_forms.report(load_points(), list(worker_forms.WorkerCpuForm)))
        return 0
    if args.fit_overhead:
        best, scores = fit_v1_worker_step(load_points())
        for value, err in scores.items():
            print(
                f"{1e3 * value:5.2f} ms: median |TPOT/ITL error| {100 * err:.1f}% on the fit half"
            )
        print(f"best: {1e3 * best:.2f} ms (sim.latency.measured_terms.V1_WORKER_STEP_S)")
        return 0
    frontend = None if args.no_api_server else VLLM_API_SERVER
    points = select(load_points(), args.ids, args.limit)
    replays = [
        replay(p, args.max_prompts, frontend, adapt_step_time=adapt_step_time) for p in points
    ]
    print(table(replays))
    notes = [f"- {r.point.id}: {r.note}" for r in replays if r.note]
    if notes:
        print("\nShortened:\n" + "\n".join(notes))
    skipped = not_replayed(replays)
    if skipped:
        print("\nNot replayed:\n" + "\n".join(skipped))
    if args.detail:
        print()
        print(detail_table(replays))
    print()
    print(summary(replays))
    print()
    print(sources_summary(replays))
    print(f"\n{len(replays)} points, {len(skipped)} not replayed, "
          f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
