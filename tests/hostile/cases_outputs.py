"""Class 1, never damage what is not ours: output targets, shared paths, scenario names, locks.

The rule these cases hold kvsim to (`sim.files.outdir`): an output path that exists and is not a
regular file is never renamed over. A character device or a FIFO is written in place (so
``--json /dev/stdout`` works, and ``--junit /dev/null`` leaves /dev/null a device); a FIFO
with no reader is refused rather than waited on; a block device, a socket or a symlink to
nothing is refused. Device nodes are made here, in the case's own folder (copies of
/dev/null's, /dev/full's and /dev/zero's numbers); no case names a real /dev path.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.hostile.harness import Case, tiny

Setup = Callable[[Path], None]

#: Lock holders started by `_lock_held`; they end when this process closes their stdin.
_HOLDERS: list[subprocess.Popen] = []


# ---------------------------------------------------------------- setups
def _node(rel: str, minor: int, kind: int = stat.S_IFCHR, major: int = 1) -> Setup:
    """A device node at `rel` (major 1: mem devices; minor 3 null, 5 zero, 7 full)."""

    def make(folder: Path) -> None:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.mknod(path, kind | 0o666, os.makedev(major, minor))
        except PermissionError:
            pytest.skip("making a device node needs CAP_MKNOD (not permitted here)")

    return make


def _null(rel: str) -> Setup:
    return _node(rel, 3)


def _full(rel: str) -> Setup:
    return _node(rel, 7)


def _zero(rel: str) -> Setup:
    return _node(rel, 5)


def _block(rel: str) -> Setup:
    # A loop device number no system has (loop250): refused before it is ever opened.
    return _node(rel, 250, stat.S_IFBLK, 7)


def _fifo(rel: str) -> Setup:
    def make(folder: Path) -> None:
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(path)

    return make


def _socket(rel: str) -> Setup:
    def make(folder: Path) -> None:
        old = Path.cwd()
        os.chdir(folder)  # bind a short relative name: AF_UNIX paths are limited to 108 bytes
        try:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(rel)
        finally:
            os.chdir(old)

    return make


def _link(rel: str, target: str) -> Setup:
    def make(folder: Path) -> None:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, folder / rel)

    return make


def _run_dir(rel: str, scenario: str = "s.yaml") -> Setup:
    """An earlier `kvsim run` (with plots) at `rel`, made in-process."""

    def make(folder: Path) -> None:
        from typer.testing import CliRunner

        from sim.cli.main import app

        old = Path.cwd()
        os.chdir(folder)
        try:
            result = CliRunner().invoke(app, ["run", scenario, "-o", rel])
        finally:
            os.chdir(old)
        assert result.exit_code == 0, result.output

    return make


_HOLD = """
import fcntl, os, select, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.flock(fd, fcntl.LOCK_EX)
os.ftruncate(fd, 0)
os.write(fd, f"{os.getpid()}\\n".encode())
print("ready", flush=True)
select.select([sys.stdin], [], [], 120)  # until the test process ends (EOF) or 2 minutes
"""


def _lock_held(rel: str) -> Setup:
    """Another process holds the advisory lock of output folder `rel` (`.NAME.lock` beside it)."""

    def make(folder: Path) -> None:
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = target.parent / f".{target.name}.lock"
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(lock)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        _HOLDERS.append(holder)

    return make


def _reader(fifo: str, sink: str) -> Setup:
    """A reader on FIFO `fifo` that copies what comes into `sink` (gives up after 30 s)."""

    def make(folder: Path) -> None:
        subprocess.Popen(
            ["timeout", "30", "sh", "-c", f"cat {fifo} > {sink}"],
            cwd=folder,
            stdin=subprocess.DEVNULL,
        )

    return make


def _all(*setups: Setup) -> Setup:
    def make(folder: Path) -> None:
        for setup in setups:
            setup(folder)

    return make


# ---------------------------------------------------------------- scenarios
S = {"s.yaml": tiny()}

#: On v0-v2 this shows admission_undercount (the 4-vs-3 case), so `kvsim shrink` has work.
SWA = """\
name: swa
model: null
cache: {block_size: 16, num_gpu_blocks: 10, sliding_window: 24}
scheduler: {design: v0-v2, max_model_len: 160}
workload:
  kind: inline
  requests:
    - {arrival_s: 0.0, prompt_tokens: 112, output_tokens: 8}
    - {arrival_s: 0.0, prompt_tokens: 64, output_tokens: 8}
step_time: {linear: {fixed_s: 0.01}}
expect: {violations: [admission_undercount]}
"""

#: A synthetic workload, for sweep and capacity.
SYN = """\
name: {name}
model: null
cache: {{block_size: 16, num_gpu_blocks: 64, num_cpu_blocks: 0, sliding_window: null}}
scheduler: {{design: v1-engine, max_model_len: 256}}
workload:
  kind: synthetic
  num_requests: 20
  seed: 1
  arrival: {{process: poisson, rate_per_s: 10}}
  lengths:
    prompt: {{kind: fixed, value: 32}}
    output: {{kind: fixed, value: 4}}
step_time: {{linear: {{fixed_s: 0.01}}}}
"""

#: A disaggregated one (one prefill, one decode replica), for `kvsim disagg`.
PD = """\
name: {name}
model: llama-3.1-8b
hardware: {{gpu: h100-sxm}}
cache: {{block_size: 16, num_gpu_blocks: 256}}
scheduler: {{design: v1-engine, vllm_version: "0.11.0", max_model_len: 512}}
engine: {{num_replicas: 2}}
cluster:
  mode: disaggregated
  prefill: {{replicas: 1}}
  decode: {{replicas: 1}}
  link: rdma-400g
workload:
  kind: synthetic
  num_requests: 4
  seed: 1
  arrival: {{process: poisson, rate_per_s: 10}}
  lengths:
    prompt: {{kind: fixed, value: 64}}
    output: {{kind: fixed, value: 4}}
"""

SWEEP = ("sweep", "s.yaml", "--set", "cache.num_gpu_blocks=64", "-j", "1", "--no-plots")
CAPACITY = ("capacity", "s.yaml", "--slo", "ttft_p99=2s", "--no-band", "--no-plots", "-j", "1")
COMPARE = ("compare-versions", "s.yaml", "-j", "1", "--no-plots")
FUZZ = ("fuzz", "--max-cases", "1")
RUN = ("run", "s.yaml", "--no-plots")


def _named(name: str) -> dict[str, str]:
    """The tiny scenario under the YAML-quoted `name` (for hostile names)."""
    return {"s.yaml": tiny().replace("name: tiny", f"name: {name}")}


def _outputs_cases() -> list[Case]:
    """Device nodes, FIFOs, sockets and symlinks as single-file outputs."""
    o = "outputs"
    return [
        Case(
            o,
            ("check", "s.yaml", "--json", "null"),
            0,
            "1 passed",
            files=S,
            setup=_null("null"),
            name="check --json onto a device node writes it in place",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "null"),
            0,
            "1 passed",
            files=S,
            setup=_null("null"),
            name="check --junit onto a device node writes it in place",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "null", "--json", "r.json"),
            0,
            "1 passed",
            files=S,
            setup=_null("null"),
            outputs=("r.json",),
            name="check --junit device and --json file",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "full"),
            2,
            "no space left",
            files=S,
            setup=_full("full"),
            name="check --json onto a full device is one line",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "sub/null"),
            0,
            "1 passed",
            files=S,
            setup=_null("sub/null"),
            name="check --junit onto a device in a subfolder",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "stdout"),
            0,
            "1 passed",
            files=S,
            setup=_all(_null("null"), _link("stdout", "null")),
            name="check --json onto a symlink to a device (the /dev/stdout shape)",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "fifo"),
            2,
            "no reader",
            files=S,
            setup=_fifo("fifo"),
            subprocess=True,
            timeout_s=60,
            name="check --json onto a FIFO with no reader does not block",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "fifo"),
            2,
            "no reader",
            files=S,
            setup=_fifo("fifo"),
            subprocess=True,
            timeout_s=60,
            name="check --junit onto a FIFO with no reader does not block",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "fifo"),
            0,
            "1 passed",
            files=S,
            setup=_all(_fifo("fifo"), _reader("fifo", "got.json")),
            subprocess=True,
            timeout_s=60,
            outputs=("got.json",),
            name="check --json onto a FIFO with a reader writes into it",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "sock"),
            2,
            "socket",
            files=S,
            setup=_socket("sock"),
            name="check --json onto a unix socket is refused",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "blk"),
            2,
            "block device",
            files=S,
            setup=_block("blk"),
            name="check --junit onto a block device is refused",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "dangling"),
            2,
            "symlink",
            files=S,
            setup=_link("dangling", "no-such-file"),
            name="check --json onto a dangling symlink is refused",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "latest.json"),
            0,
            "1 passed",
            files={**S, "reports/real.json": "old"},
            setup=_link("latest.json", "reports/real.json"),
            outputs=("reports/real.json",),
            name="check --json through a symlink keeps the link and writes its file",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "dirlink"),
            2,
            "is a folder",
            files={**S, "d/keep.txt": "mine"},
            setup=_link("dirlink", "d"),
            name="check --junit onto a symlink to a folder",
        ),
        Case(
            o,
            ("shrink", "s.yaml", "-o", "null"),
            0,
            "shrunk",
            files={"s.yaml": SWA},
            setup=_null("null"),
            name="shrink -o onto a device node writes it in place",
        ),
        Case(
            o,
            ("shrink", "s.yaml", "-o", "fifo"),
            2,
            "no reader",
            files={"s.yaml": SWA},
            setup=_fifo("fifo"),
            subprocess=True,
            timeout_s=90,
            name="shrink -o onto a FIFO with no reader does not block",
        ),
        Case(
            o,
            ("shrink", "s.yaml", "-o", "sock"),
            2,
            "socket",
            files={"s.yaml": SWA},
            setup=_socket("sock"),
            name="shrink -o onto a socket is refused before shrinking",
        ),
        Case(
            o,
            (*FUZZ, "--json", "null"),
            1,
            "violation kind",
            setup=_null("null"),
            name="fuzz --json onto a device node writes it in place",
        ),
        Case(
            o,
            (*FUZZ, "--json", "fifo"),
            2,
            "no reader",
            setup=_fifo("fifo"),
            subprocess=True,
            timeout_s=90,
            name="fuzz --json onto a FIFO with no reader",
        ),
        Case(
            o,
            (*FUZZ, "--save", "null"),
            2,
            "not a folder",
            setup=_null("null"),
            name="fuzz --save onto a device node",
        ),
        Case(
            o,
            (*FUZZ, "--save", "found", "--json", "found"),
            2,
            "--save and --json",
            name="fuzz --save and --json one path",
        ),
        Case(
            o,
            (*RUN, "-o", "null"),
            2,
            "not a folder",
            files=S,
            setup=_null("null"),
            name="run -o onto a device node",
        ),
        Case(
            o,
            (*RUN, "-o", "nl"),
            2,
            "not a folder",
            files=S,
            setup=_all(_null("null"), _link("nl", "null")),
            name="run -o onto a link to a device",
        ),
        Case(
            o,
            ("disagg", "s.yaml", "-o", "null"),
            2,
            "not a folder",
            files={"s.yaml": PD.format(name="pd")},
            setup=_null("null"),
            name="disagg -o onto a device node",
        ),
        Case(
            o,
            (*SWEEP, "-o", "null"),
            2,
            "not a folder",
            files={"s.yaml": SYN.format(name="w")},
            setup=_null("null"),
            name="sweep -o onto a device node",
        ),
        Case(
            o,
            (*CAPACITY, "-o", "null"),
            2,
            "not a folder",
            files={"s.yaml": SYN.format(name="c")},
            setup=_null("null"),
            name="capacity -o onto a device node",
        ),
        Case(
            o,
            (*COMPARE, "-o", "null"),
            2,
            "not a folder",
            files=S,
            setup=_null("null"),
            name="compare-versions -o onto a device node",
        ),
        Case(
            o,
            (*SWEEP, "-o", "sw"),
            0,
            "sweep.parquet",
            files={"s.yaml": SYN.format(name="w")},
            setup=_null("sw/sweep.csv"),
            outputs=("sw/sweep.parquet", "sw/points.jsonl"),
            name="sweep table onto a device node in the output folder writes it in place",
        ),
        Case(
            o,
            (*SWEEP, "-o", "sw"),
            2,
            "points.jsonl",
            files={"s.yaml": SYN.format(name="w")},
            setup=_fifo("sw/points.jsonl"),
            subprocess=True,
            timeout_s=60,
            name="sweep cache file a FIFO is refused, not read forever",
        ),
        Case(
            o,
            (*SWEEP, "-o", "sw"),
            2,
            "points.jsonl",
            files={"s.yaml": SYN.format(name="w")},
            setup=_all(_zero("zero"), _link("sw/points.jsonl", "../zero")),
            subprocess=True,
            timeout_s=60,
            name="sweep cache file a link to a zero device is refused",
        ),
        Case(
            o,
            (*CAPACITY, "-o", "cap"),
            0,
            "capacity.parquet",
            files={"s.yaml": SYN.format(name="c")},
            setup=_null("cap/probes.csv"),
            outputs=("cap/capacity.parquet", "cap/capacity.csv", "cap/probes.parquet"),
            name="capacity probes table onto a device node writes it in place",
        ),
        Case(
            o,
            (*COMPARE, "-o", "cv"),
            0,
            "compare_versions.parquet",
            files=S,
            setup=_null("cv/compare_versions.csv"),
            outputs=("cv/compare_versions.parquet",),
            name="compare-versions table onto a device node writes it in place",
        ),
        Case(
            o,
            ("plot", "r"),
            0,
            "wrote",
            files=S,
            setup=_all(
                _run_dir("r"),
                _null("q.png"),
                lambda f: (f / "r" / "queues.png").unlink(),
                _link("r/queues.png", "../q.png"),
            ),
            outputs=("r/kv_timeline.png", "r/latency_cdf.png"),
            name="plot onto a png that links to a device node",
        ),
        Case(
            o,
            ("plot", "r"),
            2,
            "no reader",
            files=S,
            setup=_all(
                _run_dir("r"), lambda f: (f / "r" / "queues.png").unlink(), _fifo("r/queues.png")
            ),
            outputs=("r/kv_timeline.png", "r/latency_cdf.png"),
            subprocess=True,
            timeout_s=90,
            name="plot onto a png that is a FIFO with no reader",
        ),
    ]


def _same_path_cases() -> list[Case]:
    """One path given for two outputs, or an output that is one of the command's inputs."""
    o = "outputs"
    both = "--junit and --json"
    return [
        Case(
            o,
            ("check", "s.yaml", "--junit", "r", "--json", "r"),
            2,
            both,
            files=S,
            name="check --junit F --json F",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "./r", "--json", "r"),
            2,
            both,
            files=S,
            name="check --junit ./F --json F",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "sub/../r", "--json", "r"),
            2,
            both,
            files={**S, "sub/x": ""},
            name="check --junit sub/../F --json F",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "{tmp}/r", "--json", "r"),
            2,
            both,
            files=S,
            name="check --junit /abs/F --json F",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "r", "--json", "l"),
            2,
            both,
            files={**S, "r": "old report"},
            setup=_link("l", "r"),
            name="check --junit F --json link-to-F keeps F",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "null", "--json", "null"),
            2,
            both,
            files=S,
            setup=_null("null"),
            name="check --junit and --json one device node",
        ),
        Case(
            o,
            ("check", "s.yaml", "--junit", "s.yaml"),
            2,
            "is an input",
            files=S,
            name="check --junit onto the scenario it checks",
        ),
        Case(
            o,
            ("check", "s.yaml", "--json", "./s.yaml"),
            2,
            "is an input",
            files=S,
            name="check --json onto ./scenario it checks",
        ),
        Case(
            o,
            ("check", "d", "--json", "d/s.yaml"),
            2,
            "is an input",
            files={"d/s.yaml": tiny()},
            name="check a folder, --json onto a scenario in it",
        ),
        Case(
            o,
            ("shrink", "s.yaml", "-o", "s.yaml"),
            2,
            "is an input",
            files={"s.yaml": SWA},
            name="shrink -o onto the scenario being shrunk",
        ),
        Case(
            o,
            ("shrink", "r", "-o", "r/scenario.yaml"),
            2,
            "is an input",
            files=S,
            setup=_run_dir("r"),
            name="shrink RUN_DIR -o onto the run's scenario.yaml",
        ),
    ]


def _name_cases() -> list[Case]:
    """A scenario `name:` is one folder name: it can never put a run outside runs/."""
    o = "outputs"
    bad = "name"
    cases = [
        Case(o, RUN, 2, bad, files=_named(json.dumps(text)), name=f"scenario name {label}")
        for label, text in (
            ("../escape", "../escape"),
            ("a/b", "a/b"),
            ("with a backslash", "a\\b"),
            ("empty", ""),
            (".hidden", ".hidden"),
            ("..", ".."),
            (".", "."),
            ("absolute", "{tmp}/escaped"),
            ("nul byte", "a\0b"),
            ("300 characters", "n" * 300),
        )
    ]
    escape = _named("'../escape'")
    cases += [
        Case(o, (*RUN, "--set", "name=../x"), 2, bad, files=S, name="run --set name=../x"),
        Case(
            o,
            ("disagg", "s.yaml"),
            2,
            bad,
            files={"s.yaml": PD.format(name="'../pd'")},
            name="disagg scenario name ../pd",
        ),
        Case(
            o,
            (*SWEEP,),
            2,
            bad,
            files={"s.yaml": SYN.format(name="'../w'")},
            name="sweep scenario name ../w",
        ),
        Case(
            o,
            (*CAPACITY,),
            2,
            bad,
            files={"s.yaml": SYN.format(name="'{tmp}/cap-escaped'")},
            name="capacity scenario name absolute",
        ),
        Case(o, (*COMPARE,), 2, bad, files=escape, name="compare-versions scenario name ../"),
        Case(o, ("check", "s.yaml"), 2, bad, files=escape, name="check scenario name ../"),
        Case(
            o,
            ("shrink", "s.yaml"),
            2,
            bad,
            files={"s.yaml": SWA.replace("name: swa", "name: ../swa")},
            name="shrink scenario name ../",
        ),
        Case(
            o,
            RUN,
            0,
            "outputs written",
            files=_named("v1.2-run"),
            name="scenario name with inner dots still runs into runs/",
        ),
    ]
    return cases


def _lock_cases() -> list[Case]:
    """Two `kvsim run` into one folder: the second is refused, naming the holder."""
    o = "outputs"
    busy = "is being written by another kvsim run (pid"
    return [
        Case(
            o,
            (*RUN, "-o", "out"),
            2,
            busy,
            files=S,
            setup=_lock_held("out"),
            name="run -o while another run holds the folder",
        ),
        Case(
            o,
            RUN,
            2,
            busy,
            files=S,
            setup=_lock_held("runs/tiny"),
            name="run into runs/NAME while another run holds it",
        ),
        Case(
            o,
            (*RUN, "-o", "out"),
            2,
            busy,
            files=S,
            setup=_all(_run_dir("out"), _lock_held("out")),
            name="run -o over an earlier run while another run holds it",
        ),
        Case(
            o,
            ("disagg", "s.yaml", "-o", "out"),
            2,
            busy,
            files={"s.yaml": PD.format(name="pd")},
            setup=_lock_held("out"),
            name="disagg -o while another run holds the folder",
        ),
        Case(
            o,
            (*RUN, "-o", "out"),
            0,
            "outputs written",
            files={**S, ".out.lock": "12345\n"},
            outputs=("out", ".out.lock"),
            name="run -o with a stale lock file left by a killed run",
        ),
        Case(
            o,
            (*RUN, "-o", "out"),
            2,
            ".out.lock",
            files=S,
            setup=_fifo(".out.lock"),
            subprocess=True,
            timeout_s=60,
            name="run -o whose lock path is a FIFO",
        ),
        Case(
            o,
            (*RUN, "-o", "out"),
            2,
            ".out.lock",
            files=S,
            setup=_all(_null("null"), _link(".out.lock", "null")),
            name="run -o whose lock path links to a device",
        ),
    ]


def _before_work_cases() -> list[Case]:
    """Every option and the output path are checked before any work, and a refusal makes nothing.

    `kvsim disagg` took its folder's lock and checked it only after simulating (so a scenario
    error hid a bad or busy `-o`); `check DIR --json DIR/x.yaml` wrote a report a later `check
    DIR` reads as a scenario; `capacity` made its empty output folder before refusing an option.
    """
    o = "outputs"
    # Refused once the pools are built (no CPU tier with disaggregation), after the load.
    pd_late = {
        "s.yaml": PD.format(name="pd").replace(
            "num_gpu_blocks: 256", "num_gpu_blocks: 256, cpu_offload_gib: 1"
        )
    }
    syn = {"s.yaml": SYN.format(name="w")}
    return [
        Case(
            o,
            ("disagg", "s.yaml", "-o", "out"),
            2,
            "not a folder",
            files={**pd_late, "out": "mine"},
            name="disagg -o onto a file is refused before simulating",
        ),
        Case(
            o,
            ("disagg", "s.yaml", "-o", "out"),
            2,
            "is being written by another kvsim run (pid",
            files=pd_late,
            setup=_lock_held("out"),
            name="disagg -o on a busy folder is refused before simulating",
        ),
        Case(
            o,
            ("check", "d", "--json", "d/new.yaml"),
            2,
            "--json",
            files={"d/s.yaml": tiny()},
            name="check DIR --json DIR/new.yaml would become a scenario",
        ),
        Case(
            o,
            ("check", "d", "--junit", "d/sub/r.yml"),
            2,
            "--junit",
            files={"d/s.yaml": tiny()},
            name="check DIR --junit DIR/sub/r.yml would become a scenario",
        ),
        Case(
            o,
            ("check", "d", "--json", "{tmp}/d/../d/new.yaml"),
            2,
            "--json",
            files={"d/s.yaml": tiny()},
            name="check DIR --json /abs/DIR/../DIR/new.yaml would become a scenario",
        ),
        Case(
            o,
            ("check", "d", "--json", "d/r.json"),
            0,
            "1 passed",
            files={"d/s.yaml": tiny()},
            outputs=("d/r.json",),
            name="check DIR --json DIR/r.json is not a scenario and is written",
        ),
        Case(
            o,
            ("check", "d/s.yaml", "--json", "d/new.yaml"),
            0,
            "1 passed",
            files={"d/s.yaml": tiny()},
            outputs=("d/new.yaml",),
            name="check FILE --json new.yaml beside it is fine (no folder is searched)",
        ),
        Case(
            o,
            (*CAPACITY, "--tolerance", "2"),
            2,
            "--tolerance",
            files=syn,
            name="capacity --tolerance 2 leaves no capacity folder",
        ),
        Case(
            o,
            (*CAPACITY, "--target-rate", "0"),
            2,
            "--target-rate",
            files=syn,
            name="capacity --target-rate 0 leaves no capacity folder",
        ),
        Case(
            o,
            (*CAPACITY, "--compare", "cache.bogus=1,2"),
            2,
            "--compare",
            files=syn,
            name="capacity --compare unknown key leaves no capacity folder",
        ),
        Case(
            o,
            (*CAPACITY, "--compare", "cache.num_gpu_blocks=0,64"),
            2,
            "num_gpu_blocks",
            files=syn,
            name="capacity --compare bad value leaves no capacity folder",
        ),
        Case(
            o,
            ("sweep", "s.yaml", "--set", "cache.num_gpu_blocks=0,64", "-j", "1", "--no-plots"),
            2,
            "num_gpu_blocks",
            files=syn,
            name="sweep with a bad point leaves no sweeps folder",
        ),
        Case(
            o,
            ("compare-versions", "s.yaml", "--set", "cache.bogus=1", "-j", "1", "--no-plots"),
            2,
            "bogus",
            files=syn,
            name="compare-versions --set unknown key leaves no compare folder",
        ),
    ]


CASES: list[Case] = [
    Case(
        "outputs",
        ("run", "s.yaml", "--no-plots", "-o", "s.yaml"),
        2,
        "not a folder",
        files={"s.yaml": tiny()},
        name="run -o onto the scenario file itself",
    ),
    Case(
        "outputs",
        ("check", "s.yaml", "--junit", "d"),
        2,
        "is a folder",
        files={"s.yaml": tiny(), "d/keep.txt": "mine"},
        name="check --junit onto a folder",
    ),
    Case(
        "outputs",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        0,
        "outputs",
        files={"s.yaml": tiny()},
        outputs=("out",),
        name="run into a new folder",
    ),
    *_outputs_cases(),
    *_same_path_cases(),
    *_name_cases(),
    *_lock_cases(),
    *_before_work_cases(),
]
