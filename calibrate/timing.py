"""Timing with measurement hygiene: warm-up, synchronisation, raw samples, peak memory.

On CUDA each repeat is bracketed by CUDA events (device time, no host jitter), all enqueued
behind a short GPU sleep so the host runs ahead and no event pair times a kernel launch, and the
device is synchronised before reading them; on CPU `time.perf_counter` brackets each call. The median is
the statistic we fit; the raw samples are kept. Caches are not flushed between repeats, so
repeated reads of the same small KV may hit L2: grids keep cases larger than L2 where it matters.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Timing:
    samples_s: list[float]
    median_s: float
    peak_memory_bytes: int | None  # CUDA only: max_memory_allocated during the repeats


def time_runner(
    run: Callable[[], object], *, device: str, warmup: int = 3, repeats: int = 20
) -> Timing:
    """Warm up, then time `repeats` calls individually. Example: repeats=20 -> 20 samples."""
    if repeats <= 0 or warmup < 0:
        raise ValueError("repeats must be positive and warmup non-negative")
    t0 = time.perf_counter()
    for _ in range(warmup):
        run()
    host_s = (time.perf_counter() - t0) / max(warmup, 1)  # an upper bound on one enqueue
    samples: list[float] = []
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        # Hold the GPU while the host enqueues every repeat. Without it a kernel shorter than
        # its own launch leaves the GPU idle between the start event and the kernel, and the
        # event pair times the host: on an H200 a 33 MB GEMM read 42 us, launch-bound, where
        # HBM alone takes ~8 us (run1.json in sim/data/calibrations/h200-llama-3.1-8b-bf16).
        # vLLM replays decode steps as CUDA graphs, so the kernels' own time is what to fit.
        torch.cuda._sleep(hold_cycles(host_s, repeats))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(repeats)]
        for start, end in zip(starts, ends, strict=True):
            start.record()
            run()
            end.record()
        torch.cuda.synchronize()
        samples = [s.elapsed_time(e) * 1e-3 for s, e in zip(starts, ends, strict=True)]
        peak = int(torch.cuda.max_memory_allocated())
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            run()
            samples.append(time.perf_counter() - t0)
        peak = None
    # A timer of coarse resolution can return 0 for a tiny kernel; floor at 1 ns.
    samples = [max(s, 1e-9) for s in samples]
    return Timing(samples, statistics.median(samples), peak)


#: `RunMetadata.timing` of a CUDA profile timed behind the hold below.
RUN_AHEAD = "run-ahead"
#: Cycles per second assumed when converting a hold to `torch.cuda._sleep` cycles: an H100 or
#: H200 boosts to 1.98 GHz; a lower clock only lengthens the hold, which is harmless.
HOLD_CLOCK_HZ = 2.0e9
#: The hold's floor and ceiling, in seconds.
HOLD_MIN_S, HOLD_MAX_S = 1e-3, 0.2


def hold_cycles(host_s: float, repeats: int) -> int:
    """`torch.cuda._sleep` cycles that outlast the host enqueueing `repeats` calls, twice over.

    Example: 20 repeats of a call whose warm-up took 150 us each hold 2 x 20 x 150 us = 6 ms,
    1.2e7 cycles at 2 GHz; a 10 us call holds the 1 ms floor (2e6 cycles).
    """
    hold_s = min(max(2.0 * repeats * host_s, HOLD_MIN_S), HOLD_MAX_S)
    return int(hold_s * HOLD_CLOCK_HZ)


def run_metadata(device: str, dtype: str) -> dict[str, object]:
    """Device and software facts stored with every run."""
    import sim

    meta: dict[str, object] = {
        "device": device,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "dtype": dtype,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "num_threads": torch.get_num_threads(),
        "kvsim_version": sim.__version__,
    }
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        meta["device_name"] = props.name
        meta["cuda"] = torch.version.cuda
        meta["driver"] = _nvidia_driver()
        meta["timing"] = RUN_AHEAD
    else:
        meta["device_name"] = platform.processor() or platform.machine() or "cpu"
        meta["num_threads"] = torch.get_num_threads()
    return meta


def _nvidia_driver() -> str | None:
    """The driver version from /proc (no subprocess); None where it is not exposed."""
    path = "/proc/driver/nvidia/version"
    if not os.path.exists(path):
        return None
    with open(path) as fh:
        first = fh.readline()
    parts = [p for p in first.split() if p[:1].isdigit() and "." in p]
    return parts[0] if parts else first.strip()


def probe_ceilings(
    device: str, dtype: torch.dtype, *, size_bytes: int, matmul_n: int
) -> tuple[float, float]:
    """Measured copy bandwidth (read + write bytes / s) and large-matmul FLOP/s."""
    n = size_bytes // 4
    src = torch.ones(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    t = time_runner(lambda: dst.copy_(src), device=device, warmup=2, repeats=10)
    bandwidth = 2 * size_bytes / t.median_s
    a = torch.randn(matmul_n, matmul_n, device=device).to(dtype)
    b = torch.randn(matmul_n, matmul_n, device=device).to(dtype)
    t = time_runner(lambda: a @ b, device=device, warmup=2, repeats=10)
    return bandwidth, 2.0 * matmul_n**3 / t.median_s
