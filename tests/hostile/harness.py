"""One hostile case: the files it starts from, the command, what must come back.

A case is data, not code: `Case(klass, argv, exit, fragment, files=...)`. The runner writes
`files` into a fresh temporary folder (``{tmp}`` in `argv` and in file contents is that
folder), runs ``kvsim ARGV`` with the folder as the working directory, and asserts

* the exit status is `exit` (2 bad input, 1 a finding, 0 done; 3, an internal error, is
  never an expected answer);
* `fragment` (case-insensitive) is in the output, and for exit 2 the error is one line with no
  traceback;
* nothing outside the case's outputs changed: every input file and every node the case
  made (`setup`) is as it was (same type, size and contents), and no file appeared outside
  the temporary folder (the repository's ``runs/`` in particular).

Most cases run in this process (typer's `CliRunner`; fast). A case that could block or grow
without bound on a regression (a FIFO, a huge scenario) sets `subprocess=True`: it then runs
as ``python -m sim.cli`` under a wall-clock timeout and an address-space limit, so a
regression fails the test instead of hanging CI.

Classes (the issue's sections): outputs, bounds, values, startup, noop, messages, capacity,
examples.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

CLASSES = ("outputs", "bounds", "values", "startup", "noop", "messages", "capacity", "examples")
ROOT = Path(__file__).resolve().parents[2]

#: A small V1 scenario that runs in well under a second; cases derive theirs from it by
#: `.format(**fields)` or by `--set`.
TINY_V1 = """\
name: {name}
model: null
cache: {{block_size: 16, num_gpu_blocks: 64, num_cpu_blocks: 0, sliding_window: null}}
scheduler: {{design: v1-engine, max_model_len: 256}}
workload:
  kind: inline
  requests:
    - {{arrival_s: 0.0, prompt_tokens: 40, output_tokens: 4}}
    - {{arrival_s: 0.01, prompt_tokens: 20, output_tokens: 3}}
step_time: {{linear: {{fixed_s: 0.01}}}}
expect: {{violations: none}}
"""

TINY_V0 = TINY_V1.replace("design: v1-engine", "design: v0-v2")


def tiny(name: str = "tiny", design: str = "v1-engine") -> str:
    """The tiny scenario's text, named `name`, on `design`."""
    return TINY_V1.format(name=name).replace("design: v1-engine", f"design: {design}")


@dataclass(frozen=True)
class Case:
    """One hostile input and the answer kvsim must give."""

    klass: str
    argv: tuple[str, ...]
    exit: int
    fragment: str
    files: dict[str, str] = field(default_factory=dict)
    #: Makes what a text file cannot be (a FIFO, a device node, a lock holder); gets the folder.
    setup: Callable[[Path], None] | None = None
    subprocess: bool = False
    timeout_s: float = 60.0
    #: Paths (relative to the folder) that the command may create or replace.
    outputs: tuple[str, ...] = ()
    name: str = ""

    @property
    def id(self) -> str:
        return f"{self.klass}:{self.name or ' '.join(self.argv)}"[:120]


@dataclass(frozen=True)
class Answer:
    exit: int
    output: str


def _fingerprint(path: Path) -> tuple:
    info = path.lstat()
    kind = stat.S_IFMT(info.st_mode)
    if stat.S_ISREG(info.st_mode):
        return (kind, hashlib.sha256(path.read_bytes()).hexdigest())
    if stat.S_ISLNK(info.st_mode):
        return (kind, os.readlink(path))
    if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode):
        return (kind, info.st_rdev)
    return (kind,)


def snapshot(folder: Path, skip: tuple[str, ...]) -> dict[str, tuple]:
    """Every path under `folder` but the outputs, with its type and contents."""
    seen: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(folder))
            if any(rel == out or rel.startswith(out.rstrip("/") + "/") for out in skip):
                continue
            seen[rel] = _fingerprint(path)
    return seen


def prepare(case: Case, folder: Path) -> None:
    for rel, text in case.files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.replace("{tmp}", str(folder)))
    if case.setup is not None:
        case.setup(folder)


def argv_in(case: Case, folder: Path) -> list[str]:
    return [arg.replace("{tmp}", str(folder)) for arg in case.argv]


def run_in_process(argv: list[str], folder: Path) -> Answer:
    from typer.testing import CliRunner

    from sim.cli.main import app

    old = Path.cwd()
    os.chdir(folder)
    try:
        result = CliRunner().invoke(app, argv, catch_exceptions=True)
    finally:
        os.chdir(old)
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        output += f"\n<uncaught {type(result.exception).__name__}: {result.exception}>"
        return Answer(exit=99, output=output)
    return Answer(exit=result.exit_code, output=output)


_LIMIT_AS = """
import resource, runpy, sys
limit = 6 * 1024**3
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
sys.argv = ["kvsim"] + sys.argv[1:]
from sim.cli.main import main
main()
"""


def timeout_of(case: Case) -> float:
    """The case's timeout, capped by ``KVSIM_HOSTILE_TIMEOUT_S`` when set (to count, on an old
    commit, which cases hang without waiting a minute for each)."""
    cap = os.environ.get("KVSIM_HOSTILE_TIMEOUT_S")
    return min(case.timeout_s, float(cap)) if cap else case.timeout_s


def run_in_subprocess(argv: list[str], folder: Path, timeout_s: float) -> Answer:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    try:
        done = subprocess.run(
            [sys.executable, "-c", _LIMIT_AS, *argv],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return Answer(exit=124, output=f"<timed out after {timeout_s} s>")
    return Answer(exit=done.returncode, output=done.stdout + done.stderr)


def error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]
