"""Which top-k/top-p sampler each vLLM release's profiling run exercises.

The profiling run ends with `_dummy_sampler_run`: `min(max_num_batched_tokens, max_num_seqs)`
rows of full-vocabulary logits sampled with top-k = vocab - 1 and top-p = 0.9, so its memory
peak is whatever the release's top-k/top-p path keeps alive. What each release does (read from
the wheels, not copied):

- 0.8.4 (`vllm/v1/worker/gpu_model_runner.py:L1452-1522`, `profile_run` L1524-1598) and 0.11.0
  (L3183-3250, `profile_run` L3325-3400): one sampler call. FlashInfer samples when it is
  installed and `VLLM_USE_FLASHINFER_SAMPLER` is not 0 (0.11.0 `vllm/v1/sample/ops/
  topk_topp_sampler.py:L32-75`; 0.8.4 L28-62 also refuses FlashInfer >= 0.2.3); otherwise
  PyTorch sorts the logits (`apply_top_k_top_p`: a sorted fp32 copy, int64 indices, a scatter
  back). FlashInfer is an optional extra of these wheels (0.11.0 METADATA: `extra ==
  "flashinfer"`), so kvsim's default is the sort.
- 0.19.1 and 0.20.0 (the same `topk_topp_sampler.py`): FlashInfer only on opt-in
  (`VLLM_USE_FLASHINFER_SAMPLER=1`, L39); by default `apply_top_k_top_p` (L245-256) masks the
  logits in place with a Triton kernel when there are at least 8 rows, else sorts.
- 0.25.1 and 0.26.0: the variable defaults to on (`vllm/envs.py` L808-812 / L841-845) and
  FlashInfer is a hard CUDA requirement (METADATA), so `forward_cuda` samples with FlashInfer
  (`topk_topp_sampler.py:L93-95`) unless it is set to 0. `_dummy_sampler_run` then samples
  a second time with a per-request generator (0.25.1 `gpu_model_runner.py:L6140-6160`, 0.26.0
  L6214-6234), which `forward_cuda` hands to `forward_native`: the Triton / sort choice above.
  The peak is the larger of the two calls (each frees its copies before the next).
- 0.33.0: the same two calls (L5910-5930), but `forward_native`'s `apply_top_k_top_p`
  (`topk_topp_sampler.py:L501-521`) takes the Triton kernel at any row count.

A pre-V1 (v0) engine has one path of its own (`SamplerPath.V0`). Example: 0.33.0, 1024 rows ->
(V1_FLASHINFER, V1_TRITON); 0.25.1, 4 rows -> (V1_FLASHINFER, V1_PYTORCH); 0.19.1, 4 rows ->
(V1_PYTORCH,); 0.11.0 -> (V1_PYTORCH,).
"""

from __future__ import annotations

import re

from sim.memory.terms import SamplerPath, VllmEngine

#: `apply_top_k_top_p` takes the Triton kernel from this many rows (0.19.1-0.26.0, L253).
TRITON_MIN_ROWS = 8


def release_of(version: str | None) -> tuple[int, int] | None:
    """(major, minor) of a release or pin name; None when it names none.

    Example: "0.33.0" -> (0, 33); "0.11.x (docker)" -> (0, 11); "4ac7713" (upstream main of
    2025-07, ~0.10.0) -> (0, 10); None -> None.
    """
    if version is None:
        return None
    if version.strip().startswith("4ac7713"):
        return (0, 10)
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    return (int(match.group(1)), int(match.group(2))) if match else None


def sampler_paths(
    engine: VllmEngine,
    release: tuple[int, int] | None,
    rows: int,
    flashinfer_sampler: bool | None = None,
) -> tuple[SamplerPath, ...]:
    """The sampler paths the release's profiling run exercises (its peak is the largest).

    `flashinfer_sampler`: whether FlashInfer's sampler was on (installed and not disabled);
    None takes the release's default (off up to 0.20, on from 0.25). `release` None is read as
    0.11 (kvsim's V1 default before releases were told apart).
    """
    if engine is VllmEngine.V0:
        return (SamplerPath.V0,)
    minor = release[1] if release is not None and release[0] == 0 else 11
    if release is not None and release[0] > 0:
        minor = 10**6  # a 1.x release: the newest behaviour
    if minor < 19:
        return (SamplerPath.V1_FLASHINFER if flashinfer_sampler else SamplerPath.V1_PYTORCH,)
    in_place = SamplerPath.V1_TRITON if rows >= TRITON_MIN_ROWS else SamplerPath.V1_PYTORCH
    if minor < 25:
        return (SamplerPath.V1_FLASHINFER if flashinfer_sampler else in_place,)
    # 0.25.1+: the second warm-up call (a per-request generator) always runs forward_native,
    # which from 0.33.0 takes Triton at any row count.
    native = in_place if minor < 33 else SamplerPath.V1_TRITON
    if flashinfer_sampler is False:
        return (native,)
    return (SamplerPath.V1_FLASHINFER, native)
