"""`kvsim fuzz`: random but valid workloads and cache configurations, looking for violations.

Every case is a complete scenario drawn from one integer, its case seed; the case seeds come
from the master seed (`case_seed(master, i)`), so a fuzz run is a deterministic sequence of
cases and only the number of cases a time budget reaches depends on the machine. With
`max_cases` instead of a budget the whole run is deterministic.

What a case varies (all small, so a case runs in milliseconds with the full audit):

* cache: block size (2..16 tokens), pool (6..48 blocks), CPU blocks, watermark, sliding window
  (none, or 1..6 blocks' worth of tokens), prefix caching;
* scheduler: chunked prefill and its token budget, max_num_seqs, max_model_len, preemption
  mode (v0: auto / recompute / swap), FCFS or priority;
* workload: 2..24 inline requests, bursty or spread arrivals, prompts up to a little over
  max_model_len (some get ignored), outputs up to 3 blocks, shared prefixes.

Only combinations the real engine accepts are drawn: on v0 designs a sliding window excludes
prefix caching and chunked prefill (vLLM 0.5.4 raises for both, spec section 1), and the
V1 engine only recomputes.

Example: `fuzz("v0-v2", master_seed=0, max_cases=50)` reports `admission_undercount` (the
sliding-window undercount of vLLM #7470) with the seed of the first case that showed it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.audit import ViolationKind
from sim.ci.check import explicit_yaml
from sim.errors import InputError
from sim.kv.config import Design
from sim.scenario import Scenario, ScenarioError, scenario_from_dict
from sim.workload.errors import WorkloadError

#: Simple step costs: enough to order events, cheap to compute.
FUZZ_STEP_TIME = {
    "linear": {"fixed_s": 0.005, "per_prefill_token_s": 1e-4, "per_decode_seq_s": 1e-4}
}
DEFAULT_BUDGET_S = 60.0


def case_seed(master_seed: int, index: int) -> int:
    """The seed of case `index` of a fuzz run (a uint32, independent of every other case).

    >>> case_seed(0, 0) == case_seed(0, 0) and case_seed(0, 0) != case_seed(0, 1)
    True
    """
    sequence = np.random.SeedSequence(entropy=master_seed, spawn_key=(index,))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


def _int(rng: np.random.Generator, low: int, high: int) -> int:
    """Uniform integer in [low, high] (both ends included)."""
    return int(rng.integers(low, high + 1))


def _cache_and_scheduler(
    rng: np.random.Generator, design: Design, allow_swap: bool = True
) -> tuple[dict, dict]:
    block_size = int(rng.choice([2, 4, 8, 16]))
    num_gpu_blocks = _int(rng, 6, 48)
    sliding_window = _int(rng, 1, 6 * block_size) if rng.random() < 0.6 else None
    is_v0 = design.api == "v0"
    # vLLM 0.5.4 rejects a sliding window together with prefix caching or chunked prefill.
    prefix_caching = bool(rng.random() < 0.4) and not (is_v0 and sliding_window is not None)
    chunked = bool(rng.random() < 0.4) and not (is_v0 and sliding_window is not None)
    if is_v0:
        preemption_mode = str(rng.choice(["auto", "recompute", "swap"]))
    else:
        preemption_mode = "recompute"  # the V1 engine has no swapping
    num_cpu_blocks = _int(rng, 0, 2 * num_gpu_blocks)
    if preemption_mode == "recompute":
        num_cpu_blocks = 0
    if not allow_swap:
        # Drawn above all the same, so a case seed stands for the same case otherwise.
        preemption_mode, num_cpu_blocks = "recompute", 0
    watermark = float(rng.choice([0.0, 0.01, 0.01, 0.05, 0.1]))
    # vLLM refuses to start unless one max-length request fits the pool (v0: G blocks; V1
    # engine: G - 1, block 0 being the null block, and one more with a sliding window); see
    # `sim.runner._check_cache_fits`.
    usable_blocks = num_gpu_blocks if is_v0 else num_gpu_blocks - 2
    max_model_len = _int(rng, 2 * block_size, usable_blocks * block_size)
    max_num_seqs = _int(rng, 1, 8)
    cache = {
        "block_size": block_size,
        "num_gpu_blocks": num_gpu_blocks,
        "num_cpu_blocks": num_cpu_blocks,
        "sliding_window": sliding_window,
        "enable_prefix_caching": prefix_caching,
        "watermark": watermark,
    }
    scheduler = {
        "design": design.value,
        "max_model_len": max_model_len,
        "max_num_seqs": max_num_seqs,
        "enable_chunked_prefill": chunked,
        "policy": "priority" if rng.random() < 0.2 else "fcfs",
        "preemption_mode": preemption_mode,
    }
    if chunked and rng.random() < 0.7:
        # A small token budget makes prompts arrive in several chunks (vLLM: >= max_num_seqs).
        low = max(max_num_seqs, block_size)
        scheduler["max_num_batched_tokens"] = _int(rng, low, max(low, max_model_len))
    if not is_v0 and rng.random() < 0.3:
        scheduler["long_prefill_token_threshold"] = _int(rng, 1, max_model_len)
    return cache, scheduler


def _requests(rng: np.random.Generator, cache: dict, scheduler: dict) -> list[dict]:
    block_size = cache["block_size"]
    max_model_len = scheduler["max_model_len"]
    num_requests = _int(rng, 2, 24)
    mean_gap_s = float(rng.choice([0.0, 0.002, 0.01, 0.05]))
    num_prefixes = _int(rng, 1, 3)
    prefix_tokens = [_int(rng, 1, max(1, max_model_len // 2)) for _ in range(num_prefixes)]
    share_prob = 0.6 if cache["enable_prefix_caching"] else 0.2
    requests = []
    arrival_s = 0.0
    for _ in range(num_requests):
        if mean_gap_s > 0:
            arrival_s += float(rng.exponential(mean_gap_s))
        # Mostly within max_model_len; a few beyond it exercise the "ignored" path.
        prompt = _int(rng, 1, max_model_len + block_size if rng.random() < 0.1 else max_model_len)
        request = {
            "arrival_s": round(arrival_s, 6),
            "prompt_tokens": prompt,
            "output_tokens": _int(rng, 1, 3 * block_size),
        }
        if scheduler["policy"] == "priority":
            request["priority"] = _int(rng, 0, 3)
        if rng.random() < share_prob:
            k = _int(rng, 0, num_prefixes - 1)
            request["prefix_id"] = k
            request["prefix_tokens"] = min(prompt, prefix_tokens[k])
        requests.append(request)
    return requests


def sim_time_limit_s(requests: list[dict]) -> float:
    """A simulated-time cap: 3x the time to serve the requests one by one, plus the arrivals.

    A pool too small for one sequence's next block makes v0 preempt and recompute it forever,
    as vLLM does; the cap ends such a livelock (the run reports `stopped_early`, which is not
    a violation). Serving one request alone takes at most one step per prompt token (the
    smallest chunk) plus one per output token, each of at most fixed + per-token cost.
    Example: 2 requests of 10 prompt + 5 output tokens arriving at 0 s ->
    3 * 30 steps * 0.0052 s + 0 + 1 = 1.468 s.
    """
    linear = FUZZ_STEP_TIME["linear"]
    step_s = linear["fixed_s"] + linear["per_prefill_token_s"] + linear["per_decode_seq_s"]
    num_steps = sum(r["prompt_tokens"] + r["output_tokens"] for r in requests)
    last_arrival_s = max(r["arrival_s"] for r in requests)
    return round(3 * num_steps * step_s + last_arrival_s + 1.0, 6)


def generate_case(design: str | Design, seed: int, allow_swap: bool = True) -> Scenario:
    """The valid scenario that case seed `seed` stands for on `design` (a pure function).

    `allow_swap=False` turns swap preemption off (recompute only, no CPU blocks) and changes
    nothing else of the case.
    """
    design = Design(design)
    rng = np.random.default_rng(seed)
    cache, scheduler = _cache_and_scheduler(rng, design, allow_swap)
    requests = _requests(rng, cache, scheduler)
    data = {
        "name": f"fuzz-{design.value}-{seed}",
        "description": f"kvsim fuzz case seed {seed} on {design.value}",
        "seed": seed,
        "model": None,
        "cache": cache,
        "scheduler": scheduler,
        "engine": {
            "audit_level": "full",
            "violation_policy": "record",
            "max_sim_time_s": sim_time_limit_s(requests),
        },
        "workload": {"kind": "inline", "requests": requests},
        "step_time": FUZZ_STEP_TIME,
        "expect": {"violations": "none"},
    }
    return scenario_from_dict(data, f"fuzz case {seed}")


@dataclass(slots=True)
class Finding:
    """The first case that showed one violation kind (or an engine exception)."""

    kind: str
    case_index: int
    case_seed: int
    message: str
    time_s: float | None
    scenario: Scenario
    observed_kinds: list[str]
    count: int = 1
    #: Seconds from the start of the fuzz run until this case finished.
    found_after_s: float = 0.0

    def reproduce_command(
        self, design: str, saved_path: Path | None = None, allow_swap: bool = True
    ) -> str:
        if saved_path is not None:
            return f"kvsim run {saved_path} --no-plots"
        no_swap = "" if allow_swap else " --no-swap"
        return f"kvsim fuzz --design {design}{no_swap} --case-seed {self.case_seed}"


@dataclass(slots=True)
class FuzzReport:
    design: str
    master_seed: int
    allow_swap: bool = True
    num_cases: int = 0
    elapsed_s: float = 0.0
    stopped_by: str = ""
    findings: dict[str, Finding] = field(default_factory=dict)
    num_fatal_errors: int = 0
    num_violating_cases: int = 0
    #: Cases that reached their simulated-time cap (a preemption livelock; not a violation).
    num_time_limited: int = 0
    #: Cases the scenario validation refused (a generator out of step with `sim.runner`).
    num_invalid_cases: int = 0
    first_invalid: str | None = None
    saved: dict[str, Path] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        return sorted(self.findings)

    def to_dict(self) -> dict:
        return {
            "design": self.design,
            "master_seed": self.master_seed,
            "allow_swap": self.allow_swap,
            "num_cases": self.num_cases,
            "elapsed_s": round(self.elapsed_s, 3),
            "stopped_by": self.stopped_by,
            "num_violating_cases": self.num_violating_cases,
            "num_fatal_errors": self.num_fatal_errors,
            "num_time_limited": self.num_time_limited,
            "num_invalid_cases": self.num_invalid_cases,
            "first_invalid": self.first_invalid,
            "findings": [
                {
                    "kind": f.kind,
                    "case_index": f.case_index,
                    "case_seed": f.case_seed,
                    "num_cases": f.count,
                    "found_after_s": round(f.found_after_s, 3),
                    "message": f.message,
                    "time_s": f.time_s,
                    "observed_kinds": f.observed_kinds,
                    "reproduce": f.reproduce_command(
                        self.design, self.saved.get(f.kind), self.allow_swap
                    ),
                    "saved": str(self.saved[f.kind]) if f.kind in self.saved else None,
                }
                for f in (self.findings[k] for k in self.kinds)
            ],
        }


@dataclass(frozen=True, slots=True)
class CaseResult:
    """What one case showed: (kind, first message, first time) per kind, and how it ended."""

    kinds: list[tuple[str, str, float | None]]
    fatal_error: str | None = None
    stopped_early: str | None = None

    @property
    def kind_names(self) -> list[str]:
        return [kind for kind, _, _ in self.kinds]


def run_case(scenario: Scenario) -> CaseResult:
    """Run one case. An exception escaping the simulator is a finding, `exception:<Type>`."""
    from sim.runner import run

    try:
        result = run(scenario)
    except (ScenarioError, WorkloadError):
        raise
    except Exception as error:  # noqa: BLE001 - a crash of the simulator is what we look for
        first_line = str(error).splitlines()[0] if str(error) else ""
        kind = f"exception:{type(error).__name__}"
        return CaseResult([(kind, f"{type(error).__name__}: {first_line}", None)])
    frame = result.violations
    kinds = []
    for kind in sorted(set(frame["kind"])) if len(frame) else []:
        row = frame[frame["kind"] == kind].iloc[0]
        time_s = row["time_s"]
        kinds.append((kind, str(row["message"]), None if time_s != time_s else float(time_s)))
    return CaseResult(kinds, result.summary.get("fatal_error"), result.summary.get("stopped_early"))


def fuzz(
    design: str | Design,
    master_seed: int = 0,
    budget_s: float | None = DEFAULT_BUDGET_S,
    max_cases: int | None = None,
    on_case: Callable[[int, FuzzReport], None] | None = None,
    allow_swap: bool = True,
) -> FuzzReport:
    """Run cases `case_seed(master_seed, 0), (…, 1), …` until the budget or the case count ends.

    At least one case always runs. Returns the first finding of every distinct kind.
    """
    design = Design(design)
    if budget_s is None and max_cases is None:
        raise InputError("fuzz needs a time budget or a maximum number of cases")
    if max_cases is not None and max_cases < 1:
        raise InputError(f"max_cases must be >= 1, got {max_cases}")
    if budget_s is not None and budget_s <= 0:
        raise InputError(f"budget must be positive, got {budget_s} s")
    report = FuzzReport(design.value, master_seed, allow_swap=allow_swap)
    start = time.perf_counter()
    index = 0
    while True:
        seed = case_seed(master_seed, index)
        scenario = generate_case(design, seed, allow_swap)
        try:
            case = run_case(scenario)
        except (ScenarioError, WorkloadError) as error:
            report.num_invalid_cases += 1
            report.first_invalid = report.first_invalid or f"case seed {seed}: {error}"
            case = CaseResult([])
        report.num_cases += 1
        report.num_fatal_errors += case.fatal_error is not None
        report.num_time_limited += bool(case.stopped_early) and case.fatal_error is None
        report.num_violating_cases += bool(case.kinds)
        observed = case.kind_names
        for kind, message, time_s in case.kinds:
            if kind in report.findings:
                report.findings[kind].count += 1
            else:
                found_after_s = time.perf_counter() - start
                report.findings[kind] = Finding(
                    kind, index, seed, message, time_s, scenario, observed, 1, found_after_s
                )
        if on_case is not None:
            on_case(index, report)
        index += 1
        report.elapsed_s = time.perf_counter() - start
        if max_cases is not None and index >= max_cases:
            report.stopped_by = f"{max_cases} cases"
            break
        if budget_s is not None and report.elapsed_s >= budget_s:
            report.stopped_by = f"budget of {budget_s:g} s"
            break
    return report


def finding_yaml(finding: Finding, design: str) -> str:
    """A self-contained scenario for a finding, expecting exactly the kinds its case showed."""
    kinds = [k for k in finding.observed_kinds if not k.startswith("exception:")]
    scenario = finding.scenario.model_copy(
        update={
            "name": f"fuzz-{design}-{finding.kind.replace(':', '-')}-{finding.case_seed}",
            "expect": finding.scenario.expect.model_copy(
                update={"violations": [ViolationKind(k) for k in kinds] or "none"}
            ),
        }
    )
    header = (
        f"# Found by: kvsim fuzz --design {design} (case {finding.case_index}, "
        f"case seed {finding.case_seed}).\n"
        f"# First {finding.kind}: {finding.message}\n"
        f"# Reproduce: kvsim run <this file> --no-plots   (or: kvsim fuzz --design {design} "
        f"--case-seed {finding.case_seed})\n"
    )
    return header + explicit_yaml(scenario)


def save_findings(report: FuzzReport, out_dir: str | Path) -> dict[str, Path]:
    """Write one scenario YAML per finding into `out_dir`; returns kind -> path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for kind in report.kinds:
        finding = report.findings[kind]
        name = f"{report.design}-{kind.replace(':', '-')}-seed{finding.case_seed}.yaml"
        path = out / name
        path.write_text(finding_yaml(finding, report.design), encoding="utf-8")
        report.saved[kind] = path
    return dict(report.saved)


def parse_budget(text: str) -> float:
    """'60s' -> 60.0, '2m' -> 120.0, '90' -> 90.0, '1.5h' -> 5400.0 (seconds)."""
    raw = text.strip().lower()
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
    for suffix in sorted(units, key=len, reverse=True):
        if raw.endswith(suffix):
            number, scale = raw[: -len(suffix)], units[suffix]
            break
    else:
        number, scale = raw, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise InputError(f"--budget {text!r}: expected a duration such as 60s, 2m or 90") from None
    if not value > 0:
        raise InputError(f"--budget {text!r}: must be positive")
    return value
