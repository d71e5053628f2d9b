"""Disaggregated vs co-located serving on one workload and the same GPUs: where P/D pays.

    python benchmarks/disagg_crossover.py [--requests N] [--rates 8,16] [--gpus 4] [--link NAME]

Llama-3.1-8B on H100-SXM (TP 1), vLLM 0.11.0's V1 engine with its OpenAI-server defaults
on a >= 70 GiB GPU (max_num_batched_tokens 8192, max_num_seqs 1024: arg_utils.py:L1605-1614
@0.11.0), chunked prefill on; Poisson arrivals, prompts lognormal (mean 2,048, CV 0.5),
outputs lognormal (mean 256, CV 0.5); KV over RDMA 400 Gb/s (`sim/data/links.yaml`).
Shapes on `--gpus` GPUs: all co-located, and every P+D split. Prints one table over the rate
sweep (TTFT/TPOT p50/p99, throughput, KV transfer cost: MB and ms per request, share of TTFT)
and, per shape and SLO, the highest rate below which every swept rate meets it. Default SLOs:
TTFT p99 <= 1 s with TPOT p99 <= 15 ms (tight) and <= 50 ms (loose); `--slo TTFT_S,TPOT_S`
(repeatable) replaces them. The SLO column of the table is the first SLO's.

Expected shape. DistServe (Zhong et al., OSDI'24) finds that co-locating prefill and decode
makes them interfere, so a co-located system meeting tight TTFT and TPOT targets must
over-provision, and that disaggregation raises the rate served within both (its "goodput");
Splitwise (Patel et al., ISCA'24) splits the phases over machines with the KV state moved
over the cluster's back-plane and reports up to 1.4x the throughput at 20% lower cost. Both
expect the gain where TPOT is tight and the transfer cheap next to TTFT.

What kvsim finds (1,000 requests, 4 GPUs, rdma-400g; `python benchmarks/disagg_crossover.py`;
with the V1 engine's per-step worker CPU term at 2.25 ms, docs/accuracy.md): co-located TPOT
p99 grows with load (12.6 ms at 8 req/s, 23.8 at 24, 57.4 at 40: chunked prefills share steps
with decodes) while the decode pool's grows far less (2P+2D: 11.5 -> 17.7 -> 27.9 ms); the KV
read is 280 MB and 6.3 ms per request, 6.4% of 2P+2D's TTFT at 8 req/s, less as queueing grows
(0.9% at 40). Under TPOT p99 <= 15 ms 2P+2D and 1P+3D serve 16 req/s against co-located's 12
(2P+2D served 20 with the term at 1.75 ms), so disaggregation pays above about 12 req/s;
under a loose TPOT p99 <= 50 ms co-located serves 36 req/s against 2P+2D's 32 (a prefill pool
of 2 GPUs saturates first: TTFT p99 1.2 s at 36 req/s). 3P+1D serves less than co-located under either SLO, 1P+3D under the loose one
(the prefill or the decode pool saturates). So kvsim agrees in sign and shape:
disaggregation pays only under a tight TPOT SLO and with the right split. The size is far
below DistServe's headline 7.4x, whose setup (per-phase parallelism search, its own models,
baselines and SLOs) differs; here the co-located baseline already uses chunked prefill
(8,192-token budget). Over TCP at 25 GbE (`--link tcp-25g --rates 8,24`) the read takes
128 ms, 48-58% of 2P+2D's TTFT. `tests/benchmarks/test_disagg_crossover.py` (slow) checks
these figures.
"""

from __future__ import annotations

import argparse
import math

from sim.cluster.compare import Slo, at_rate, cluster_metrics, max_rate_meeting_slo
from sim.scenario.schema import Scenario, scenario_from_dict


def base_scenario(
    num_requests: int, gpus: int, split: tuple[int, int] | None, link: str = "rdma-400g"
) -> Scenario:
    data: dict = {
        "name": "disagg-crossover",
        "model": "llama-3.1-8b",
        "hardware": {"gpu": "h100-sxm"},
        "cache": {"block_size": 16},
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": "0.11.0",
            "enable_chunked_prefill": True,
            "max_num_batched_tokens": 8192,
            "max_num_seqs": 1024,
        },
        "engine": {"num_replicas": gpus, "router": "least_outstanding"},
        "workload": {
            "kind": "synthetic",
            "num_requests": num_requests,
            "seed": 7,
            "arrival": {"process": "poisson", "rate_per_s": 1.0},
            "lengths": {
                "prompt": {"kind": "lognormal", "mean": 2048, "cv": 0.5, "max_tokens": 16000},
                "output": {"kind": "lognormal", "mean": 256, "cv": 0.5, "max_tokens": 2048},
            },
        },
    }
    if split is not None:
        data["cluster"] = {
            "mode": "disaggregated",
            "prefill": {"replicas": split[0], "router": "least_outstanding"},
            "decode": {"replicas": split[1], "router": "least_outstanding"},
            "link": link,
        }
    return scenario_from_dict(data, "disagg_crossover")


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:8.1f}"


def sweep(
    requests: int, gpus: int, rates: list[float], link: str = "rdma-400g"
) -> dict[str, list[dict]]:
    """`cluster_metrics` of every shape on `gpus` GPUs (all co-located, then each P+D split)
    at each rate, by shape name, rows in rate order (each row carries `rate_per_s`)."""
    splits: list[tuple[int, int] | None] = [None] + [(p, gpus - p) for p in range(1, gpus)]
    by_shape: dict[str, list[dict]] = {}
    for rate in rates:
        for split in splits:
            row = cluster_metrics(at_rate(base_scenario(requests, gpus, split, link), rate))
            row["rate_per_s"] = rate
            by_shape.setdefault(row["shape"], []).append(row)
    return by_shape


def _row_line(row: dict, slo: Slo) -> str:
    kv_mb = row["kv_bytes_mean"] / 1e6
    share = row["transfer_share_of_ttft_mean"]
    meets = "yes" if max_rate_meeting_slo([row], slo) is not None else "no"
    return (
        f"{row['rate_per_s']:6.1f} {row['shape']:>14} {_ms(row['ttft_p50_s'])} "
        f"{_ms(row['ttft_p99_s'])} {_ms(row['tpot_p50_s'])} {_ms(row['tpot_p99_s'])} "
        f"{row['throughput_tok_per_s']:7.0f} {row['num_finished']:5d} "
        f"{'-' if math.isnan(kv_mb) else f'{kv_mb:9.1f}':>9} "
        f"{_ms(row['transfer_s_mean']):>7} "
        f"{'-' if math.isnan(share) else f'{share:9.1%}':>9} {meets:>3}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--rates", default="8,12,16,20,24,28,32,36,40")
    parser.add_argument("--link", default="rdma-400g", help="a sim/data/links.yaml name")
    parser.add_argument("--slo", action="append", help="TTFT_P99_S,TPOT_P99_S (repeatable)")
    args = parser.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    slos = [Slo(*map(float, text.split(","))) for text in args.slo or ["1.0,0.015", "1.0,0.05"]]
    print(
        f"{'rate/s':>6} {'shape':>14} {'TTFT p50':>8} {'TTFT p99':>8} {'TPOT p50':>8} "
        f"{'TPOT p99':>8} {'tok/s':>7} {'done':>5} {'KV MB/req':>9} {'xfer ms':>7} "
        f"{'xfer/TTFT':>9} {'SLO':>3}"
    )
    by_shape = sweep(args.requests, args.gpus, rates, args.link)
    for i in range(len(rates)):
        for rows in by_shape.values():
            print(_row_line(rows[i], slos[0]))
    for slo in slos:
        print(f"\nSLO: TTFT p99 <= {slo.ttft_p99_s} s, TPOT p99 <= {slo.tpot_p99_s * 1e3:.0f} ms")
        for shape, rows in by_shape.items():
            best = max_rate_meeting_slo(rows, slo)
            print(f"  {shape:>14}: highest rate meeting the SLO: {best if best else 'none'} req/s")


if __name__ == "__main__":
    main()
