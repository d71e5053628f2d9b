"""Each pin's resolved engine settings (`sim.scenario.vllm_defaults`), worked by hand from the
releases' code (the numbers below are read off engine/arg_utils.py and config/*.py, not
printed by the module); no vLLM needed. `tests/vllm_real/test_vllm_defaults_lockstep.py` compares the
same module with the real code over the whole grid."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import fields

import pytest

from sim.catalog import get_gpu, get_model
from sim.errors import InputError
from sim.scenario.vllm_defaults import (
    RELEASES,
    DefaultsError,
    Origin,
    Refusal,
    ResolvedDefaults,
    UsageContext,
    UserFlags,
    resolve_defaults,
)
from sim.vllm_real.defaults_grid import GRID_GPUS, GRID_MODELS, grid

LLM = UsageContext.LLM_CLASS


def _resolve(release: str, model: str, gpu: str, **kwargs) -> ResolvedDefaults:
    return resolve_defaults(release, get_model(model), get_gpu(gpu), **kwargs)


def _batch(resolved: ResolvedDefaults) -> tuple[int, int]:
    return resolved.max_num_seqs.value, resolved.max_num_batched_tokens.value


# -- 0.33.0 ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpu", "usage", "expected"),
    [
        # >= 70 GiB and no "a100" in the name: 1024 seqs; 8192 tokens served, 16384 offline.
        ("h100-sxm", UsageContext.API_SERVER, (1024, 8192)),
        ("h100-sxm", LLM, (1024, 16384)),
        # H200: 141 GB x 79.19/80 = 139.6 GiB, under the 160 GiB tier.
        ("h200", UsageContext.API_SERVER, (1024, 8192)),
        # B200: 180 GB -> 178.2 GiB >= 160: 16384 tokens for both contexts.
        ("b200", UsageContext.API_SERVER, (1024, 16384)),
        ("b200", LLM, (1024, 16384)),
        # A100 80GB has the memory but the name keeps it on the small tier (PR #17885).
        ("a100-80gb-sxm", UsageContext.API_SERVER, (256, 2048)),
        ("a100-40gb-sxm", LLM, (256, 8192)),
        ("l40s", UsageContext.API_SERVER, (256, 2048)),
    ],
)
def test_v033_batch_tiers(gpu: str, usage: UsageContext, expected: tuple[int, int]) -> None:
    assert _batch(_resolve("0.33.0", "llama-3.1-8b", gpu, usage=usage)) == expected


def test_v033_h100_api_server_everything() -> None:
    got = _resolve("0.33.0", "llama-3.1-8b", "h100-sxm")
    assert got.values() == {
        "max_num_seqs": 1024,
        "max_num_batched_tokens": 8192,
        "enable_prefix_caching": True,
        "enable_chunked_prefill": True,
        "gpu_memory_utilization": 0.92,
        "block_size": 16,
        "max_model_len": 131072,
        "async_scheduling": True,
        "long_prefill_token_threshold": 0,
        "sliding_window": None,
        "executor": "uni",
    }
    assert {getattr(got, f.name).origin for f in fields(got) if f.name != "release"} == {
        Origin.RELEASE
    }


def test_v033_throughput_mode_doubles_only_what_the_user_left() -> None:
    assert _batch(
        _resolve(
            "0.33.0", "llama-3.1-8b", "h100-sxm", flags=UserFlags(performance_mode="throughput")
        )
    ) == (2048, 16384)
    flags = UserFlags(performance_mode="throughput", max_num_seqs=100)
    assert _batch(_resolve("0.33.0", "llama-3.1-8b", "h100-sxm", flags=flags)) == (100, 16384)


def test_v033_caps() -> None:
    # No chunked prefill: at least one whole sequence, max(4096, 2048) = 4096 (Llama-2, L4).
    flags = UserFlags(enable_chunked_prefill=False)
    got = _resolve("0.33.0", "llama-2-70b", "l4", tp=8, flags=flags)
    assert _batch(got) == (256, 4096)
    assert got.enable_chunked_prefill.origin is Origin.USER
    # A tiny max_model_len caps the batch at seqs x len: min(4 x 256, 2048) = 1024.
    flags = UserFlags(max_num_seqs=4, max_model_len=256)
    assert _batch(_resolve("0.33.0", "llama-3.1-8b", "l4", flags=flags)) == (4, 1024)
    # A user batch below the default seqs pulls max_num_seqs down: min(1024, 100) = 100.
    flags = UserFlags(max_num_batched_tokens=100)
    assert _batch(_resolve("0.33.0", "llama-3.1-8b", "h100-sxm", flags=flags)) == (100, 100)


def test_v033_async_on_with_pipeline_parallelism() -> None:
    """The V2 model runner (a GPU install) keeps async scheduling on with PP > 1."""
    got = _resolve("0.33.0", "llama-3.1-70b", "h100-sxm", tp=4, pp=2)
    assert (got.async_scheduling.value, got.executor.value) == (True, "mp")
    off = _resolve("0.33.0", "llama-3.1-8b", "h100-sxm", flags=UserFlags(async_scheduling=False))
    assert (off.async_scheduling.value, off.async_scheduling.origin) == (False, Origin.USER)


def test_v033_sliding_window_only_when_every_layer_slides() -> None:
    assert _resolve("0.33.0", "mistral-7b-v0.1", "h100-sxm").sliding_window.value == 4096
    assert _resolve("0.33.0", "gemma-2-9b", "h100-sxm").sliding_window.value is None
    flags = UserFlags(disable_sliding_window=True)
    got = _resolve("0.33.0", "mistral-7b-v0.1", "h100-sxm", flags=flags)
    assert (got.sliding_window.value, got.max_model_len.value) == (None, 4096)


# -- 0.11.0 and 4ac7713 ------------------------------------------------------------------------
def test_v011_no_160_gib_tier_and_sync_by_default() -> None:
    got = _resolve("0.11.0", "llama-3.1-8b", "b200")
    assert _batch(got) == (1024, 8192)
    assert (got.gpu_memory_utilization.value, got.async_scheduling.value) == (0.9, False)
    assert _batch(_resolve("4ac7713", "llama-3.1-8b", "a100-80gb-sxm")) == (256, 2048)


def test_v011_chunked_prefill_overrides_the_user() -> None:
    got = _resolve(
        "0.11.0", "llama-3.1-8b", "h100-sxm", flags=UserFlags(enable_chunked_prefill=False)
    )
    assert (got.enable_chunked_prefill.value, got.enable_chunked_prefill.origin) == (
        True,
        Origin.RELEASE,
    )


def test_v011_async_opt_in() -> None:
    got = _resolve("0.11.0", "llama-3.1-8b", "h100-sxm", flags=UserFlags(async_scheduling=True))
    assert (got.async_scheduling.value, got.executor.value) == (True, "mp")
    with pytest.raises(DefaultsError) as err:
        _resolve("0.11.0", "llama-3.1-8b", "h100-sxm", pp=2, flags=UserFlags(async_scheduling=True))
    assert err.value.refusal is Refusal.ASYNC_WITH_PP


# -- 0.5.4 (v0) ------------------------------------------------------------------------------
def test_v054_long_context_chunks_by_default() -> None:
    # 131072 > 32K, no window, no prefix caching: chunked prefill on, so a 512-token batch.
    got = _resolve("0.5.4", "llama-3.1-8b", "h100-sxm")
    assert (_batch(got), got.enable_chunked_prefill.value) == ((256, 512), True)
    assert (got.enable_prefix_caching.value, got.executor.value) == (False, None)
    # Prefix caching on turns the automatic chunking off: one whole 131072-token sequence.
    got = _resolve("0.5.4", "llama-3.1-8b", "h100-sxm", flags=UserFlags(enable_prefix_caching=True))
    assert (_batch(got), got.enable_chunked_prefill.value) == ((256, 131072), False)


def test_v054_windows() -> None:
    # Mistral: 32768 is not > 32K and it has a window: no chunking, max(32768, 2048).
    got = _resolve("0.5.4", "mistral-7b-v0.1", "a100-80gb-sxm")
    assert (_batch(got), got.sliding_window.value) == ((256, 32768), 4096)
    # Gemma-2: interleaved windows unsupported, so the length is capped at the window.
    got = _resolve("0.5.4", "gemma-2-9b", "h100-sxm")
    assert (got.max_model_len.value, got.sliding_window.value, _batch(got)) == (
        4096,
        None,
        (256, 4096),
    )
    with pytest.raises(DefaultsError) as err:
        _resolve("0.5.4", "gemma-2-9b", "h100-sxm", pp=2)
    assert err.value.refusal is Refusal.PP_UNSUPPORTED_ARCH


# -- refusals and inputs ---------------------------------------------------------------------
@pytest.mark.parametrize("release", sorted(RELEASES))
@pytest.mark.parametrize(
    ("model", "tp", "flags", "refusal"),
    [
        ("llama-3.1-8b", 1, UserFlags(max_model_len=200000), Refusal.MAX_MODEL_LEN),
        ("qwen2.5-7b", 8, UserFlags(), Refusal.HEADS_NOT_DIVISIBLE),  # 28 heads
        (
            "llama-3.1-8b",
            1,
            UserFlags(max_num_seqs=4096, max_num_batched_tokens=2048),
            Refusal.BATCH_BELOW_SEQS,
        ),
    ],
)
def test_refusals(release: str, model: str, tp: int, flags: UserFlags, refusal: Refusal) -> None:
    with pytest.raises(DefaultsError) as err:
        _resolve(release, model, "h100-sxm", tp=tp, flags=flags)
    assert err.value.refusal is refusal


def test_user_values_win_and_say_so() -> None:
    flags = UserFlags(max_num_seqs=64, gpu_memory_utilization=0.8, block_size=32)
    for release in RELEASES:
        got = _resolve(release, "llama-3.1-8b", "h100-sxm", flags=flags)
        for name, value in (
            ("max_num_seqs", 64),
            ("gpu_memory_utilization", 0.8),
            ("block_size", 32),
        ):
            assert (getattr(got, name).value, getattr(got, name).origin) == (value, Origin.USER)


def test_flags_a_release_lacks_are_refused() -> None:
    with pytest.raises(InputError, match="async-scheduling"):
        _resolve("0.5.4", "llama-3.1-8b", "h100-sxm", flags=UserFlags(async_scheduling=True))
    with pytest.raises(InputError, match="performance-mode"):
        _resolve(
            "0.11.0", "llama-3.1-8b", "h100-sxm", flags=UserFlags(performance_mode="throughput")
        )
    with pytest.raises(InputError, match="no defaults table"):
        _resolve("0.9.9", "llama-3.1-8b", "h100-sxm")


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_every_release_default_cites_its_lines(release: str) -> None:
    """A release default names the file and lines it follows (or says the release lacks it)."""
    got = _resolve(release, "mistral-7b-v0.1", "h100-sxm", tp=2)
    for f in fields(got):
        if f.name == "release":
            continue
        rule = getattr(got, f.name).rule
        assert re.search(r"\.py( \(|$| L\d+)", rule) or "has no" in rule, (f.name, rule)


# -- the lockstep's grid (pure data) -----------------------------------------------------------
@pytest.mark.parametrize("release", ["0.5.4", "0.11.0", "0.33.0"])
def test_grid_covers_every_dimension(release: str) -> None:
    for cases in (grid(release), grid(release, 300)):
        assert len(cases) >= 200
        assert {c.model for c in cases} == set(GRID_MODELS)
        assert {c.gpu for c in cases} == set(GRID_GPUS)
        assert {c.tp for c in cases} == {1, 2, 4, 8} and {c.pp for c in cases} == {1, 2}
        usages = {c.usage for c in cases}
        assert usages == ({UsageContext.API_SERVER} if release == "0.5.4" else set(UsageContext))
    assert all(c.flags.async_scheduling is None for c in grid("0.5.4"))


def test_defaults_import_no_torch() -> None:
    code = (
        "import sys, sim.scenario.vllm_defaults, sim.vllm_real.defaults_grid; "
        "assert 'torch' not in sys.modules and 'vllm' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_lockstep_comparison_is_not_vacuous() -> None:
    """A different field, a refusal on one side only, or a refusal for another reason is a
    divergence (`defaults_lockstep.same_outcome`; importing it loads no torch)."""
    from sim.vllm_real.defaults_lockstep import same_outcome

    mine = _resolve("0.33.0", "llama-3.1-8b", "h100-sxm").values()
    assert same_outcome(mine, dict(mine))
    assert not same_outcome(mine, {**mine, "max_num_seqs": 256})
    assert not same_outcome("refused: MAX_MODEL_LEN", mine)
    real_text = "refused: ValueError: max_num_batched_tokens (100) must be greater than or equal to max_num_seqs (256)."
    assert same_outcome("refused: BATCH_BELOW_SEQS", real_text)
    assert not same_outcome("refused: HEADS_NOT_DIVISIBLE", real_text)


def test_long_prefill_threshold_above_the_length() -> None:
    """0.33.0 refuses a threshold above max_model_len; 0.11.0 checks it only with concurrent
    partial prefills, which its V1 engine lacks, so it keeps the user's value."""
    flags = UserFlags(long_prefill_token_threshold=16384)
    with pytest.raises(DefaultsError) as err:
        _resolve("0.33.0", "llama-2-70b", "h100-sxm", tp=8, flags=flags)
    assert err.value.refusal is Refusal.LONG_PREFILL_ABOVE_MODEL_LEN
    got = _resolve("0.11.0", "llama-2-70b", "h100-sxm", tp=8, flags=flags)
    assert (got.long_prefill_token_threshold.value, got.long_prefill_token_threshold.origin) == (
        16384,
        Origin.USER,
    )


# -- the 2026-bug pins (found by the defaults lockstep, `kvsim verify --defaults`) -------------
@pytest.mark.parametrize(
    ("release", "batch"),
    [("0.19.1", (1024, 8192)), ("0.26.0", (1024, 8192)), ("0.33.0", (1024, 16384))],
)
def test_b200_batch_tier_is_0_33_0_s_alone_regression_defaults_lockstep(release, batch):
    """The >= 160 GiB tier (16,384 tokens for the API server) arrived in 0.33.0; the 2026 pins
    kept 0.11.0's two tiers, so a B200 gets the H100 table there."""
    assert _batch(_resolve(release, "llama-3.1-8b", "b200")) == batch


@pytest.mark.parametrize(("release", "util"), [("0.19.1", 0.9), ("0.20.0", 0.92)])
def test_gpu_memory_utilization_default_rose_in_0_20_0_regression_defaults_lockstep(release, util):
    assert _resolve(release, "llama-3.1-8b", "h100-sxm").gpu_memory_utilization.value == util


def test_long_prefill_bound_is_0_33_0_s_alone_regression_defaults_lockstep():
    """0.19.1-0.26.0 check the threshold against max_model_len only with partial prefills."""
    flags = UserFlags(long_prefill_token_threshold=16384, max_model_len=8192)
    assert _resolve("0.26.0", "llama-3.1-8b", "h100-sxm", flags=flags).max_model_len.value == 8192
    with pytest.raises(DefaultsError):
        _resolve("0.33.0", "llama-3.1-8b", "h100-sxm", flags=flags)
