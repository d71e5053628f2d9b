"""Replay a whole conversation trace on a cluster of V1-engine replicas behind a router, each
run in a fresh process, and print wall time, peak memory (max RSS of the process), the prefix
hit rate and TTFT p50/p99.

    python benchmarks/cluster_replay.py            # speed rows and the router table, Azure
    python benchmarks/cluster_replay.py speed      # only 1 replica vs 8 replicas (prefix-aware)
    python benchmarks/cluster_replay.py routers    # only the router table (8 replicas)
    python benchmarks/cluster_replay.py mooncake   # the router table on the Mooncake trace
    python benchmarks/cluster_replay.py kv_events  # 8 replicas prefix-aware, recording KV events

Azure: the whole Azure LLM inference 2023 conversation trace (19,366 requests,
scenarios/mistral_azure_conv_swa.yaml) on the V1 engine with chunked prefill and prefix
caching. One replica is already a little over capacity at the trace's rate (its queue grows),
so 8 replicas replay it `AZURE_RATE_SCALE` = 6 times as fast: about 6/8 of one replica's
load each. The speed target (issue #15): no worse per request than one replica. The row
"1 replica, rate x0.75" is one replica under the load each of the 8 carries: the same work
per request (one overloaded replica runs fewer, fuller steps per request).

The Azure trace gives token counts only, no content, so no two prompts share a block and the
hit rate is 0 whatever the router (prefix-aware then routes on load alone). The Mooncake
conversation trace names its 512-token blocks (`hash_ids`), so it is where routing on the
cache shows; `mooncake` replays its first `MOONCAKE_FIRST_N` requests on 8 replicas at 8 times
the rate one H100 keeps up with (scenarios/mooncake_prefix_caching.yaml: 0.25).

`kv_events` is the 8-replica prefix-aware row with `engine.kv_events: true`: the `kv_events`
table (one row per block of every replica's events) streams to its files as the run goes, so
the peak stays near the row without it; the row also prints the table's size and the sha256
of `kv_events.csv` and `requests.csv` (to compare the bytes across versions of kvsim).

Machines are noisy: compare the rows of one run with each other, not with another day's.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _isolated import in_forked_child  # benchmarks/ is the script's folder

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT / "scenarios" / "mistral_azure_conv_swa.yaml"
MOONCAKE = ROOT / "scenarios" / "mooncake_prefix_caching.yaml"
AZURE_V1 = [
    "scheduler.design=v1-engine",
    # vLLM's V1 engine turns chunked prefill on by default; without it, its startup check
    # refuses this pool for Mistral's 32k max_model_len.
    "scheduler.enable_chunked_prefill=true",
    "cache.enable_prefix_caching=true",
]
AZURE_RATE_SCALE = 6.0
MOONCAKE_FIRST_N = 4000
MOONCAKE_RATE_SCALE = 2.0
NUM_REPLICAS = 8
#: label -> (router, staleness s)
ROUTERS = {
    "round robin": ("round_robin", 0.0),
    "prefix-aware": ("prefix_cache_aware", 0.0),
    "prefix-aware, 1 s stale": ("prefix_cache_aware", 1.0),
}


def _cluster(replicas: int, router: str, staleness_s: float, rate_scale: float) -> list[str]:
    return [
        f"engine.num_replicas={replicas}",
        f"engine.router={router}",
        f"engine.router_staleness_s={staleness_s}",
        f"workload.rate_scale={rate_scale}",
    ]


def cases(which: str) -> list[tuple[str, Path, list[str]]]:
    """(label, scenario, --set overrides) of each row."""
    if which == "speed":
        per_replica = AZURE_RATE_SCALE / NUM_REPLICAS
        return [
            ("azure 1 replica", AZURE, AZURE_V1 + _cluster(1, "round_robin", 0.0, 1.0)),
            (
                f"azure 1 replica, rate x{per_replica:g}",
                AZURE,
                AZURE_V1 + _cluster(1, "round_robin", 0.0, per_replica),
            ),
            (
                f"azure {NUM_REPLICAS} replicas prefix-aware",
                AZURE,
                AZURE_V1 + _cluster(NUM_REPLICAS, "prefix_cache_aware", 0.0, AZURE_RATE_SCALE),
            ),
            (
                f"azure {NUM_REPLICAS} replicas round robin",
                AZURE,
                AZURE_V1 + _cluster(NUM_REPLICAS, "round_robin", 0.0, AZURE_RATE_SCALE),
            ),
        ]
    if which == "routers":
        return [
            (
                f"azure {label}",
                AZURE,
                AZURE_V1 + _cluster(NUM_REPLICAS, router, staleness_s, AZURE_RATE_SCALE),
            )
            for label, (router, staleness_s) in ROUTERS.items()
        ]
    if which == "mooncake":
        return [
            (
                f"mooncake {label}",
                MOONCAKE,
                [f"workload.first_n={MOONCAKE_FIRST_N}"]
                + _cluster(NUM_REPLICAS, router, staleness_s, MOONCAKE_RATE_SCALE),
            )
            for label, (router, staleness_s) in ROUTERS.items()
        ]
    if which == "kv_events":
        cluster = _cluster(NUM_REPLICAS, "prefix_cache_aware", 0.0, AZURE_RATE_SCALE)
        return [
            (f"azure {NUM_REPLICAS} prefix-aware", AZURE, AZURE_V1 + cluster),
            (
                f"azure {NUM_REPLICAS} prefix-aware kv_events",
                AZURE,
                AZURE_V1 + cluster + ["engine.kv_events=true"],
            ),
        ]
    raise SystemExit(f"unknown table {which!r}: speed, routers, mooncake or kv_events")


def replay(label: str, scenario: Path, overrides: list[str]) -> dict:
    import pandas as pd
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "sim.cli", "run", str(scenario), "--no-plots", "--json"]
        cmd += ["-o", out]
        for override in overrides:
            cmd += ["--set", override]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True)
        wall_s = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"{label}: kvsim run failed ({proc.returncode}): {proc.stderr}")
        summary = json.loads(proc.stdout)["summary"]
        requests = pd.read_parquet(Path(out) / "requests.parquet")
        events = Path(out) / "kv_events.parquet"
        num_event_rows = pq.ParquetFile(events).metadata.num_rows if events.exists() else 0
        digests = {
            f"sha256_{name}": hashlib.sha256((Path(out) / f"{name}.csv").read_bytes()).hexdigest()
            for name in ("requests", "kv_events")
            if (Path(out) / f"{name}.csv").exists()
        }
    return {
        "label": label,
        "wall_s": wall_s,
        "requests": summary["num_requests"],
        "steps": summary["num_steps"],
        "finished": summary["states"]["finished"],
        "us_per_request": 1e6 * wall_s / summary["num_requests"],
        "hit_rate": float(
            requests["num_prefix_hit_tokens"].sum() / requests["prompt_tokens"].sum()
        ),
        "ttft_p50_s": summary["ttft_p50_s"],
        "ttft_p99_s": summary["ttft_p99_s"],
        "violations": summary["num_violations"],
        "kv_event_rows": num_event_rows,
        **digests,
    }


def measure(label: str, scenario: Path, overrides: list[str]) -> dict:
    """`replay` in a forked child, so that its children's ru_maxrss is this replay's alone."""
    return in_forked_child(lambda: replay(label, scenario, overrides))


def main() -> None:
    tables = sys.argv[1:] or ["speed", "routers"]
    header = (
        f"{'run':<34} {'wall s':>7} {'peak MB':>8} {'requests':>8} {'steps':>7} {'us/req':>7} "
        f"{'hit rate':>8} {'TTFT p50 s':>10} {'TTFT p99 s':>10} {'violations':>10}"
    )
    print(header)
    print("-" * len(header))
    for which in tables:
        for label, scenario, overrides in cases(which):
            r = measure(label, scenario, overrides)
            print(
                f"{r['label']:<34} {r['wall_s']:>7.1f} {r['peak_rss_mb']:>8.0f} "
                f"{r['requests']:>8} {r['steps']:>7} {r['us_per_request']:>7.0f} {r['hit_rate']:>8.3f} "
                f"{r['ttft_p50_s']:>10.3f} {r['ttft_p99_s']:>10.3f} {r['violations']:>10}",
                flush=True,
            )
            if r["kv_event_rows"]:
                digests = ", ".join(f"{k} {v[:16]}" for k, v in r.items() if k.startswith("sha"))
                print(f"    kv_events: {r['kv_event_rows']} rows; {digests}", flush=True)


if __name__ == "__main__":
    main()
