"""`sim.workload.plain_csv`: a plain Azure trace read without pandas gives what the pandas
reader gives, and anything not plain is left to the pandas reader (and its error messages)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.workload.loaders as loaders
from sim.engine.run import builtin_scenario_path
from sim.workload.errors import WorkloadError
from sim.workload.loaders import load_azure
from sim.workload.plain_csv import NotPlain, read_plain_azure, timestamp_text

AZURE = (
    builtin_scenario_path().parent.parent / "traces/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
)
HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"


def _by_pandas(path, monkeypatch):
    """`load_azure` through its pandas reader (the plain reader told to decline)."""
    with monkeypatch.context() as patch:
        patch.setattr(loaders, "plain_azure_chunks", _decline)
        return load_azure(path)


def _decline(path, chunk_rows):
    raise NotPlain


def _assert_same_workload(a, b) -> None:
    assert a.requests == b.requests
    assert a.metadata == b.metadata
    assert a.source == b.source


def test_the_bundled_azure_trace_is_read_plainly_and_the_same(monkeypatch):
    assert read_plain_azure(AZURE) is not None  # the fast path is the one taken
    _assert_same_workload(load_azure(AZURE), _by_pandas(AZURE, monkeypatch))


_stamp = st.tuples(
    st.integers(1970, 2100),  # year
    st.integers(1, 12),
    st.integers(1, 28),
    st.integers(0, 23),
    st.integers(0, 59),
    st.integers(0, 59),
    st.text("0123456789", max_size=9),  # fraction digits (none: whole seconds)
)


def _stamp_text(parts) -> str:
    year, month, day, hour, minute, second, fraction = parts
    text = f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{fraction}" if fraction else "")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(_stamp, st.integers(1, 10**6), st.integers(1, 10**4)), min_size=1, max_size=8
    )
)
def test_plain_files_read_as_pandas_reads_them(tmp_path_factory, rows):
    rows = sorted(rows, key=lambda row: np.datetime64(_stamp_text(row[0]), "ns"))
    path = tmp_path_factory.mktemp("plain") / "trace.csv"
    body = "".join(f"{_stamp_text(s)},{p},{o}\r\n" for s, p, o in rows)
    path.write_text(HEADER + body, newline="")
    assert read_plain_azure(path) is not None
    with pytest.MonkeyPatch.context() as monkeypatch:
        _assert_same_workload(load_azure(path), _by_pandas(path, monkeypatch))


NOT_PLAIN = {
    "spaces_around_a_count": "2023-11-16 18:15:46.68,  374 ,44\n",
    "a_blank_line_between_rows": "2023-11-16 18:15:46.68,374,44\n\n2023-11-16 18:15:47,1,1\n",
    "a_float_count": "2023-11-16 18:15:46.68,374.0,44\n",
    "a_zero_count": "2023-11-16 18:15:46.68,374,0\n",
    "february_30": "2023-02-30 18:15:46.68,374,44\n",
    "a_year_outside_datetime64_ns": "9999-11-16 18:15:46,374,44\n",
    "time_going_back": "2023-11-16 18:15:47,374,44\n2023-11-16 18:15:46,1,1\n",
    "a_missing_field": "2023-11-16 18:15:46,374\n",
    "no_rows": "",
}


@pytest.mark.parametrize("body", NOT_PLAIN.values(), ids=NOT_PLAIN.keys())
def test_a_file_not_plain_is_left_to_the_pandas_reader(tmp_path, monkeypatch, body):
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + body, newline="")
    assert read_plain_azure(path) is None
    try:
        expected = _by_pandas(path, monkeypatch)
    except WorkloadError as error:
        with pytest.raises(WorkloadError) as raised:
            load_azure(path)
        assert str(raised.value) == str(error)  # the same message, line and column
    else:
        _assert_same_workload(load_azure(path), expected)


def test_a_reordered_header_is_read_by_name(tmp_path, monkeypatch):
    path = tmp_path / "trace.csv"
    path.write_text("GeneratedTokens,TIMESTAMP,ContextTokens\n44,2023-11-16 18:15:46.1,374\n")
    assert read_plain_azure(path) is not None
    _assert_same_workload(load_azure(path), _by_pandas(path, monkeypatch))


@settings(max_examples=200)
@given(st.integers(0, 2**62))
def test_timestamp_text_is_how_pandas_prints_a_timestamp(ns):
    assert timestamp_text(ns) == str(pd.Timestamp(ns))


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(_stamp, st.integers(1, 10**6), st.integers(1, 10**4)), min_size=1, max_size=12
    ),
    st.integers(1, 5),
    st.sampled_from([None, *NOT_PLAIN]),
)
def test_plain_and_pandas_chunks_give_the_whole_file(tmp_path_factory, rows, chunk_rows, fault):
    """Streamed in chunks (`sim.workload.trace_stream`), either reader gives what reading the
    file whole gives; a row that is not plain in a later chunk falls back to pandas, whole.
    (A file with two faults may report the other one in chunks: see trace_stream.)"""
    if fault is not None:  # one fault only: the rows come before the fault's 2023-11-16
        rows = [((min(s[0], 2022), *s[1:]), p, o) for s, p, o in rows]
    rows = sorted(rows, key=lambda row: np.datetime64(_stamp_text(row[0]), "ns"))
    path = tmp_path_factory.mktemp("chunks") / "trace.csv"
    body = "".join(f"{_stamp_text(s)},{p},{o}\r\n" for s, p, o in rows)
    tail = "" if fault is None else NOT_PLAIN[fault]
    path.write_text(HEADER + body + tail, newline="")
    answers = []
    for rows_per_chunk in (1 << 40, chunk_rows):
        for by_pandas in (False, True):
            with pytest.MonkeyPatch.context() as monkeypatch:
                if by_pandas:
                    monkeypatch.setattr(loaders, "plain_azure_chunks", _decline)
                try:
                    workload = loaders.load_azure(path, chunk_rows=rows_per_chunk)
                    answers.append((list(workload.requests), workload.metadata))
                except WorkloadError as error:
                    answers.append((str(error), None))
    assert all(answer == answers[0] for answer in answers), answers


@pytest.mark.parametrize("fraction", ["", ".1234567"])
def test_a_year_past_datetime64_ns_is_refused_in_any_chunk(tmp_path, monkeypatch, fraction):
    """pandas parses a chunk without 7-digit fractions in microseconds, where 2263 fits: it
    must still be refused (it once wrapped around in nanoseconds), as where it is parsed in ns."""
    path = tmp_path / "trace.csv"
    body = f"2023-11-16 18:15:46{fraction},1,1\r\n2263-01-01 00:00:00,2,2\r\n"
    path.write_text(HEADER + body + "2500-01-01 00:00:00,1,1\r\n", newline="")
    for chunk_rows in (1 << 40, 1):
        with pytest.raises(WorkloadError, match="trace.csv:3: column 'TIMESTAMP': expected"):
            loaders.load_azure(path, chunk_rows=chunk_rows)
