"""Class 2, bounded time and memory for every input.

Every path kvsim reads (a scenario, a trace it names, a step-time profile or coefficients file,
the files of `kvsim plot RUN_DIR`, `kvsim check PATH...`, `kvsim shrink`'s input, `--vllm-root`)
that exists but is not a regular file is refused in one line before it is opened: a FIFO
would block forever, a character device such as /dev/zero would be read until the kernel kills
the process. Device nodes are made in the case's folder with /dev/zero's numbers (1, 5)
(skipped where `mknod` is not permitted); every such case runs in a subprocess under a timeout,
so a regression fails instead of hanging. Also: the scenario size cap, `kvsim step` with huge
counts, and replica counts that enter the up-front memory check.
"""

from __future__ import annotations

import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile.harness import Case, tiny

#: Short: a FIFO case either answers at once or has regressed.
_QUICK_S = 30.0


def _fifo(*rels: str) -> Callable[[Path], None]:
    """A setup making a FIFO (named pipe) at each of `rels`."""

    def setup(folder: Path) -> None:
        for rel in rels:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(folder / rel)

    return setup


def _zero(*rels: str) -> Callable[[Path], None]:
    """A setup making a character device with /dev/zero's numbers at each of `rels`."""

    def setup(folder: Path) -> None:
        for rel in rels:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mknod(folder / rel, stat.S_IFCHR | 0o666, os.makedev(1, 5))
            except PermissionError:
                pytest.skip("mknod of a character device is not permitted here")

    return setup


def _socket(rel: str) -> Callable[[Path], None]:
    """A setup making a Unix socket at `rel` (bound relative to the folder: paths are short)."""

    def setup(folder: Path) -> None:
        old = Path.cwd()
        os.chdir(folder)
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.bind(rel)
            sock.close()
        finally:
            os.chdir(old)

    return setup


_MAKERS = {"fifo": (_fifo, "fifo"), "device": (_zero, "character device")}

#: The commands that take a scenario path as their first argument, with what else they need.
_SCENARIO_COMMANDS: dict[str, tuple[str, ...]] = {
    "run": ("--no-plots",),
    "check": (),
    "shrink": (),
    "sweep": ("--set", "scheduler.max_num_seqs=1,2", "-j", "1", "--no-plots"),
    "capacity": ("--slo", "ttft_p99=2s", "-j", "1", "--no-plots"),
    "compare-versions": ("-j", "1", "--no-plots"),
    "disagg": (),
    "cluster-capacity": ("--rate", "1", "--ttft-p99-s", "1", "--tpot-p99-s", "1", "-j", "1"),
}


def _scenario_node_cases() -> list[Case]:
    """Each scenario-reading command, on a FIFO and on a character device named s.yaml."""
    cases = []
    for command, extra in _SCENARIO_COMMANDS.items():
        for kind, (maker, said) in _MAKERS.items():
            cases.append(
                Case(
                    "bounds",
                    (command, "s.yaml", *extra),
                    2,
                    said,
                    setup=maker("s.yaml"),
                    subprocess=True,
                    timeout_s=_QUICK_S,
                    name=f"{command} on a {kind} scenario is refused before it is opened",
                )
            )
        cases.append(
            Case(
                "bounds",
                (command, "s.yaml", *extra),
                2,
                "folder" if command != "shrink" else "scenario.yaml",
                files={"s.yaml/inner.txt": "not a scenario"},
                name=f"{command} on a folder named s.yaml",
            )
        )
    return cases


def _trace_scenario(workload: str) -> str:
    """The tiny scenario with its inline workload replaced by `workload` (a YAML flow map)."""
    text = tiny()
    start = text.index("workload:")
    end = text.index("step_time:")
    return text[:start] + f"workload: {workload}\n" + text[end:]


#: Workloads that name a file (t.*), each way a scenario can name one.
_TRACE_WORKLOADS = {
    "trace auto csv": ("t.csv", "{kind: trace, path: t.csv}"),
    "trace azure csv": ("t.csv", "{kind: trace, path: t.csv, format: azure}"),
    "trace vidur csv": ("t.csv", "{kind: trace, path: t.csv, format: vidur}"),
    "trace canonical jsonl": ("t.jsonl", "{kind: trace, path: t.jsonl, format: canonical}"),
    "trace mooncake jsonl": ("t.jsonl", "{kind: trace, path: t.jsonl, format: mooncake}"),
    "trace parquet": ("t.parquet", "{kind: trace, path: t.parquet}"),
    "sessions mooncake": (
        "t.jsonl",
        "{kind: sessions, sessions: {source: mooncake, path: t.jsonl}}",
    ),
    "synthetic lengths from a trace": (
        "t.csv",
        "{kind: synthetic, num_requests: 4, arrival: {process: poisson, rate_per_s: 1}, "
        "lengths: {prompt: {kind: trace, path: t.csv}, output: {kind: fixed, value: 4}}}",
    ),
}


def _trace_node_cases() -> list[Case]:
    cases = []
    for label, (rel, workload) in _TRACE_WORKLOADS.items():
        cases.append(
            Case(
                "bounds",
                ("run", "s.yaml", "--no-plots"),
                2,
                "fifo",
                files={"s.yaml": _trace_scenario(workload)},
                setup=_fifo(rel),
                subprocess=True,
                timeout_s=_QUICK_S,
                name=f"run: a {label} workload whose file is a fifo",
            )
        )
    for label in ("trace auto csv", "trace azure csv", "synthetic lengths from a trace"):
        rel, workload = _TRACE_WORKLOADS[label]
        cases.append(
            Case(
                "bounds",
                ("run", "s.yaml", "--no-plots"),
                2,
                "character device",
                files={"s.yaml": _trace_scenario(workload)},
                setup=_zero(rel),
                subprocess=True,
                timeout_s=_QUICK_S,
                name=f"run: a {label} workload whose file is a character device",
            )
        )
    rel, workload = _TRACE_WORKLOADS["trace azure csv"]
    cases.append(
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "folder",
            files={"s.yaml": _trace_scenario(workload), "t.csv/x": ""},
            name="run: an azure trace path that is a folder",
        )
    )
    rel, workload = _TRACE_WORKLOADS["trace auto csv"]
    cases.append(
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots", "--set", "workload.path=f.csv"),
            2,
            "fifo",
            files={"s.yaml": _trace_scenario(workload), "t.csv": "arrival_s,x\n"},
            setup=_fifo("f.csv"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run --set workload.path onto a fifo",
        )
    )
    return cases


_PROFILE_STEP_TIME = "step_time: {calibrated: {profile: p.json}}\n"
_COEFF_STEP_TIME = "step_time: {measured: {coefficients: c.json}}\n"


def _with_step_time(step_time: str) -> str:
    text = tiny().replace("model: null", "model: llama-3.1-8b")
    return text.replace("step_time: {linear: {fixed_s: 0.01}}\n", step_time)


def _profile_cases() -> list[Case]:
    cases = [
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "fifo",
            files={"s.yaml": _with_step_time(_PROFILE_STEP_TIME)},
            setup=_fifo("p.json"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run: a calibrated profile that is a fifo",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "character device",
            files={"s.yaml": _with_step_time(_PROFILE_STEP_TIME)},
            setup=_zero("p.json"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run: a calibrated profile that is a character device",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "fifo",
            files={"s.yaml": _with_step_time(_COEFF_STEP_TIME)},
            setup=_fifo("c.json"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run: measured coefficients that are a fifo",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "folder",
            files={"s.yaml": _with_step_time(_COEFF_STEP_TIME), "c.json/x": ""},
            name="run: measured coefficients that are a folder",
        ),
    ]
    step = ("step", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--decode", "1x10")
    for kind, (maker, said) in _MAKERS.items():
        cases.append(
            Case(
                "bounds",
                (*step, "--step-time", "p.json"),
                2,
                said,
                setup=maker("p.json"),
                subprocess=True,
                timeout_s=_QUICK_S,
                name=f"step --step-time on a {kind} profile",
            )
        )
    cases.append(
        Case(
            "bounds",
            (*step, "--step-time", "p.json"),
            2,
            "folder",
            files={"p.json/x": ""},
            name="step --step-time on a folder",
        )
    )
    return cases


def _plot_cases() -> list[Case]:
    run = {"r/requests.parquet": "", "r/steps.parquet": ""}
    return [
        Case(
            "bounds",
            ("plot", "r"),
            2,
            "fifo",
            files={"r/requests.parquet": ""},
            setup=_fifo("r/steps.parquet"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="plot: steps.parquet is a fifo",
        ),
        Case(
            "bounds",
            ("plot", "r"),
            2,
            "fifo",
            files=run,
            setup=_fifo("r/summary.json"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="plot: summary.json is a fifo",
        ),
        Case(
            "bounds",
            ("plot", "r"),
            2,
            "character device",
            files={"r/x.txt": ""},
            setup=_zero("r/sweep.parquet"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="plot: sweep.parquet is a character device",
        ),
        Case(
            "bounds",
            ("plot", "r"),
            2,
            "folder",
            files={"r/steps.parquet": "", "r/requests.parquet/x": ""},
            name="plot: requests.parquet is a folder",
        ),
        Case(
            "bounds",
            ("plot", "r"),
            2,
            "fifo",
            setup=_fifo("r"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="plot: the run folder is a fifo",
        ),
    ]


def _check_shrink_cases() -> list[Case]:
    return [
        Case(
            "bounds",
            ("check", "d"),
            2,
            "fifo",
            files={"d/a.yaml": tiny("a")},
            setup=_fifo("d/b.yaml"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="check: a folder holding a fifo named b.yaml",
        ),
        Case(
            "bounds",
            ("check", "a.yaml", "b.yaml"),
            2,
            "fifo",
            files={"a.yaml": tiny("a")},
            setup=_fifo("b.yaml"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="check: the second of two scenarios is a fifo",
        ),
        Case(
            "bounds",
            ("check", "s.yaml"),
            2,
            "socket",
            setup=_socket("s.yaml"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="check: the scenario is a socket",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "socket",
            setup=_socket("s.yaml"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run: the scenario is a socket",
        ),
        Case(
            "bounds",
            ("check", "d"),
            0,
            "2 passed",
            files={"d/a.yaml": tiny("a"), "d/sub.yaml/b.yaml": tiny("b")},
            name="check: a folder named sub.yaml inside is searched, not refused",
        ),
        Case(
            "bounds",
            ("shrink", "r"),
            2,
            "fifo",
            files={"r/x.txt": ""},
            setup=_fifo("r/scenario.yaml"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="shrink: a run folder whose scenario.yaml is a fifo",
        ),
        Case(
            "bounds",
            ("shrink", "r"),
            2,
            "character device",
            files={"r/x.txt": ""},
            setup=_zero("r/scenario.yaml"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="shrink: a run folder whose scenario.yaml is a character device",
        ),
    ]


def _vllm_root_cases() -> list[Case]:
    verify = ("verify", "--design", "v0-v2", "--num-ops", "10")
    return [
        Case(
            "bounds",
            (*verify, "--vllm-root", "v"),
            2,
            "fifo",
            setup=_fifo("v"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="verify --vllm-root on a fifo",
        ),
        Case(
            "bounds",
            (*verify, "--vllm-root", "v"),
            2,
            "not a folder",
            files={"v": "a file"},
            name="verify --vllm-root on a regular file",
        ),
        Case(
            "bounds",
            (*verify, "--vllm-root", "v"),
            2,
            "fifo",
            files={"v/vllm/__init__.py": ""},
            setup=_fifo("v/vllm/version.py"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="verify --vllm-root whose vllm/version.py is a fifo",
        ),
        Case(
            "bounds",
            ("verify", "--scheduler", "--design", "v1-engine", "--trace", "t.jsonl"),
            2,
            "fifo",
            setup=_fifo("t.jsonl"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="verify --trace on a fifo",
        ),
        Case(
            "bounds",
            ("verify", "--scheduler", "--design", "v1-engine", "--trace", "t.jsonl"),
            2,
            "character device",
            setup=_zero("t.jsonl"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="verify --trace on a character device",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots", "--vllm-root", "v"),
            2,
            "fifo",
            files={"s.yaml": tiny(design="v0-v2")},
            setup=_fifo("v"),
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run --vllm-root on a fifo",
        ),
    ]


def _size_cases() -> list[Case]:
    big = tiny() + "# " + "x" * (5 << 20) + "\n"
    return [
        Case(
            "bounds",
            (command, "s.yaml", *_SCENARIO_COMMANDS[command]),
            2,
            "trace file",
            files={"s.yaml": big},
            subprocess=True,
            timeout_s=_QUICK_S,
            name=f"{command}: a scenario file over the size cap",
        )
        for command in ("run", "check")
    ]


def _step_cases() -> list[Case]:
    step = ("step", "--model", "llama-3.1-8b", "--gpu", "h100-sxm")
    huge = "1000000000x1000000000"
    return [
        Case(
            "bounds",
            (*step, "--decode", huge),
            2,
            "--decode",
            subprocess=True,
            timeout_s=_QUICK_S,
            name="step --decode 1e9x1e9 answers at once",
        ),
        Case(
            "bounds",
            (*step, "--prefill", huge),
            2,
            "--prefill",
            subprocess=True,
            timeout_s=_QUICK_S,
            name="step --prefill 1e9x1e9 answers at once",
        ),
        Case(
            "bounds",
            (*step, "--decode", "1000000000x100", "--json"),
            2,
            "--decode",
            subprocess=True,
            timeout_s=_QUICK_S,
            name="step --decode with a billion decodes answers at once",
        ),
        Case(
            "bounds",
            (*step, "--decode", "64x4096", "--decode", "64x4096", "--prefill", "1x99999999999"),
            2,
            "--prefill",
            subprocess=True,
            timeout_s=_QUICK_S,
            name="step --prefill beyond any context answers at once",
        ),
        Case(
            "bounds",
            (*step, "--decode", "1024x131072", "--json"),
            0,
            "step_time_s",
            subprocess=True,
            timeout_s=_QUICK_S,
            name="step at the largest batch and context still runs",
        ),
    ]


#: The tiny scenario with 100,000 GPU blocks per replica (~40 MB: one replica fits anywhere).
_BIG_POOL = tiny().replace("num_gpu_blocks: 64", "num_gpu_blocks: 100000")
#: ... as a disaggregated cluster of P prefill and D decode replicas (it needs a model).
_DISAGG = _BIG_POOL.replace("model: null", "model: llama-3.1-8b") + (
    "cluster: {mode: disaggregated, prefill: {replicas: P}, decode: {replicas: D}}\n"
)


def _replica_cases() -> list[Case]:
    scenario = _BIG_POOL.replace(
        "expect: {violations: none}", "engine: {num_replicas: 100000}\nexpect: {violations: none}"
    )

    def disagg(p: int, d: int) -> str:
        return _DISAGG.replace("replicas: P", f"replicas: {p}").replace(
            "replicas: D", f"replicas: {d}"
        )

    return [
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots", "--set", "engine.num_replicas=4"),
            0,
            "outputs",
            files={"s.yaml": tiny()},
            name="run: a few replicas of a small pool still run",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "num_replicas",
            files={"s.yaml": scenario},
            subprocess=True,
            timeout_s=_QUICK_S,
            name="run: engine.num_replicas 100000 is refused at once",
        ),
        Case(
            "bounds",
            ("check", "s.yaml"),
            2,
            "num_replicas",
            files={"s.yaml": scenario},
            subprocess=True,
            timeout_s=_QUICK_S,
            name="check: engine.num_replicas 100000 is refused at once",
        ),
        Case(
            "bounds",
            ("disagg", "s.yaml"),
            2,
            "replicas",
            files={"s.yaml": disagg(100000, 1)},
            subprocess=True,
            timeout_s=_QUICK_S,
            name="disagg: cluster.prefill.replicas 100000 is refused at once",
        ),
        Case(
            "bounds",
            ("disagg", "s.yaml"),
            2,
            "replicas",
            files={"s.yaml": disagg(1, 100000)},
            subprocess=True,
            timeout_s=_QUICK_S,
            name="disagg: cluster.decode.replicas 100000 is refused at once",
        ),
    ]


def _inline_yaml_cases() -> list[Case]:
    dup = tiny().replace("prompt_tokens: 40,", "prompt_tokens: 40, prompt_tokens: 41,")
    tag = tiny().replace("prompt_tokens: 40,", "prompt_tokens: !!python/object:os.system 40,")
    return [
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "duplicate key 'prompt_tokens'",
            files={"s.yaml": dup},
            name="run: a duplicate key inside an inline request",
        ),
        Case(
            "bounds",
            ("run", "s.yaml", "--no-plots"),
            2,
            "invalid yaml",
            files={"s.yaml": tag},
            name="run: a python tag inside an inline request",
        ),
    ]


CASES: list[Case] = [
    *_scenario_node_cases(),
    *_trace_node_cases(),
    *_profile_cases(),
    *_plot_cases(),
    *_check_shrink_cases(),
    *_vllm_root_cases(),
    *_size_cases(),
    *_step_cases(),
    *_replica_cases(),
    *_inline_yaml_cases(),
]
