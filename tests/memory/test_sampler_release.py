"""The profiling run's sampler peak, per vLLM release (`sim.memory.sampler_release`).

Each release's path is pinned twice: by what kvsim subtracts (hand-computed bytes for
Qwen2.5-72B at 1,024 rows, vocab 152,064) and, where the wheels are installed under .vllm/, by
the line of upstream code that makes the release take it, so a swap of two releases' paths
fails one or the other.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sim.catalog import ModelSpec, get_gpu, get_model
from sim.memory.derive import derive_num_gpu_blocks
from sim.memory.sampler_release import release_of, sampler_paths
from sim.memory.terms import (
    ACTIVATION_FIT,
    SamplerPath,
    VllmEngine,
    estimate_peak_activation_bytes,
    triton_sampler_bytes,
)

ROOT = Path(__file__).resolve().parents[2]
V1, V0 = VllmEngine.V1, VllmEngine.V0
SORT, FI, TRITON = SamplerPath.V1_PYTORCH, SamplerPath.V1_FLASHINFER, SamplerPath.V1_TRITON

#: Qwen2.5-72B-Instruct's geometry (config.json), as sim/data/vllm_serving_measurements.yaml.
QWEN25_72B = ModelSpec(
    name="qwen2.5-72b", num_layers=80, hidden_size=8192, num_attention_heads=64,
    num_kv_heads=8, head_dim=128, intermediate_size=29568, vocab_size=152064,
    max_position_embeddings=32768, tie_word_embeddings=False, qkv_bias=True,
)  # fmt: skip

#: One fp32 logits copy at 1,024 rows: 1,024 x 152,064 x 4 B.
LOGITS = 622_854_144
#: Per release (flashinfer_sampler left to its default): the paths and the activation peak.
PEAKS = {
    "0.11.0": ((SORT,), 6_072_827_904),  # 9.75 x LOGITS
    "0.19.1": ((TRITON,), 2_104_565_760),  # 3.25 x LOGITS + 132 x 152,064 x 4
    "0.20.0": ((TRITON,), 2_104_565_760),
    "0.25.1": ((FI, TRITON), 2_104_565_760),  # both calls; Triton's buffer is the larger
    "0.26.0": ((FI, TRITON), 2_104_565_760),
    "0.33.0": ((FI, TRITON), 2_104_565_760),
}


@pytest.mark.parametrize("release", sorted(PEAKS))
def test_each_releases_sampler_peak(release: str) -> None:
    paths, peak = PEAKS[release]
    assert sampler_paths(V1, release_of(release), 1024) == paths
    got = estimate_peak_activation_bytes(
        QWEN25_72B, max_num_batched_tokens=8192, max_num_seqs=1024, tp=2, sampler=paths
    )
    assert got == peak


def test_the_hand_figures_follow_the_fitted_copies() -> None:
    """The constants above are 9.75 / 3.25 copies: a refit changes them here too."""
    copies = ACTIVATION_FIT.sampler_copies
    assert (copies[SORT], copies[FI]) == (9.75, 3.25)
    assert PEAKS["0.11.0"][1] == 9.75 * LOGITS
    assert triton_sampler_bytes(QWEN25_72B, 8192, 1024) == 3.25 * LOGITS + 132 * 152_064 * 4


@pytest.mark.parametrize(
    ("release", "rows", "flashinfer", "paths"),
    [
        ("0.11.0", 1024, True, (FI,)),  # installed and not disabled
        ("0.11.0", 1024, False, (SORT,)),
        ("0.19.1", 4, None, (SORT,)),  # fewer than 8 rows: the sort, not Triton
        ("0.19.1", 1024, True, (FI,)),  # VLLM_USE_FLASHINFER_SAMPLER=1
        ("0.20.0", 8, None, (TRITON,)),
        ("0.25.1", 1024, False, (TRITON,)),  # VLLM_USE_FLASHINFER_SAMPLER=0
        ("0.25.1", 4, False, (SORT,)),
        ("0.26.0", 4, None, (FI, SORT)),  # the second call: forward_native, < 8 rows
        ("0.33.0", 4, False, (TRITON,)),  # 0.33.0 takes Triton at any row count
        ("0.33.0", 4, None, (FI, TRITON)),
        ("4ac7713", 1024, None, (SORT,)),  # ~0.10
        ("0.8.x (assumed)", 1024, None, (SORT,)),
        (None, 1024, None, (SORT,)),
    ],
)
def test_the_flag_and_the_row_count_pick_the_path(
    release: str | None, rows: int, flashinfer: bool | None, paths: tuple[SamplerPath, ...]
) -> None:
    assert sampler_paths(V1, release_of(release), rows, flashinfer) == paths


@given(st.sampled_from(list(PEAKS) + ["0.5.4", None]), st.integers(1, 4096), st.booleans())
def test_the_v0_engine_has_one_path_at_every_release(release, rows, flashinfer) -> None:
    assert sampler_paths(V0, release_of(release), rows, flashinfer) == (SamplerPath.V0,)


@given(st.integers(1, 2048), st.integers(1, 2048))
def test_the_peak_of_two_calls_is_the_larger(tokens: int, seqs: int) -> None:
    model = get_model("llama-3.1-8b")

    def peak(paths: tuple[SamplerPath, ...]) -> int:
        return estimate_peak_activation_bytes(
            model, max_num_batched_tokens=tokens, max_num_seqs=seqs, sampler=paths
        )

    assert peak((FI, TRITON)) == max(peak((FI,)), peak((TRITON,)))


def test_a_scenarios_pool_follows_its_release() -> None:
    """Gemma-3-27B (vocab 262,208) at 1,024 rows: 0.11.0's sort reserves 10.47 GB, 0.19.1's
    Triton kernel 3.63 GB; same utilization (0.9), so 0.19.1 has that much more pool."""
    gemma, h100 = get_model("gemma-3-27b"), get_gpu("h100-sxm")
    budgets = {
        r: derive_num_gpu_blocks(
            gemma,
            h100,
            engine="v1",
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
            vllm_release=r,
        )  # fmt: skip
        for r in ("0.11.0", "0.19.1")
    }
    old, new = budgets["0.11.0"], budgets["0.19.1"]
    assert (old.peak_activation_bytes, new.peak_activation_bytes) == (
        10_471_538_688, 3_628_958_720)  # fmt: skip
    gained = old.peak_activation_bytes - new.peak_activation_bytes
    assert new.available_kv_bytes - old.available_kv_bytes == gained


#: The upstream line that makes each release take its path (file under vllm/, text).
UPSTREAM = {
    "0.11.0": [("envs.py", 'if "VLLM_USE_FLASHINFER_SAMPLER" in os.environ else None')],
    "0.19.1": [
        ("v1/sample/ops/topk_topp_sampler.py", "if HAS_TRITON and logits.shape[0] >= 8:"),
        ("v1/sample/ops/topk_topp_sampler.py", "if envs.VLLM_USE_FLASHINFER_SAMPLER:"),
    ],
    "0.20.0": [("v1/sample/ops/topk_topp_sampler.py", "if HAS_TRITON and logits.shape[0] >= 8:")],
    "0.25.1": [
        ("envs.py", "else True"),
        ("v1/worker/gpu_model_runner.py", "# Also warm forward_native"),
        ("v1/sample/ops/topk_topp_sampler.py", "if HAS_TRITON and logits.shape[0] >= 8:"),
    ],
    "0.26.0": [
        ("envs.py", "else True"),
        ("v1/worker/gpu_model_runner.py", "# Also warm forward_native"),
        ("v1/sample/ops/topk_topp_sampler.py", "if HAS_TRITON and logits.shape[0] >= 8:"),
    ],
    "0.33.0": [
        ("v1/worker/gpu_model_runner.py", "# Also warm forward_native"),
        ("v1/sample/ops/topk_topp_sampler.py", "    if HAS_TRITON:\n        return apply_top_k"),
    ],
}
ABSENT = {  # ... and what would make it take another
    "0.11.0": [("v1/sample/ops/topk_topp_sampler.py", "HAS_TRITON")],
    "0.19.1": [("envs.py", "else True"), ("v1/worker/gpu_model_runner.py", "warm forward_native")],
    "0.20.0": [("envs.py", "else True"), ("v1/worker/gpu_model_runner.py", "warm forward_native")],
    "0.33.0": [("v1/sample/ops/topk_topp_sampler.py", "logits.shape[0] >= 8")],
}


@pytest.mark.parametrize("release", sorted(UPSTREAM))
def test_the_wheels_say_what_each_release_does(release: str) -> None:
    root = ROOT / ".vllm" / release / "vllm"
    if not root.exists():
        pytest.skip(f"vLLM {release} is not installed under .vllm/")
    for rel, text in UPSTREAM[release]:
        assert text in (root / rel).read_text(), f"{release} {rel}: {text!r}"
    for rel, text in ABSENT.get(release, []):
        assert text not in (root / rel).read_text(), f"{release} {rel}: {text!r}"
