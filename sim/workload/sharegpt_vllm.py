"""ShareGPT lengths as vLLM's serving benchmark samples them, written as a lengths CSV.

kvsim bundles Sarathi-Serve's ShareGPT lengths (`traces/length_distributions/
sharegpt_8k_filtered_stats_llama2_tokenizer.csv`: conversations up to ~8k tokens, prompts
averaging 2,340 tokens). vLLM's own benchmark (`vllm bench serve --dataset-name sharegpt`,
formerly `benchmarks/benchmark_serving.py`) samples the same dataset very differently, and its
prompts average about 230 tokens: vLLM PR #18566 printed 229,711 input tokens for 1,000
prompts with the Llama-3.1-8B tokenizer (https://github.com/vllm-project/vllm/pull/18566).
No public file of those per-request lengths exists, and the conversations themselves are not
redistributable here, so this module regenerates them from your own copy of the dataset.

The rules (vLLM 0.11.0 `vllm/benchmarks/datasets.py`: `ShareGPTDataset` L928-1008 and
`is_valid_sequence` L254-278; the same since the original `sample_sharegpt_requests`):

1. keep conversations with at least two turns;
2. shuffle them with Python's `random` seeded with the benchmark seed (default 0);
3. walk them in order: prompt = turn 0, completion = turn 1, each tokenized with the model's
   tokenizer (`len(tokenizer(text).input_ids)`, special tokens included);
4. skip a pair when prompt < 4 or completion < 4 tokens, prompt > 1024 tokens, or
   prompt + completion > 2048 tokens; stop at `num_prompts` pairs (default 1000).

Usage (needs `transformers` and the dataset; neither is a kvsim dependency)::

    python -m sim.workload.sharegpt_vllm ShareGPT_V3_unfiltered_cleaned_split.json \\
        --tokenizer meta-llama/Llama-3.1-8B-Instruct -o sharegpt_vllm_bench_llama3.csv

The dataset file is `ShareGPT_V3_unfiltered_cleaned_split.json` from the Hugging Face dataset
`anon8231489123/ShareGPT_Vicuna_unfiltered`. The CSV loads with `format: lengths`.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sim.files.outdir import staged_file


@dataclass(frozen=True, slots=True)
class ShareGptRules:
    """vLLM's `is_valid_sequence` defaults (token counts)."""

    min_tokens: int = 4
    max_prompt_tokens: int = 1024
    max_total_tokens: int = 2048

    def keeps(self, prompt_tokens: int, output_tokens: int) -> bool:
        """Example: (1024, 1024) is kept, (1025, 4) and (1000, 1049) are not."""
        return (
            prompt_tokens >= self.min_tokens
            and output_tokens >= self.min_tokens
            and prompt_tokens <= self.max_prompt_tokens
            and prompt_tokens + output_tokens <= self.max_total_tokens
        )


def sample_vllm_sharegpt(
    conversations: Iterable[dict],
    count_tokens: Callable[[str], int],
    *,
    num_prompts: int = 1000,
    seed: int = 0,
    rules: ShareGptRules = ShareGptRules(),
) -> list[tuple[int, int]]:
    """(prompt_tokens, output_tokens) pairs in the order vLLM's benchmark would send them."""
    if num_prompts <= 0:
        raise ValueError(f"num_prompts must be positive, got {num_prompts}")
    entries = [e for e in conversations if len(e.get("conversations", ())) >= 2]
    # vLLM seeds the module-level generator and shuffles; a fresh Random(seed) draws the same.
    random.Random(seed).shuffle(entries)
    pairs: list[tuple[int, int]] = []
    for entry in entries:
        if len(pairs) >= num_prompts:
            break
        turns = entry["conversations"]
        prompt_tokens = count_tokens(turns[0]["value"])
        output_tokens = count_tokens(turns[1]["value"])
        if rules.keeps(prompt_tokens, output_tokens):
            pairs.append((prompt_tokens, output_tokens))
    return pairs


def write_lengths_csv(pairs: list[tuple[int, int]], path: Path) -> None:
    """The bundled lengths format: num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio."""
    with staged_file(Path(path)) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["num_prefill_tokens", "num_decode_tokens", "num_total_tokens", "pd_ratio"])
        for prompt, output in pairs:
            writer.writerow([prompt, output, prompt + output, prompt / output])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="ShareGPT lengths as vLLM's benchmark samples them"
    )
    parser.add_argument("dataset", type=Path, help="ShareGPT_V3_unfiltered_cleaned_split.json")
    parser.add_argument("--tokenizer", required=True, help="Hugging Face tokenizer name or path")
    parser.add_argument("--num-prompts", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-o", "--output", type=Path, required=True)
    args = parser.parse_args(argv)
    if not args.dataset.is_file():
        print(f"{args.dataset}: no such file", file=sys.stderr)
        return 2
    try:
        from transformers import AutoTokenizer  # type: ignore[import-not-found]  # optional: only this tool needs it
    except ImportError:
        print("this tool needs `pip install transformers`", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    conversations = json.loads(args.dataset.read_text(encoding="utf-8"))
    pairs = sample_vllm_sharegpt(
        conversations,
        lambda text: len(tokenizer(text).input_ids),
        num_prompts=args.num_prompts,
        seed=args.seed,
    )
    write_lengths_csv(pairs, args.output)
    prompts = sum(p for p, _ in pairs)
    outputs = sum(o for _, o in pairs)
    print(f"{len(pairs)} requests: {prompts} prompt tokens ({prompts / len(pairs):.1f} mean), "
          f"{outputs} output tokens ({outputs / len(pairs):.1f} mean) -> {args.output}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
