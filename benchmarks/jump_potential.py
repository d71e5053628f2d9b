"""Could the engine jump over runs of quiet decode steps? Measure the runs before building it.

Issue #13's "fewer steps" idea: advance a run of decode-only steps in which nothing arrives,
finishes, is preempted or gets a new block in one jump. It pays only if such runs are long.
This reads a run's steps and requests tables and prints the distribution of run lengths:

    python benchmarks/jump_potential.py            # the Azure replay (v1-engine) and a
                                                   # synthetic Poisson Llama-3.1-8B/A100 load
    python benchmarks/jump_potential.py runs/x ... # the tables of finished runs (kvsim run -o)

A step k (after step k-1 of the same replica) CONTINUES a run when both are decode-only steps
of the same decodes: k ran no prefill, preempted nothing, runs as many decodes as k-1, no
request finished at the end of k-1 or of k, none arrived at this replica between the two
schedule calls, and the pool's used blocks did not change (no decode crossed into a new block).
A run is a step plus the steps that continue it; a jump would replace it with one iteration.
The "relaxed" columns drop the block condition (a jump that also allocates the boundary blocks,
in the order the steps would have, which the block ids and the audit make harder).

Reading: `steps per run` is the mean run length; `saved` is the share of step-loop iterations
a perfect jump removes, 1 - runs / steps. With N decodes at random offsets in blocks of B
tokens, a step crosses no block boundary with probability about (1 - 1/B)^N: 0.2% for N = 100,
B = 16, so at a realistic load the strict runs are a step or two long.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

#: Run lengths bucketed by powers of two (the last bucket is open).
BUCKETS = [(1, 1), (2, 2), (3, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, None)]

#: Llama-3.1-8B on one A100 under Poisson arrivals at a rate that keeps ~100 requests running
#: (measured: 9.5 req/s -> 85 running, 11 req/s -> 160; near one A100's capacity here).
SYNTHETIC = {
    "name": "jump-potential-poisson-llama8b-a100",
    "model": "llama-3.1-8b",
    "hardware": {"gpu": "a100-80gb-sxm"},
    "cache": {"block_size": 16},
    "scheduler": {"design": "v1-engine", "max_num_seqs": 256},
    "workload": {
        "kind": "synthetic",
        "num_requests": 5000,
        "seed": 0,
        "arrival": {"process": "poisson", "rate_per_s": 10.0},
        "lengths": {
            "prompt": {"kind": "lognormal", "mean": 600, "cv": 1.0, "max_tokens": 4096},
            "output": {"kind": "lognormal", "mean": 250, "cv": 1.0, "max_tokens": 2048},
        },
    },
}


def continues(steps: pd.DataFrame, requests: pd.DataFrame, strict: bool) -> np.ndarray:
    """For each step (sorted by replica, step): does it continue the previous step's run?"""
    steps = steps.sort_values(["replica", "step"]).reset_index(drop=True)
    end_s = (steps["start_s"] + steps["duration_s"]).to_numpy()
    start_s = steps["start_s"].to_numpy()
    replica = steps["replica"].to_numpy()
    decode_only = (
        (steps["num_prefill_seqs"].to_numpy() == 0)
        & (steps["duration_s"].to_numpy() > 0)
        & (steps["num_preempted"].to_numpy() == 0)
    )
    ok = np.zeros(len(steps), dtype=bool)
    ok[1:] = (
        (replica[1:] == replica[:-1])
        & decode_only[1:]
        & decode_only[:-1]
        & (steps["num_decode_seqs"].to_numpy()[1:] == steps["num_decode_seqs"].to_numpy()[:-1])
    )
    if strict:
        used = steps["num_used_blocks"].to_numpy()
        ok[1:] &= used[1:] == used[:-1]
    for r in np.unique(replica):
        mine = replica == r
        reqs = requests[requests["replica"] == r]
        finishes = np.sort(reqs["finish_s"].dropna().to_numpy())
        arrivals = np.sort(reqs["arrival_s"].to_numpy())
        index = np.flatnonzero(mine)
        # A finish at the end of this step or the previous one changes the decodes.
        finished_now = np.isin(end_s[index], finishes)
        finished_before = np.concatenate(([True], finished_now[:-1]))
        # An arrival between the previous schedule call and this one: (start_{k-1}, start_k].
        prev_start = np.concatenate(([-np.inf], start_s[index][:-1]))
        arrived = np.searchsorted(arrivals, start_s[index], side="right") > np.searchsorted(
            arrivals, prev_start, side="right"
        )
        ok[index] &= ~finished_now & ~finished_before & ~arrived
    return ok


def run_lengths(cont: np.ndarray) -> np.ndarray:
    """Lengths of the runs: a step that does not continue starts a new run."""
    starts = np.flatnonzero(~cont)
    return np.diff(np.append(starts, len(cont)))


def report(label: str, steps: pd.DataFrame, requests: pd.DataFrame) -> None:
    in_flight = steps.loc[steps["duration_s"] > 0, "num_running"].mean()
    print(f"\n{label}: {len(steps)} steps, {len(requests)} requests, {in_flight:.0f} running")
    header = f"{'':<8} {'runs':>8} {'steps/run':>9} {'p50':>4} {'p99':>5} {'max':>6} {'saved':>6}"
    print(header + "  share of steps in runs of length " + " ".join(_bucket_names()))
    for strict in (True, False):
        lengths = run_lengths(continues(steps, requests, strict))
        shares = []
        for low, high in BUCKETS:
            inside = (lengths >= low) & (lengths <= (high or lengths.max()))
            shares.append(lengths[inside].sum() / lengths.sum())
        print(
            f"{'strict' if strict else 'relaxed':<8} {len(lengths):>8} "
            f"{lengths.mean():>9.2f} {np.percentile(lengths, 50):>4.0f} "
            f"{np.percentile(lengths, 99):>5.0f} {lengths.max():>6} "
            f"{1 - len(lengths) / lengths.sum():>6.1%}  " + " ".join(f"{s:>5.1%}" for s in shares)
        )


def _bucket_names() -> list[str]:
    return [
        f"{low}" if low == high else f"{low}-{high}" if high else f"{low}+" for low, high in BUCKETS
    ]


def _read(out_dir: Path, name: str) -> pd.DataFrame:
    parquet = out_dir / f"{name}.parquet"
    return pd.read_parquet(parquet) if parquet.exists() else pd.read_csv(out_dir / f"{name}.csv")


def main() -> None:
    import sim
    from sim.scenario.schema import scenario_from_dict

    if sys.argv[1:]:
        for arg in sys.argv[1:]:
            out_dir = Path(arg)
            report(str(out_dir), _read(out_dir, "steps"), _read(out_dir, "requests"))
        return
    azure = sim.run(
        ROOT / "scenarios" / "mistral_azure_conv_swa.yaml",
        overrides={"scheduler.design": "v1-engine", "scheduler.enable_chunked_prefill": True},
    )
    report("Azure conversation replay, v1-engine", azure.steps, azure.requests)
    synthetic = sim.run(scenario_from_dict(SYNTHETIC, "jump_potential.py"))
    report(
        "synthetic Poisson, Llama-3.1-8B on A100, v1-engine", synthetic.steps, synthetic.requests
    )


if __name__ == "__main__":
    main()
