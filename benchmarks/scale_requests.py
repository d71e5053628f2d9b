"""Bounded memory at scale: a synthetic Poisson workload (Llama-3.1-8B on one A100-80GB, a
rate that keeps about 100 requests in flight) of 100k and 1M requests (10M with --10m), each
run by `kvsim run -o` in a fresh process, outputs written, plots off. Prints wall time (whole
process), peak memory (max RSS of that process) and the mean number of requests in flight.

    python benchmarks/scale_requests.py             # 100k, 1M
    python benchmarks/scale_requests.py --10m       # 100k, 1M, 10M
    python benchmarks/scale_requests.py 20000       # given sizes only

Targets (issue #13): 1M requests in <= 2 min and <= 1 GB peak; 10M completes with peak memory
within 1.5x of the 1M run (the tables stream to files, no per-request state is kept).
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

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
#: About 100 requests in flight (measured: the steps' mean of running + waiting).
RATE_PER_S = 13.5
SCENARIO = f"""\
name: scale-llama3-8b-a100
model: llama-3.1-8b
hardware: {{gpu: a100-80gb-sxm}}
cache: {{block_size: 16, num_gpu_blocks: derive}}
scheduler: {{design: v0-v2, max_num_seqs: 256}}
workload:
  kind: synthetic
  num_requests: 1000
  seed: 1
  arrival: {{process: poisson, rate_per_s: {RATE_PER_S}}}
  lengths:
    prompt: {{kind: lognormal, mean: 512, cv: 1.0, max_tokens: 4096}}
    output: {{kind: lognormal, mean: 128, cv: 1.0, max_tokens: 1024}}
"""


def run_one(num_requests: int) -> dict:
    """One size in a fresh process, its peak RSS from wait4."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        scenario = work / "scale.yaml"
        scenario.write_text(SCENARIO)
        out = work / "run"
        cmd = [sys.executable, "-m", "sim.cli", "run", str(scenario), "--no-plots", "--json"]
        cmd += ["-o", str(out), "--set", f"workload.num_requests={num_requests}"]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        start = time.perf_counter()
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            proc = subprocess.Popen(cmd, stdout=stdout, stderr=stderr, cwd=ROOT, env=env)
            _, status, usage = os.wait4(proc.pid, 0)
            wall_s = time.perf_counter() - start
            proc.returncode = os.waitstatus_to_exitcode(status)
            stdout.seek(0)
            stderr.seek(0)
            if proc.returncode != 0:
                raise SystemExit(f"{num_requests}: kvsim run failed: {stderr.read()[-2000:]!r}")
            summary = json.loads(stdout.read())["summary"]
        steps = pq.read_table(out / "steps.parquet", columns=["num_running", "num_waiting"])
        in_flight = (steps["num_running"].to_numpy() + steps["num_waiting"].to_numpy()).mean()
        return {
            "requests": num_requests,
            "wall_s": wall_s,
            "peak_mb": usage.ru_maxrss / 1024,  # KiB on Linux
            "steps": summary["num_steps"],
            "finished": summary["states"]["finished"],
            "in_flight": float(in_flight),
        }


def main(argv: list[str]) -> None:
    sizes = [int(a.replace("_", "")) for a in argv if not a.startswith("--")]
    if not sizes:
        sizes = [100_000, 1_000_000] + ([10_000_000] if "--10m" in argv else [])
    print(
        f"{'requests':>10} {'wall s':>8} {'peak MB':>8} {'steps':>10} {'finished':>10} {'in flight':>9}"
    )
    for n in sizes:
        row = run_one(n)
        print(
            f"{row['requests']:>10} {row['wall_s']:>8.1f} {row['peak_mb']:>8.0f} "
            f"{row['steps']:>10} {row['finished']:>10} {row['in_flight']:>9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:])
