"""The prompts `vllm bench serve` sends, as kvsim needs them: lengths and shared prefixes.

vLLM 0.33.0 `vllm/benchmarks/datasets/` (`datasets.py`, `utils.py`); kvsim never sees text, so
each dataset keeps what decides scheduling and KV use: the prompt length, the output length
(these datasets ignore EOS or fix the length, so it is exact) and which prompts share a prefix.

* `random` (`RandomDataset.sample`, datasets.py L581-689; `get_sampling_params`, utils.py
  L39-107): with `g = numpy.random.default_rng(seed)`, input lengths are
  `g.integers(floor(r * (1 - q)), ceil(r * (1 + q)) + 1, n)` with `r = input_len -
  num_special_tokens` and `q` the input range ratio, then output lengths likewise around
  `output_len` (at least 1); every prompt starts with the same `prefix_len` random tokens (one
  prefix, generated once). A prompt is `prefix_len + input_len_i` tokens as the client counts
  it; the server adds the tokenizer's special tokens (`num_special_tokens`, e.g. Llama's BOS).
  Left out: the decode/re-encode step that can shift a prompt by a token or two
  (`gen_prompt_decode_to_target_len`, tokenizer-dependent).
* `prefix_repetition` (`PrefixRepetitionRandomDataset.sample`, L4197-4266): `num_prefixes`
  prefixes of `prefix_len` tokens, each with `num_prompts // num_prefixes` prompts of
  `suffix_len` more tokens (so `num_prompts` is rounded down to a multiple), then shuffled with
  Python's `random` seeded with `seed` (the list order only depends on its length, so
  shuffling indices gives the release's order).
* `sharegpt` (`ShareGPTDataset`, L1327-1414): the lengths need the model's tokenizer, which
  kvsim does not run; give the lengths file `python -m sim.workload.sharegpt_vllm` writes (it
  applies the release's shuffle and filter with your tokenizer), taken in its order, oversampled
  as vLLM does (`maybe_oversample_requests`, L289-337) when it has fewer rows than asked.
* `sonnet`: gone from 0.33.0's dataset choices (L1592-1611), and it needs a tokenizer anyway.

Example::

    >>> reqs = random_dataset(num_prompts=3, input_len=100, output_len=10, range_ratio=0.5,
    ...                       prefix_len=0, seed=0, num_special_tokens=1)
    >>> [(r.input_len, r.output_len) for r in reqs]
    [(134, 7), (113, 8), (100, 5)]
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.errors import InputError

DATASETS = ("random", "sharegpt", "sonnet", "prefix_repetition")


class DatasetError(InputError):
    """A dataset option `vllm bench serve` would refuse, or one kvsim cannot sample."""


@dataclass(frozen=True, slots=True)
class BenchRequest:
    """One prompt: `input_len` tokens as the client counts them (what vLLM reports), the
    tokens the server adds (`num_special_tokens`), the output, and the shared prefix
    (`prefix_id` None: nothing shared)."""

    input_len: int
    output_len: int
    prefix_id: int | None = None
    prefix_len: int = 0
    num_special_tokens: int = 0

    @property
    def server_prompt_tokens(self) -> int:
        return self.input_len + self.num_special_tokens


def _range_ratios(text: str) -> tuple[float, float]:
    """`--random-range-ratio`: a float or `{"input": a, "output": b}` (utils.py L19-36)."""
    try:
        ratio = float(text)
        return ratio, ratio
    except ValueError:
        pass
    try:
        value = json.loads(text)
        return float(value["input"]), float(value["output"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError):
        raise DatasetError(
            f'--random-range-ratio {text}: give a number or {{"input": a, "output": b}}'
        ) from None


def random_dataset(
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    range_ratio: str | float,
    prefix_len: int,
    seed: int,
    num_special_tokens: int,
) -> list[BenchRequest]:
    """The random dataset's lengths (see the module docstring)."""
    q_in, q_out = _range_ratios(str(range_ratio))
    for name, q in (("input", q_in), ("output", q_out)):
        if not 0.0 <= q < 1.0:
            raise DatasetError(f"--random-range-ratio: the {name} ratio must be in [0, 1), got {q}")
    real_input = max(0, input_len - num_special_tokens)
    low, high = math.floor(real_input * (1 - q_in)), math.ceil(real_input * (1 + q_in))
    if prefix_len + low < 1:
        raise DatasetError(
            f"--random-input-len {input_len} is too small: with {num_special_tokens} special "
            "tokens the shortest prompt has no token"
        )
    out_low = max(math.floor(output_len * (1 - q_out)), 1)
    out_high = max(math.ceil(output_len * (1 + q_out)), 1)
    rng = np.random.default_rng(seed)
    inputs = rng.integers(low, high + 1, size=num_prompts)
    outputs = rng.integers(out_low, out_high + 1, size=num_prompts)
    prefix_id = 0 if prefix_len > 0 else None
    return [
        BenchRequest(prefix_len + int(i), int(o), prefix_id, prefix_len, num_special_tokens)
        for i, o in zip(inputs, outputs, strict=True)
    ]


def prefix_repetition_dataset(
    *,
    num_prompts: int,
    prefix_len: int,
    suffix_len: int,
    num_prefixes: int,
    output_len: int,
    seed: int,
    num_special_tokens: int,
) -> list[BenchRequest]:
    """The prefix-repetition dataset (see the module docstring)."""
    per_prefix = num_prompts // num_prefixes if num_prefixes > 0 else 0
    if per_prefix == 0:
        raise DatasetError(
            f"--num-prompts {num_prompts} must be at least "
            f"--prefix-repetition-num-prefixes {num_prefixes}"
        )
    requests = [
        BenchRequest(prefix_len + suffix_len, output_len, p, prefix_len, num_special_tokens)
        for p in range(num_prefixes)
        for _ in range(per_prefix)
    ]
    order = list(range(len(requests)))
    random.Random(seed).shuffle(order)
    return [requests[i] for i in order]


def sharegpt_dataset(path: Path, *, num_prompts: int, seed: int) -> list[BenchRequest]:
    """ShareGPT from a lengths file (see the module docstring)."""
    from sim.workload.loaders import load_lengths

    if path.suffix.lower() == ".json":
        raise DatasetError(
            f"{path}: ShareGPT conversations need the model's tokenizer, which kvsim does not "
            "run; write their lengths first: python -m sim.workload.sharegpt_vllm "
            f"{path} --tokenizer MODEL -o lengths.csv (then --dataset-path lengths.csv)"
        )
    samples = load_lengths(path)
    pairs = list(zip(samples.prompt_tokens.tolist(), samples.output_tokens.tolist(), strict=True))
    chosen = pairs[:num_prompts]
    if len(chosen) < num_prompts:  # maybe_oversample_requests: random.seed(seed); choice
        rng = random.Random(seed)
        chosen += [rng.choice(chosen) for _ in range(num_prompts - len(chosen))]
    # The file's counts are the tokenizer's own (special tokens included), as vLLM counts them.
    return [BenchRequest(int(p), int(o)) for p, o in chosen]
