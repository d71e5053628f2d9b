"""Workloads: trace loaders (canonical, Azure 2023, Mooncake, Vidur/Sarathi, lengths), seeded
synthetic arrivals and lengths, windowing and time scaling, all producing `RequestSpec`s.

Bad input raises `WorkloadError` (a `ValueError`) whose message is one line naming the file,
the line and the column.
"""

from sim.workload.config import (
    ArrivalConfig,
    InlineRequest,
    LengthDist,
    LengthsConfig,
    WorkloadConfig,
)
from sim.workload.errors import WorkloadError
from sim.workload.load import load_workload
from sim.workload.loaders import (
    LengthSamples,
    detect_format,
    load_azure,
    load_canonical,
    load_lengths,
    load_mooncake,
    load_trace,
    load_vidur,
)
from sim.workload.request import RequestSpec, Workload
from sim.workload.transform import first_n, scale_time, time_window

__all__ = [
    "ArrivalConfig",
    "InlineRequest",
    "LengthDist",
    "LengthSamples",
    "LengthsConfig",
    "RequestSpec",
    "Workload",
    "WorkloadConfig",
    "WorkloadError",
    "detect_format",
    "first_n",
    "load_azure",
    "load_canonical",
    "load_lengths",
    "load_mooncake",
    "load_trace",
    "load_vidur",
    "load_workload",
    "scale_time",
    "time_window",
]
