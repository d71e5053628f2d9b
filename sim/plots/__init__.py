"""Plots: a DataFrame in, a matplotlib Figure out; `run` (one run), `planning` (sweeps and capacity),
`versions` (compare-versions), `common` (what every figure shares).

`sim.plots` is public: it re-exports the figures, e.g. ``sim.plots.kv_timeline(result.steps)``.
"""

from sim.plots.common import design_text, subject_text
from sim.plots.planning import capacity_band, capacity_frontier, throughput_latency
from sim.plots.run import (
    kv_timeline,
    latency_cdfs,
    queue_lengths,
    save_dir_plots,
    save_run_plots,
)

__all__ = [
    "capacity_band",
    "capacity_frontier",
    "design_text",
    "kv_timeline",
    "latency_cdfs",
    "queue_lengths",
    "save_dir_plots",
    "save_run_plots",
    "subject_text",
    "throughput_latency",
]
