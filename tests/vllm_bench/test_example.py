"""The shipped example result (examples/vllm_bench/) is what it says: written by kvsim, labelled
so, from the scenario and command its README gives."""

from __future__ import annotations

import json
from pathlib import Path

from sim.vllm_bench.importer import import_serve_line

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "vllm_bench"
LINE = "vllm serve meta-llama/Llama-3.1-8B-Instruct --max-num-seqs 128 --port 8001"


def test_the_example_result_is_labelled_as_kvsims() -> None:
    result = json.loads((EXAMPLES / "kvsim_a100_llama8b_result.json").read_text())
    assert result["kvsim"]["note"] == "predicted by kvsim (a simulation), not measured on a GPU"
    assert result["kvsim"]["gpu"] == "a100-80gb-sxm" and result["num_prompts"] == 100
    assert "not a measurement" in (EXAMPLES / "README.md").read_text()


def test_the_example_scenario_is_what_import_vllm_writes() -> None:
    written = import_serve_line(LINE, gpu="a100-80gb-sxm", version="0.33.0")
    assert (EXAMPLES / "llama8b_a100.yaml").read_text() == written
    assert LINE in (EXAMPLES / "README.md").read_text()
