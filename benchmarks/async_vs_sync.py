"""The Azure LLM inference 2023 conversation trace (19,366 requests; the golden tables' Azure
scenario, `scenarios/mistral_azure_conv_swa.yaml`, with the V1 engine's chunked prefill) under
each V1 release kvsim pins, synchronous vs async scheduling, as a markdown table: preemptions,
TTFT and TPOT p50 / p99, throughput, KV use. Each row is one replay in a fresh process.

    python benchmarks/async_vs_sync.py               # the six rows
    python benchmarks/async_vs_sync.py 0.33.0        # one release, sync and async

Async scheduling changes the decisions (`sim.scheduler.v1.async_scheduler`, verified by
`kvsim verify --scheduler --async`) and the time (the engine CPU overhead hidden behind the
GPU, `sim.latency.overlap`). Its replay runs without the decode fast path (the speed layer
stands down under async), so it takes longer in wall time; the results do not depend on that.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "mistral_azure_conv_swa.yaml"
PINS = ["4ac7713", "0.11.0", "0.33.0"]
COLUMNS = (
    ("preemptions", "num_preemptions", "{:d}"),
    ("TTFT p50 (s)", "ttft_p50_s", "{:.3f}"),
    ("TTFT p99 (s)", "ttft_p99_s", "{:.3f}"),
    ("TPOT p50 (ms)", "tpot_p50_s", "{:.2f}"),
    ("TPOT p99 (ms)", "tpot_p99_s", "{:.2f}"),
    ("req/s", "throughput_req_per_s", "{:.2f}"),
    ("tok/s", "throughput_tok_per_s", "{:.0f}"),
    ("KV mean", "kv_util_mean", "{:.3f}"),
    ("KV max", "kv_util_max", "{:.3f}"),
)


def replay(pin: str, async_scheduling: bool) -> dict:
    """The summary of one replay (`kvsim run --json`)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "sim.cli", "run", str(SCENARIO), "--no-plots", "--json"]
        cmd += ["-o", out, "--set", "scheduler.design=v1-engine"]
        cmd += ["--set", f"scheduler.vllm_version={pin}"]
        cmd += ["--set", "scheduler.enable_chunked_prefill=true"]
        cmd += ["--set", f"scheduler.async_scheduling={str(async_scheduling).lower()}"]
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=False)
        if done.returncode not in (0, 1):  # 1: the scenario's expected violations differ
            raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr}")
        return json.loads(Path(out, "summary.json").read_text())["summary"]


def cell(summary: dict, key: str, fmt: str) -> str:
    value = summary[key]
    if key.startswith("tpot"):
        value *= 1000
    return fmt.format(value)


def main(argv: list[str]) -> None:
    pins = [a for a in argv if a in PINS] or PINS
    print("| vLLM | scheduling | " + " | ".join(name for name, _, _ in COLUMNS) + " |")
    print("|---|---|" + "---:|" * len(COLUMNS))
    for pin in pins:
        for async_scheduling in (False, True):
            summary = replay(pin, async_scheduling)
            cells = [cell(summary, key, fmt) for _, key, fmt in COLUMNS]
            mode = "async" if async_scheduling else "sync"
            print(f"| {pin} | {mode} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
