"""All-reduce between GPUs that cannot reach each other's memory (no peer-to-peer access).

The measured model's all-reduce (`sim/data/steptime_coefficients.json`, fitted on Vidur's NCCL
profiles of NVLink-connected A100s and H100s) assumes the GPUs read each other's memory
directly. On a host without GPU peer-to-peer access (PCIe cards behind different root ports,
many cloud VMs, consumer cards: `nvidia-smi topo -m` says `SYS`) two things change:

- vLLM turns its own custom all-reduce off and logs it (0.11.0
  `vllm/distributed/device_communicators/custom_all_reduce.py`, `CustomAllreduce.__init__`:
  "Custom allreduce is disabled because your platform lacks GPU P2P capability or P2P test
  failed"), so every all-reduce is NCCL's (pynccl);
- NCCL moves the data through a shared-memory buffer in host RAM (its SHM transport), each
  byte crossing PCIe twice, with a far higher latency and a far lower bandwidth.

`hardware.p2p: false` selects this path: latency + bytes / algbw per all-reduce, with

- latency 39 us, from one public measurement of NCCL's SHM transport on two PCIe 4.0 x16 GPUs
  without peer access, sglang PR #39605 (https://github.com/sgl-project/sglang/pull/39605,
  2026-09-15, two RTX 5070 Ti): a 10 KB all-reduce took 39 us;
- algbw 6.5 GB/s at TP 2, FITTED on the fit half of the serving points that need it
  (`p2p: false` in sim/data/vllm_serving_measurements.yaml: two A100 80GB servers of vLLM
  0.10.1.1 whose logs say custom all-reduce is off for lack of P2P), the value on a 0.5 GB/s
  grid with the smallest median |error| over their TTFT, TPOT and throughput
  (`benchmarks/serving_accuracy.py` `fit_host_staged_algbw`); the held-out half is its test
  (docs/accuracy.md). That desktop's 20 MB all-reduce moved 1.84 GB/s (10.9 ms): a server's
  root complex moves ~3.5x more, so the desktop figure is not used.

For more ranks the ring takes 2 (n - 1) steps instead of 2, so the latency grows by (n - 1) and
the algorithm bandwidth is the bus bandwidth x n / (2 (n - 1)): TP 4 = 117 us and 4.33 GB/s
(an assumption: no TP > 2 point without P2P has been compared). What this leaves out: NCCL's
protocol choice per message size; `NCCL_SHM_USE_CUDA_MEMCPY`; vLLM's other all-reduce
backends (symmetric memory, FlashInfer fusion), which also need peer access.
"""

from __future__ import annotations

#: NCCL all-reduce through host shared memory at TP 2 (module docstring: the latency measured
#: in sglang PR #39605, the bandwidth fitted on the fit half of the serving points).
HOST_STAGED_LATENCY_S = 39e-6
HOST_STAGED_ALGBW_GBPS = 6.5


def host_staged_allreduce(
    tp: int, tp2_algbw_GBps: float = HOST_STAGED_ALGBW_GBPS
) -> dict[str, float]:
    """`measured_terms.allreduce_time_s` coefficients of NCCL's SHM ring over `tp` ranks, with
    `tp2_algbw_GBps` the bandwidth at TP 2 (the fitted one unless a fit passes a candidate:
    benchmarks/serving_accuracy.py `fit_host_staged_algbw`).

    Example: tp 2 -> 39 us + bytes / 6.5 GB/s (an 8,192-token prefill of a 3,584-wide model
    all-reduces 58.7 MB: 9.07 ms); tp 4 -> 117 us + bytes / 4.33 GB/s.
    """
    if tp < 2:
        raise ValueError(f"an all-reduce needs tp >= 2, got {tp}")
    steps_ratio = tp - 1  # 2 (n - 1) ring steps against TP 2's two
    busbw_GBps = tp2_algbw_GBps  # at TP 2 the algorithm and bus bandwidths coincide
    return {
        "latency_s": HOST_STAGED_LATENCY_S * steps_ratio,
        "algbw_GBps": busbw_GBps * tp / (2 * (tp - 1)),
    }
