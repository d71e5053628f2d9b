"""What every kvsim figure shares: the figure factory, the subject line, axis formats.

The subject line names the scenario, the design and the vLLM release the design models
(`sim.kv.Design.upstream`), so a plot read alone says what it shows.
"""

from __future__ import annotations

import re
import textwrap
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


def _given(value: Any) -> bool:
    return value is not None and value == value  # not None, not NaN


def subject_text(
    scenarios: Iterable[Any], designs: Iterable[Any], versions: Iterable[Any] | None = None
) -> str:
    """One title line: which scenario(s) and design(s), and what vLLM each design models.

    Example: (["azure"], ["v0-v2"]) -> "scenario azure | design v0-v2 = vLLM 0.5.4 v0,
    BlockSpaceManagerV2"; several designs are listed with "designs" and "; ". `versions`
    (parallel to `designs`: the release each row ran) names the release, not the family:
    (["chat"], ["v1-engine"], ["0.33.0"]) -> "... design v1-engine = vLLM 0.33.0 V1 engine".
    """
    names = sorted({str(s) for s in scenarios if _given(s)})
    designs = list(designs)
    releases = list(versions) if versions is not None else [None] * len(designs)
    pairs = sorted(
        {
            (str(d), str(v) if _given(v) else "")
            for d, v in zip(designs, releases, strict=True)
            if _given(d)
        }
    )
    parts = []
    if names:
        parts.append(("scenario " if len(names) == 1 else "scenarios ") + ", ".join(names))
    if pairs:
        parts.append(
            ("design " if len(pairs) == 1 else "designs ")
            + "; ".join(design_text(d, v or None) for d, v in pairs)
        )
    return " | ".join(parts)


def subject_of(subject: str | Mapping[str, Any] | None) -> str:
    """A subject given as text, or as a run's `inputs` (its "scenario" and "design")."""
    if subject is None:
        return ""
    if isinstance(subject, str):
        return subject
    # the pinned release that ran, not the family
    return subject_text(
        [subject.get("scenario")], [subject.get("design")], [subject.get("vllm_version")]
    )


def table_subject(table: pd.DataFrame) -> str:
    """The subject of a sweep or probes table, from its `scenario` and `design` columns and,
    where the table has it, the `vllm_version` each row ran (so a V1 plot names the release)."""
    designs = list(table.get("design", []))
    versions = list(table["vllm_version"]) if "vllm_version" in table else None
    return subject_text(table.get("scenario", []), designs, versions)


#: Characters of a "medium" (10 pt) title line per inch of figure width, with a margin.
_CHARS_PER_INCH = 11


def name_figure(fig: Figure, subject: str, note: str = "") -> None:
    """The subject (and a note) as the figure's title, wrapped to the figure's width: a
    suptitle is never wrapped by matplotlib, so a long one ran off both edges."""
    width = max(40, int(fig.get_figwidth() * _CHARS_PER_INCH))
    lines = [
        wrapped
        for line in (subject, note)
        if line
        for wrapped in textwrap.wrap(line, width, break_on_hyphens=False)
    ]
    if lines:
        fig.suptitle("\n".join(lines), fontsize="medium")


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
