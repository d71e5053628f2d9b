"""`startup_gate_mismatch`: vLLM's startup check accepts max_model_len, the admission gate
charges such a request more blocks than the pool has (issue #23's liveness check between
startup sizing and runtime admission)."""

from __future__ import annotations

import pytest

from sim import run as run_scenario
from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict


def _hybrid(vllm_version: str, num_gpu_blocks: int = 30, prompt_tokens: int = 20) -> dict:
    """Full attention + a 32-token window, bs 16, T 64, max_model_len 256."""
    return {
        "name": "gate-mismatch",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": 0,
            "kv_cache_groups": [{"sliding_window": 32}, {}],
        },
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": vllm_version,
            "max_model_len": 256,
            "max_num_batched_tokens": 64,
            "async_scheduling": False,
        },
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": prompt_tokens, "output_tokens": 2}],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }


def test_uncapped_gate_of_0_19_1_can_never_admit_what_startup_accepts():
    """Startup charges 16 + cdiv(31 + 64, 16) + 1 = 23 <= 29 usable; 0.19.1's gate charges a
    256-token request 16 + 16 = 32 > 29: found before any request arrives."""
    resolved = resolve(scenario_from_dict(_hybrid("0.19.1")))
    (row,) = resolved.inputs["startup_violations"]
    assert row["kind"] == "startup_gate_mismatch"
    assert (row["counted_blocks"], row["needed_blocks"], row["free_blocks"]) == (23, 32, 29)
    assert "would never be admitted" in row["message"] and "0.19.1" in row["message"]
    (found,) = resolved.engine.startup_violations
    assert found.kind.value == "startup_gate_mismatch"


@pytest.mark.parametrize("release", ["0.20.0", "0.25.1", "0.26.0", "0.33.0"])
def test_capped_gates_of_later_releases_admit_what_startup_accepts(release):
    resolved = resolve(scenario_from_dict(_hybrid(release)))
    assert "startup_violations" not in resolved.inputs
    assert resolved.engine.startup_violations == ()


def test_the_finding_is_a_run_violation_and_the_long_request_really_stalls():
    """A short workload still reports it (first in the violations); a 250-token prompt then
    waits forever on 0.19.1 (no_progress) and runs on 0.20.0."""
    short = run_scenario(scenario_from_dict(_hybrid("0.19.1")))
    kinds = list(short.violations["kind"])
    assert kinds == ["startup_gate_mismatch"]
    assert short.summary["states"]["finished"] == 1
    long_019 = run_scenario(scenario_from_dict(_hybrid("0.19.1", prompt_tokens=250)))
    assert list(long_019.violations["kind"]) == ["startup_gate_mismatch", "no_progress"]
    long_020 = run_scenario(scenario_from_dict(_hybrid("0.20.0", prompt_tokens=250)))
    assert long_020.num_violations == 0 and long_020.summary["states"]["finished"] == 1


def test_a_pool_the_gate_fits_has_no_finding():
    resolved = resolve(scenario_from_dict(_hybrid("0.19.1", num_gpu_blocks=33)))
    assert "startup_violations" not in resolved.inputs
