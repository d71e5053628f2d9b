"""`compare-bench`: the error per metric and whether the measurement is in kvsim's band."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.errors import InputError
from sim.vllm_bench.compare import compare, read_result, render

PREDICTED = {"duration": 10.0, "num_prompts": 5, "mean_ttft_ms": 40.0, "p99_itl_ms": 9.0,
             "ttfts": [0.04], "request_goodput": None,
             "kvsim": {"band": {"mean_ttft_ms": [36.0, 44.0], "duration": [9.0, 11.0]}}}  # fmt: skip
MEASURED = {"duration": 12.0, "num_prompts": 5, "mean_ttft_ms": 42.0, "p99_itl_ms": 10.0,
            "ttfts": [0.05], "request_goodput": 1.0}  # fmt: skip


def test_rows_errors_and_bands() -> None:
    rows = {r.metric: r for r in compare(PREDICTED, MEASURED)}
    assert set(rows) == {"duration", "mean_ttft_ms", "p99_itl_ms"}  # settings, lists, None left out
    assert rows["mean_ttft_ms"].error == pytest.approx(-2 / 42)
    assert rows["mean_ttft_ms"].in_band is True
    assert rows["duration"].in_band is False  # 12 s measured, band 9-11 s
    assert rows["p99_itl_ms"].in_band is None
    lines = render(list(rows.values()), Path("p.json"), Path("m.json"))
    assert lines[-1] == "1 of 2 banded metrics inside kvsim's band; 3 metrics compared"


def test_a_file_that_is_not_a_result_is_bad_input(tmp_path: Path) -> None:
    for text, message in (
        ("{", "not a vllm bench serve result"),
        ('{"a": 1}', "no 'duration'"),
        ("", "not a"),
    ):
        path = tmp_path / "r.json"
        path.write_text(text)
        with pytest.raises(InputError, match=message):
            read_result(path)


def test_an_appended_result_file_reads_its_last_line(tmp_path: Path) -> None:
    """vLLM's --append-result writes one JSON per line."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"duration": 1.0}) + "\n" + json.dumps(MEASURED))
    assert read_result(path)["duration"] == 12.0
