"""Replay the first N requests of the Mooncake conversation trace
(`scenarios/mooncake_prefix_caching.yaml`) on the v0 block managers with prefix caching, each in
a fresh process, and print a table: design, requests, wall s (whole process), peak MB (max RSS).

    python benchmarks/v0_prefix_caching.py                  # v0-v1, v0-v2 at 100, 300, 1000
    python benchmarks/v0_prefix_caching.py 40 100           # given sizes only
    python benchmarks/v0_prefix_caching.py --design=v0-v2   # one design
    python benchmarks/v0_prefix_caching.py --timeout-s=60   # give up on a run after 60 s

The pool holds tens of thousands of blocks, so an evictor that scans all of its entries on every
eviction (as vLLM 0.5.4's do) makes these replays quadratic; a run past the timeout prints
`> T` instead of its time. Machines are noisy: compare the rows of one run with each other.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _isolated import in_forked_child  # benchmarks/ is the script's folder

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "mooncake_prefix_caching.yaml"
DESIGNS = ["v0-v1", "v0-v2"]
SIZES = [100, 300, 1000]


def replay(design: str, num_requests: int, timeout_s: float) -> dict:
    """One replay in a fresh process; `wall_s` is None when it ran past `timeout_s`."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "sim.cli", "run", str(SCENARIO), "--no-plots", "--json"]
        cmd += ["-o", out, "--set", f"scheduler.design={design}"]
        # The scenario pins a V1-engine release; the v0 designs run unpinned.
        cmd += ["--set", "scheduler.vllm_version=null"]
        cmd += ["--set", f"workload.first_n={num_requests}"]
        start = time.perf_counter()
        try:
            subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"design": design, "requests": num_requests, "wall_s": None}
        except subprocess.CalledProcessError as e:
            raise SystemExit(
                f"{design} {num_requests}: kvsim run failed: {e.stderr[-2000:]!r}"
            ) from e
        wall_s = time.perf_counter() - start
    return {"design": design, "requests": num_requests, "wall_s": wall_s}


def main(argv: list[str]) -> None:
    designs, sizes, timeout_s = DESIGNS, [], 300.0
    for arg in argv:
        if arg.startswith("--design="):
            designs = [arg.removeprefix("--design=")]
        elif arg.startswith("--timeout-s="):
            timeout_s = float(arg.removeprefix("--timeout-s="))
        else:
            sizes.append(int(arg))
    sizes = sizes or SIZES
    print(f"{'design':8} {'requests':>9} {'wall s':>9} {'peak MB':>9}")
    for design in designs:
        for n in sizes:
            row = in_forked_child(lambda: replay(design, n, timeout_s))  # noqa: B023
            wall = f"> {timeout_s:.0f}" if row["wall_s"] is None else f"{row['wall_s']:.1f}"
            print(f"{design:8} {n:>9} {wall:>9} {row['peak_rss_mb']:>9.0f}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
