"""kvsim's derived KV pool against real vLLM startup logs (sim/data/vllm_startup_logs.yaml).

Tolerance, per log: |predicted - observed pool| <= max(1.0 GiB, 3% of the pool). 3% is the
scale of the issue's target (median 2%). 1 GiB is how far the terms kvsim estimates move
between vLLM releases for one model and GPU (non-torch at TP 1: 0.13 GiB in 0.11, 1.79 GiB in a
0.6.5 build; the sampler's profile with and without FlashInfer: ~3x), while the activations
the fit half logged are matched within 0.10 GiB. Logs outside it are listed in KNOWN_OUTLIERS
with the reason; the test fails if one of them comes back inside (so the list cannot rot) or
a new one falls outside.
"""

import statistics

import pytest

from sim.memory import validation as memory_validation
from sim.memory.terms import ACTIVATION_FIT, GIB, NON_TORCH_GIB
from sim.memory.validation import (
    PROFILED_RELEASE,
    Split,
    compare_all,
    fit_activation,
    fit_non_torch_gib,
    load_logs,
    observed_pool_bytes,
)

KNOWN_OUTLIERS = {
    "gateway550-llama2-7b-h100": "LoRA adapters: vLLM logged 2.38 GiB activation, kvsim 0.35",
    "i21348-qwen3-235b-a22b-fp8-h100-tp4": "LMCache KV connector; four launch fields assumed",
    "pr10511-llama3-8b-h100-tp2": "0.6.5 development build logged 3.58 GiB non-torch at TP 2",
    "pr2031-llama2-70b-a100-tp4": "vLLM 0.2.5 at TP 4: 12.8 GiB more than any later profiler",
}

#: What benchmarks/memory_accuracy.py prints and the report claims (fractions).
CLAIMED = {
    "held_out": {"count": 13, "median": 0.0110, "worst": 0.1085},
    "fit": {"count": 14, "median": 0.0147, "worst": 0.5031},
    "held_out_recent": {"count": 12, "median": 0.0111, "worst": 0.1085},
    # issue #24's target (median <= 2% on held-out logs of vLLM >= 0.11); three sources
    "held_out_0_11": {"count": 6, "median": 0.0073, "worst": 0.1085},
    # the releases whose sampler peak is derived from code (0.19.1+): two logs, two sources
    "held_out_0_19": {"count": 2, "median": 0.0229, "worst": 0.0348},
    "held_out_before": {"median": 0.1451},
}

ROWS = compare_all()


def test_at_least_20_logs_each_with_a_source_split_half_and_half():
    logs = load_logs()
    assert len(logs) >= 20
    assert all(log.source.startswith("https://") for log in logs)
    assert len({log.id for log in logs}) == len(logs)
    splits = [c.split for c in ROWS]
    assert abs(splits.count(Split.FIT) - splits.count(Split.HELD_OUT)) <= 1


@pytest.mark.parametrize("row", ROWS, ids=[c.log.id for c in ROWS])
def test_each_log_within_tolerance_or_a_known_outlier(row):
    error_gib = abs(row.after_gib - row.observed_gib)
    inside = error_gib <= max(1.0, 0.03 * row.observed_gib)
    if row.log.id in KNOWN_OUTLIERS:
        assert not inside, f"{row.log.id} is now within tolerance: drop it from KNOWN_OUTLIERS"
    else:
        assert inside, f"{row.log.id}: {row.after_gib:.2f} GiB vs {row.observed_gib:.2f} GiB"


def _summary(rows, attr="after_error"):
    errors = [abs(getattr(c, attr)) for c in rows]
    return len(errors), statistics.median(errors), max(errors)


def test_the_benchmark_claims():
    held = [c for c in ROWS if c.split is Split.HELD_OUT]
    fit = [c for c in ROWS if c.split is Split.FIT]
    recent = [c for c in held if c.log.release >= PROFILED_RELEASE]
    current = [c for c in held if c.log.release >= (0, 11)]
    newest = [c for c in held if c.log.release >= (0, 19)]
    named = (("held_out", held), ("fit", fit), ("held_out_recent", recent),
             ("held_out_0_11", current), ("held_out_0_19", newest))  # fmt: skip
    for name, rows in named:
        count, median, worst = _summary(rows)
        claim = CLAIMED[name]
        assert count == claim["count"]
        assert median == pytest.approx(claim["median"], abs=5e-5)
        assert worst == pytest.approx(claim["worst"], abs=5e-5)
    _, before_median, _ = _summary(held, "before_error")
    assert before_median == pytest.approx(CLAIMED["held_out_before"]["median"], abs=5e-5)


def test_shipped_constants_are_what_the_fit_half_gives():
    non_torch = fit_non_torch_gib()
    assert non_torch == NON_TORCH_GIB
    assert fit_activation(non_torch) == ACTIVATION_FIT


def test_fit_ignores_the_held_out_half(monkeypatch):
    """Changing every held-out log's numbers must not move a fitted constant."""
    logs = load_logs()
    altered = []
    for log in logs:
        if log.split is Split.HELD_OUT:
            logged = log.logged.model_copy(
                update={
                    "non_torch_gib": 9.0,
                    "activation_gib": 9.0,
                    "kv_cache_gib": 1.0,
                    "kv_cache_tokens": None,
                    "num_gpu_blocks": None,
                }  # fmt: skip
            )
            log = log.model_copy(update={"logged": logged})
        altered.append(log)
    monkeypatch.setattr(memory_validation, "load_logs", lambda: altered)
    non_torch = fit_non_torch_gib()
    assert non_torch == NON_TORCH_GIB
    assert fit_activation(non_torch) == ACTIVATION_FIT


def test_observed_pool_prefers_the_token_count_vllm_scheduled_with():
    """Tokens x bytes per token when logged (the binding number), else the GiB line."""
    log = next(x for x in load_logs() if x.id == "dl-qwen2-7b-a100-80gb-util025")
    per_token = 2 * 28 * 4 * 128 * 2  # Qwen2-7B: 28 layers, 4 KV heads, head_dim 128, bf16
    assert observed_pool_bytes(log) == 93_872 * per_token
    assert observed_pool_bytes(log) / GIB == pytest.approx(log.logged.kv_cache_gib, abs=0.005)


def test_before_used_the_datasheet_and_after_the_driver_figure():
    row = next(c for c in ROWS if c.log.id == "llmd-llama31-8b-h100")
    # Same weights (14.96 GiB) both times; the old code had 0.9 x 0.81 GiB more memory and
    # less activation, so its pool was bigger than vLLM's.
    assert row.before_gib > row.observed_gib
    assert abs(row.after_error) < abs(row.before_error)


def test_the_docs_quote_the_0_11_target_row():
    """docs/accuracy.md's sentence on issue #24's pool target quotes the benchmark's row."""
    from pathlib import Path

    current = [c for c in ROWS if c.split is Split.HELD_OUT and c.log.release >= (0, 11)]
    count, median, _ = _summary(current)
    words = {4: "four", 5: "five", 6: "six", 7: "seven"}
    docs = (Path(__file__).resolve().parents[2] / "docs" / "accuracy.md").read_text("utf-8")
    quoted = f"is met on the {words.get(count, count)} there are ({100 * median:.1f} %:"
    assert quoted in " ".join(docs.split()), quoted
    assert median <= 0.02


def test_logs_of_0_19_and_later_are_replayed_not_skipped():
    """Every log of a release >= 0.19 is compared (a pool predicted under that release's
    sampler path, not the 0.11 default) and has its source and licence note."""
    from sim.memory.terms import SamplerPath

    newest = [c for c in ROWS if c.log.release >= (0, 19)]
    assert {c.log.id for c in newest} >= {"myoceane-gpt-oss-20b-a100-80gb-util065"}
    for c in newest:
        assert c.log.license and c.log.source.startswith("https://")
        assert c.observed_gib > 0 and c.after_gib > 0
        # 256 rows, FlashInfer off by 0.19's default: the Triton top-k/top-p path
        assert SamplerPath.V1_TRITON in c.log.sampler_paths
    row = next(c for c in newest if c.log.id == "myoceane-gpt-oss-20b-a100-80gb-util065")
    assert row.split is Split.HELD_OUT  # as the YAML records it, not chosen here
    assert row.observed_gib == pytest.approx(36.56, abs=0.005)


def test_the_docs_quote_the_0_19_held_out_row():
    """docs/accuracy.md's sentence on the newest releases quotes the benchmark's row."""
    from pathlib import Path

    newest = [c for c in ROWS if c.split is Split.HELD_OUT and c.log.release >= (0, 19)]
    count, median, _ = _summary(newest)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "accuracy.md").read_text("utf-8")
    quoted = f"held-out logs of vLLM >= 0.19: {count}, median |error| {100 * median:.1f} %"
    assert quoted in " ".join(docs.split()), quoted


def test_the_0_19_gpt_oss_log_checks_the_triton_sampler_path():
    """docs/accuracy.md: with the MXFP4 experts in Marlin's layout the 0.19.0 A100 log's
    weights match vLLM's within 0.1 GiB, and the Triton sampler path kvsim derives for 0.19
    (0.72 GiB) lands closer than 0.11's sort path (1.87 GiB) would: +1.1 % against -2.0 %."""
    from sim.memory.terms import SamplerPath, estimate_peak_activation_bytes

    row = next(c for c in ROWS if c.log.id == "myoceane-gpt-oss-20b-a100-80gb-util065")
    budget = memory_validation.predicted_budget(row.log)
    assert abs(row.log.logged.weights_gib - budget.weight_bytes / GIB) < 0.1
    sort = estimate_peak_activation_bytes(
        row.log.model_spec, max_num_batched_tokens=2048, max_num_seqs=256,
        sampler=SamplerPath.V1_PYTORCH,
    )  # fmt: skip
    assert sort / GIB == pytest.approx(1.87, abs=0.01)
    assert budget.peak_activation_bytes / GIB == pytest.approx(0.72, abs=0.01)
    sort_pool_gib = row.after_gib - (sort - budget.peak_activation_bytes) / GIB
    assert row.after_error == pytest.approx(0.011, abs=0.001)
    assert (sort_pool_gib - row.observed_gib) / row.observed_gib == pytest.approx(-0.020, abs=0.001)


def test_marlin_padding_brings_the_a100_gpt_oss_120b_log_in():
    """docs/accuracy.md: the 0.10.1 gpt-oss-120b log at TP 4 on A100s counts 17.13 GiB of
    weights against vLLM's 17.22 (15.17 unpadded) and misses by -0.6 % (was +3.7 %)."""
    from sim.memory.terms import weight_bytes

    row = next(c for c in ROWS if c.log.id == "dl-gpt-oss-120b-a100-80gb-tp4-util08")
    budget = memory_validation.predicted_budget(row.log)
    assert budget.weight_bytes / GIB == pytest.approx(17.13, abs=0.005)
    assert weight_bytes(row.log.model_spec, "mxfp4", 4) / GIB == pytest.approx(15.17, abs=0.005)
    assert row.after_error == pytest.approx(-0.006, abs=0.001)
