"""Workload loaders, synthetic generation, transforms and config (sim.workload)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.kv.types import Segment
from sim.workload import (
    RequestSpec,
    WorkloadConfig,
    WorkloadError,
    detect_format,
    first_n,
    load_azure,
    load_canonical,
    load_lengths,
    load_mooncake,
    load_trace,
    load_vidur,
    load_workload,
    scale_time,
    time_window,
)
from sim.workload.request import PREFIX_KEY_BASE, UNIQUE_KEY_BASE

TRACES = Path(__file__).resolve().parents[2] / "sim" / "data" / "traces"
AZURE_CONV = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
AZURE_CODE = TRACES / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv"
MOONCAKE = TRACES / "mooncake_fast25" / "conversation_trace.jsonl"
SHAREGPT = TRACES / "length_distributions" / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"


# ----------------------------------------------------------------------------- real traces


def test_bundled_traces_are_byte_identical_upstream():
    import hashlib

    expected = {
        AZURE_CONV: "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
        AZURE_CODE: "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
        MOONCAKE: "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
        SHAREGPT: "6d6c296302a853e2669a674a96f269283e60c57e60363bd450588a1066919f9f",
    }
    for path, sha in expected.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == sha, path
    assert AZURE_CONV.read_bytes()[:50].count(b"\r\n") == 1  # CRLF kept
    assert not AZURE_CONV.read_bytes().endswith(b"\n")  # no final newline kept


def test_azure_conv_loads_with_7_digit_fractions():
    # How fast it loads is measured by benchmarks/ci_speed.py, not asserted here.
    w = load_azure(AZURE_CONV)
    assert len(w) == 19_366
    first, second, last = w[0], w[1], w[-1]
    assert (first.arrival_s, first.prompt_tokens, first.output_tokens) == (0.0, 374, 44)
    # 18:15:50.9951690 - 18:15:46.6805900, exact to the 100 ns the format carries
    assert second.arrival_s == pytest.approx(4.314579, abs=1e-9)
    assert (second.prompt_tokens, second.output_tokens) == (396, 109)
    # 19:14:08.4025270 - 18:15:46.6805900 (the last row has no final newline)
    assert last.arrival_s == pytest.approx(3501.721937, abs=1e-9)
    assert (last.prompt_tokens, last.output_tokens) == (197, 183)
    assert w.metadata["start_timestamp"] == "2023-11-16 18:15:46.680590"
    assert [r.request_id for r in w] == list(range(19_366))


def test_azure_code_trace():
    w = load_trace(AZURE_CODE)
    assert len(w) == 8_819 and w.metadata["format"] == "azure"
    assert (w[0].arrival_s, w[0].prompt_tokens, w[0].output_tokens) == (0.0, 4808, 10)
    assert w[1].arrival_s == pytest.approx(0.052, abs=1e-9)
    frame = w.to_frame()
    assert frame["output_tokens"].min() == 6 and frame["prompt_tokens"].max() == 7437


def test_mooncake_conversation_trace():
    w = load_mooncake(MOONCAKE)
    assert len(w) == 12_031
    r0 = w[0]
    assert (r0.arrival_s, r0.prompt_tokens, r0.output_tokens) == (0.0, 6758, 500)
    assert [s.key for s in r0.prefix] == list(range(14))
    assert r0.prefix[-1] == Segment(13, 6758 - 512 * 13)  # partial last block
    assert r0.num_prefix_tokens == r0.prompt_tokens
    frame = w.to_frame()
    assert frame["prompt_tokens"].mean() == pytest.approx(12035.1, abs=0.05)
    assert frame["arrival_s"].iloc[-1] == 3536.999  # ms / 1000


def test_mooncake_requests_share_hash_id_prefix_at_any_block_size():
    w = load_mooncake(MOONCAKE)
    a, b = w[0].prompt_content(), w[1].prompt_content()  # both start with hash id 0
    for block_size in (16, 512):
        shared = 512 // block_size
        for i in range(shared):
            assert a.block_key(i, block_size) == b.block_key(i, block_size)
        assert a.block_key(shared, block_size) != b.block_key(shared, block_size)
        assert a.block_hashes(block_size, shared) == b.block_hashes(block_size, shared)


def test_mooncake_prefix_sharing_small_file(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [
        {"timestamp": 0, "input_length": 1600, "output_length": 5, "hash_ids": [7, 8, 9, 10]},
        {"timestamp": 1500, "input_length": 1600, "output_length": 1, "hash_ids": [7, 8, 4, 11]},
        {"timestamp": 1500, "input_length": 600, "output_length": 1, "hash_ids": [5, 6]},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    w = load_trace(path)  # auto-detected as mooncake
    assert w.metadata["format"] == "mooncake"
    assert [r.arrival_s for r in w] == [0.0, 1.5, 1.5]
    a, b, c = (r.prompt_content() for r in w)
    for block_size in (16, 48, 512):  # 48 does not divide 512: blocks straddle segments
        num_shared = 1024 // block_size
        for i in range(num_shared):
            assert a.block_key(i, block_size) == b.block_key(i, block_size)
        assert a.block_key(num_shared, block_size) != b.block_key(num_shared, block_size)
        assert a.block_key(0, block_size) != c.block_key(0, block_size)


def test_sharegpt_lengths():
    samples = load_lengths(SHAREGPT)
    assert len(samples) == 30_731
    assert (samples.prompt_tokens[0], samples.output_tokens[0]) == (74, 918)
    assert detect_format(SHAREGPT) == "lengths"


def test_detect_format():
    assert detect_format(AZURE_CONV) == "azure"
    assert detect_format(MOONCAKE) == "mooncake"


# ----------------------------------------------------------------------------- canonical / vidur


def test_canonical_csv_jsonl_parquet_agree(tmp_path):
    frame = pd.DataFrame(
        {
            "arrival_s": [0.0, 0.5, 0.5],
            "prompt_tokens": [100, 40, 64],
            "output_tokens": [3, 1, 9],
            "priority": [0, 2, -1],
        }
    )
    frame.to_csv(tmp_path / "t.csv", index=False)
    frame.to_parquet(tmp_path / "t.parquet")
    (tmp_path / "t.jsonl").write_text(frame.to_json(orient="records", lines=True))
    loaded = [load_canonical(tmp_path / f"t.{ext}") for ext in ("csv", "jsonl", "parquet")]
    assert loaded[0].requests == loaded[1].requests == loaded[2].requests
    assert [r.priority for r in loaded[0]] == [0, 2, -1]


def test_canonical_prefix_ids_share_tokens(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(
        "arrival_s,prompt_tokens,output_tokens,prefix_id,prefix_tokens,hash_ids\n"
        "0,100,2,3,64,\n"
        "1,80,2,3,32,\n"
        "2,30,2,,,\n"
        "3,600,2,,,0 1\n"
    )
    w = load_canonical(path)
    assert w[0].prefix == (Segment(PREFIX_KEY_BASE + 3, 64),)
    assert w[2].prefix == ()
    assert w[3].prefix == (Segment(0, 512), Segment(1, 88))
    a, b = w[0].prompt_content(), w[1].prompt_content()
    assert a.block_key(1, 16) == b.block_key(1, 16)  # tokens 16..31 shared
    assert a.block_key(2, 16) != b.block_key(2, 16)  # b's prefix ended at 32
    assert w[2].prompt_content().segments == [Segment(UNIQUE_KEY_BASE + 2, 30)]


def test_vidur_trace(tmp_path):
    path = tmp_path / "splitwise_code.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,4808,10\n0.052,3180,8\n")
    assert detect_format(path) == "vidur"
    w = load_vidur(path)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in w] == [
        (0.0, 4808, 10),
        (0.052, 3180, 8),
    ]


# ----------------------------------------------------------------------------- bad input

CANON = "arrival_s,prompt_tokens,output_tokens\n"
BAD_FILES = [
    # (name, content, expected message start (after the path), loader)
    (
        "missing_col.csv",
        "arrival_s,prompt_tokens\n0,1\n",
        ":1: column 'output_tokens': missing",
        "canonical",
    ),
    (
        "extra_col.csv",
        CANON.strip() + ",foo\n0,1,1,2\n",
        ":1: column 'foo': unexpected",
        "canonical",
    ),
    (
        "nonnum.csv",
        CANON + "0,5,1\n1,abc,1\n",
        ":3: column 'prompt_tokens': not a number: 'abc'",
        "canonical",
    ),
    (
        "zero_prompt.csv",
        CANON + "0,0,1\n",
        ":2: column 'prompt_tokens': must be >= 1, got 0",
        "canonical",
    ),
    (
        "zero_output.csv",
        CANON + "0,5,1\n0,5,1\n1,5,0\n",
        ":4: column 'output_tokens': must be >= 1, got 0 (vLLM",
        "canonical",
    ),
    (
        "neg_output.csv",
        CANON + "0,5,-2\n",
        ":2: column 'output_tokens': must be >= 1, got -2",
        "canonical",
    ),
    (
        "fraction.csv",
        CANON + "0,5.5,1\n",
        ":2: column 'prompt_tokens': not an integer",
        "canonical",
    ),
    ("neg_arrival.csv", CANON + "-1,5,1\n", ":2: column 'arrival_s': must be >= 0", "canonical"),
    (
        "backwards.csv",
        CANON + "0,5,1\n2,5,1\n1,5,1\n",
        ":4: column 'arrival_s': arrivals must be non-decreasing",
        "canonical",
    ),
    (
        "blank_mid.csv",
        CANON + "0,5,1\n\n1,5,1\n",
        ":3: column 'arrival_s': missing value",
        "canonical",
    ),
    ("too_many.csv", CANON + "0,5,1\n0,5,1,9\n", ":3: expected 3 fields, found 4", "canonical"),
    (
        "missing_field.csv",
        CANON + "0,5\n",
        ":2: column 'output_tokens': missing value",
        "canonical",
    ),
    (
        "inf.csv",
        CANON + "0,5,1\n1,inf,1\n",
        ":3: column 'prompt_tokens': not a finite number",
        "canonical",
    ),
    ("nan.csv", CANON + "nan,5,1\n", ":2: column 'arrival_s': not a number: 'nan'", "canonical"),
    ("header_only.csv", CANON, ": no requests in file", "canonical"),
    ("empty.csv", "", ":1: file is empty", "canonical"),
    (
        "prefix_big.csv",
        CANON.strip() + ",prefix_id,prefix_tokens\n0,5,1,1,6\n",
        ":2: column 'prefix_tokens': exceeds prompt_tokens",
        "canonical",
    ),
    (
        "bad_json.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n{"arrival_s": 1,\n',
        ":2: invalid JSON",
        "canonical",
    ),
    (
        "str_json.jsonl",
        '{"arrival_s": 0, "prompt_tokens": "7", "output_tokens": 1}\n',
        ":1: column 'prompt_tokens': not a number: '7'",
        "canonical",
    ),
    (
        "bool_json.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 7, "output_tokens": true}\n',
        ":1: column 'output_tokens': not a number",
        "canonical",
    ),
    (
        "key_json.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 7}\n',
        ":1: column 'output_tokens': missing required key",
        "canonical",
    ),
    (
        "blank_json.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 7, "output_tokens": 1}\n\n{"arrival_s": 0, "prompt_tokens": 7, "output_tokens": 1}\n',
        ":2: blank line between records",
        "canonical",
    ),
    (
        "az_time.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,1,1\r\n2023-11-16 25:15:46.1,1,1",
        ":3: column 'TIMESTAMP': expected 'YYYY-MM-DD",
        "azure",
    ),
    (
        "az_zero.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6805900,1,0",
        ":2: column 'GeneratedTokens': must be >= 1",
        "azure",
    ),
    (
        "az_back.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\r\n2023-11-16 18:15:46.6,1,1\r\n2023-11-16 18:15:46.5,1,1",
        ":3: column 'TIMESTAMP': arrivals must be non-decreasing",
        "azure",
    ),
    (
        "mc_len.jsonl",
        '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2]}\n',
        ":1: column 'hash_ids': has 2 ids but ceil(1100 prompt tokens / 512) = 3",
        "mooncake",
    ),
    (
        "mc_neg.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [-1]}\n',
        ":1: column 'hash_ids': id -1 is not an integer",
        "mooncake",
    ),
    (
        "mc_extra.jsonl",
        '{"timestamp": 0, "input_length": 10, "output_length": 5, "hash_ids": [1], "x": 1}\n',
        ":1: column 'x': unexpected key",
        "mooncake",
    ),
    (
        "vidur_zero.csv",
        "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,0\n",
        ":2: column 'num_decode_tokens': must be >= 1",
        "vidur",
    ),
    (
        "len_total.csv",
        "num_prefill_tokens,num_decode_tokens,num_total_tokens\n3,4,7\n3,4,8\n",
        ":3: column 'num_total_tokens': 8 != 3 + 4",
        "lengths",
    ),
]


@pytest.mark.parametrize(
    ("name", "content", "expected", "fmt"), BAD_FILES, ids=[b[0] for b in BAD_FILES]
)
def test_bad_file_error_names_file_line_and_column(tmp_path, name, content, expected, fmt):
    path = tmp_path / name
    path.write_bytes(content.encode())
    with pytest.raises(WorkloadError) as info:
        if fmt == "lengths":
            load_lengths(path)
        else:
            load_trace(path, fmt)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path) + expected), message


def test_missing_file_error(tmp_path):
    with pytest.raises(WorkloadError, match=r"nope\.csv: file not found$"):
        load_trace(tmp_path / "nope.csv")


def test_parquet_error_names_row(tmp_path):
    pd.DataFrame(
        {"arrival_s": [0.0, 1.0], "prompt_tokens": [5, 0], "output_tokens": [1, 1]}
    ).to_parquet(tmp_path / "t.parquet")
    with pytest.raises(
        WorkloadError, match=r"t\.parquet:row 2: column 'prompt_tokens': must be >= 1"
    ):
        load_trace(tmp_path / "t.parquet")


# ----------------------------------------------------------------------------- synthetic


def _synthetic(seed: int, **over) -> WorkloadConfig:
    spec = {
        "kind": "synthetic",
        "num_requests": 20_000,
        "seed": seed,
        "arrival": {"process": "gamma", "rate_per_s": 4.0, "cv": 2.0},
        "lengths": {
            "prompt": {"kind": "lognormal", "mean": 1000, "cv": 0.5},
            "output": {"kind": "uniform", "min_tokens": 10, "max_tokens": 20},
        },
    }
    spec.update(over)
    return WorkloadConfig.model_validate(spec)


def test_synthetic_is_deterministic_per_seed():
    a = load_workload(_synthetic(1)).to_frame()
    b = load_workload(_synthetic(1)).to_frame()
    c = load_workload(_synthetic(2)).to_frame()
    pd.testing.assert_frame_equal(a, b)
    assert not a["arrival_s"].equals(c["arrival_s"])


@pytest.mark.parametrize(
    ("process", "cv"), [("poisson", 1.0), ("gamma", 2.0), ("gamma", 0.5), ("gamma", 0.0)]
)
def test_synthetic_rate_and_cv(process, cv):
    spec = _synthetic(3, arrival={"process": process, "rate_per_s": 4.0, "cv": cv})
    frame = load_workload(spec).to_frame()
    gaps = np.diff(frame["arrival_s"].to_numpy())
    assert frame["arrival_s"].iloc[0] == 0.0
    assert 1 / gaps.mean() == pytest.approx(4.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, abs=0.1)
    prompt = frame["prompt_tokens"]
    assert prompt.mean() == pytest.approx(1000, rel=0.03)
    assert prompt.std() / prompt.mean() == pytest.approx(0.5, abs=0.05)
    assert set(frame["output_tokens"]) == set(range(10, 21))


def test_changing_lengths_keeps_arrivals():
    a = load_workload(_synthetic(5)).to_frame()
    b = load_workload(
        _synthetic(
            5,
            lengths={
                "prompt": {"kind": "fixed", "value": 7},
                "output": {"kind": "fixed", "value": 3},
            },
        )
    ).to_frame()
    assert a["arrival_s"].equals(b["arrival_s"])
    assert set(b["prompt_tokens"]) == {7} and set(b["output_tokens"]) == {3}


def test_zipf_lengths_within_bounds_and_skewed():
    spec = _synthetic(
        4,
        lengths={
            "prompt": {"kind": "zipf", "exponent": 1.2, "min_tokens": 16, "max_tokens": 4096},
            "output": {"kind": "fixed", "value": 1},
        },
    )
    prompt = load_workload(spec).to_frame()["prompt_tokens"]
    assert prompt.min() == 16 and prompt.max() <= 4096
    assert (prompt == 16).mean() > (prompt == 17).mean() > (prompt == 100).mean()


def test_trace_sampled_lengths_keep_rows_together(tmp_path):
    lengths = {"kind": "trace", "path": "sharegpt.csv"}
    (tmp_path / "sharegpt.csv").write_bytes(SHAREGPT.read_bytes())
    spec = _synthetic(9, num_requests=500, lengths={"prompt": lengths, "output": lengths})
    frame = load_workload(spec, base_dir=tmp_path).to_frame()
    samples = load_lengths(SHAREGPT)
    rows = set(zip(samples.prompt_tokens.tolist(), samples.output_tokens.tolist(), strict=True))
    assert set(zip(frame["prompt_tokens"], frame["output_tokens"], strict=True)) <= rows


def test_lengths_file_with_arrival_process(tmp_path):
    spec = WorkloadConfig(
        kind="trace",
        path=str(SHAREGPT),
        arrival={"process": "poisson", "rate_per_s": 2.0},
        num_requests=100,
        seed=3,
    )
    w = load_workload(spec)
    assert len(w) == 100 and w.metadata["num_excluded_rows"] == 30_731 - 100
    assert (w[0].prompt_tokens, w[0].output_tokens) == (74, 918)  # file order


# ----------------------------------------------------------------------------- transforms, config


def test_transforms_window_and_scale():
    w = load_azure(AZURE_CONV)
    windowed = time_window(w, 600.0, 1200.0)
    arrivals = [r.arrival_s for r in windowed]
    assert min(arrivals) >= 0 and max(arrivals) < 600
    inside = [r for r in w if 600.0 <= r.arrival_s < 1200.0]
    assert [r.request_id for r in windowed] == [r.request_id for r in inside]
    assert windowed.metadata["transforms"][-1]["num_excluded"] == len(w) - len(inside)
    head = first_n(w, 10)
    assert [r.request_id for r in head] == list(range(10))
    fast = scale_time(head, 4.0)
    assert [r.arrival_s * 4.0 for r in fast] == pytest.approx([r.arrival_s for r in head])
    with pytest.raises(WorkloadError, match="no request arrives"):
        time_window(w, 10_000.0, 20_000.0)


def test_load_workload_trace_with_relative_path_and_transforms(tmp_path):
    (tmp_path / "traces").mkdir()
    (tmp_path / "traces" / "conv.csv").write_bytes(AZURE_CONV.read_bytes())
    spec = WorkloadConfig(
        kind="trace",
        path="traces/conv.csv",
        time_range_s=(100.0, 400.0),
        first_n=50,
        rate_scale=2.0,
    )
    w = load_workload(spec, base_dir=tmp_path)
    assert len(w) == 50
    full = load_azure(AZURE_CONV)
    first = next(r for r in full if r.arrival_s >= 100.0)
    assert w[0].request_id == first.request_id
    assert w[0].arrival_s == pytest.approx((first.arrival_s - 100.0) / 2.0)


def test_config_rejects_unknown_and_inconsistent_keys():
    with pytest.raises(pydantic.ValidationError, match="Extra inputs"):
        WorkloadConfig.model_validate({"kind": "trace", "path": "x.csv", "bogus": 1})
    with pytest.raises(pydantic.ValidationError, match="synthetic needs 'arrival'"):
        WorkloadConfig(kind="synthetic", num_requests=3)
    with pytest.raises(pydantic.ValidationError, match="poisson process has cv 1"):
        WorkloadConfig.model_validate(
            {
                "kind": "synthetic",
                "num_requests": 3,
                "arrival": {"process": "poisson", "rate_per_s": 1, "cv": 2},
            }
        )
    with pytest.raises(pydantic.ValidationError, match="use 'first_n'"):
        WorkloadConfig(kind="trace", path="x.csv", format="azure", num_requests=3)


def test_trace_with_own_arrivals_rejects_arrival_process():
    spec = WorkloadConfig(kind="trace", path=str(AZURE_CODE), arrival={"rate_per_s": 1.0})
    with pytest.raises(WorkloadError, match="has its own arrivals"):
        load_workload(spec)


def test_inline_requests():
    spec = WorkloadConfig.model_validate(
        {
            "kind": "inline",
            "requests": [
                {
                    "arrival_s": 0,
                    "prompt_tokens": 40,
                    "output_tokens": 2,
                    "prefix_id": 1,
                    "prefix_tokens": 32,
                },
                {
                    "arrival_s": 0.1,
                    "prompt_tokens": 33,
                    "output_tokens": 1,
                    "prefix_id": 1,
                    "prefix_tokens": 32,
                    "priority": 1,
                },
            ],
        }
    )
    a, b = load_workload(spec)
    assert a.prompt_content().block_hashes(16, 2) == b.prompt_content().block_hashes(16, 2)
    bad = WorkloadConfig.model_validate(
        {
            "kind": "inline",
            "requests": [
                {"arrival_s": 1, "prompt_tokens": 4, "output_tokens": 1},
                {"arrival_s": 0, "prompt_tokens": 4, "output_tokens": 1},
            ],
        }
    )
    with pytest.raises(WorkloadError, match=r"^workload.requests:item 1: column 'arrival_s'"):
        load_workload(bad)


# ----------------------------------------------------------------------------- RequestSpec


def test_request_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="output_tokens"):
        RequestSpec(0, 0.0, 5, 0)
    with pytest.raises(ValueError, match="more than prompt_tokens"):
        RequestSpec(0, 0.0, 5, 1, prefix=(Segment(1, 6),))
    with pytest.raises(ValueError, match="key >= 0"):
        RequestSpec(0, 0.0, 5, 1, prefix=(Segment(-1, 2),))


@settings(max_examples=60, deadline=None)
@given(
    ids_a=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    ids_b=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    block_size=st.sampled_from([1, 16, 48, 512]),
)
def test_blocks_shared_exactly_over_common_hash_prefix(ids_a, ids_b, block_size):
    """Chained block hashes match exactly over the common leading run of hash ids."""

    def spec(rid, ids):
        return RequestSpec(rid, 0.0, 512 * len(ids), 1, prefix=tuple(Segment(h, 512) for h in ids))

    a, b = spec(0, ids_a).prompt_content(), spec(1, ids_b).prompt_content()
    assert a.num_tokens == 512 * len(ids_a)
    common = 0
    while common < min(len(ids_a), len(ids_b)) and ids_a[common] == ids_b[common]:
        common += 1
    num_full = min(a.num_tokens, b.num_tokens) // block_size
    hashes_a, hashes_b = a.block_hashes(block_size, num_full), b.block_hashes(block_size, num_full)
    for i in range(num_full):
        same = (i + 1) * block_size <= common * 512
        assert (hashes_a[i] == hashes_b[i]) == same


# ----------------------------------------------------------------------------- streamed reading
# Every loader reads `chunk_rows` rows at a time (`sim.workload.trace_stream`); a file longer
# than one chunk is validated in one reading and read again as it is iterated. Whatever the
# chunk size, the requests, metadata and errors must be those of reading the file whole
# (chunk_rows beyond the file's rows is exactly how a file was read before).

WHOLE = 1 << 40

_rows = st.lists(
    st.tuples(
        st.integers(0, 3),  # arrival gap, ms
        st.integers(1, 2000),  # prompt tokens
        st.integers(1, 50),  # output tokens
        st.integers(-2, 2),  # priority
        st.sampled_from(["none", "prefix", "hash"]),
    ),
    min_size=1,
    max_size=40,
)


def _canonical_frame(rows) -> pd.DataFrame:
    arrivals = np.cumsum([gap / 1000 for gap, *_ in rows]).tolist()
    return pd.DataFrame(
        {
            "arrival_s": arrivals,
            "prompt_tokens": [p for _, p, *_ in rows],
            "output_tokens": [o for _, _, o, *_ in rows],
            "priority": [q for *_, q, _ in rows],
            "prefix_id": [7 if k == "prefix" else None for *_, k in rows],
            "prefix_tokens": [min(p, 33) if k == "prefix" else None for _, p, *_, k in rows],
            "hash_ids": [
                " ".join(str(j) for j in range(-(-p // 512))) if k == "hash" else ""
                for _, p, *_, k in rows
            ],
        }
    )


def _same_at_every_chunk_size(load, path, chunk_rows) -> None:
    whole, streamed = load(path, chunk_rows=WHOLE), load(path, chunk_rows=chunk_rows)
    assert isinstance(whole.requests, list)
    assert list(streamed.requests) == whole.requests
    assert list(streamed.requests) == whole.requests  # a second reading: the same again
    assert streamed.metadata == whole.metadata
    assert len(streamed) == len(whole) and streamed.span_s == whole.span_s
    assert streamed[0] == whole[0] and streamed[-1] == whole[-1]
    middle = len(whole) // 2
    assert streamed[middle] == whole[middle]


@settings(max_examples=40, deadline=None)
@given(rows=_rows, chunk_rows=st.integers(1, 12), ext=st.sampled_from(["csv", "jsonl"]))
def test_canonical_chunks_give_the_whole_file(tmp_path_factory, rows, chunk_rows, ext):
    path = tmp_path_factory.mktemp("c") / f"t.{ext}"
    frame = _canonical_frame(rows)
    if ext == "csv":
        frame.to_csv(path, index=False)
    else:  # JSONL: absent keys, hash_ids as lists
        records = []
        for record in frame.to_dict(orient="records"):
            record = {k: v for k, v in record.items() if v is not None and v == v and v != ""}
            if "hash_ids" in record:
                record["hash_ids"] = [int(j) for j in record["hash_ids"].split()]
            for key in ("prefix_id", "prefix_tokens"):
                if key in record:
                    record[key] = int(record[key])
            records.append(json.dumps(record))
        path.write_text("\n".join(records) + "\n")
    _same_at_every_chunk_size(load_canonical, path, chunk_rows)


@settings(max_examples=20, deadline=None)
@given(rows=_rows, chunk_rows=st.integers(1, 12))
def test_parquet_row_batches_give_the_whole_file(tmp_path_factory, rows, chunk_rows):
    path = tmp_path_factory.mktemp("p") / "t.parquet"
    frame = _canonical_frame(rows)[["arrival_s", "prompt_tokens", "output_tokens", "priority"]]
    frame.to_parquet(path, row_group_size=5)
    _same_at_every_chunk_size(load_canonical, path, chunk_rows)


@settings(max_examples=30, deadline=None)
@given(rows=_rows, chunk_rows=st.integers(1, 12), blank_tail=st.integers(0, 30))
def test_vidur_mooncake_lengths_chunks_give_the_whole_file(
    tmp_path_factory, rows, chunk_rows, blank_tail
):
    folder = tmp_path_factory.mktemp("v")
    frame = _canonical_frame(rows)
    vidur = folder / "v.csv"
    body = "".join(
        f"{a!r},{p},{o},{p + o},{p / o:.4g}\n"
        for a, p, o in zip(frame.arrival_s, frame.prompt_tokens, frame.output_tokens, strict=True)
    )
    vidur.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
        + body
        + "\n" * blank_tail  # trailing blank lines, possibly longer than a chunk
    )
    _same_at_every_chunk_size(load_vidur, vidur, chunk_rows)
    lengths = folder / "l.csv"  # the same rows without arrivals: a length-distribution file
    lengths.write_text(
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
        + "".join(line.split(",", 1)[1] + "\n" for line in body.splitlines())
        + "\n" * blank_tail
    )
    whole, chunked = (
        load_lengths(lengths, chunk_rows=WHOLE),
        load_lengths(lengths, chunk_rows=chunk_rows),
    )
    assert (whole.prompt_tokens == chunked.prompt_tokens).all()
    assert (whole.output_tokens == chunked.output_tokens).all()
    mooncake = folder / "m.jsonl"
    mooncake.write_text(
        "".join(
            json.dumps(
                {
                    "timestamp": int(a * 1000),
                    "input_length": p,
                    "output_length": o,
                    "hash_ids": list(range(-(-p // 512))),
                }
            )
            + "\n"
            for a, p, o in zip(
                frame.arrival_s, frame.prompt_tokens, frame.output_tokens, strict=True
            )
        )
        + "\n" * blank_tail
    )
    _same_at_every_chunk_size(load_mooncake, mooncake, chunk_rows)


_FAULTS = [
    # (CSV row text, {a}: the row's own arrival; column named): one bad row in a valid trace
    ("x,10,5", "arrived_at"),
    ("{a},ten,5", "num_prefill_tokens"),
    ("{a},10,0", "num_decode_tokens"),
    ("{a},10.5,5", "num_prefill_tokens"),
    ("0.0001,10,5", "arrived_at"),  # back in time
    (",,", "arrived_at"),  # a blank row with data after it
    ("", "arrived_at"),  # an empty line with data after it
    ("{a},10,5,6", None),  # too many fields
]


@settings(max_examples=60, deadline=None)
@given(
    num_rows=st.integers(3, 30),
    at=st.integers(1, 29),
    fault=st.sampled_from(_FAULTS),
    chunk_rows=st.integers(1, 10),
)
def test_one_bad_row_is_named_alike_at_every_chunk_size(
    tmp_path_factory, num_rows, at, fault, chunk_rows
):
    # A data row follows the fault (trailing blanks are dropped); not the first row: pandas
    # reads a first row with one field too many as an index column, whole or chunked.
    at = max(1, min(at, num_rows - 2))
    text, column = fault
    rows = [f"{1 + i / 100!r},10,5" for i in range(num_rows)]
    rows[at] = text.format(a=repr(1 + at / 100))
    path = tmp_path_factory.mktemp("f") / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "\n".join(rows) + "\n")
    errors = []
    for rows_per_chunk in (WHOLE, chunk_rows):
        with pytest.raises(WorkloadError) as info:
            load_vidur(path, chunk_rows=rows_per_chunk)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    assert f"t.csv:{at + 2}:" in errors[0]
    assert column is None or f"column {column!r}" in errors[0]


def test_a_streamed_trace_is_read_again_and_refuses_a_changed_file(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "0.5,10,5\n" * 10)
    workload = load_vidur(path, chunk_rows=3)
    assert not isinstance(workload.requests, list)  # longer than a chunk: streamed
    assert len(list(workload)) == 10
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n" + "0.5,10,5\n" * 11)
    with pytest.raises(WorkloadError, match="changed while kvsim was reading it"):
        list(workload)


def test_streamed_transforms_are_views_equal_to_the_list_ones(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(
        "arrived_at,num_prefill_tokens,num_decode_tokens\n"
        + "".join(f"{i * 0.37!r},{i + 1},{i % 7 + 1}\n" for i in range(200))
    )
    whole, streamed = load_vidur(path, chunk_rows=WHOLE), load_vidur(path, chunk_rows=16)
    steps = [
        lambda w: scale_time(first_n(time_window(w, 3.3, 50.1), 40), 0.3),
        lambda w: first_n(w, 7),
        lambda w: scale_time(w, 2.5),
        lambda w: time_window(w, 20.0, 1e6),
        lambda w: time_window(scale_time(w, 2.0), 1.0, 9.0),  # another order: materialised
    ]
    for step in steps:
        a, b = step(whole), step(streamed)
        assert list(b.requests) == list(a.requests)
        assert b.metadata == a.metadata and len(b) == len(a) and b.span_s == a.span_s
    assert not isinstance(first_n(streamed, 7).requests, list)
    with pytest.raises(WorkloadError, match=r"no request arrives in \[100, 200\) s"):
        time_window(streamed, 100, 200)


def test_a_streamed_workload_pickles(tmp_path):
    import pickle

    path = tmp_path / "t.jsonl"
    path.write_text(
        "".join(
            json.dumps({"arrival_s": i, "prompt_tokens": 5, "output_tokens": 1}) + "\n"
            for i in range(9)
        )
    )
    workload = first_n(load_canonical(path, chunk_rows=2), 5)
    copy = pickle.loads(pickle.dumps(workload))
    assert list(copy.requests) == list(workload.requests) and len(copy) == 5


def test_a_jsonl_line_past_the_cap_is_refused_not_read(tmp_path, monkeypatch):
    import sim.workload._table as table

    monkeypatch.setattr(table, "MAX_LINE_CHARS", 70)
    path = tmp_path / "t.jsonl"
    record = '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1}'
    pad = '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 1, "x": "' + "y" * 20 + '"}'
    path.write_text(f"{record}\n{record[:-1]}   }}\n{pad}\n")
    with pytest.raises(WorkloadError, match=r"t.jsonl:3: line longer than 70 characters"):
        load_canonical(path)
    path.write_text(f"{record}\n" + record + " " * (70 - len(record)))  # 70, no newline: fine
    assert len(load_canonical(path)) == 2
