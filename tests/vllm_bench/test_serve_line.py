"""A `vllm serve` line is parsed as the release's FlexibleArgumentParser parses it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.vllm_bench.serve_line import ServeLineError, parse_serve_line


def test_equals_and_space_forms_and_underscores_give_the_same_values() -> None:
    a = parse_serve_line("vllm serve m --max-num-seqs 64 --gpu-memory-utilization 0.8", "0.33.0")
    b = parse_serve_line("vllm serve m --max_num_seqs=64 --gpu_memory_utilization=0.8", "0.33.0")
    assert a.values == b.values == {"max_num_seqs": "64", "gpu_memory_utilization": "0.8"}


@pytest.mark.parametrize(
    ("flag", "version", "value"),
    [
        ("--enable-prefix-caching", "0.33.0", True),
        ("--no-enable-prefix-caching", "0.33.0", False),
        ("--disable-prefix-caching", "0.33.0", False),
        ("--no-enable-prefix-caching", "0.11.0", False),
        ("--enable-prefix-caching", "0.11.0", True),
    ],  # fmt: skip
)
def test_boolean_options_and_their_negative_forms(flag: str, version: str, value: bool) -> None:
    assert (
        parse_serve_line(f"vllm serve m {flag}", version).values["enable_prefix_caching"] is value
    )


def test_disable_forms_are_0_33_0s_only() -> None:
    with pytest.raises(ServeLineError, match="unrecognized arguments: --disable-prefix-caching"):
        parse_serve_line("vllm serve m --disable-prefix-caching", "0.11.0")


def test_model_option_moves_to_the_front_and_short_flags_work() -> None:
    args = parse_serve_line("vllm serve -tp 2 --model org/m --port 8001", "0.33.0")
    assert args.model == "org/m"
    assert args.values == {"tensor_parallel_size": "2", "port": "8001"}
    assert args.spelled["tensor_parallel_size"] == "-tp"


def test_json_valued_and_dotted_options_become_one_json_value() -> None:
    import json

    a = parse_serve_line(
        "vllm serve m --compilation-config.mode 3 --compilation-config.x=a", "0.33.0"
    )
    assert json.loads(a.values["compilation_config"]) == {"mode": 3, "x": "a"}
    b = parse_serve_line("""vllm serve m --speculative-config '{"method": "ngram"}'""", "0.33.0")
    assert json.loads(b.values["speculative_config"]) == {"method": "ngram"}


def test_optimization_level_short_forms() -> None:
    for text in ("-O3", "-O=3", "-O 3"):
        assert (
            parse_serve_line(f"vllm serve m {text}", "0.33.0").values["optimization_level"] == "3"
        )


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("vllm serve m --bogus 1", "unrecognized arguments: --bogus"),
        ("vllm serve m --max-num-seqs", "expected one argument"),
        ("python serve.py m", "start with `vllm serve`"),
        ("vllm serve --port 1", "no model"),
        ("vllm serve m --config c.yaml", "--config"),
        ("vllm serve m 'unclosed", "cannot split"),
    ],  # fmt: skip
)
def test_bad_lines_are_one_line_errors(line: str, message: str) -> None:
    with pytest.raises(ServeLineError, match=message) as caught:
        parse_serve_line(line, "0.33.0")
    assert "\n" not in str(caught.value)


OPTIONS = ["--max-num-seqs 8", "--block-size 32", "--port 9000", "--enable-chunked-prefill",
           "--no-enable-prefix-caching", "-tp 2", "--max-model-len 4k", "--api-key k"]  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.permutations(OPTIONS), st.integers(0, len(OPTIONS)))
def test_the_order_of_options_does_not_matter(order: list[str], model_at: int) -> None:
    words = list(order)
    words.insert(model_at, "--model m")
    shuffled = parse_serve_line("vllm serve " + " ".join(words), "0.33.0")
    first = parse_serve_line("vllm serve m " + " ".join(OPTIONS), "0.33.0")
    assert (shuffled.model, shuffled.values) == (first.model, first.values)
    assert len(shuffled.values) == len(OPTIONS)
