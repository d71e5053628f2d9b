"""The lockstep tier's zygote (`tests.harness.zygote`) runs a check as a fresh interpreter
would, in a process of its own: what one check patches, the next does not see; exit statuses,
tracebacks and long outputs come back whole; a timeout kills the check; a dead zygote fails
the request that found it dead and is replaced for the next.

Each test compares the zygote's answer with a plain `subprocess.run` of the same argv (the
fresh interpreter it stands in for) wherever the two can be compared.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import zygote, zygote_server
from tests.harness.vllm_install import root_or_skip

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
#: The release with the cheapest preload (~4 s).
VERSION = "0.11.0"
#: The sources: a check may patch a kvsim class (compiled classes refuse it).
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "KVSIM_NATIVE": "0"}


def _zygote(*argv: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    root_or_skip(VERSION)
    return zygote.run_python(list(argv), vllm_version=VERSION, env=ENV, cwd=ROOT, timeout=timeout)


def _fresh(*argv: str) -> subprocess.CompletedProcess[str]:
    return zygote.run_python(list(argv), vllm_version=VERSION, env=ENV, cwd=ROOT, fresh=True)


_PATCH = """
import sys
from sim.kv.v1_engine.single_type import FullAttentionManager
print("before", getattr(FullAttentionManager, "kvsim_zygote_mark", None))
if sys.argv[1] == "patch":
    FullAttentionManager.kvsim_zygote_mark = "patched"
    import vllm.v1.core.kv_cache_utils as utils
    utils.kvsim_zygote_mark = "patched"
import vllm.v1.core.kv_cache_utils as utils
print("vllm", getattr(utils, "kvsim_zygote_mark", None))
"""


def test_a_patch_in_one_request_is_not_seen_by_the_next():
    """A kvsim class and a preloaded vLLM module patched by one check are untouched in the next
    (the patch lives and dies in the first check's fork)."""
    first = _zygote("-c", _PATCH, "patch")
    second = _zygote("-c", _PATCH, "look")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert first.stdout == "before None\nvllm patched\n", first.stdout
    assert second.stdout == "before None\nvllm None\n", second.stdout


_WHERE = """
import json, os, sys
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "name": __name__, "cwd": os.getcwd(),
    "native": os.environ.get("KVSIM_NATIVE"), "pythonpath": os.environ.get("PYTHONPATH"),
    "tests_imported": sorted(m for m in sys.modules if m.split(".")[0] == "tests"),
    "main_file": getattr(sys.modules["__main__"], "__file__", None),
}))
"""


def test_a_check_sees_the_argv_path_cwd_and_environment_of_a_fresh_interpreter():
    assert _zygote("-c", _WHERE, "a", "b").stdout == _fresh("-c", _WHERE, "a", "b").stdout


def test_a_module_run_with_m_sees_the_argv_and_output_of_a_fresh_interpreter():
    argv = ("-m", "sim.cli", "verify", "--mamba-caching")  # refused: one line, exit 2
    ours, fresh = _zygote(*argv), _fresh(*argv)
    assert ours.returncode == fresh.returncode == 2, ours.stderr
    assert (ours.stdout, ours.stderr) == (fresh.stdout, fresh.stderr)


@pytest.mark.parametrize(
    "script",
    [
        "def f():\n    raise ValueError('boom')\nf()",
        "import sys\nprint('out')\nsys.exit(3)",
        "import sys\nsys.exit('a message')",
        "import sys\nsys.exit(None)",
        "import atexit\natexit.register(lambda: print('at exit'))",
        "import threading, time\n"
        "threading.Thread(target=lambda: (time.sleep(0.3), print('late thread'))).start()",
    ],
    ids=["raises", "exit-3", "exit-message", "exit-none", "atexit", "thread"],
)
def test_exit_status_stdout_and_stderr_come_back_as_from_a_fresh_interpreter(script):
    """A raising script's traceback (starting at the script, as a fresh `-c` prints it) and
    status 1; `sys.exit` codes and messages; atexit callbacks and non-daemon threads run."""
    ours, fresh = _zygote("-c", script), _fresh("-c", script)
    assert (ours.returncode, ours.stdout, ours.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )


def test_a_large_stdout_and_stderr_come_back_complete():
    script = (
        "import sys\n"
        "for i in range(200_000): print(i)\n"
        "sys.stderr.write('e' * 3_000_000)\n"
        "sys.stdout.write('no newline at the end')"
    )
    out = _zygote("-c", script)
    lines = out.stdout.split("\n")
    assert lines[:-1] == [str(i) for i in range(200_000)]
    assert lines[-1] == "no newline at the end"
    assert out.stderr == "e" * 3_000_000


def test_a_request_past_its_timeout_is_killed_and_the_zygote_serves_on(tmp_path):
    pid_file = tmp_path / "pid"
    script = f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
    # Sleeps far past the call: if the timeout did not kill it, it is still alive below.
    script += "time.sleep(600)"
    with pytest.raises(subprocess.TimeoutExpired):
        _zygote("-c", script, timeout=2)
    with pytest.raises(ProcessLookupError):  # killed and reaped: no such process any more
        os.kill(int(pid_file.read_text()), 0)
    assert _zygote("-c", "print('next')").stdout == "next\n"


def test_a_dead_zygote_fails_the_request_loudly_and_is_replaced_for_the_next():
    """A check that kills its zygote (the parent of its fork) gets an error naming the zygote,
    not a hang; the next request starts a new zygote."""
    before = _zygote("-c", "import os; print(os.getppid())")
    with pytest.raises(RuntimeError, match=f"zygote for vLLM {VERSION} died") as died:
        _zygote("-c", "import os, signal; os.kill(os.getppid(), signal.SIGKILL)")
    log = re.search(r"its log (\S+) ends", str(died.value))
    assert log is not None, died.value
    Path(log.group(1)).unlink()  # kept for a real death's post-mortem; this one was ordered
    after = _zygote("-c", "import os; print(os.getppid())")
    assert after.returncode == 0 and after.stdout != before.stdout


def test_the_preload_environment_is_the_scheduler_adapter_s():
    """The zygote imports vLLM under the variables the V1 scheduler adapter sets before its
    own imports (huggingface_hub and transformers read them once, at import)."""
    from sim.vllm_real.v1_sched_adapter import OFFLINE_ENV, QUIET_ENV

    assert zygote_server.PRELOAD_ENV == {**OFFLINE_ENV, **QUIET_ENV}


def test_a_check_environment_is_the_request_s_not_the_preload_s():
    script = "import os; print(os.environ.get('HF_HUB_OFFLINE'), os.environ.get('KVSIM_X'))"
    root_or_skip(VERSION)
    env = {k: v for k, v in ENV.items() if k != "HF_HUB_OFFLINE"} | {"KVSIM_X": "1"}
    argv = ["-c", script]
    ours = zygote.run_python(argv, vllm_version=VERSION, env=env, cwd=ROOT)
    fresh = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env)
    assert ours.stdout == fresh.stdout == "None 1\n"
