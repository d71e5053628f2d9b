"""Small scenarios with hand-computable answers for the sweep / capacity / plot tests."""

from __future__ import annotations

from typing import Any


def dd1_scenario(
    num_requests: int = 200, gap_s: float = 0.02, fixed_s: float = 0.01
) -> dict[str, Any]:
    """D/D/1: a request every `gap_s`, each served alone (max_num_seqs 1) in one `fixed_s` step.

    One output token, so a request finishes in its prefill step: the service rate is
    1 / fixed_s = 100 req/s and TTFT_i = fixed_s + max(0, i * (fixed_s - gap_s / scale)).
    """
    return {
        "name": "dd1",
        "model": None,
        "cache": {
            "block_size": 16,
            "num_gpu_blocks": 64,
            "num_cpu_blocks": 0,
            "sliding_window": None,
        },
        "scheduler": {"design": "v0-v2", "max_model_len": 64, "max_num_seqs": 1},
        "workload": {
            "kind": "inline",
            "requests": [
                {"arrival_s": round(i * gap_s, 9), "prompt_tokens": 8, "output_tokens": 1}
                for i in range(num_requests)
            ],
        },
        "step_time": {"linear": {"fixed_s": fixed_s}},
    }
