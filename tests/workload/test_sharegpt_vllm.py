"""vLLM's ShareGPT benchmark sampling, on synthetic conversations (no dataset, no tokenizer)."""

import random

from sim.workload import load_lengths
from sim.workload.sharegpt_vllm import ShareGptRules, sample_vllm_sharegpt, write_lengths_csv


def words(n: int) -> str:
    return " ".join(["w"] * n)


def count_words(text: str) -> int:
    return len(text.split())


def conversation(prompt: int, output: int, turns: int = 2) -> dict:
    values = [words(prompt), words(output)] + [words(1)] * (turns - 2)
    return {"conversations": [{"value": v} for v in values[:turns]]}


def test_the_filter_edges_are_vllms():
    rules = ShareGptRules()
    assert rules.keeps(4, 4) and rules.keeps(1024, 1024)
    assert not rules.keeps(3, 100) and not rules.keeps(100, 3)
    assert not rules.keeps(1025, 4)  # prompt over 1024
    assert not rules.keeps(1000, 1049)  # total over 2048


def test_short_conversations_and_invalid_pairs_are_skipped_in_shuffled_order():
    data = [
        conversation(10, 20),
        conversation(10, 20, turns=1),  # one turn: dropped before the shuffle
        conversation(2000, 10),  # prompt too long
        conversation(30, 40),
        conversation(50, 60, turns=3),
    ]
    pairs = sample_vllm_sharegpt(data, count_words, num_prompts=10, seed=0)
    kept = [d for d in data if len(d["conversations"]) >= 2]
    random.Random(0).shuffle(kept)
    expected = [
        (count_words(d["conversations"][0]["value"]), count_words(d["conversations"][1]["value"]))
        for d in kept
    ]
    assert pairs == [p for p in expected if p != (2000, 10)]
    assert sorted(pairs) == [(10, 20), (30, 40), (50, 60)]


def test_stops_at_num_prompts_and_the_seed_picks_the_order():
    data = [conversation(10 + i, 20 + i) for i in range(50)]
    first = sample_vllm_sharegpt(data, count_words, num_prompts=5, seed=0)
    again = sample_vllm_sharegpt(data, count_words, num_prompts=5, seed=0)
    other = sample_vllm_sharegpt(data, count_words, num_prompts=5, seed=1)
    assert len(first) == 5 and first == again and first != other


def test_the_csv_loads_as_a_lengths_file(tmp_path):
    path = tmp_path / "sharegpt_vllm.csv"
    write_lengths_csv([(230, 200), (12, 7)], path)
    samples = load_lengths(path)
    assert list(samples.prompt_tokens) == [230, 12]
    assert list(samples.output_tokens) == [200, 7]
