"""One capacity answer before and after the measured step-time default (issue "Numbers").

The notebook's question (notebooks/capacity_planning.ipynb): how many req/s one Llama-3.1-70B
replica at TP=2 sustains on the Azure conversation trace within TTFT p99 <= 2 s and TPOT p99 <=
100 ms, on H100 and H200, over three 10-minute windows, and how many replicas 20 req/s needs.
Answered under the roofline (the old default) and the measured model (the new one), each at the
central step time with its seed/window interval and at the ends of the model's error band.

    python benchmarks/capacity_before_after.py            # ~2-4 min on 2 cores
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import sim

TRACE = Path(sim.__file__).parent / "data/traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"


def scenario(step_time: str) -> sim.Scenario:
    return sim.scenario_from_dict(
        {
            "name": f"azure-conv-70b-{step_time}",
            "model": "llama-3.1-70b",
            "hardware": {"gpu": "h100-sxm", "tensor_parallel_size": 2},
            "cache": {"block_size": 16, "num_gpu_blocks": "derive"},
            "scheduler": {"design": "v0-v2", "max_model_len": 8192, "max_num_batched_tokens": 8192},
            "workload": {"kind": "trace", "path": str(TRACE), "first_n": 200},
            "step_time": step_time,
        }
    )


def main() -> None:
    windows = [{"workload.time_range_s": [s, s + 600]} for s in (0, 600, 1200)]
    rows = []
    for step_time in ("roofline", "measured"):
        table = sim.capacity(
            scenario(step_time),
            ["ttft_p99=2s", "tpot_p99=100ms"],
            target_rate=20,
            replicates=windows,
            compare={"hardware.gpu": ["h100-sxm", "h200"]},
            tolerance=0.15,
            workers=2,
        )
        for _, row in table.iterrows():
            rows.append(
                {
                    "step time": step_time,
                    "gpu": row["hardware.gpu"],
                    "band": f"x{row['step_time_low_factor']:g}-x{row['step_time_high_factor']:g}",
                    "req/s (central)": round(row["capacity_rate_req_per_s"], 2),
                    "95% interval": f"{row['capacity_ci_low']:.2f}-{row['capacity_ci_high']:.2f}",
                    "req/s slow-fast step": f"{row['capacity_slow_step_req_per_s']:.2f}-"
                    f"{row['capacity_fast_step_req_per_s']:.2f}",
                    "GPUs for 20 req/s": int(row["replicas_needed"]) * 2,
                    "(slow step)": int(row["replicas_needed_slow_step"]) * 2,
                }
            )
    with pd.option_context("display.width", 200, "display.max_columns", None):
        print(pd.DataFrame(rows).to_string(index=False))


if __name__ == "__main__":
    main()
