"""Trace files stream: peak memory of a 1M-request trace in Vidur's CSV format (issue #20).

Draws the synthetic workload of `benchmarks/scale_requests.py` (Poisson 13.5 req/s, lognormal
lengths, seed 1; about 100 requests in flight on Llama-3.1-8B / A100-80GB), writes the same
requests as a Vidur trace (``arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,
pd_ratio``; arrivals written with ``repr``, so they read back as the same doubles) into a
temporary folder, then runs each row in a fresh process and prints its peak RSS (wait4) and
wall time:

- ``vidur, whole file``: the trace read as one chunk (`TRACE_CHUNK_ROWS` set beyond the file's
  rows), which is how every trace was read before: one DataFrame of the file, one list of
  requests;
- ``vidur, streamed``: the default, 65,536 rows at a time, the file read again as the run
  goes;
- ``synthetic``: the same requests drawn by the generator (`LazySpecs`), which streams.

The trace and the synthetic rows simulate the same requests, so their request tables match
(`same requests table` compares them).

    python benchmarks/stream_traces.py              # 1M requests, full kvsim run
    python benchmarks/stream_traces.py 100000       # another size
    python benchmarks/stream_traces.py --load-only  # read + iterate the workload, no simulation

Machines are noisy: compare the rows of one run with each other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.scale_requests import SCENARIO  # noqa: E402  # after the path is set

#: A child: set the chunk size, then `kvsim run` (or only load and iterate the workload).
CHILD = """\
import sys
import sim.workload.trace_stream as trace_stream
chunk, mode, *args = sys.argv[1:]
trace_stream.TRACE_CHUNK_ROWS = int(chunk)
if mode == "run":
    from sim.cli.main import app
    app(["run", *args], prog_name="kvsim")
else:
    from pathlib import Path
    from sim.scenario.schema import load_scenario
    from sim.workload import load_workload
    scenario = load_scenario(Path(args[0]))
    workload = load_workload(scenario.workload, Path(args[0]).parent)
    print(sum(1 for _ in workload.requests))
"""


def write_trace(num_requests: int, path: Path) -> None:
    """The synthetic scenario's requests as a Vidur CSV trace."""
    import yaml

    from sim.workload.config import WorkloadConfig
    from sim.workload.synthetic import LazySpecs

    config = WorkloadConfig(**{**yaml.safe_load(SCENARIO)["workload"], "num_requests": 1})
    specs = LazySpecs(num_requests, config.arrival, config.lengths, config.seed, ROOT)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n")
        for s in specs:
            p, o = s.prompt_tokens, s.output_tokens
            fh.write(f"{s.arrival_s!r},{p},{o},{p + o},{p / o:.6g}\n")


def scenarios(work: Path, num_requests: int, trace: Path) -> dict[str, Path]:
    synthetic = work / "synthetic.yaml"
    synthetic.write_text(SCENARIO.replace("num_requests: 1000", f"num_requests: {num_requests}"))
    vidur = work / "vidur.yaml"
    head, _, _ = SCENARIO.partition("workload:")
    vidur.write_text(head + f"workload:\n  kind: trace\n  path: {trace}\n  format: vidur\n")
    return {"synthetic": synthetic, "vidur": vidur}


def measure(args: list[str], cwd: Path) -> tuple[float, float]:
    """(peak RSS MB, wall s) of one child process."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args], cwd=cwd, stdout=out, stderr=subprocess.STDOUT
        )
        _, status, usage = os.wait4(proc.pid, 0)
        wall_s = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            out.seek(0)
            raise SystemExit(f"{args}: failed: {out.read()[-2000:]!r}")
    return usage.ru_maxrss / 1024, wall_s


def main(argv: list[str]) -> None:
    sizes = [int(a.replace("_", "")) for a in argv if not a.startswith("--")] or [1_000_000]
    load_only = "--load-only" in argv
    print(f"{'format':<20} {'requests':>10} {'peak RSS MB':>12} {'wall s':>8}  same requests table")
    for n in sizes:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            trace = work / "vidur_trace.csv"
            write_trace(n, trace)
            files = scenarios(work, n, trace)
            rows = [
                ("vidur, whole file", str(n + 1), files["vidur"]),
                ("vidur, streamed", "65536", files["vidur"]),
                ("synthetic", "65536", files["synthetic"]),
            ]
            tables = {}
            for label, chunk, scenario in rows:
                out = work / label.replace(", ", "_").replace(" ", "_")
                if load_only:
                    args = [chunk, "load", str(scenario)]
                else:
                    args = [chunk, "run", str(scenario), "--no-plots", "-o", str(out)]
                peak_mb, wall_s = measure(args, ROOT)
                tables[label] = None if load_only else (out / "requests.csv").read_bytes()
                same = "" if load_only else str(tables[label] == tables["vidur, whole file"])
                print(f"{label:<20} {n:>10} {peak_mb:>12.0f} {wall_s:>8.1f}  {same}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
