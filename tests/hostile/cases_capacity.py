"""Class 7, capacity answers that are true: planning commands' arguments, seeds that reach the
workload (or a refusal saying they cannot), and closed-loop capacity.

Every `kvsim capacity` case writes into ``out`` (declared), with ``--no-plots --no-band -j 1``
so a case runs in this process in well under a second.
"""

from __future__ import annotations

from tests.hostile.harness import ROOT, Case, tiny

#: A small synthetic V1 scenario whose workload pins its seed (the case of issue 20, section 7).
PINNED = """\
name: pinned
model: null
cache: {block_size: 16, num_gpu_blocks: 256, num_cpu_blocks: 0, sliding_window: null}
scheduler: {design: v1-engine, max_model_len: 512, max_num_seqs: 8}
workload:
  kind: synthetic
  seed: 7
  num_requests: 40
  arrival: {process: poisson, rate_per_s: 20.0}
  lengths:
    prompt: {kind: uniform, min_tokens: 16, max_tokens: 200}
    output: {kind: uniform, min_tokens: 2, max_tokens: 20}
step_time: {linear: {fixed_s: 0.005}}
"""

#: Small closed-loop sessions: a turn arrives a think time after the previous one finished.
SESSIONS = """\
name: chat
model: null
cache: {block_size: 16, num_gpu_blocks: 512, num_cpu_blocks: 0, sliding_window: null,
        enable_prefix_caching: true}
scheduler: {design: v1-engine, max_model_len: 2048, max_num_seqs: 16}
workload:
  kind: sessions
  seed: 3
  sessions:
    source: synthetic
    num_sessions: 6
    arrival: {process: poisson, rate_per_s: 2.0}
    turns: {min: 2, max: 4}
    first_prompt: {kind: uniform, min_tokens: 50, max_tokens: 200}
    new_tokens: {kind: uniform, min_tokens: 10, max_tokens: 40}
    output: {kind: uniform, min_tokens: 5, max_tokens: 30}
    think_s: {kind: exponential, mean_s: 1.0}
step_time: {linear: {fixed_s: 0.01}}
"""

#: A canonical trace: its arrivals and lengths are the file's, whatever the seed.
TRACE_CSV = "request_id,arrival_s,prompt_tokens,output_tokens\n" + "".join(
    f"{i},{i * 0.05:.2f},{20 + i},{3 + i % 4}\n" for i in range(30)
)
TRACE = tiny("traced").replace(
    """  kind: inline
  requests:
    - {arrival_s: 0.0, prompt_tokens: 40, output_tokens: 4}
    - {arrival_s: 0.01, prompt_tokens: 20, output_tokens: 3}
""",
    "  kind: trace\n  path: t.csv\n",
)

_FAST = ("--no-plots", "--no-band", "-j", "1", "-o", "out")


def cap(*args: str, scenario: str = "s.yaml") -> tuple[str, ...]:
    """`kvsim capacity SCENARIO ARGS --no-plots --no-band -j 1 -o out`."""
    return ("capacity", scenario, *args, *_FAST)


def bad_capacity(args: tuple[str, ...], fragment: str, name: str, text: str = "") -> Case:
    """A `kvsim capacity` on the tiny scenario that must be refused in one line (exit 2)."""
    return Case(
        "capacity",
        cap(*args),
        2,
        fragment,
        files={"s.yaml": text or tiny()},
        outputs=("out",),
        name=name,
    )


_SLO = ("--slo", "ttft_p99=1s")

CAPACITY_ARGS: list[Case] = [
    bad_capacity(("--slo", "ttft_p95=1s"), "unknown metric 'ttft_p95'", "slo unknown metric"),
    bad_capacity(("--slo", "ttft_p99"), "METRIC=DURATION", "slo without ="),
    bad_capacity(("--slo", "ttft_p99=100"), "needs a unit", "slo bare number"),
    bad_capacity(("--slo", "ttft_p99=0s"), "must be positive", "slo zero limit"),
    bad_capacity(("--slo", "ttft_p99=-1s"), "duration", "slo negative limit"),
    bad_capacity(("--slo", "ttft_p99=fast"), "duration", "slo not a duration"),
    bad_capacity(("--slo", "ttft_p99=1h"), "duration", "slo unknown unit"),
    bad_capacity(("--slo", "=1s"), "unknown metric", "slo no metric"),
    bad_capacity((*_SLO, "--seeds", "a,b"), "not an integer", "seeds not integers"),
    bad_capacity((*_SLO, "--seeds=-1"), "must be >= 0", "seeds negative"),
    bad_capacity((*_SLO, "--seeds", ","), "at least one seed", "seeds empty"),
    bad_capacity(
        (*_SLO, "--seeds", "1,1"),
        "repeated",
        "seeds repeated are not independent replicates",
        PINNED,
    ),
    bad_capacity((*_SLO, "--tolerance", "0"), "--tolerance", "tolerance zero"),
    bad_capacity((*_SLO, "--tolerance", "1.5"), "--tolerance", "tolerance above one"),
    bad_capacity((*_SLO, "--tolerance", "nan"), "--tolerance", "tolerance nan"),
    bad_capacity((*_SLO, "--target-rate", "0"), "--target-rate", "target rate zero"),
    bad_capacity((*_SLO, "--target-rate", "nan"), "--target-rate", "target rate nan"),
    bad_capacity((*_SLO, "--target-rate", "inf"), "--target-rate", "target rate inf"),
    bad_capacity((*_SLO, "--step-time-band", "2,1"), "--step-time-band", "band reversed"),
    bad_capacity((*_SLO, "--step-time-band", "abc"), "--step-time-band", "band not numbers"),
    bad_capacity((*_SLO, "--step-time-band", "0.9"), "--step-time-band", "band one number"),
    bad_capacity((*_SLO, "--step-time-band", "nan,nan"), "--step-time-band", "band nan"),
    bad_capacity((*_SLO, "--step-time-band", "0.5,inf"), "--step-time-band", "band inf"),
    bad_capacity((*_SLO, "--compare", "bogus.key=1,2"), "bogus", "compare unknown key"),
    bad_capacity(
        (*_SLO, "--compare", "scheduler.max_num_seqs=4,4"), "repeated", "compare repeated value"
    ),
    bad_capacity((*_SLO, "--set", "bogus.key=1"), "bogus", "set unknown key"),
    Case(
        "capacity",
        ("capacity", "s.yaml", *_SLO, "--no-plots", "-j", "0", "-o", "out"),
        2,
        "--workers",
        files={"s.yaml": tiny()},
        outputs=("out",),
        name="workers zero",
    ),
    Case(
        "capacity",
        ("capacity", "s.yaml", *_SLO, "--no-plots", "--workers=-2", "-o", "out"),
        2,
        "--workers",
        files={"s.yaml": tiny()},
        outputs=("out",),
        name="workers negative",
    ),
    bad_capacity(
        _SLO,
        "same instant",
        "every arrival at one instant has no rate to scale",
        tiny().replace("arrival_s: 0.01", "arrival_s: 0.0"),
    ),
    Case(
        "capacity",
        cap(*_SLO, "--set", "workload.num_requests=20"),
        2,
        "cluster-capacity",
        files={"s.yaml": (ROOT / "scenarios" / "pd_disagg_llama8b_h100.yaml").read_text()},
        outputs=("out",),
        name="capacity on a disaggregated scenario is refused before any probe",
    ),
    Case(
        "capacity",
        cap(*_SLO, scenario="missing.yaml"),
        2,
        "missing.yaml",
        outputs=("out",),
        name="capacity on a missing scenario",
    ),
    Case(
        "capacity",
        ("capacity", "s.yaml", "--no-plots"),
        2,
        "--slo",
        files={"s.yaml": tiny()},
        name="capacity without --slo",
    ),
]

#: Seeds that cannot reach the workload are refused; seeds on a pinned workload reach it.
SEEDS: list[Case] = [
    bad_capacity((*_SLO, "--seeds", "0,1,2"), "seed", "seeds on an inline workload are refused"),
    Case(
        "capacity",
        cap(*_SLO, "--seeds", "0,1"),
        2,
        "seed",
        files={"s.yaml": TRACE, "t.csv": TRACE_CSV},
        outputs=("out",),
        name="seeds on a trace workload are refused",
    ),
    Case(
        "capacity",
        cap(*_SLO, "--seeds", "0,1,2"),
        0,
        "workload.seed",
        files={"s.yaml": PINNED},
        outputs=("out",),
        name="seeds reach a pinned workload.seed",
    ),
    Case(
        "capacity",
        cap(*_SLO, "--seeds", "0"),
        0,
        "kvsim capacity",
        files={"s.yaml": TRACE, "t.csv": TRACE_CSV},
        outputs=("out",),
        name="one seed on a trace workload runs",
    ),
    Case(
        "capacity",
        cap(*_SLO, "--compare", "seed=0,1"),
        2,
        "pins workload.seed",
        files={"s.yaml": PINNED},
        outputs=("out",),
        name="compare over seed on a pinned workload.seed is refused",
    ),
    Case(
        "capacity",
        cap(*_SLO, "--compare", "workload.seed=1,2", "--seeds", "0,1"),
        2,
        "both set the seed",
        files={"s.yaml": PINNED},
        outputs=("out",),
        name="seeds and a compared seed are refused",
    ),
    Case(
        "capacity",
        cap(*_SLO, "--compare", "workload.seed=1,2"),
        0,
        "kvsim capacity",
        files={"s.yaml": PINNED},
        outputs=("out",),
        name="compare over workload.seed keeps each configuration's seed",
    ),
    Case(
        "capacity",
        ("sweep", "s.yaml", "--set", "seed=0,1", "--no-plots", "-j", "1", "-o", "out"),
        2,
        "workload.seed",
        files={"s.yaml": PINNED},
        outputs=("out",),
        name="sweep over seed on a pinned workload.seed is refused",
    ),
    Case(
        "capacity",
        ("sweep", "s.yaml", "--set", "seed=0,1", "--no-plots", "-j", "1", "-o", "out"),
        2,
        "seed",
        files={"s.yaml": tiny()},
        outputs=("out",),
        name="sweep over seed on an inline workload is refused",
    ),
    Case(
        "capacity",
        ("sweep", "s.yaml", "--set", "workload.seed=0,1", "--no-plots", "-j", "1", "-o", "out"),
        0,
        "2 points",
        files={"s.yaml": PINNED},
        outputs=("out",),
        name="sweep over workload.seed runs",
    ),
]

#: Closed loop: the capacity is the rate measured at the passing probe, and the table says so.
CLOSED_LOOP: list[Case] = [
    Case(
        "capacity",
        cap("--slo", "ttft_p99=2s"),
        0,
        "closed loop",
        files={"s.yaml": SESSIONS},
        outputs=("out",),
        name="closed-loop sessions capacity says it is measured",
    ),
]


def _sweep(*args: str) -> tuple[str, ...]:
    return ("sweep", "s.yaml", *args, "--no-plots", "-o", "out")


SWEEP: list[Case] = [
    Case("capacity", _sweep("--set", "bogus=1"), 2, "bogus", files={"s.yaml": tiny()},
         outputs=("out",), name="sweep unknown key"),
    Case("capacity", _sweep("--set", "scheduler.max_num_seqs=4,4"), 2, "repeated",
         files={"s.yaml": tiny()}, outputs=("out",), name="sweep repeated value"),
    Case("capacity", _sweep("--set", "scheduler.max_num_seqs=4", "--set",
                            "scheduler.max_num_seqs=8"), 2, "given twice",
         files={"s.yaml": tiny()}, outputs=("out",), name="sweep key given twice"),
    Case("capacity", _sweep("--set", "scheduler.max_num_seqs=4", "-j", "0"), 2, "--workers",
         files={"s.yaml": tiny()}, outputs=("out",), name="sweep workers zero"),
    Case("capacity", _sweep("--set", "scheduler.max_num_seqs"), 2, "scheduler.max_num_seqs",
         files={"s.yaml": tiny()}, outputs=("out",), name="sweep set without value"),
]  # fmt: skip


def _cc(*args: str, scenario: str = "s.yaml") -> tuple[str, ...]:
    base = ("cluster-capacity", scenario, "--rate", "10", "--ttft-p99-s", "1", "--tpot-p99-s")
    return (*base, "0.1", *args)


def bad_cc(argv: tuple[str, ...], fragment: str, name: str, text: str = PINNED) -> Case:
    return Case("capacity", argv, 2, fragment, files={"s.yaml": text}, name=name)


_RATE = ("cluster-capacity", "s.yaml", "--ttft-p99-s", "1", "--tpot-p99-s", "0.1", "-j", "1")

CLUSTER_CAPACITY: list[Case] = [
    bad_cc((*_RATE, "--rate", "0"), "--rate", "cluster-capacity rate zero"),
    bad_cc((*_RATE, "--rate", "nan"), "--rate", "cluster-capacity rate nan"),
    bad_cc((*_RATE, "--rate", "inf"), "--rate", "cluster-capacity rate inf"),
    bad_cc(_cc("--max-gpus", "0"), "--max-gpus", "cluster-capacity max gpus zero"),
    bad_cc(_cc("--max-gpus=-1"), "--max-gpus", "cluster-capacity max gpus negative"),
    bad_cc(
        (
            "cluster-capacity",
            "s.yaml",
            "--rate",
            "10",
            "--ttft-p99-s",
            "nan",
            "--tpot-p99-s",
            "0.1",
        ),
        "--ttft-p99-s",
        "cluster-capacity ttft nan",
    ),  # fmt: skip
    bad_cc(
        ("cluster-capacity", "s.yaml", "--rate", "10", "--ttft-p99-s", "1", "--tpot-p99-s", "0"),
        "--tpot-p99-s",
        "cluster-capacity tpot zero",
    ),  # fmt: skip
    bad_cc(_cc("-j", "0"), "--workers", "cluster-capacity workers zero"),
    bad_cc(
        _cc("--routers", "round_robin,round_robin"), "distinct", "cluster-capacity routers twice"
    ),
    bad_cc(_cc(), "synthetic", "cluster-capacity on closed-loop sessions", SESSIONS),
    bad_cc(_cc(), "synthetic", "cluster-capacity on an inline workload", tiny()),
]

CASES: list[Case] = CAPACITY_ARGS + SEEDS + CLOSED_LOOP + SWEEP + CLUSTER_CAPACITY
