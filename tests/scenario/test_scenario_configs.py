"""One translation of settings into configs (`sim.scenario.configs`): a lockstep case against
real vLLM gets the configs a scenario of the same settings resolves to, so the lockstep tests
check the configs kvsim runs with, not a copy of them."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.scenario.resolve import resolve
from sim.scenario.schema import scenario_from_dict
from sim.vllm_real.v1_sched_adapter import SchedCase, case_configs

CASES = [
    SchedCase(20, 16, 128, 4, 64),
    SchedCase(40, 8, 96, 3, 24, True, True, 17, 12, "priority"),
    SchedCase(30, 4, 64, 2, 96, enable_chunked_prefill=False),
]


def _scenario_of(case: SchedCase, pin: str, fast_path: bool) -> dict:
    """The case written as a scenario, field by field (no model: the pool is given)."""
    return {
        "model": None,
        "cache": {
            "block_size": case.block_size,
            "num_gpu_blocks": case.num_blocks,
            "sliding_window": case.sliding_window,
            "enable_prefix_caching": case.enable_prefix_caching,
        },
        "scheduler": {
            "design": "v1-engine",
            "vllm_version": pin,
            "max_model_len": case.max_model_len,
            "max_num_seqs": case.max_num_seqs,
            "max_num_batched_tokens": case.max_num_batched_tokens,
            "enable_chunked_prefill": case.enable_chunked_prefill,
            "long_prefill_token_threshold": case.long_prefill_token_threshold,
            "async_scheduling": case.async_scheduling,
            "policy": case.policy,
            "decode_fast_path": fast_path,
            "decode_cohort": fast_path,
        },
        "workload": {
            "kind": "inline",
            "requests": [{"arrival_s": 0.0, "prompt_tokens": 10, "output_tokens": 2}],
        },
        "step_time": {"linear": {"fixed_s": 0.01}},
    }


@pytest.mark.parametrize("fast_path", [False, True])
@pytest.mark.parametrize("pin", ["4ac7713", "0.11.0", "0.33.0"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.block_size}x{c.num_blocks}")
def test_a_lockstep_case_resolves_as_its_scenario(case, pin, fast_path):
    """Every setting of the case is given, so the release's defaults change nothing, except
    where the release overrides the user: 0.11.0's rules (4ac7713 follows them) chunk every
    generative model (arg_utils.py L1547-1548), so a case without chunked prefill runs as a
    scenario with it, and the scenario's resolution says so."""
    resolved = resolve(scenario_from_dict(_scenario_of(case, pin, fast_path)))
    overrides_chunking = pin != "0.33.0" and not case.enable_chunked_prefill
    if overrides_chunking:
        case = replace(case, enable_chunked_prefill=True)
    scheduler, kv = case_configs(case, pin, fast_path)
    assert scheduler == resolved.engine.scheduler
    assert kv == resolved.engine.kv
    overridden = ["scheduler.enable_chunked_prefill"] if overrides_chunking else []
    assert resolved.inputs["settings_overridden"] == overridden
