"""Which all-reduce vLLM runs for a message, and what it costs.

vLLM does not send every tensor-parallel all-reduce through NCCL. Its CUDA communicator tries a
chain of backends and takes the first that accepts the message (by size, TP size, GPU
generation and interconnect); NCCL (pynccl) is the last resort. This module mirrors that chain
for the releases kvsim pins and charges each backend latency + bytes / bandwidth.

The dispatch, 0.11.0 (`vllm/distributed/device_communicators/`):

- `cuda_communicator.py` L121-159 `all_reduce`: NCCL symmetric memory (off: `VLLM_USE_NCCL_SYMM_MEM`
  defaults to 0, `envs.py` L1470-1471), quick reduce (ROCm only), custom all-reduce
  (`should_custom_ar`), torch symmetric memory (`should_use_symm_mem`), then pynccl;
- `custom_all_reduce.py` L51 supported world sizes (2, 4, 6, 8); L57 `max_size` 8 MiB, lowered to
  `CUSTOM_ALL_REDUCE_MAX_SIZES[capability][tp]` where symmetric memory is on (L113-119); L141-148
  off above 2 GPUs unless fully NVLink-connected; L153-160 off without P2P; L221-234 used for
  `bytes < max_size` at TP 2 or fully connected;
- `all_reduce_utils.py` L30-58 the two size tables (SM 9.0 and 10.0);
- `symm_mem.py` L56-95: on for SM 9.0 / 10.0 at TP 2, 4, 6, 8 where the GPUs share NVSwitch
  multicast (`multicast_ptr == 0` turns it off), used below `SYMM_MEM_ALL_REDUCE_MAX_SIZES`
  (L96-104); `VLLM_ALLREDUCE_USE_SYMM_MEM` defaults to 1 (`envs.py` L1410-1411).

0.33.0 adds FlashInfer's all-reduce first in the chain (`cuda_communicator.py` L362-432;
`VLLM_ALLREDUCE_USE_FLASHINFER` defaults to 1, `envs.py` L1961-1962, and flashinfer-python is a
dependency of the wheel): `flashinfer_all_reduce.py` L393-448 turns it on where
`FI_ALLREDUCE_FUSION_MAX_SIZE_MB` has the GPU's capability and TP size
(`compilation/passes/fusion/allreduce_rms_fusion.py` L104-127) and L468-497 takes messages up to
that size (inclusive). Custom all-reduce's size table adds SM 10.3 / 10.7 (`all_reduce_utils.py`
L31-83); it starts at TP 16 (`custom_all_reduce.py` L118) but `should_custom_ar` refuses world
sizes above 8 (L497), so the TP sizes it serves are still 2, 4, 6, 8.

Inside custom all-reduce the kernel is one-shot (each rank reads every peer's buffer and reduces)
at TP 2 and, fully NVLink-connected, below 512 KiB at TP <= 4 or 256 KiB at TP <= 8; two-shot
(reduce-scatter then all-gather) above (`csrc/custom_all_reduce.cuh`, `CustomAllreduce::allreduce`,
`REDUCE_CASE`; the same rule at vllm-project/vllm@036bb68 and @c9eabec; the wheels ship it
compiled, so the releases' own copies were not read).

Costs (seconds; `AllReduceCost`):

- custom one-shot: latency + (tp - 1) * bytes / peer_read_bw; custom two-shot:
  latency + 2 (tp - 1) / tp * bytes / peer_read_bw. Both FITTED (least squares) on vLLM's own
  CUDA-graph benchmark of H100 SXM (`benchmarks/kernels/benchmark_device_communicators.py`),
  posted in vllm-project/vllm PR #24111 (https://github.com/vllm-project/vllm/pull/24111,
  2025-09-02; no licence stated, numbers only): the `ca_1stage` and `ca_2stage` columns at TP 4
  and 6, 0.5-4 MB (`ONE_SHOT_POINTS`, `TWO_SHOT_POINTS`). The TP 2 row (one-shot, 0.5 MB,
  7 us) is held out (benchmarks/allreduce_accuracy.py). On another GPU the bandwidth scales by
  its datasheet interconnect against the H100's 900 GB/s and the latency is kept (no public
  small-message custom all-reduce table of A100 under CUDA graphs was found).
- FlashInfer: charged as custom one-shot (an ASSUMPTION: its kernel is also a one-shot push over
  peer memory; no public per-size table of the standalone FlashInfer all-reduce on Hopper was
  found).
- torch symmetric memory: charged the NCCL fit (an upper bound: its size caps were set where it
  stops beating pynccl, vllm-project/vllm PRs #20759 and #37756), so sizes where it runs are not
  made faster than before.
- NCCL: the existing fit on Vidur's profiles (`sim/data/steptime_coefficients.json`).
- no P2P: NCCL through host memory (`sim.latency.interconnect`).

Worked example: Llama-3.1-8B (hidden 4,096) decoding one token on two H100 SXM under 0.11.0
all-reduces 4,096 x 2 B = 8 KiB, below custom all-reduce's 8 MiB cap, so one-shot (fitted
4.54 us latency, 331 GB/s peer reads): 4.54 us + 1 x 8,192 B / 331 GB/s = 4.56 us, where NCCL's
fit charged 16.24 us + 8,192 B / 280.5 GB/s = 16.27 us; over 64 all-reduces per step that is
0.29 ms instead of 1.04 ms. (Two-shot: 12.6 us latency, 249 GB/s.)

The other V1 pins (0.19.1, 0.20.0, 0.25.1, 0.26.0) follow 0.11.0's chain (`CHAINS`).

Leaves out: NCCL symmetric memory and MSCCL++ (off by default), ROCm's quick reduce and AITER
(MI300X keeps the NCCL fit), the all-reduce + RMSNorm fusion pass, the v0 pin 0.5.4 and the
commit pin 4ac7713 (they keep the NCCL fit), FlashInfer's own one-shot / two-shot switch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

KiB = 1024
MiB = 1024 * KiB


class Algorithm(enum.Enum):
    """The backend vLLM's communicator picks for one all-reduce."""

    CUSTOM_ONE_SHOT = "custom_one_shot"
    CUSTOM_TWO_SHOT = "custom_two_shot"
    FLASHINFER = "flashinfer"
    TORCH_SYMM_MEM = "torch_symm_mem"
    NCCL = "nccl"
    HOST_STAGED = "host_staged"


#: The pins whose dispatch is mirrored, by the chain they follow; any other keeps NCCL for every
#: message. 0.19.1, 0.20.0, 0.25.1 and 0.26.0 ship FlashInfer's all-reduce but off by default
#: (`VLLM_ALLREDUCE_USE_FLASHINFER` "0": envs.py L1483-1484, L1553-1554, L1712-1713, L1757-1758)
#: and otherwise 0.11.0's chain for the catalog's GPUs (custom below the same caps, world sizes
#: 2-8, then symmetric memory, then pynccl: cuda_communicator.py `all_reduce` L180, L174, L273,
#: L273; their size tables add only SM 10.3, which no catalog GPU has).
class Chain(enum.Enum):
    """The order a release's communicator tries its backends in (module docstring)."""

    #: 0.11.0: custom all-reduce, torch symmetric memory, pynccl
    CUSTOM_FIRST = "custom-first"
    #: 0.33.0: FlashInfer's all-reduce, then 0.11.0's chain (with 0.33.0's size tables)
    FLASHINFER_FIRST = "flashinfer-first"


CHAINS = {
    "0.11.0": Chain.CUSTOM_FIRST,
    "0.19.1": Chain.CUSTOM_FIRST,
    "0.20.0": Chain.CUSTOM_FIRST,
    "0.25.1": Chain.CUSTOM_FIRST,
    "0.26.0": Chain.CUSTOM_FIRST,
    "0.33.0": Chain.FLASHINFER_FIRST,
}
RELEASES = tuple(CHAINS)

#: CUDA compute capability and full NVLink (NVSwitch) connectivity of the catalog's GPUs
#: (sim/data/gpus.yaml). PCIe cards (and NVLink-bridged pairs) are not fully connected.
GPU_LINKS: dict[str, tuple[str, bool]] = {
    "a100-40gb-sxm": ("8.0", True),
    "a100-80gb-sxm": ("8.0", True),
    "a100-80gb-pcie": ("8.0", False),
    "h100-sxm": ("9.0", True),
    "h100-pcie": ("9.0", False),
    "h200": ("9.0", True),
    "l4": ("8.9", False),
    "l40s": ("8.9", False),
    "b200": ("10.0", True),
}

#: `CUSTOM_ALL_REDUCE_MAX_SIZES` (0.11.0 all_reduce_utils.py L30-43; 0.33.0 L31-56).
_CUSTOM_MAX_0_11 = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: MiB // 2, 8: MiB // 4},
    "10.0": {2: 2 * MiB, 4: 2 * MiB, 6: 1 * MiB, 8: 1 * MiB},
}
_CUSTOM_MAX_0_33 = _CUSTOM_MAX_0_11 | {
    "10.3": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
    "10.7": {2: 4 * MiB, 4: 4 * MiB, 6: 8 * MiB, 8: 4 * MiB},
}
#: `SYMM_MEM_ALL_REDUCE_MAX_SIZES` (0.11.0 L45-58; 0.33.0 L58-83; only 9.0 and 10.0 matter here).
_SYMM_MAX = {
    "9.0": {2: 64 * MiB, 4: 32 * MiB, 6: 64 * MiB, 8: 64 * MiB},
    "10.0": {2: 8 * MiB, 4: 32 * MiB, 6: 128 * MiB, 8: 128 * MiB},
}
#: `FI_ALLREDUCE_FUSION_MAX_SIZE_MB` (0.33.0 allreduce_rms_fusion.py L104-127), bytes.
_FLASHINFER_MAX_0_33 = {
    "9.0": {2: 64 * MiB, 4: 2 * MiB, 8: MiB // 2},
    "10.0": {2: 64 * MiB, 4: 32 * MiB, 8: 1 * MiB, 16: 64 * MiB},
}
#: custom_all_reduce.py L57: the buffer every rank registers (8 MiB).
CUSTOM_BUFFER_BYTES = 8 * MiB
#: World sizes custom all-reduce serves (0.11.0 L51; 0.33.0 L118 with L497's `world_size > 8`).
CUSTOM_TP = (2, 4, 6, 8)


@dataclass(frozen=True, slots=True)
class Link:
    """What the dispatch needs of the GPUs: capability ("9.0"; None off CUDA or unknown),
    whether all GPUs share NVLink (NVSwitch), and whether they reach each other's memory."""

    capability: str | None
    full_nvlink: bool
    p2p: bool = True

    @classmethod
    def of(cls, gpu_name: str, *, p2p: bool = True) -> Link:
        """The catalog GPU's link; a GPU outside `GPU_LINKS` gets none (NCCL only)."""
        capability, nvlink = GPU_LINKS.get(gpu_name, (None, False))
        return cls(capability, nvlink, p2p)


def custom_kernel(nbytes: int, tp: int, full_nvlink: bool) -> Algorithm:
    """One-shot or two-shot inside custom all-reduce (`REDUCE_CASE`, module docstring).

    Example: 1 MiB at TP 4 on NVLink -> two-shot; 256 KiB -> one-shot; any size at TP 2 -> one-shot.
    """
    if tp == 2 or not full_nvlink:
        return Algorithm.CUSTOM_ONE_SHOT
    if (tp <= 4 and nbytes < 512 * KiB) or (tp <= 8 and nbytes < 256 * KiB):
        return Algorithm.CUSTOM_ONE_SHOT
    return Algorithm.CUSTOM_TWO_SHOT


def _symm_mem_max(link: Link, tp: int) -> int | None:
    """Torch symmetric memory's cap, or None where it is off (symm_mem.py L56-95)."""
    if not link.full_nvlink or link.capability is None:
        return None
    return _SYMM_MAX.get(link.capability, {}).get(tp)


def _custom_max(link: Link, tp: int, chain: Chain) -> int | None:
    """Custom all-reduce's cap, or None where it is off (custom_all_reduce.py, docstring)."""
    if link.capability is None or tp not in CUSTOM_TP:
        return None
    if tp > 2 and not link.full_nvlink:
        return None
    table = _CUSTOM_MAX_0_33 if chain is Chain.FLASHINFER_FIRST else _CUSTOM_MAX_0_11
    cap = table.get(link.capability, {}).get(tp)
    if _symm_mem_max(link, tp) is not None and cap is not None:
        return min(cap, CUSTOM_BUFFER_BYTES)
    return CUSTOM_BUFFER_BYTES


def algorithm(nbytes: int, tp: int, link: Link, release: str | None) -> Algorithm:
    """The backend `CudaCommunicator.all_reduce` of `release` runs for `nbytes` at `tp`.

    Example (H100 SXM, TP 4): 16 KiB -> custom one-shot in 0.11.0, FlashInfer in 0.33.0;
    16 MiB -> torch symmetric memory in both; 64 MiB -> NCCL.
    """
    if tp < 2:
        raise ValueError(f"an all-reduce needs tp >= 2, got {tp}")
    if not link.p2p:
        return Algorithm.HOST_STAGED  # every peer-memory backend is off (interconnect.py)
    chain = CHAINS.get(release or "")
    if chain is None or link.capability is None:
        return Algorithm.NCCL
    if chain is Chain.FLASHINFER_FIRST:
        fi_cap = _FLASHINFER_MAX_0_33.get(link.capability, {}).get(tp)
        if fi_cap is not None and nbytes <= fi_cap:
            return Algorithm.FLASHINFER
    custom_cap = _custom_max(link, tp, chain)
    if custom_cap is not None and nbytes < custom_cap:
        return custom_kernel(nbytes, tp, link.full_nvlink)
    symm_cap = _symm_mem_max(link, tp)
    if symm_cap is not None and nbytes < symm_cap:
        return Algorithm.TORCH_SYMM_MEM
    return Algorithm.NCCL


# -- costs --------------------------------------------------------------------------------------
#: PR #24111's H100 SXM table (ms per all-reduce, CUDA graphs, bf16, hidden 8192): (tp, MB, ms)
#: of the `ca_1stage` and `ca_2stage` columns; MB there is MiB (32 x 8192 x 2 B = 0.50 MB).
ONE_SHOT_POINTS = (
    *((4, mb, ms) for mb, ms in ((0.5, 0.010), (1, 0.015), (1.5, 0.019), (2, 0.022), (3, 0.030))),
    (4, 4.0, 0.038),
    *((6, mb, ms) for mb, ms in ((0.5, 0.013), (1, 0.021), (1.5, 0.030), (2, 0.038), (3, 0.053))),
    (6, 4.0, 0.070),
)
TWO_SHOT_POINTS = (
    *((4, mb, ms) for mb, ms in ((0.5, 0.017), (1, 0.018), (1.5, 0.027), (2, 0.027), (3, 0.035))),
    (4, 4.0, 0.043),
    *((6, mb, ms) for mb, ms in ((0.5, 0.015), (1, 0.017), (1.5, 0.020), (2, 0.026), (3, 0.029))),
    (6, 4.0, 0.037),
)
#: The H100 SXM's datasheet NVLink (bidirectional, GB/s) the costs were measured on.
MEASURED_INTERCONNECT_GBPS = 900.0


def _traffic(kind: Algorithm, tp: int) -> float:
    """Bytes each rank reads from peers per message byte: one-shot (tp - 1), two-shot
    2 (tp - 1) / tp (a reduce-scatter and an all-gather of 1/tp each)."""
    return float(tp - 1) if kind is Algorithm.CUSTOM_ONE_SHOT else 2.0 * (tp - 1) / tp


def fit_peer_cost(
    points: tuple[tuple[int, float, float], ...], kind: Algorithm
) -> tuple[float, float]:
    """(latency_s, peer_read_GBps) by least squares of time on traffic x bytes.

    Example: ONE_SHOT_POINTS -> (4.54e-06, 331): the measured 10 us at TP 4 and 0.5 MiB is
    predicted as 4.54 us + 3 x 524,288 B / 331 GB/s = 9.30 us.
    """
    xs = [_traffic(kind, tp) * mb * MiB for tp, mb, _ in points]
    ys = [ms * 1e-3 for _, _, ms in points]
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / sxx
    return mean_y - slope * mean_x, 1.0 / slope / 1e9


ONE_SHOT_LATENCY_S, ONE_SHOT_PEER_GBPS = fit_peer_cost(ONE_SHOT_POINTS, Algorithm.CUSTOM_ONE_SHOT)
TWO_SHOT_LATENCY_S, TWO_SHOT_PEER_GBPS = fit_peer_cost(TWO_SHOT_POINTS, Algorithm.CUSTOM_TWO_SHOT)


@dataclass(frozen=True, slots=True)
class AllReduceCost:
    """Charges one all-reduce of a message by the backend `algorithm` picks.

    `nccl` and `host_staged` are `measured_terms.allreduce_time_s` coefficients (latency_s,
    algbw_GBps); `interconnect_GBps` scales the custom kernels' bandwidth.
    """

    tp: int
    link: Link
    release: str | None
    nccl: dict[str, float]
    host_staged: dict[str, float]
    interconnect_GBps: float

    def time_s(self, nbytes: float) -> float:
        """Seconds of one all-reduce of `nbytes` (module docstring: worked example)."""
        return self.time_and_algorithm(nbytes)[0]

    def time_and_algorithm(self, nbytes: float) -> tuple[float, Algorithm]:
        """(seconds, backend) of one all-reduce of `nbytes`."""
        kind = algorithm(int(nbytes), self.tp, self.link, self.release)
        return self.kernel_time_s(kind, nbytes), kind

    def kernel_time_s(self, kind: Algorithm, nbytes: float) -> float:
        """Seconds `kind` takes for `nbytes`, whichever backend vLLM would pick.

        Example (H100, TP 4): custom one-shot at 1 MiB = 4.54 us + 3 x 1,048,576 B / 331 GB/s
        = 14.06 us; two-shot = 12.58 us + 1.5 x 1,048,576 B / 249 GB/s = 18.90 us.
        """
        if kind in (Algorithm.CUSTOM_ONE_SHOT, Algorithm.FLASHINFER):
            latency, peer = ONE_SHOT_LATENCY_S, ONE_SHOT_PEER_GBPS
            traffic = _traffic(Algorithm.CUSTOM_ONE_SHOT, self.tp)
        elif kind is Algorithm.CUSTOM_TWO_SHOT:
            latency, peer = TWO_SHOT_LATENCY_S, TWO_SHOT_PEER_GBPS
            traffic = _traffic(kind, self.tp)
        else:
            c = self.host_staged if kind is Algorithm.HOST_STAGED else self.nccl
            return c["latency_s"] + nbytes / (c["algbw_GBps"] * 1e9)
        scale = self.interconnect_GBps / MEASURED_INTERCONNECT_GBPS
        return latency + traffic * nbytes / (peer * scale * 1e9)
