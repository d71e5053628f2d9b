"""What `kvsim run` shows on the terminal: a late progress bar, the summary table, the first
violations and the commands to run next.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from sim.cli.exits import console, err_console


class LazyProgress:
    """A progress bar that appears only once a run has taken more than `delay_s` seconds."""

    def __init__(self, description: str, enabled: bool = True, delay_s: float = 1.5) -> None:
        self.description = description
        self.enabled = enabled and sys.stderr.isatty()
        self.delay_s = delay_s
        self.start = time.perf_counter()
        self._progress: Any = None  # a rich Progress, made on first need
        self._task: Any = None

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._progress is None:
            if time.perf_counter() - self.start < self.delay_s:
                return
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self._progress = Progress(
                "[progress.description]{task.description}",
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=err_console,
                transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=total)
        self._progress.update(self._task, completed=done, total=total)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        return f"{value:.4g}"
    return str(value)


def _kv_group_rows(groups: list[dict] | None) -> list[tuple[str, str]]:
    """One row per hybrid KV-cache group: "sliding 4096, 21 layers, peak 375 blocks"
    ("chunked 8192, peak 12 blocks" for a group given in `cache.kv_cache_groups`: no layer
    count)."""
    rows = []
    for group in groups or []:
        window, chunk = group["sliding_window"], group.get("attention_chunk_size")
        kind = "full" if window is None else f"sliding {window}"
        if chunk is not None:
            kind = f"chunked {chunk}"
        if group.get("mamba"):
            kind = "mamba"
        if group.get("sink_len") is not None:
            kind = f"sink {group['sink_len']}"
        if group.get("rswa_window") is not None:
            kind = f"rswa {group['rswa_window']}"
        if group.get("circular_buffer"):
            kind = "circular buffer"
        peak = group.get("peak_blocks")
        text = kind
        if "num_layers" in group:
            text += f", {group['num_layers']} layers"
        if peak is not None:
            text += f", peak {peak} blocks"
        rows.append((f"  KV group {group['group_id']}", text))
    return rows


def _admission_reserve_rows(reserve: dict | None) -> list[tuple[str, str]]:
    """The full-sequence gate's per-request charge a request never holds, where there is one
    (`sim.planning.admission_reserve`, vllm #54703)."""
    if not reserve:
        return []
    tokens, charged = reserve["request_tokens"], reserve["charged_blocks"]
    share = reserve["reserved_share"]
    return [
        (
            "admission reserve",
            f"{charged - reserve['resident_blocks']} of {charged} blocks per {tokens}-token "
            f"request never held ({share:.1%})",
        ),
        (
            "  at once (gate / pooled)",
            f"{reserve['gate_concurrency']} / {reserve['pooled_concurrency']} requests",
        ),
    ]


def print_summary(name: str, summary: dict, inputs: dict, out_dir: Path | None) -> None:
    table = Table(title=f"kvsim run: {name}", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    states = summary["states"]
    rows = [
        ("design", _design_row(inputs.get("design"), inputs.get("vllm_version"))),
        ("block manager", _manager_row(inputs.get("block_manager"))),
        ("step time", _step_time_row(inputs.get("step_time"), summary.get("step_time_band"))),
        *_settings_rows(inputs.get("settings")),
        ("GPU blocks", f"{inputs.get('num_gpu_blocks')} ({inputs.get('num_gpu_blocks_source')})"),
        ("sliding window (tokens)", inputs.get("sliding_window")),
        *_kv_group_rows(inputs.get("kv_cache_groups")),
        *_admission_reserve_rows(inputs.get("admission_reserve")),
        *(("vLLM would log", line) for line in inputs.get("vllm_kv_cache_log") or ()),
        ("requests", summary["num_requests"]),
        ("  finished / ignored", f"{states['finished']} / {states['ignored']}"),
        ("  failed / aborted", f"{states['failed']} / {states['aborted']}"),
        ("violations", summary["num_violations"]),
        ("  kinds", ", ".join(summary["violation_kinds"]) or "-"),
        ("simulated time (s)", summary["simulated_s"]),
        ("steps", summary["num_steps"]),
        ("throughput (req/s)", summary["throughput_req_per_s"]),
        ("throughput (tok/s)", summary["throughput_tok_per_s"]),
        ("TTFT p50 / p99 (s)", f"{_fmt(summary['ttft_p50_s'])} / {_fmt(summary['ttft_p99_s'])}"),
        ("TPOT p50 / p99 (s)", f"{_fmt(summary['tpot_p50_s'])} / {_fmt(summary['tpot_p99_s'])}"),
        ("E2E p50 / p99 (s)", f"{_fmt(summary['e2e_p50_s'])} / {_fmt(summary['e2e_p99_s'])}"),
        ("preemptions", summary["num_preemptions"]),
        ("KV used mean / max", f"{_fmt(summary['kv_util_mean'])} / {_fmt(summary['kv_util_max'])}"),
    ]
    for metric, value in rows:
        table.add_row(metric, _fmt(value))
    console.print(table)
    if summary.get("fatal_error"):
        console.print(f"[bold red]fatal engine error:[/] {escape(summary['fatal_error'])}")
    if summary.get("stopped_early"):
        console.print(f"[yellow]run stopped early:[/] {escape(summary['stopped_early'])}")
    for line in settings_notes(inputs):
        console.print(line, highlight=False, soft_wrap=True)
    if out_dir is not None:
        console.print(
            f"outputs written to {out_dir}/ (requests, steps, violations as Parquet and CSV)"
        )
    for line in next_steps(summary, out_dir):
        console.print(line, highlight=False, soft_wrap=True)


def _settings_rows(settings: dict | None) -> list[tuple[str, str]]:
    """The engine settings a run used, each marked as the user's or the release's:
    ('max seqs / tokens', '1024 / 8192 (release default)')."""
    if not settings:
        return []

    def show(*names: str) -> str:
        values = " / ".join(str(settings[name]["value"]) for name in names)
        origins = {settings[name]["origin"] for name in names}
        origin = origins.pop() if len(origins) == 1 else "set by the user / release default"
        return f"{values} ({'set' if origin == 'user' else origin})"

    return [
        ("max seqs / tokens", show("max_num_seqs", "max_num_batched_tokens")),
        ("prefix cache / chunked", show("enable_prefix_caching", "enable_chunked_prefill")),
        ("async scheduling", show("async_scheduling")),
        ("GPU memory util.", show("gpu_memory_utilization")),
    ]


def settings_notes(inputs: dict) -> list[str]:
    """Lines under the table: settings the release overrode, and the release defaults this run
    uses that the previous release's table would not."""
    lines = []
    release = inputs.get("vllm_version")
    for field in inputs.get("settings_overridden", ()):
        lines.append(
            f"note: {field} as given has no effect on vLLM {release}; the run uses the "
            "release's value (summary.json inputs.settings has the rule)"
        )
    for why in (inputs.get("settings_not_modelled") or {}).values():
        lines.append(f"note: {why}")
    changed = inputs.get("settings_since_previous") or {}
    if changed.get("changes"):
        lines.append(
            f"vLLM {release} defaults that differ from {changed['previous']}'s: "
            + "; ".join(changed["changes"])
        )
    return lines


def _design_row(design: str | None, vllm_version: str | None = None) -> str | None:
    """'v0-v2' -> 'v0-v2 = vLLM 0.5.4 v0, BlockSpaceManagerV2': which vLLM it models."""
    from sim.kv.config import Design

    try:
        return f"{design} = {Design(design).upstream_at(vllm_version)}"
    except ValueError:
        return design


def _manager_row(manager: dict | None) -> str:
    """Which block manager ran: kvsim's model, or vLLM's real code (`--vllm-root`)."""
    if not manager or manager.get("kind") != "real":
        return "kvsim's model"
    return f"vLLM {manager.get('vllm_version')} real code ({manager.get('vllm_root')})"


def _step_time_row(step_time: dict | None, band: dict | None) -> str:
    """'measured, x0.92-x1.06 of it' : the step-time model and how sure it is.

    Example: ({"measured": {}}, {"low_factor": 0.924, "high_factor": 1.057, ...}) ->
    "measured (real steps x0.924-x1.057 of it)"; an unvalidated band says so.
    """
    name = next(iter(step_time), "?") if step_time else "?"
    if not band:
        return name
    low, high = band.get("low_factor"), band.get("high_factor")
    if low == high == 1.0:
        return f"{name} (no validated error band)"
    extrapolated = ", extrapolated" if band.get("extrapolated") else ""
    return f"{name} (real steps x{low:g}-x{high:g} of it{extrapolated})"


def next_steps(summary: dict, out_dir: Path | None) -> list[str]:
    """What to run after a run that found violations: shrink one kind, then check it in CI.

    Example (kinds admission_undercount and leaked_blocks, outputs in runs/x)::

        next: shrink it to a minimal reproducer, then keep that as a CI check:
          kvsim shrink runs/x -o runs/x/minimal.yaml --kind admission_undercount
          kvsim check runs/x/minimal.yaml
        (one kind per shrink; the others: leaked_blocks)
    """
    kinds = list(summary.get("violation_kinds") or [])
    if not kinds:
        return []
    source = str(out_dir) if out_dir is not None else "SCENARIO.yaml"
    minimal = str(out_dir / "minimal.yaml") if out_dir is not None else "minimal.yaml"
    lines = [
        "[bold]next:[/] shrink it to a minimal reproducer, then keep that as a CI check "
        "(its expect: lists the kinds it shows; check exits 1 when that changes):",
        f"  kvsim shrink {escape(source)} -o {escape(minimal)} --kind {kinds[0]}",
        f"  kvsim check {escape(minimal)}",
    ]
    if len(kinds) > 1:
        lines.append(f"(one kind per shrink; the others: {', '.join(kinds[1:])})")
    return lines


def print_violations(result, limit: int = 5) -> None:
    """The first `limit` violations, one line each (from the run's list: no pandas needed)."""
    count = result.num_violations
    if not count:
        return
    console.print(f"[bold]first {min(limit, count)} of {count} violations:[/]")
    for kind, time_s, message in result.first_violations(limit):
        console.print(
            f"  [red]{kind}[/] at t={_fmt(time_s)} s: {escape(message)}",
            highlight=False,
        )
