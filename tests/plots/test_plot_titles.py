"""Planner plot titles fit the figure and name the vLLM release that ran (issue 20, section 8)."""

from __future__ import annotations

import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg

from sim.plots.common import name_figure, subject_of, table_subject
from sim.plots.planning import throughput_latency


def _sweep_table() -> pd.DataFrame:
    rows = []
    for version in ("0.11.0", "0.33.0"):
        for seqs, tput in ((32, 700.0), (64, 720.0)):
            rows.append(
                {
                    "scheduler.max_num_seqs": seqs,
                    "scheduler.vllm_version": version,
                    "throughput_tok_per_s": tput,
                    "ttft_p99_s": 0.1,
                    "scenario": "sessions-chat-v1-engine-with-a-long-name",
                    "design": "v1-engine",
                    "vllm_version": version,
                    "error": None,
                }
            )
    return pd.DataFrame(rows)


def _title_inside(fig) -> bool:
    renderer = FigureCanvasAgg(fig).get_renderer()
    fig.draw(renderer)
    box = fig._suptitle.get_window_extent(renderer)
    return box.x0 >= 0 and box.x1 <= fig.bbox.width


def test_the_sweep_title_is_not_clipped():
    """Regression: the subject line of a V1 sweep (~150 characters) ran off both edges."""
    fig = throughput_latency(_sweep_table())
    assert _title_inside(fig), fig.get_suptitle()


def test_a_long_title_wraps_and_a_short_one_is_as_it_was():
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3))
    name_figure(fig, "word " * 60, "a note")
    assert fig.get_suptitle().count("\n") >= 3
    assert _title_inside(fig)
    short = Figure(figsize=(9, 3))
    subject = "scenario s | design v0-v2 = vLLM 0.5.4 v0, BlockSpaceManagerV2"
    name_figure(short, subject)
    assert short.get_suptitle() == subject


def test_v1_sweep_and_run_plots_name_the_release_that_ran():
    """Regression: a V1 sweep's title said "vLLM V1 engine (4ac7713, 0.11.0 or 0.33.0 by
    scheduler.vllm_version)", not which one ran."""
    text = table_subject(_sweep_table())
    assert "v1-engine = vLLM 0.11.0 V1 engine; v1-engine = vLLM 0.33.0 V1 engine" in text
    assert "by scheduler.vllm_version" not in text
    one = subject_of({"scenario": "s", "design": "v1-engine", "vllm_version": "0.33.0"})
    assert one == "scenario s | design v1-engine = vLLM 0.33.0 V1 engine"
    pinned = subject_of({"scenario": "s", "design": "v1-engine", "vllm_version": "4ac7713"})
    assert pinned.endswith("vLLM ~0.10 V1 engine @ 4ac7713")
    # A table without the column (an old sweep) keeps the family's words.
    old = table_subject(_sweep_table().drop(columns="vllm_version"))
    assert "by scheduler.vllm_version" in old
