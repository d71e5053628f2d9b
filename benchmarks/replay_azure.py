"""Replay the whole Azure LLM inference 2023 conversation trace (19,366 requests) once per
scheduler / block-manager design, each in a fresh process, and print a table of wall time
(whole process: imports, load, simulate, write outputs), simulated requests per second and peak
memory (max RSS of the process).

    python benchmarks/replay_azure.py            # all four designs
    python benchmarks/replay_azure.py v1-engine  # one design

Target (issue #3): under 10 s and 500 MB per replay on a 2-core machine. Machines are noisy:
compare the rows of one run with each other, not with another day's run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "mistral_azure_conv_swa.yaml"
DESIGNS = ["v0-v1", "v0-v2", "v0-fixed", "v1-engine"]


def replay(design: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "sim.cli",
            "run",
            str(SCENARIO),
            "--no-plots",
            "--json",
            "-o",
            out,
            "--set",
            f"scheduler.design={design}",
        ]
        if design == "v1-engine":
            # vLLM's V1 engine turns chunked prefill on by default (spec 1.3); without it, its
            # startup check refuses this pool for a 32k max_model_len.
            cmd += ["--set", "scheduler.enable_chunked_prefill=true"]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout = proc.stdout.read()
        stderr = proc.stderr.read()
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"{design}: kvsim run failed ({proc.returncode}): {stderr.strip()}")
        summary = json.loads(stdout)["summary"]
    return {
        "design": design,
        "wall_s": wall_s,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "requests": summary["num_requests"],
        "sim_req_per_wall_s": summary["num_requests"] / wall_s,
        "steps": summary["num_steps"],
        "violations": summary["num_violations"],
        "failed": summary["states"]["failed"],
    }


def main() -> None:
    designs = sys.argv[1:] or DESIGNS
    rows = [replay(d) for d in designs]
    header = f"{'design':<10} {'wall s':>7} {'peak MB':>8} {'requests':>8} {'req/wall-s':>10} {'steps':>8} {'violations':>10} {'failed':>6}"
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['design']:<10} {r['wall_s']:>7.1f} {r['peak_rss_mb']:>8.0f} {r['requests']:>8} "
            f"{r['sim_req_per_wall_s']:>10.0f} {r['steps']:>8} {r['violations']:>10} {r['failed']:>6}"
        )


if __name__ == "__main__":
    main()
