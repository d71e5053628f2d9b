"""Transfer time of KV blocks over a link: bytes / effective bandwidth + a fixed latency.

A `Link` is one direction of a physical link. A `TransferQueue` is one ordered queue of
transfers on it (a CUDA stream: vLLM 0.11.0's CPU offloading copies GPU->CPU on one stream and
CPU->GPU on another, `vllm/v1/kv_offload/worker/cpu_gpu.py:L57-59`), so transfers in one
direction run one after another and the two directions overlap (PCIe is full duplex).

Host links (GPU <-> CPU memory), per direction, nominal::

    PCIe 4.0 x16: 16 GT/s x 16 lanes x 128/130 / 8 = 31.5 GB/s
    PCIe 5.0 x16: 32 GT/s x 16 lanes x 128/130 / 8 = 63.0 GB/s

(PCI-SIG, PCI Express Base Specification 4.0 / 5.0: 16 and 32 GT/s per lane, 128b/130b
encoding.) A100 / L4 / L40S sit on PCIe 4.0 x16 (their datasheets: "PCIe Gen4 64GB/s", the
two directions summed); H100 / H200 / B200 / MI300X on PCIe 5.0 x16 ("PCIe Gen5 128GB/s").

Efficiency: kvsim assumes 80% of nominal for block copies between pinned host memory and HBM
(PCIe packet headers and flow control take part of the raw rate, and vLLM copies each layer's
block separately), and 10 us per transfer job for the launch and DMA setup. Both are
assumptions, not measurements of vLLM's copy kernels; give `Link(...)` measured figures where
they exist.

Worked example: one Llama-3.1-8B bf16 block of 16 tokens is 2,097,152 B
(`sim.memory.block_bytes`); 10 of them over PCIe 5.0 x16 at 80% take
10 us + 20,971,520 / (63.0e9 x 0.8) = 10 us + 416.1 us = 426.1 us.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Nominal GB/s per direction (see the module docstring for the arithmetic and sources).
PCIE_GEN4_X16_GBPS = 31.5
PCIE_GEN5_X16_GBPS = 63.0
#: Share of the nominal bandwidth a bulk pinned copy achieves (an assumption; see above).
DEFAULT_EFFICIENCY = 0.8
#: Per-transfer fixed cost (an assumption; see above).
DEFAULT_LATENCY_S = 10e-6

#: The host link of each catalog GPU (`sim/data/gpus.yaml` names).
HOST_LINK_GBPS: dict[str, float] = {
    "a100-40gb-sxm": PCIE_GEN4_X16_GBPS,
    "a100-80gb-sxm": PCIE_GEN4_X16_GBPS,
    "a100-80gb-pcie": PCIE_GEN4_X16_GBPS,
    "l4": PCIE_GEN4_X16_GBPS,
    "l40s": PCIE_GEN4_X16_GBPS,
    "h100-sxm": PCIE_GEN5_X16_GBPS,
    "h100-pcie": PCIE_GEN5_X16_GBPS,
    "h200": PCIE_GEN5_X16_GBPS,
    "b200": PCIE_GEN5_X16_GBPS,
    "mi300x": PCIE_GEN5_X16_GBPS,
}


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a link: nominal bandwidth (GB/s, 1e9 B/s), efficiency, latency."""

    name: str
    bandwidth_GBps: float
    efficiency: float = DEFAULT_EFFICIENCY
    latency_s: float = DEFAULT_LATENCY_S

    def __post_init__(self) -> None:
        if not self.bandwidth_GBps > 0:
            raise ValueError(f"link {self.name}: bandwidth_GBps must be > 0")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"link {self.name}: efficiency must be in (0, 1]")
        if not self.latency_s >= 0:
            raise ValueError(f"link {self.name}: latency_s must be >= 0")

    def transfer_s(self, num_bytes: int) -> float:
        """Seconds to move `num_bytes` (see the module docstring's worked example)."""
        return self.latency_s + num_bytes / (self.bandwidth_GBps * 1e9 * self.efficiency)


def host_link(gpu_name: str) -> Link:
    """The GPU's host (PCIe) link; PCIe 5.0 x16 for a GPU outside the table."""
    bandwidth = HOST_LINK_GBPS.get(gpu_name, PCIE_GEN5_X16_GBPS)
    generation = "pcie-gen4-x16" if bandwidth == PCIE_GEN4_X16_GBPS else "pcie-gen5-x16"
    return Link(generation, bandwidth)


class TransferQueue:
    """Transfers on one link direction, in submission order (one CUDA stream).

    Example (a link taking 1 s per job): jobs submitted at 0 s and 0.5 s end at 1 s and 2 s.
    """

    def __init__(self, link: Link) -> None:
        self.link = link
        self.busy_until_s = 0.0
        self.num_jobs = 0
        self.num_bytes = 0

    def submit(self, now_s: float, num_bytes: int) -> float:
        """Queue a transfer at `now_s`; returns its completion time."""
        start_s = max(now_s, self.busy_until_s)
        self.busy_until_s = start_s + self.link.transfer_s(num_bytes)
        self.num_jobs += 1
        self.num_bytes += num_bytes
        return self.busy_until_s
