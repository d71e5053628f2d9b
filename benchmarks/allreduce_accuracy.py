"""kvsim's all-reduce charge before (NCCL's fit for every message) and after (the backend vLLM
picks, `sim.latency.allreduce`) against public measurements.

    python benchmarks/allreduce_accuracy.py

Three tables, each row with its source, measured value, kvsim before and after, and errors:

1. Kernel: single all-reduces of vLLM's CUDA-graph communicator benchmark on H100 SXM. The TP 4
   and 6 custom-kernel rows of PR #24111 are the fit (`sim.latency.allreduce`); held out: its
   TP 2 one-shot row and PR #24532's repeat of the TP 4 table (another run, not fitted). The
   `pynccl` rows check the NCCL fit kvsim keeps (from Vidur's profiles; never fitted on these).
2. Whole run: PR #2192's `benchmark_latency.py` (64 prompts of 256 tokens, 256 output tokens,
   A100-80G, vLLM of 2023-12) before and after custom all-reduce, replayed step by step with the
   measured model (v0 engine); its all-reduce dispatch on A100 (custom below 8 MiB, else NCCL)
   is the same as 0.11.0's, which is the release used.
3. Serving: tenstorrent/tt-inference-server#143's Qwen2.5-72B on two H100s at concurrency 1
   (mean TPOT), each decode step of the request at its context; release 0.11.0 (the thread's
   0.8.x also sends a 16 KiB message to custom one-shot).

No data here set a coefficient except table 1's "fit" rows. No GPU needed; a few seconds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from importlib import resources
from typing import Any

import yaml

from sim.catalog import ModelSpec, get_gpu, get_model
from sim.latency.allreduce import ONE_SHOT_POINTS, TWO_SHOT_POINTS, Algorithm, MiB
from sim.latency.batch import BatchShape
from sim.latency.measured import MeasuredStepTime

PR24111 = "https://github.com/vllm-project/vllm/pull/24111"
PR24532 = "https://github.com/vllm-project/vllm/pull/24532"
PR2192 = "https://github.com/vllm-project/vllm/pull/2192"
TT143 = "https://github.com/tenstorrent/tt-inference-server/issues/143"
SIZES_MB = (0.5, 1.0, 1.5, 2.0, 3.0, 4.0)

#: (source, tp, kernel, ms per size of SIZES_MB); no licence stated, numbers only.
HELD_OUT_KERNEL = (
    (PR24532, 4, "ca_1stage", (0.010, 0.014, 0.019, 0.023, 0.030, 0.038)),
    (PR24532, 4, "ca_2stage", (0.017, 0.018, 0.025, 0.026, 0.035, 0.042)),
    (PR24111, 4, "pynccl", (0.017, 0.019, 0.022, 0.026, 0.031, 0.037)),
    (PR24111, 6, "pynccl", (0.023, 0.025, 0.032, 0.043, 0.047, 0.053)),
    (PR24532, 4, "pynccl", (0.021, 0.023, 0.025, 0.028, 0.033, 0.039)),
)
#: LLaMA-1 33B (huggyllama/llama-30b config.json): PR #2192's "Llama 33B".
LLAMA_33B: dict[str, Any] = {
    "name": "llama-33b",
    "source": "https://huggingface.co/huggyllama/llama-30b/blob/main/config.json",
    "num_layers": 60,
    "hidden_size": 6656,
    "num_attention_heads": 52,
    "num_kv_heads": 52,
    "head_dim": 128,
    "intermediate_size": 17920,
    "vocab_size": 32000,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": False,
}
#: (model, tp, max_num_batched_tokens of that vLLM = max_model_len, s before, s after)
WHOLE_RUNS = (
    ("llama-2-70b", 4, 4096, 16.37, 14.57),
    (LLAMA_33B, 2, 2048, 15.88, 14.38),
)
#: (input_len, output_len, mean TPOT ms) of tt143's 2 x H100 table (concurrency 1).
TT143_ROWS = ((1024, 128, 31.0), (128, 1024, 30.9), (128, 128, 30.9), (2048, 128, 31.0))


def _err(pred: float, meas: float) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}%"


def _step(model: str | ModelSpec | dict, gpu: str, tp: int, release: str | None, engine: str):
    return MeasuredStepTime(get_model(model), get_gpu(gpu), tp=tp, release=release, engine=engine)


#: The measured kernel -> the backend whose cost kvsim charges for it.
KERNELS = {
    "ca_1stage": Algorithm.CUSTOM_ONE_SHOT,
    "ca_2stage": Algorithm.CUSTOM_TWO_SHOT,
    "pynccl": Algorithm.NCCL,
}


def kernel_points() -> list[tuple[str, str, int, str, float, float]]:
    """(split, source, tp, kernel, MiB, measured ms) of table 1."""
    points: list[tuple[str, str, int, str, float, float]] = []
    for kernel, table in (("ca_1stage", ONE_SHOT_POINTS), ("ca_2stage", TWO_SHOT_POINTS)):
        points += [("fit", PR24111, tp, kernel, mb, ms) for tp, mb, ms in table]
    points.append(("held out", PR24111, 2, "ca_1stage", 0.5, 0.007))
    for source, tp, kernel, values in HELD_OUT_KERNEL:
        points += [
            ("held out", source, tp, kernel, mb, ms)
            for mb, ms in zip(SIZES_MB, values, strict=True)
        ]
    return points


def kernel_row(point: tuple[str, str, int, str, float, float]) -> tuple[float, float, float, str]:
    """(measured us, before us, after us, backend 0.11.0 would pick) of one point: before is
    NCCL's fit (kvsim's charge for every message), after the measured kernel's cost."""
    _, _, tp, kernel, mb, ms = point
    cost = _step("llama-3.1-70b", "h100-sxm", tp, "0.11.0", "v1").allreduce_cost
    assert cost is not None
    nbytes = mb * MiB
    before = cost.kernel_time_s(Algorithm.NCCL, nbytes)
    after = cost.kernel_time_s(KERNELS[kernel], nbytes)
    return ms * 1e3, before * 1e6, after * 1e6, cost.time_and_algorithm(nbytes)[1].value


def kernel_table() -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]]:
    """Table 1's rows and its summary (median |error| per split and kernel family)."""
    rows, errors = [], {}
    for point in kernel_points():
        split, source, tp, kernel, mb, _ = point
        m_us, b_us, a_us, picked = kernel_row(point)
        family = "NCCL" if kernel == "pynccl" else "custom"
        errors.setdefault((split, family), []).append((abs(b_us / m_us - 1), abs(a_us / m_us - 1)))
        rows.append((split, source.rsplit("/", 1)[-1], str(tp), kernel, f"{mb:g}", picked,
                     f"{m_us:.0f}", f"{b_us:.1f}", f"{a_us:.1f}", _err(b_us, m_us), _err(a_us, m_us)))  # fmt: skip
    summary = []
    for (split, family), pairs in sorted(errors.items()):
        before = 100 * statistics.median(b for b, _ in pairs)
        after = 100 * statistics.median(a for _, a in pairs)
        summary.append((split, family, str(len(pairs)), f"{before:.1f}% -> {after:.1f}%"))
    return rows, summary


def whole_run_s(model: Any, tp: int, max_tokens: int, release: str | None) -> float:
    """benchmark_latency's one batch: 64 prompts of 256 prefilled max_tokens at a time, then
    255 decode steps of all 64 (the first output token comes from the prefill)."""
    step = _step(model, "a100-80gb-sxm", tp, release, "v0")
    per_step = max_tokens // 256
    total = 0.0
    for start in range(0, 64, per_step):
        n = min(per_step, 64 - start)
        total += step.predict_s(BatchShape((), ((0, 256),) * n))
    for i in range(1, 256):
        total += step.predict_s(BatchShape((256 + i,) * 64, ()))
    return total


def tpot_ms(input_len: int, output_len: int, release: str | None) -> float:
    model = get_model(_qwen25_72b())
    step = _step(model, "h100-sxm", 2, release, "v1")
    times = [step.predict_s(BatchShape((input_len + i,), ())) for i in range(1, output_len)]
    return 1e3 * statistics.fmean(times)


def _qwen25_72b() -> dict[str, Any]:
    """The geometry the serving measurements file gives tt143's Qwen2.5-72B."""
    text = resources.files("sim.data").joinpath("vllm_serving_measurements.yaml").read_text()
    entries = yaml.safe_load(text)["measurements"]
    entry = next(e for e in entries if e["id"].startswith("tt143-"))
    return dict(entry["model"])


def _print(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    print("## 1. Single all-reduces, H100 SXM, CUDA graphs (us)\n")
    rows, summary = kernel_table()
    _print(("split", "PR", "tp", "measured kernel", "MiB", "0.11.0 picks", "measured",
            "before", "after", "before err", "after err"), rows)  # fmt: skip
    print()
    _print(("split", "kernel", "n", "median abs error before -> after"), summary)
    print("\n## 2. benchmark_latency, A100-80G, 64 x (256 in, 256 out) (s)\n")
    rows = []
    for model, tp, max_tokens, nccl_m, custom_m in WHOLE_RUNS:
        name = model if isinstance(model, str) else model["name"]
        b, a = (
            whole_run_s(model, tp, max_tokens, None),
            whole_run_s(model, tp, max_tokens, "0.11.0"),
        )
        rows.append((name, str(tp), f"{nccl_m:.2f}", f"{custom_m:.2f}", f"{b:.2f}", f"{a:.2f}",
                     _err(b, nccl_m), _err(b, custom_m), _err(a, custom_m),
                     f"{nccl_m / custom_m:.3f}", f"{b / a:.3f}"))  # fmt: skip
    _print(("model", "tp", "measured NCCL", "measured custom", "kvsim before", "kvsim after",
            "before vs NCCL run", "before vs custom run", "after vs custom run",
            "measured speed-up", "kvsim speed-up"), rows)  # fmt: skip
    print(f"\n({PR2192})\n")
    print("## 3. Qwen2.5-72B, 2 x H100 SXM, concurrency 1, mean TPOT (ms)\n")
    rows = []
    for input_len, output_len, measured in TT143_ROWS:
        b, a = tpot_ms(input_len, output_len, None), tpot_ms(input_len, output_len, "0.11.0")
        rows.append((f"{input_len}/{output_len}", f"{measured:.1f}", f"{b:.2f}", f"{a:.2f}",
                     _err(b, measured), _err(a, measured)))  # fmt: skip
    _print(("in/out", "measured", "before", "after", "before err", "after err"), rows)
    print(f"\n({TT143})")


if __name__ == "__main__":
    main()
