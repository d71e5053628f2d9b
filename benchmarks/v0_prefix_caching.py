"""The v0 block managers with prefix caching on the Mooncake conversation trace: the first N
requests of `scenarios/mooncake_prefix_caching.yaml` replayed on v0-v1 and v0-v2 (model
managers, `vllm_version` unset), each by `kvsim run -o` in a fresh process, plots off. Prints
wall time (whole process), peak memory (max RSS of that process) and the requests finished.

    python benchmarks/v0_prefix_caching.py               # N = 100, 300, 1000
    python benchmarks/v0_prefix_caching.py 40 80         # given sizes only
    python benchmarks/v0_prefix_caching.py --timeout 120 100

Why: vLLM 0.5.4's LRU evictors scan their entries on every eviction, and the pool is ~28k
blocks, so kvsim's replays that evict were quadratic while its evictors scanned as upstream
does (v0-v1: 100 requests did not finish in 120 s; v0-v2: 100 took 74 s). They now pick the
same victims by representation (`sim.kv.v0_v1.evictor`: runs of equal access time;
`sim.kv.v0_v2.evictor`: a heap), 100 requests in ~1.5 s. A run past `--timeout` (default
600 s) is killed and shows "timeout".
Machines are noisy: compare the rows of one run with each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _isolated import in_forked_child  # benchmarks/ is the script's folder

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "mooncake_prefix_caching.yaml"
DESIGNS = ("v0-v1", "v0-v2")
DEFAULT_SIZES = (100, 300, 1000)


def replay(design: str, num_requests: int, timeout_s: float) -> dict:
    """One replay by `kvsim run` in a child process (killed past `timeout_s`)."""
    row: dict = {"design": design, "requests": num_requests}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "sim.cli", "run", str(SCENARIO), "--no-plots", "--json"]
        cmd += ["-o", str(Path(tmp) / "run"), "--set", f"scheduler.design={design}"]
        cmd += ["--set", "scheduler.vllm_version=null"]
        cmd += ["--set", f"workload.first_n={num_requests}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                cmd, capture_output=True, cwd=ROOT, env=env, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            return {**row, "wall_s": None, "finished": "timeout"}
        wall_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{design} {num_requests}: kvsim failed: {proc.stderr[-2000:]!r}")
        summary = json.loads(proc.stdout)["summary"]
    return {**row, "wall_s": wall_s, "finished": summary["states"]["finished"]}


def main(argv: list[str]) -> None:
    timeout_s = 600.0
    if argv[:1] == ["--timeout"]:
        timeout_s, argv = float(argv[1]), argv[2:]
    sizes = [int(arg) for arg in argv] or list(DEFAULT_SIZES)
    print(f"{'design':8} {'requests':>8} {'wall s':>8} {'peak MB':>8} {'finished':>9}")
    for num_requests in sizes:
        for design in DESIGNS:
            row = in_forked_child(lambda d=design, n=num_requests: replay(d, n, timeout_s))
            wall = "-" if row["wall_s"] is None else f"{row['wall_s']:.1f}"
            peak = "-" if row["wall_s"] is None else f"{row['peak_rss_mb']:.0f}"
            print(f"{design:8} {num_requests:>8} {wall:>8} {peak:>8} {row['finished']!s:>9}")


if __name__ == "__main__":
    main(sys.argv[1:])
