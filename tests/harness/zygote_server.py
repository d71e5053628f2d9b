"""The zygote process itself (`tests.harness.zygote` starts it and says what it is for).

It talks over its stdin (requests) and stdout (answers), one JSON object a line; its stderr is
a log file. Started as `python -c "...serve(VERSION)"` from the repository root, with the
environment of the checks it will serve, so its `sys.path[0]` is "" as a `-c` check's is.

This module imports nothing from `tests.harness.zygote` (whose pool registers an atexit hook
that a forked check must not run) and nothing heavy before `serve` preloads the release.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import json
import os
import random
import runpy
import select
import signal
import sys
import threading
import types
from typing import Any, NoReturn

#: The heavy vLLM modules the lockstep scripts import anyway, relative to `vllm.`; one a release
#: does not have is skipped (and logged). Chosen with `python -X importtime` on the KV-manager
#: and scheduler lockstep scripts of 0.11.0, 0.19.1 and 0.33.0: their top-level non-kvsim
#: imports over 20 ms (they take 4-6 s of a check's 9-15 s).
PRELOAD = (
    "utils.torch_utils",
    "config",
    "v1.request",
    "v1.kv_cache_interface",
    "v1.core.kv_cache_utils",
    "v1.core.kv_cache_manager",
    "multimodal.utils",
    "sampling_params",
    "model_executor.parameter",
    "model_executor.models.interfaces",
    "model_executor.models.registry",
    "v1.executor",
    "_aiter_ops",
    "v1.outputs",
    "v1.structured_output",
    "v1.core.sched.scheduler",
    "v1.core.sched.async_scheduler",
)

#: Set (where unset) while preloading, then taken out of the environment again: the V1
#: scheduler adapter sets these before it imports vLLM (`sim.vllm_real.v1_sched_adapter`'s
#: OFFLINE_ENV and QUIET_ENV; a test checks they match), and huggingface_hub and transformers
#: read them once, at import. A check's own environment is the request's, as before.
PRELOAD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}


def serve(vllm_version: str) -> None:
    """Preload `vllm_version`, say so, then fork one child per request until end of input."""
    request_fd, answer_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)  # a check reads nothing, as under `subprocess.run(capture_output=True)`
    os.close(devnull)
    os.dup2(2, 1)  # what the preload prints goes to the log, never into the answers
    env_before = dict(os.environ)
    for key, value in PRELOAD_ENV.items():
        os.environ.setdefault(key, value)
    _preload(vllm_version)
    for key in PRELOAD_ENV.keys() - env_before.keys():
        del os.environ[key]
    # What the loader set (VLLM_LOGGING_LEVEL, by setdefault): a fresh check's load sets it too.
    added_env = {k: v for k, v in os.environ.items() if env_before.get(k) != v}
    _send(answer_fd, {"ready": True, "pid": os.getpid()})
    lines = _Lines(request_fd)
    while (line := lines.next()) is not None:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()  # a child must not inherit (and write out) the log's buffer
        pid = os.fork()
        if pid == 0:
            _child(request, (request_fd, answer_fd), added_env)  # never returns
        with contextlib.suppress(OSError):  # also done in the child: whichever runs first
            os.setpgid(pid, pid)
        returncode, timed_out = _wait(pid, request["timeout"])
        _send(answer_fd, {"returncode": returncode, "timed_out": timed_out})
    sys.stderr.flush()
    os._exit(0)


def _preload(vllm_version: str) -> None:
    from sim.vllm_real.loader import import_vllm, load_vllm

    install = load_vllm(vllm_version=vllm_version)
    for name in PRELOAD:
        try:
            import_vllm(name, install)
        except Exception as exc:  # a module this release lacks: the check imports it or fails
            print(f"zygote {vllm_version}: vllm.{name} not preloaded: {exc}", file=sys.stderr)


def _wait(pid: int, timeout_s: float | None) -> tuple[int, bool]:
    """(exit status as `subprocess` reports it, timed out); past `timeout_s` the child's
    process group is killed."""
    pidfd = os.pidfd_open(pid)
    try:
        done, _, _ = select.select([pidfd], [], [], timeout_s)
    finally:
        os.close(pidfd)
    if not done:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), not done


def _child(request: dict[str, Any], pipes: tuple[int, int], added_env: dict[str, str]) -> NoReturn:
    """Become `python ARGV` in the request's cwd and environment, output to its two files."""
    os.setpgid(0, 0)  # a timeout kills this check and whatever it started, nothing else
    for fd in pipes:
        os.close(fd)
    for target, path in ((1, request["stdout"]), (2, request["stderr"])):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in added_env.items():
        os.environ.setdefault(key, value)
    _reseed()
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        del sys.modules[name]  # a fresh interpreter has imported none of the test tree
    run = _runner(request["argv"])
    try:
        run()
        status = 0
    except SystemExit as exc:
        status = _exit_status(exc)
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_globals is globals():
            tb = tb.tb_next  # the traceback a fresh interpreter prints starts at the script
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)  # it prints __traceback__
        status = 1
    _shut_down(status)


def _exit_status(exc: SystemExit) -> int:
    """The status the interpreter gives `sys.exit(code)`: None 0, an int itself, anything
    else printed to stderr and 1."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    sys.stderr.write(f"{exc.code}\n")
    return 1


def _shut_down(status: int) -> NoReturn:
    """What the interpreter's shutdown does that a check can see (wait for non-daemon
    threads, run atexit callbacks, flush stdout and stderr), then exit. The rest (tearing
    down every module, ~2.4 s in a fork holding torch and a release) changes no output."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the script: nothing to write
            stream.flush()
    os._exit(status & 0xFF)


def _runner(argv: list[str]) -> Any:
    """The callable that runs `python ARGV`'s program, after setting `sys.argv`,
    `sys.path[0]` and `__main__` as the interpreter would."""
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        main = types.ModuleType("__main__")
        main.__dict__.update(__builtins__=builtins, __loader__=None, __spec__=None)
        sys.modules["__main__"] = main
        code = compile(argv[1], "<string>", "exec")
        return lambda: exec(code, main.__dict__)
    if argv[0] == "-m":
        sys.argv = ["-m", *argv[2:]]
        sys.path[0] = os.getcwd()
        return lambda: runpy._run_module_as_main(argv[1], alter_argv=True)  # type: ignore[attr-defined]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(argv[0]))
    return lambda: runpy.run_path(argv[0], run_name="__main__")


def _reseed() -> None:
    """Fresh seeds where a fresh interpreter would draw them (the zygote's were drawn once)."""
    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def _send(fd: int, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode() + b"\n"
    while data:
        data = data[os.write(fd, data) :]


class _Lines:
    """Lines from a raw fd (no file object, so a forked child holds no buffer of it)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def next(self) -> str | None:
        while b"\n" not in self.buffer:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()
