"""What the 0.19.x startup logs say about the CUDA-graph estimate and the driver's total.

Two logs of sim/data/vllm_startup_logs.yaml (0.19.0 on 4 x L40S, 0.19.1 on an A100 40GB) print
"Estimated CUDA graph memory" without subtracting it (0.19's default), and the utilization line
"increase --gpu-memory-utilization from U to U + estimate / total" (0.19.1 gpu_worker.py
L442-445), which is where their entries' totals come from. docs/accuracy.md quotes both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sim.catalog import get_gpu
from sim.memory.cudagraph import GIB, cudagraph_estimate_bytes
from sim.memory.terms import MemorySource, visible_memory
from sim.memory.validation import (
    compare_all,
    load_logs,
    observed_pool_bytes,
    predicted_budget,
    predicted_pool_bytes,
)
from tests.harness.vllm_install import root_or_skip

DOCS = Path(__file__).resolve().parents[2] / "docs" / "accuracy.md"

#: What each log printed on its utilization line: (estimate GiB, utilization, suggested one),
#: read from the entry's source (the L40S lesson's line 140, the A100 post's log).
UTILIZATION_LINE = {
    "eksai-qwen25-72b-l40s-tp4": (2.73, 0.9000, 0.9616),
    "tokenkaki-qwen3-8b-a100-40gb": (2.35, 0.9000, 0.9596),
}


def _docs() -> str:
    return " ".join(DOCS.read_text("utf-8").split())


def _logs_with_estimates():
    return [log for log in load_logs() if log.logged.cudagraph_estimate_gib is not None]


def _total_bounds_gib(estimate: float, util: float, suggested: float) -> tuple[float, float]:
    """The driver totals the printed (rounded) figures allow: estimate to 0.01 GiB, the
    suggested utilization to 4 places. Example: 2.73 GiB, 0.9 -> 0.9616: 44.20-44.44 GiB."""
    delta = suggested - util
    return (estimate - 0.005) / (delta + 0.00005), (estimate + 0.005) / (delta - 0.00005)


def test_the_logs_with_an_estimate_are_the_two_0_19_logs_and_none_is_subtracted():
    logs = _logs_with_estimates()
    assert {log.id for log in logs} == set(UTILIZATION_LINE)
    for log in logs:
        assert log.release == (0, 19)
        assert predicted_budget(log).cudagraph_bytes == 0  # 0.19's default: printed only
        assert log.logged.cudagraph_estimate_gib == UTILIZATION_LINE[log.id][0]


def test_the_totals_are_the_ones_the_utilization_line_gives():
    """The L40S entry's total is that line's midpoint; the A100 40GB entry keeps the catalog's
    estimate, which the docs say lies just outside the line's range."""
    logs = {log.id: log for log in load_logs()}
    l40s = logs["eksai-qwen25-72b-l40s-tp4"]
    low, high = _total_bounds_gib(*UTILIZATION_LINE[l40s.id])
    visible = l40s.gpu_spec.memory_visible_gib
    assert visible is not None and low <= visible <= high
    estimate, util, suggested = UTILIZATION_LINE[l40s.id]
    assert visible == pytest.approx(estimate / (suggested - util), abs=0.005)
    docs = _docs()
    assert f"{visible:.2f} GiB for the L40S ({low:.2f}-{high:.2f} with the printed rounding" in docs
    errors = []
    for bound in (low, high):
        gpu = l40s.gpu if isinstance(l40s.gpu, dict) else {}
        moved = l40s.model_copy(update={"gpu": {**gpu, "memory_visible_gib": round(bound, 2)}})
        errors.append(predicted_pool_bytes(moved) / observed_pool_bytes(l40s) - 1)
    assert f"a pool error of {100 * errors[0]:.1f} % to {100 * errors[1]:.1f} %" in docs
    a100 = logs["tokenkaki-qwen3-8b-a100-40gb"]
    estimate, util, suggested = UTILIZATION_LINE[a100.id]
    low, high = _total_bounds_gib(estimate, util, suggested)
    total_bytes, source = visible_memory(a100.gpu_spec)  # no measured total: the H100 ratio
    catalog = total_bytes / GIB
    assert source is MemorySource.ESTIMATED and catalog > high
    midpoint = estimate / (suggested - util)
    assert (
        f"{midpoint:.2f} GiB for the A100 40GB, where the catalog's estimate ({catalog:.2f})"
        in docs
    )


def test_the_catalog_l40s_takes_the_logs_total_and_the_old_estimate_would_miss():
    """The catalog's `l40s` now carries this log's total (its entry's own GPU gives the same
    pool); the H100-ratio estimate it replaced would miss the log by about +53 %."""
    log = next(x for x in load_logs() if x.id == "eksai-qwen25-72b-l40s-tp4")
    catalog = get_gpu("l40s")
    total_bytes, source = visible_memory(catalog)
    assert source is MemorySource.MEASURED
    assert catalog.memory_visible_gib == log.gpu_spec.memory_visible_gib
    with_catalog = log.model_copy(update={"gpu": "l40s"})
    assert predicted_pool_bytes(with_catalog) == predicted_pool_bytes(log)
    unmeasured = catalog.model_copy(update={"memory_visible_gib": None})
    estimated_bytes, how = visible_memory(unmeasured)
    assert how is MemorySource.ESTIMATED and estimated_bytes > total_bytes
    gpu = {**catalog.model_dump(), "memory_visible_gib": None, "name": "l40s-estimated"}
    with_estimate = log.model_copy(update={"gpu": gpu})
    error = predicted_pool_bytes(with_estimate) / observed_pool_bytes(log) - 1
    assert error > 0.5
    quoted = (
        f"its H100-ratio estimate ({estimated_bytes / GIB:.2f} GiB) would miss this log by "
        f"{100 * error:+.1f} %"
    )
    assert quoted in _docs(), quoted


def test_kvsims_constants_miss_the_0_19_estimates_as_the_docs_say():
    """kvsim's 0.20.0 estimate at each log's settings (51 + 35 graphs) against what 0.19
    printed for the same graphs with the same profiler code."""
    errors = []
    for log in sorted(_logs_with_estimates(), key=lambda x: x.logged.cudagraph_estimate_gib):
        kvsim = cudagraph_estimate_bytes(
            release=(0, 20),
            max_num_seqs=log.max_num_seqs,
            max_num_batched_tokens=log.max_num_batched_tokens,
        )
        logged = log.logged.cudagraph_estimate_gib
        assert logged is not None
        errors.append(kvsim / GIB / logged - 1)
    assert all(e < -0.75 for e in errors)
    quoted = (
        f"kvsim's constants give 0.52 GiB ({100 * errors[0]:.0f} % and {100 * errors[1]:.0f} %)"
    )
    assert quoted in _docs(), quoted


def test_the_docs_quote_the_two_new_logs_errors():
    rows = {c.log.id: c for c in compare_all()}
    l40s = rows["eksai-qwen25-72b-l40s-tp4"].after_error
    a100 = rows["tokenkaki-qwen3-8b-a100-40gb"].after_error
    docs = _docs()
    assert f"Qwen2.5-72B on four L40S under 0.19.0 at {100 * l40s:+.1f} %" in docs
    assert f"Qwen3-8B on an A100 40GB under 0.19.1 at {100 * a100:+.1f} %" in docs


def _function_source(root: Path, name: str) -> str:
    path = root / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    tree = ast.parse(path.read_text("utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return ast.unparse(node)
    raise AssertionError(f"{name} not in {path}")


@pytest.mark.vllm
def test_0_19_1_profiles_cudagraph_memory_with_0_20_0s_code():
    """docs/accuracy.md: the 0.19 estimates are the quantity kvsim subtracts from 0.20.0 on."""
    old = _function_source(root_or_skip("0.19.1"), "profile_cudagraph_memory")
    new = _function_source(root_or_skip("0.20.0"), "profile_cudagraph_memory")
    assert old == new
