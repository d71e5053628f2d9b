"""Running `python -c SCRIPT ...` / `python -m MODULE ...` for the lockstep tier without paying
for vLLM's imports on every check.

Each lockstep check used to start a fresh interpreter, and about half of its time went to
importing the release (`vllm.config`, `vllm.model_executor.models`, torch). A *zygote* is one
long-lived helper process per (vLLM release, environment) per pytest worker: it starts in the
environment the check's own interpreter would have had, loads the release through
`sim.vllm_real.loader.load_vllm`, imports the heavy vLLM modules (`zygote_server.PRELOAD`),
then, for each request, `os.fork()`s a child that runs the program as `python ARGV` would
(`__main__`, `sys.argv`, `sys.path[0]`, cwd, the request's environment exactly, stdin on
/dev/null, stdout and stderr into two files), and ends as the interpreter would where a check
can see it (non-daemon threads joined, atexit callbacks run, streams flushed, the same exit
status and traceback) before `os._exit`. Every check still runs in a process of its own, so a
mutation that patches a class in one check cannot be seen by the next.

What differs from a fresh interpreter, and nothing else:

* the release's vLLM modules in `PRELOAD` (and what they import: torch, transformers,
  pydantic) are already imported, under the V1 scheduler adapter's offline/quiet variables
  (`zygote_server.PRELOAD_ENV`), and its `_deps` folder is already on `sys.path`;
  `sim.vllm_real.loader` has already loaded the release (a later `load_vllm` of it returns it);
* no `sim` module but the loader's chain (`sim`, `sim.native`, `sim.errors`,
  `sim.files.inputs`) is imported, and no `tests` module, so a script that patches a kvsim
  class or function does so in the same import order as before;
* what vLLM logs while importing ("Failed to import Triton kernels") goes to the zygote's log;
* `random` and numpy are reseeded in each child, but the string hash seed is the zygote's.

A script that depends on what is *not* imported yet (`sim.vllm_real.defaults_lockstep._RealV1`
puts stand-ins for `vllm._C` in sys.modules before its first vLLM import), or that loads
another release, keeps a plain subprocess (`fresh=True`, or its own `subprocess.run`); so does
every V0 release (0.5.4).

`KVSIM_ZYGOTE=0` in the environment turns all of this off: every request is a plain
`subprocess.run` (to compare timings, or to rule the zygote out when a check fails).

Example::

    out = run_python(["-c", "import sys; print(sys.argv)", "a"], vllm_version="0.19.1",
                     env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    out.returncode, out.stdout   # (0, "['-c', 'a']\\n")
"""

from __future__ import annotations

import atexit
import contextlib
import json
import locale
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

#: The repository root: where a zygote starts (its `-c` server finds `tests.harness` there).
ROOT = Path(__file__).resolve().parents[2]
#: `KVSIM_ZYGOTE=0`: plain subprocesses for every request.
ENV_SWITCH = "KVSIM_ZYGOTE"
#: Live zygotes per pytest worker; the least recently used is stopped beyond it (each holds
#: ~0.5 GB: torch plus one release's vLLM modules). 8 covers one test file's releases in both
#: the compiled-core and sources environments without restarts.
MAX_ZYGOTES = 8
#: Environment variables that change per test but cannot change what a preload imports.
VOLATILE_ENV = frozenset({"PYTEST_CURRENT_TEST"})


def run_python(
    argv: Sequence[str],
    *,
    vllm_version: str,
    env: Mapping[str, str],
    cwd: str | Path,
    timeout: float | None = None,
    fresh: bool = False,
) -> subprocess.CompletedProcess[str]:
    """`python ARGV` (argv as after the interpreter: `-c CODE ARGS`, `-m MODULE ARGS` or
    `SCRIPT ARGS`) with `env` and `cwd`, output captured as text, the exit status left to the
    caller; run in a fork of the zygote for (`vllm_version`, `env`) unless `fresh` or
    `KVSIM_ZYGOTE=0`. A run past `timeout` seconds is killed and raises
    `subprocess.TimeoutExpired`, as `subprocess.run` does."""
    v0_release = tuple(int(p) for p in vllm_version.split(".")[:2]) < (0, 11)
    # A V0 release (0.5.4) stays fresh: its scheduler adapter installs a stand-in `vllm.config`
    # only where none is imported yet (`v0_sched_adapter._install_config_stand_in`).
    if fresh or v0_release or os.environ.get(ENV_SWITCH) == "0":
        return subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            cwd=cwd,
            env=dict(env),
            timeout=timeout,
            check=False,
        )
    return _POOL.get(vllm_version, env).run(list(argv), dict(env), str(cwd), timeout)


@dataclass
class _Zygote:
    """The client side of one zygote: its process, request pipe and log."""

    key: tuple[str, frozenset[tuple[str, str]]]
    proc: subprocess.Popen[bytes]
    log_path: Path
    last_used_s: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, vllm_version: str, env: dict[str, str]) -> _Zygote:
        fd, log = tempfile.mkstemp(prefix=f"kvsim-zygote-{vllm_version}-", suffix=".log")
        with os.fdopen(fd, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-c", _SERVER_MAIN, vllm_version],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                cwd=ROOT,
                env=env,
                start_new_session=True,  # a Ctrl-C in the terminal reaches pytest, not it
            )
        zygote = cls(_key(vllm_version, env), proc, Path(log))
        ready = zygote._read_line(timeout=600.0)
        if ready.get("ready") is not True:
            zygote.stop()
            raise RuntimeError(f"zygote for vLLM {vllm_version} did not start: {ready}")
        return zygote

    def run(
        self, argv: list[str], env: dict[str, str], cwd: str, timeout: float | None
    ) -> subprocess.CompletedProcess[str]:
        self.last_used_s = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="kvsim-zygote-run-") as tmp:
            out_path, err_path = Path(tmp) / "stdout", Path(tmp) / "stderr"
            request = {"argv": argv, "env": env, "cwd": cwd, "timeout": timeout}
            request |= {"stdout": str(out_path), "stderr": str(err_path)}
            try:
                self._write_line(request)
                # The zygote enforces `timeout`; the margin only guards against a hung zygote.
                reply = self._read_line(None if timeout is None else timeout + 120.0)
            except BaseException:  # e.g. KeyboardInterrupt: an answer left unread would be
                self.stop(kill=True)  # taken for the next request's, so this zygote goes
                raise
            stdout, stderr = _read_text(out_path), _read_text(err_path)
        command = [sys.executable, *argv]
        if reply.get("timed_out"):
            raise subprocess.TimeoutExpired(command, timeout or 0.0, stdout, stderr)
        return subprocess.CompletedProcess(command, int(reply["returncode"]), stdout, stderr)

    def _write_line(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(json.dumps(message).encode() + b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            self._died("a request")

    def _read_line(self, timeout: float | None) -> dict[str, Any]:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.stop(kill=True)
            raise RuntimeError(f"zygote {self.key[0]} gave no answer in {timeout} s")
        line = self.proc.stdout.readline()
        if not line:
            self._died("its answer")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def _died(self, waiting_for: str) -> NoReturn:
        self.stop()
        log = self.log_path.read_text(errors="replace")[-4000:]
        raise RuntimeError(
            f"zygote for vLLM {self.key[0]} died before {waiting_for} "
            f"(exit {self.proc.returncode}); its log {self.log_path} ends:\n{log}"
        )

    def stop(self, kill: bool = False) -> None:
        """Close its request pipe (it exits on end of input); kill it if that does not do, or
        at once with `kill`."""
        _POOL.forget(self)
        if not kill and self.proc.poll() is None:
            assert self.proc.stdin is not None
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.proc.returncode == 0:  # a clean stop: nothing in the log to look at
            self.log_path.unlink(missing_ok=True)


class _Pool:
    """The live zygotes of this process, by (release, environment); least recently used
    stopped beyond `MAX_ZYGOTES`, all stopped at exit."""

    def __init__(self) -> None:
        self.zygotes: dict[tuple[str, frozenset[tuple[str, str]]], _Zygote] = {}
        atexit.register(self.stop_all)

    def get(self, vllm_version: str, env: Mapping[str, str]) -> _Zygote:
        key = _key(vllm_version, env)
        zygote = self.zygotes.get(key)
        if zygote is not None and zygote.proc.poll() is None:
            return zygote
        while len(self.zygotes) >= MAX_ZYGOTES:
            min(self.zygotes.values(), key=lambda z: z.last_used_s).stop()
        zygote = _Zygote.start(vllm_version, dict(env))
        self.zygotes[key] = zygote
        return zygote

    def forget(self, zygote: _Zygote) -> None:
        if self.zygotes.get(zygote.key) is zygote:
            del self.zygotes[zygote.key]

    def stop_all(self) -> None:
        for zygote in list(self.zygotes.values()):
            zygote.stop()


_POOL = _Pool()


def stop_all() -> None:
    """Stop every zygote of this process and wait for it (the test session's end)."""
    _POOL.stop_all()


def _key(vllm_version: str, env: Mapping[str, str]) -> tuple[str, frozenset[tuple[str, str]]]:
    return vllm_version, frozenset((k, v) for k, v in env.items() if k not in VOLATILE_ENV)


def _read_text(path: Path) -> str:
    """A captured stream as `subprocess.run(text=True)` decodes it (locale encoding,
    universal newlines)."""
    with open(path, encoding=locale.getpreferredencoding(False), newline=None) as handle:
        return handle.read()


_SERVER_MAIN = "import sys; from tests.harness.zygote_server import serve; serve(sys.argv[1])"
