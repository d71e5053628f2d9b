"""Refuse a block pool that cannot fit in this machine's memory, before building it.

kvsim's block managers hold one Python object per GPU block (and, for the v0 designs, per CPU
block), as vLLM's do. `cache.num_gpu_blocks: 400000000` would take ~96 GB as v0-v2 objects:
the kernel kills the process after it has eaten all memory, with no message. So the pool is
estimated first and refused with one line when it exceeds half the memory available (the
other half is for the requests, the records and the result tables).

Bytes per block: the peak Python heap of building a 200,000-block pool (tracemalloc),
rounded up, largest over prefix caching on/off and GPU/CPU pools
(`python benchmarks/block_object_bytes.py`: v0-v1 201, v0-v2 236, v0-fixed 236, v1-engine
370 B; v0-v1 with prefix caching makes its blocks as they are first used, so its pool grows
to the same size during a run). Example: v0-v2, 400,000,000 GPU + 0 CPU blocks -> 400e6 x 240 B = 96 GB; with
22 GB available the limit is 11 GB, so the scenario is refused.

Available memory: the smallest of MemAvailable (/proc/meminfo) and the cgroup limit minus
its usage (/sys/fs/cgroup), else free pages from `os.sysconf`; when none can be read, a
fixed 8 GiB is assumed (and the message says so).
"""

from __future__ import annotations

import gc
import os
import tracemalloc
from pathlib import Path

from sim.kv.config import Design, KVCacheConfig, make_manager

#: Peak bytes of Python heap per block object while a pool is built (see the docstring).
BYTES_PER_BLOCK = {
    Design.V0_V1: 210,
    Design.V0_V2: 240,
    Design.V0_FIXED: 240,
    Design.V1_ENGINE: 380,
}
#: Bytes per replica besides its blocks (scheduler, queues, router view, audit): an engine of
#: 3,000 replicas of 17 blocks each peaked at 7.3 kB (v1-engine) and 8.4 kB (v0-v2) per
#: replica, blocks included (tracemalloc); rounded up. `engine.num_replicas: 100000` of
#: derived pools would otherwise pass a check made for one replica and then eat all memory.
REPLICA_BYTES = 8 << 10
#: The share of available memory the block objects may take.
POOL_SHARE = 0.5
#: Assumed available memory where the system tells nothing.
FALLBACK_BYTES = 8 << 30


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: str) -> int | None:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _cgroup_headroom() -> int | None:
    """The cgroup's memory limit minus its usage (v2, then v1), or None without a limit."""
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        (
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/memory/memory.usage_in_bytes",
        ),
    ):
        limit = _read_int(limit_file)
        if limit is not None and limit < 1 << 60:  # v1 writes "no limit" as ~2^63
            return max(0, limit - (_read_int(usage_file) or 0))
    return None


def _sysconf_available() -> int | None:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def available_memory() -> tuple[int, str]:
    """(bytes available to this process, where the figure comes from)."""
    found = [
        (value, source)
        for value, source in (
            (_meminfo_available(), "MemAvailable"),
            (_cgroup_headroom(), "the cgroup limit"),
        )
        if value is not None
    ]
    if found:
        return min(found)
    free = _sysconf_available()
    if free is not None:
        return free, "free pages"
    return FALLBACK_BYTES, "an assumed 8 GiB (this system reports no free memory)"


def check_pool_fits(
    design: Design, num_gpu_blocks: int, num_cpu_blocks: int, num_replicas: int = 1
) -> str | None:
    """None when `num_replicas` replicas' pools fit, else the one-line reason they do not.

    >>> check_pool_fits(Design.V0_V2, 1000, 0) is None
    True
    >>> check_pool_fits(Design.V0_V2, 100_000, 0, num_replicas=100_000) is None
    False
    """
    num_blocks = num_gpu_blocks + (num_cpu_blocks if design.api == "v0" else 0)
    per_block = BYTES_PER_BLOCK[design]
    # One replica's own objects are within the other half of memory (as before replicas were
    # counted: a one-replica estimate is unchanged); each further replica adds its own.
    need = num_replicas * num_blocks * per_block + (num_replicas - 1) * REPLICA_BYTES
    have, source = available_memory()
    if need <= POOL_SHARE * have:
        return None
    pools = f"{num_gpu_blocks} GPU" + (
        f" + {num_cpu_blocks} CPU blocks" if design.api == "v0" else " blocks"
    )
    replicas = f"{num_replicas} replicas of " if num_replicas > 1 else ""
    return (
        f"{replicas}{pools} need about {need / 1e9:.3g} GB as {design.value} block objects "
        f"({per_block} B each), more than half of the {have / 1e9:.3g} GB this machine has "
        f"available ({source}); lower "
        + ("the replicas or " if num_replicas > 1 else "")
        + "cache.num_gpu_blocks"
        + (" or cache.num_cpu_blocks / swap_space_gib" if design.api == "v0" else "")
    )


def peak_bytes_per_block(
    design: Design, num_blocks: int, prefix_caching: bool, cpu: bool = False
) -> float:
    """Peak heap growth of building the pool, divided by its number of blocks."""
    config = KVCacheConfig(
        num_gpu_blocks=1 if cpu else num_blocks,
        num_cpu_blocks=num_blocks if cpu else 0,
        enable_prefix_caching=prefix_caching,
    )
    make_manager(design, KVCacheConfig(num_gpu_blocks=1))  # imports: not the pool's cost
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        manager = make_manager(design, config)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    del manager
    return (peak - base) / num_blocks


__all__ = [
    "BYTES_PER_BLOCK",
    "REPLICA_BYTES",
    "available_memory",
    "check_pool_fits",
    "peak_bytes_per_block",
]
