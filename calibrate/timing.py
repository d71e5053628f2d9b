"""Timing with measurement hygiene: warm-up, synchronisation, raw samples, peak memory.

On CUDA each repeat is bracketed by CUDA events (device time, no host jitter) and the device is
synchronised before reading them; on CPU `time.perf_counter` brackets each call. The median is
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
    for _ in range(warmup):
        run()
    samples: list[float] = []
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
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
