"""`kvsim step`: one step's predicted time, its breakdown by term and its band."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from typer.testing import CliRunner

from sim.cli.main import app
from sim.cli.step import breakdown_terms, parse_decodes, parse_prefills
from sim.latency import BatchShape, LinearStepTime
from sim.scenario.schema import ScenarioError

ARGS = ["step", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--step-time", "roofline"]


def _json(*extra: str) -> dict:
    result = CliRunner().invoke(app, [*ARGS, *extra, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_step_matches_the_roofline_worked_example() -> None:
    """64 decodes at 4k on an H100: the roofline docstring's hand computation, 17.64 ms
    (linear 5.27 + attention 12.07 + 0.3 overhead), with its band x1-x1.67."""
    report = _json("--decode", "64x4096")
    assert report["step_time_s"] == pytest.approx(17.64e-3, rel=2e-3)
    terms = report["breakdown_s"]
    assert terms["linear"] == pytest.approx(5.27e-3, rel=2e-3)
    assert terms["attention"] == pytest.approx(12.07e-3, rel=2e-3)
    assert sum(terms.values()) == pytest.approx(report["step_time_s"], rel=1e-12)
    band = report["band"]
    assert band["low_s"] == report["step_time_s"] * band["low_factor"]
    assert band["high_s"] == pytest.approx(report["step_time_s"] * 1.67)
    assert report["batch"]["num_decode_seqs"] == 64
    assert report["details"]["linear_bytes"] == pytest.approx(15.01e9, rel=1e-3)


def test_default_model_terms_sum_to_the_step() -> None:
    """Whatever the default model is, its terms add up to its step and its band brackets it."""
    args = ["step", "--model", "llama-3.1-8b", "--gpu", "h200", "--decode", "64x4096"]
    result = CliRunner().invoke(app, [*args, "--prefill", "1x512@1024", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert sum(report["breakdown_s"].values()) == pytest.approx(report["step_time_s"], rel=1e-9)
    band = report["band"]
    assert band["low_s"] <= report["step_time_s"] <= band["high_s"]


def test_step_text_output_and_tp() -> None:
    result = CliRunner().invoke(
        app, [*ARGS, "--tp", "2", "--decode", "64x4096", "--prefill", "1x2048"]
    )
    assert result.exit_code == 0, result.output
    assert "step time" in result.output and "band x1-x1.67" in result.output
    for term in ("linear", "attention", "allreduce", "overhead"):
        assert term in result.output
    report = _json("--tp", "2", "--decode", "64x4096", "--prefill", "1x2048")
    assert report["breakdown_s"]["allreduce"] > 0  # only with tp > 1
    assert report["batch"]["num_tokens"] == 64 + 2048


def test_prefill_prior_context_costs_more() -> None:
    fresh = _json("--prefill", "1x512")
    later = _json("--prefill", "1x512@8192")
    assert later["breakdown_s"]["attention"] > fresh["breakdown_s"]["attention"]
    assert later["breakdown_s"]["linear"] == fresh["breakdown_s"]["linear"]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--decode", "64by4096"], "--decode '64by4096'"),
        (["--prefill", "1x0"], "--prefill '1x0'"),
        (["--prefill", "1x2048@"], "--prefill '1x2048@'"),
        (["--decode", "1x1", "--step-time", "nonsense"], "--step-time 'nonsense'"),
        (["--decode", "1x1", "--step-time", "missing.json"], "missing.json"),
        (["--decode", "1x1", "--tp", "0"], "--tp 0"),
        (["--decode", "1x1", "--vllm-version", "0.5.4"], "--vllm-version"),
        ([], "at least one --decode or --prefill"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle) -> None:
    result = CliRunner().invoke(app, [*ARGS, *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output


def test_unknown_model_and_gpu() -> None:
    for option, value in (("--model", "nope-7b"), ("--gpu", "tpu-v9")):
        args = [*ARGS, "--decode", "1x1"]
        args[args.index(option) + 1] = value
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2 and value in result.output


@given(st.lists(st.tuples(st.integers(0, 300), st.integers(0, 10**6)), max_size=5))
def test_parse_decodes_counts_and_contexts(pairs) -> None:
    contexts = parse_decodes([f"{n}x{c}" for n, c in pairs])
    assert len(contexts) == sum(n for n, _ in pairs)
    assert sum(contexts) == sum(n * c for n, c in pairs)


def test_parse_prefills() -> None:
    assert parse_prefills(["1x2048", "2x512@1024"]) == ((0, 2048), (1024, 512), (1024, 512))
    with pytest.raises(ScenarioError, match="COUNTxTOKENS"):
        parse_prefills(["2048"])


def test_breakdown_of_models_without_one_or_with_a_dict() -> None:
    batch = BatchShape((100,), ())
    linear = LinearStepTime(0.005, per_decode_seq_s=1e-4)
    assert breakdown_terms(linear, batch) == ({"total": pytest.approx(0.0051)}, {})

    class DictModel:
        def predict_s(self, batch):
            return 0.003

        def breakdown(self, batch):
            return {"gemm_s": 0.002, "overhead_s": 0.001, "total_s": 0.003, "tokens": 1}

    terms, details = breakdown_terms(DictModel(), batch)
    assert terms == {"gemm": 0.002, "overhead": 0.001}  # total_s is not a term
    assert details == {"tokens": 1.0}


def test_vllm_version_picks_the_all_reduce_backends_as_a_scenario_does() -> None:
    """Default (0.33.0) and 0.11.0 charge a one-token decode at TP 2 the custom one-shot
    latency; 4ac7713 (a pin sim.latency.allreduce does not mirror) keeps NCCL's fit."""
    from sim.latency import allreduce as ar

    args = ["step", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "2"]
    reports = {}
    for version in (None, "0.11.0", "4ac7713"):
        extra = [] if version is None else ["--vllm-version", version]
        result = CliRunner().invoke(app, [*args, "--decode", "1x1024", *extra, "--json"])
        assert result.exit_code == 0, result.output
        reports[version] = json.loads(result.output)
    assert reports[None]["vllm_version"] == "0.33.0"
    one_shot = 64 * (ar.ONE_SHOT_LATENCY_S + 8192 / (ar.ONE_SHOT_PEER_GBPS * 1e9))
    assert reports[None]["breakdown_s"]["allreduce"] == pytest.approx(one_shot)
    assert reports["0.11.0"]["breakdown_s"]["allreduce"] == pytest.approx(one_shot)
    assert reports["4ac7713"]["breakdown_s"]["allreduce"] > 3 * one_shot
