"""What every kvsim figure shares: the figure factory, the subject line, axis formats.

The subject line names the scenario, the design and the vLLM release the design models
(`sim.kv.Design.upstream`), so a plot read alone says what it shows.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

from sim.kv.config import Design


def figure(nrows: int = 1, ncols: int = 1, width: float = 9.0, height: float = 3.2, **kw):
    fig = Figure(figsize=(width, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def design_text(design: str | None, vllm_version: str | None = None) -> str:
    """'v0-v2' -> 'v0-v2 = vLLM 0.5.4 v0, BlockSpaceManagerV2'; the V1 pin when given."""
    try:
        return f"{design} = {Design(design).upstream_at(vllm_version)}"
    except ValueError:
        return str(design)


def subject_text(scenarios: Iterable[Any], designs: Iterable[Any]) -> str:
    """One title line: which scenario(s) and design(s), and what vLLM each design models.

    Example: (["azure"], ["v0-v2"]) -> "scenario azure | design v0-v2 = vLLM 0.5.4 v0,
    BlockSpaceManagerV2"; several designs are listed with "designs" and "; ".
    """
    names = sorted({str(s) for s in scenarios if s is not None and s == s})
    kinds = sorted({str(d) for d in designs if d is not None and d == d})
    parts = []
    if names:
        parts.append(("scenario " if len(names) == 1 else "scenarios ") + ", ".join(names))
    if kinds:
        parts.append(
            ("design " if len(kinds) == 1 else "designs ") + "; ".join(map(design_text, kinds))
        )
    return " | ".join(parts)


def subject_of(subject: str | Mapping[str, Any] | None) -> str:
    """A subject given as text, or as a run's `inputs` (its "scenario" and "design")."""
    if subject is None:
        return ""
    if isinstance(subject, str):
        return subject
    text = subject_text([subject.get("scenario")], [subject.get("design")])
    design, version = subject.get("design"), subject.get("vllm_version")
    if version is not None and design is not None:  # name the pinned release, not the family
        text = text.replace(design_text(design), design_text(design, version))
    return text


def table_subject(table: pd.DataFrame) -> str:
    """The subject of a sweep or probes table, from its `scenario` and `design` columns."""
    return subject_text(
        table.get("scenario", []),
        table.get("design", []),
    )


def name_figure(fig: Figure, subject: str, note: str = "") -> None:
    text = "\n".join(t for t in (subject, note) if t)
    if text:
        fig.suptitle(text, fontsize="medium")


def short(text: str) -> str:
    """Dotted setting names without their section: 'workload.rate_scale=1' -> 'rate_scale=1'."""
    return re.sub(r"\b[A-Za-z_]\w*\.(?=[A-Za-z_])", "", text)


def seconds_text(value: float) -> str:
    return f"{value * 1e3:.3g} ms" if value < 1 else f"{value:.3g} s"


def readable_log_axis(ax) -> None:
    """A log y axis with plain ticks at 1, 2 and 5 per decade ("0.05", "2"), not 10^k powers."""
    ax.set_yscale("log")
    axis = ax.yaxis
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axis.set_minor_formatter(NullFormatter())


def axis_label(column: str) -> str:
    units = {"_req_per_s": " (requests/s)", "_tok_per_s": " (tokens/s)", "_s": " (s)"}
    for suffix, unit in units.items():
        if column.endswith(suffix):
            return column.removesuffix(suffix).replace("_", " ") + unit
    return column.replace("_", " ")
