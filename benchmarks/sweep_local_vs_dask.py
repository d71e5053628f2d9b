"""Wall time of a 16-point sweep of the Azure conversation trace: local processes vs Dask.

Grid: scheduler.max_num_seqs in {64, 256} x workload.rate_scale in {0.5, 1, 2, 4} x
hardware.gpu in {h100-sxm, h200}; Llama-3.1-8B, v0-v2, roofline step time. The whole trace
(19,366 requests, one hour) takes minutes per point, so by default each point replays a
window: the first FIRST_N requests (`--first-n`, default 500).

    .venv/bin/python benchmarks/sweep_local_vs_dask.py [--first-n 500] [--workers 2]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import sim

TRACE = (
    Path(sim.__file__).parent
    / "data"
    / "traces"
    / "azure_llm_2023"
    / "AzureLLMInferenceTrace_conv.csv"
)
GRID = {
    "scheduler.max_num_seqs": [64, 256],
    "workload.rate_scale": [0.5, 1, 2, 4],
    "hardware.gpu": ["h100-sxm", "h200"],
}


def scenario(first_n: int) -> dict:
    return {
        "name": "azure-conv-sweep-bench",
        "model": "llama-3.1-8b",
        "scheduler": {"design": "v0-v2", "max_model_len": 8192, "max_num_batched_tokens": 8192},
        "workload": {"kind": "trace", "path": str(TRACE), "first_n": first_n},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first-n", type=int, default=500)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from distributed import Client, LocalCluster

    rows = []
    start = time.perf_counter()
    serial = sim.sweep(scenario(args.first_n), GRID, workers=1)
    rows.append(("in-process (1 worker)", time.perf_counter() - start, serial))
    start = time.perf_counter()
    local = sim.sweep(scenario(args.first_n), GRID, workers=args.workers)
    rows.append((f"local processes ({args.workers})", time.perf_counter() - start, local))
    with tempfile.TemporaryDirectory():
        start = time.perf_counter()
        cluster = LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=None
        )
        with cluster, Client(cluster) as client:
            setup_s = time.perf_counter() - start
            dask = sim.sweep(scenario(args.first_n), GRID, cluster=client)
        rows.append(
            (
                f"Dask LocalCluster ({args.workers} procs, incl. {setup_s:.1f} s start)",
                time.perf_counter() - start,
                dask,
            )
        )
    for name, _, table in rows:
        if table["error"].notna().any():
            print(f"{name}: first error: {table['error'].dropna().iloc[0]}")
    same = all(r[2][["key", "ttft_p99_s"]].equals(serial[["key", "ttft_p99_s"]]) for r in rows)
    print(f"16-point sweep, Azure conv trace, first {args.first_n} requests per point")
    print(f"{'executor':<48} {'wall (s)':>9} {'sum of point times (s)':>23} {'failed':>7}")
    for name, wall_s, table in rows:
        print(
            f"{name:<48} {wall_s:>9.1f} {table['wall_s'].sum():>23.1f} {int(table['error'].notna().sum()):>7}"
        )
    print(f"identical tables: {same}")


if __name__ == "__main__":
    main()
