"""docs/accuracy.md "How far vLLM's CUDA-graph estimate spreads": every figure it quotes.

The section sets kvsim's estimate beside every public "Estimated CUDA graph memory" line the
repository records (sim/data/vllm_cudagraph_estimates.yaml and the two 0.19.x startup logs of
sim/data/vllm_startup_logs.yaml), bounds the per-graph cost the 51 + 35-graph lines imply, and
says how far README's 0.20.0 pools would move if the subtracted estimate were what 0.19's
lines print. Each figure is recomputed here from the data and the model, then looked up in the
docs, so a moved figure fails this test instead of going stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from sim.memory.cudagraph import (
    CUDAGRAPH_FIT,
    GIB,
    MIB,
    CaptureMode,
    capture_sizes,
    cudagraph_estimate_bytes,
    estimate_from_counts,
    graph_counts,
    load_cudagraph_logs,
)
from sim.memory.validation import load_logs
from sim.scenario.overrides import apply_overrides
from sim.scenario.resolve import resolve
from sim.scenario.schema import load_scenario
from tests.harness.vllm_install import root_or_skip

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "accuracy.md"
#: The README findings whose 0.20.0 pool includes the subtracted estimate.
FINDINGS = {
    "Gemma-3-27B": ROOT / "scenarios" / "gemma3_hybrid_versions_v1.yaml",
    "Gemma-2-9B": ROOT / "scenarios" / "gemma2_hybrid_v1.yaml",
}


def _docs() -> str:
    return " ".join(DOCS.read_text("utf-8").split())


def _rows() -> list[tuple[str, int, int, float, float, str]]:
    """(id, PIECEWISE graphs, FULL graphs, logged GiB, kvsim GiB, note) for every line."""
    rows = []
    for entry in load_cudagraph_logs():
        kvsim = estimate_from_counts(entry.piecewise_graphs, entry.full_graphs) / GIB
        note = ", ".join(entry.unmodelled) or "dense"
        rows.append(
            (
                entry.id,
                entry.piecewise_graphs,
                entry.full_graphs,
                entry.estimated_gib,
                kvsim,
                f"{note}; {entry.split}",
            )
        )
    for log in load_logs():
        logged = log.logged.cudagraph_estimate_gib
        if logged is None:
            continue
        sizes = capture_sizes((0, 20), log.max_num_seqs, log.max_num_batched_tokens)
        pw, full = graph_counts(CaptureMode.FULL_AND_PIECEWISE, sizes, log.max_num_seqs)
        kvsim = (
            cudagraph_estimate_bytes(
                release=(0, 20),
                max_num_seqs=log.max_num_seqs,
                max_num_batched_tokens=log.max_num_batched_tokens,
            )
            / GIB
        )
        rows.append((log.id, pw, full, logged, kvsim, "dense; startup log, not fitted"))
    return sorted(rows, key=lambda r: (r[1] + r[2], r[3]))


def test_the_table_lists_every_recorded_line_with_kvsims_figure() -> None:
    docs = _docs()
    rows = _rows()
    assert len(rows) == 9
    for rid, pw, full, logged, kvsim, note in rows:
        error = round(100 * (kvsim / logged - 1))
        row = f"| {rid} | {pw} + {full} | {logged:.2f} | {kvsim:.2f} | {error:+d} % | {note} |"
        assert row in docs, row


def _default_grid_lines() -> list[tuple[str, float]]:
    """The dense lines with the default 51 + 35 graphs: (id, logged GiB)."""
    return [(r[0], r[3]) for r in _rows() if (r[1], r[2]) == (51, 35) and r[5].startswith("dense")]


def test_the_51_plus_35_lines_and_what_one_graph_would_cost() -> None:
    """Three dense lines share the default grid; with kvsim's first capture held, the second
    capture (one graph's cost) would be (logged - 0.33 GiB) / 84; with its 2.3 MiB per graph
    held, the first capture would be logged - 84 x 2.3 MiB."""
    lines = dict(_default_grid_lines())
    assert set(lines) == {
        "lmcache3430-qwen3-8b-24gb",
        "tokenkaki-qwen3-8b-a100-40gb",
        "eksai-qwen25-72b-l40s-tp4",
    }
    low, high = min(lines.values()), max(lines.values())
    first = CUDAGRAPH_FIT.first_capture_gib * GIB
    per_graph = {k: (v * GIB - first) / 84 / MIB for k, v in lines.items()}
    first_if = {
        k: (v * GIB - 84 * CUDAGRAPH_FIT.per_graph_mib * MIB) / GIB for k, v in lines.items()
    }
    a100, l40s = "tokenkaki-qwen3-8b-a100-40gb", "eksai-qwen25-72b-l40s-tp4"
    quoted = (
        f"from {low:.2f} to {high:.2f} GiB ({high / low:.1f} x) for the same 51 + 35 graphs; "
        f"held to kvsim's first capture (0.33 GiB), one more graph would cost "
        f"{per_graph['lmcache3430-qwen3-8b-24gb']:.1f} MiB on the 24 GB card, "
        f"{per_graph[a100]:.1f} MiB on the A100 and {per_graph[l40s]:.1f} MiB on the L40S; "
        f"held to its 2.3 MiB a graph, the first capture would be {first_if[a100]:.2f} and "
        f"{first_if[l40s]:.2f} GiB"
    )
    assert quoted in _docs(), quoted


def _blocks_at(path: Path, version: str) -> tuple[int, int, int, int]:
    """(blocks, available KV bytes, subtracted estimate bytes, block bytes) as resolved."""
    scenario = apply_overrides(load_scenario(path), {"scheduler.vllm_version": version})
    inputs = resolve(scenario, base_dir=path.parent).inputs
    memory = inputs["memory"]
    return (
        inputs["num_gpu_blocks"],
        memory["available_kv_bytes"],
        memory["cudagraph_bytes"],
        memory["block_bytes"],
    )


@pytest.mark.parametrize("name", sorted(FINDINGS))
def test_what_readmes_0_20_pools_would_be_at_0_19s_estimates(name: str) -> None:
    """The pool is available bytes // block bytes (checked here), so replacing kvsim's
    estimate E by X moves it to (available + E - X) // block bytes; the estimate at which
    0.20.0's pool falls to 0.19.1's is where the utilization step (0.92 vs 0.9) is used up."""
    path = FINDINGS[name]
    old_blocks, _, old_cg, _ = _blocks_at(path, "0.19.1")
    blocks, available, estimate, block = _blocks_at(path, "0.20.0")
    assert old_cg == 0 and blocks == available // block
    at = {gib: (available + estimate - int(gib * GIB)) // block for gib in (2.35, 2.73)}
    even_gib = (available + estimate - old_blocks * block) / GIB
    quoted = (
        f"{name}: {blocks:,} blocks at 0.20.0 with kvsim's {estimate / GIB:.2f} GiB, "
        f"{at[2.35]:,} at 2.35 GiB and {at[2.73]:,} at 2.73 GiB, against {old_blocks:,} on "
        f"0.19.1 (the two meet at {even_gib:.2f} GiB)"
    )
    assert quoted in _docs(), quoted
    assert at[2.73] < at[2.35] < old_blocks < blocks
    # README's Gemma-3 finding carries the same caveat, and says Gemma-2's pools meet at the
    # same estimate.
    readme = " ".join((ROOT / "README.md").read_text("utf-8").split())
    logged = [row[3] for row in _rows()]
    assert f"public logs print {min(logged):.2f}-{max(logged):.2f} GiB for it" in readme
    if name == "Gemma-3-27B":
        caveat = (
            f"0.20.0 would hold {at[2.35]:,} blocks, fewer than 0.19.1 (the two meet at "
            f"{even_gib:.2f} GiB, as Gemma-2's below do"
        )
        assert caveat in readme, caveat
    else:
        assert f"the two meet at {even_gib:.2f} GiB, as Gemma-2's below do" in readme


#: The decoder arithmetic the docs say every pin shares: two samples per mode, the second
#: at least 1 MiB and multiplied by the other graphs, the larger first capture counted once.
ARITHMETIC = (
    "profile_descs = descs[:2]",
    "max(mem_samples[1] if len(mem_samples) > 1 else 0, 1 << 20)",
    "per_graph_estimate[mode] = per_graph * (len(descs) - 1)",
    "max(shared_memory_estimate.values()",
    "sum(per_graph_estimate.values())",
)


@pytest.mark.vllm
@pytest.mark.parametrize("pin", ["0.19.1", "0.20.0", "0.25.1", "0.26.0", "0.33.0"])
def test_each_pin_samples_two_graphs_and_extrapolates_the_second(pin: str) -> None:
    path = root_or_skip(pin) / "vllm" / "v1" / "worker" / "gpu_model_runner.py"
    tree = ast.parse(path.read_text("utf-8"))
    source = next(
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "profile_cudagraph_memory"
    )
    for line in ARITHMETIC:
        assert line in source, (pin, line)
