"""kvsim's dataset lengths, prefix order and send times equal what vLLM 0.33.0's own code draws.

The release's functions run from its source (`source_exec.release_code`): `get_sampling_params`
(what `RandomDataset.sample` draws first from its fresh `default_rng(seed)`),
`PrefixRepetitionRandomDataset` (with a tokenizer stand-in whose decode is the identity), and
`get_request` with the benchmark's seeding (`np.random.seed(seed)`, as `main_async` does) on a
fake clock.
"""

from __future__ import annotations

import asyncio
import math
import random
import types
from collections.abc import AsyncGenerator, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.vllm_bench.arrivals import send_times
from sim.vllm_bench.datasets import DatasetError, prefix_repetition_dataset, random_dataset
from tests.harness.vllm_install import root_or_skip
from tests.vllm_bench.source_exec import release_code

pytestmark = pytest.mark.vllm


@dataclass
class _Sample:  # the fields of vLLM's SampleRequest these functions set
    prompt: Any
    prompt_len: int
    expected_output_len: int
    timestamp: float | None = None


class _Tokenizer:
    def __init__(self, num_special: int, vocab_size: int = 32000) -> None:
        self.num_special = num_special
        self.vocab_size = vocab_size

    def num_special_tokens_to_add(self) -> int:
        return self.num_special

    def decode(self, tokens: list[int]) -> tuple[int, ...]:
        return tuple(tokens)


def _utils() -> dict[str, Any]:
    root = root_or_skip("0.33.0")
    ns: dict[str, Any] = {"np": np, "math": math, "logger": types.SimpleNamespace(info=print),
                          "RangeRatio": Any, "TokenizerLike": Any}  # fmt: skip
    path = root / "vllm/benchmarks/datasets/utils.py"
    return release_code(path, ("_resolve_range_ratios", "get_sampling_params"), ns)


@settings(max_examples=60, deadline=None)
@given(
    num=st.integers(1, 50),
    input_len=st.integers(4, 3000),
    output_len=st.integers(1, 500),
    ratio=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
    prefix_len=st.integers(0, 64),
    special=st.integers(0, 2),
    seed=st.integers(0, 2**31),
)
def test_random_lengths_are_the_releases(
    num, input_len, output_len, ratio, prefix_len, special, seed
) -> None:
    utils = _utils()
    inputs, outputs, _ = utils["get_sampling_params"](
        np.random.default_rng(seed), num, ratio, input_len, output_len, _Tokenizer(special)
    )
    kwargs = dict(num_prompts=num, input_len=input_len, output_len=output_len,
                  range_ratio=ratio, prefix_len=prefix_len, seed=seed,
                  num_special_tokens=special)  # fmt: skip
    if (
        prefix_len + math.floor(max(0, input_len - special) * (1 - ratio)) < 1
    ):  # RandomDataset.sample refuses such lengths before drawing (L598-613)
        with pytest.raises(DatasetError, match="too small"):
            random_dataset(**kwargs)
        return
    ours = random_dataset(**kwargs)
    assert [r.input_len for r in ours] == [prefix_len + int(i) for i in inputs]
    assert [r.output_len for r in ours] == [int(o) for o in outputs]
    assert {r.prefix_id for r in ours} == ({0} if prefix_len else {None})


def _prefix_repetition() -> type:
    root = root_or_skip("0.33.0")

    class _Base:
        def __init__(self, random_seed: int = 0, **kwargs: Any) -> None:
            self.random_seed = random_seed

    def decode_to_target(tokenizer, token_sequence, target_token_len, add_special_tokens, rng=None):
        return None, token_sequence, 0

    ns: dict[str, Any] = {"np": np, "random": random, "BenchmarkDataset": _Base,
                          "TokenizerLike": Any, "SampleRequest": _Sample,
                          "gen_prompt_decode_to_target_len": decode_to_target,
                          "logger": types.SimpleNamespace(warning=print)}  # fmt: skip
    path = root / "vllm/benchmarks/datasets/datasets.py"
    return release_code(path, ("PrefixRepetitionRandomDataset",), ns)[
        "PrefixRepetitionRandomDataset"
    ]


@settings(max_examples=25, deadline=None)
@given(num=st.integers(1, 60), prefixes=st.integers(1, 8), seed=st.integers(0, 10**6))
def test_prefix_repetition_order_is_the_releases(num: int, prefixes: int, seed: int) -> None:
    if num < prefixes:
        return
    dataset = _prefix_repetition()(random_seed=seed)
    theirs = dataset.sample(_Tokenizer(0), num, prefix_len=4, suffix_len=3,
                            num_prefixes=prefixes, output_len=5)  # fmt: skip
    ours = prefix_repetition_dataset(num_prompts=num, prefix_len=4, suffix_len=3,
                                     num_prefixes=prefixes, output_len=5, seed=seed,
                                     num_special_tokens=0)  # fmt: skip
    assert len(ours) == len(theirs) == prefixes * (num // prefixes)
    # Same grouping in the same order: positions sharing a prefix in vLLM's list share one here.
    groups_theirs = _groups([r.prompt[:4] for r in theirs])
    groups_ours = _groups([r.prefix_id for r in ours])
    assert groups_ours == groups_theirs
    assert all(r.input_len == 7 and r.output_len == 5 for r in ours)


def _groups(keys: list) -> list[int]:
    """Each position's group as the index of the group's first appearance (a relabelling)."""
    first: dict = {}
    return [first.setdefault(k, len(first)) for k in keys]


def _release_send_times(num: int, rate: float, burstiness: float, seed: int) -> list[float]:
    root = root_or_skip("0.33.0")
    clock = {"now": 1000.0}

    async def sleep(seconds: float) -> None:
        clock["now"] += seconds

    fake_time = types.SimpleNamespace(time=lambda: clock["now"])
    fake_asyncio = types.SimpleNamespace(sleep=sleep)
    ns: dict[str, Any] = {"np": np, "time": fake_time, "asyncio": fake_asyncio,
                          "Literal": Literal, "Iterable": Iterable,
                          "AsyncGenerator": AsyncGenerator, "SampleRequest": _Sample}  # fmt: skip
    code = release_code(
        root / "vllm/benchmarks/serve.py", ("_get_current_request_rate", "get_request"), ns
    )
    np.random.seed(seed)  # main_async: random.seed(args.seed); np.random.seed(args.seed)
    requests = [_Sample("p", 1, 1) for _ in range(num)]

    async def collect() -> list[float]:
        return [
            clock["now"] - 1000.0 async for _ in code["get_request"](requests, rate, burstiness)
        ]

    return asyncio.run(collect())


@settings(max_examples=40, deadline=None)
@given(
    num=st.integers(1, 80),
    rate=st.sampled_from([0.5, 3.0, 40.0, math.inf]),
    burstiness=st.sampled_from([0.2, 1.0, 4.0, math.inf]),
    seed=st.integers(0, 2**31),
)
def test_send_times_are_the_releases(num: int, rate: float, burstiness: float, seed: int) -> None:
    theirs = _release_send_times(num, rate, burstiness, seed)
    ours = send_times(num, request_rate=rate, burstiness=burstiness, seed=seed)
    assert ours == pytest.approx(theirs, abs=1e-9)
