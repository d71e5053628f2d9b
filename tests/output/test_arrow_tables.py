"""`sim.files.arrow` makes the Arrow tables (and files) pandas makes, without pandas.

Each test builds a table both ways, `arrow_table` from numpy columns and
`pa.Table.from_pandas` from the DataFrame pandas makes of the same columns, and compares
the values, the schema with its ``pandas`` metadata, and the written CSV and Parquet bytes.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.files.arrow import _pandas_version, arrow_table, empty_arrow_table, records_columns
from sim.files.tables import write_arrow_table, write_table
from sim.output.records import REQUEST_COLUMNS, STEP_COLUMNS, columns_frame, empty_frame
from sim.output.results import VIOLATION_COLUMNS, violations_frame

KINDS = ("int", "float", "text", "none")


def _column(draw, kind: str, n: int) -> np.ndarray:
    if kind == "int":
        return np.array(draw(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=n, max_size=n)))
    if kind == "float":
        values = st.one_of(st.floats(allow_nan=False), st.just(math.nan))
        return np.array(draw(st.lists(values, min_size=n, max_size=n)), dtype=np.float64)
    if kind == "text":
        values = st.one_of(st.text(max_size=6), st.none())
        return np.array(draw(st.lists(values, min_size=n, max_size=n)) + [None], dtype=object)[:n]
    return np.array([None] * n + [0], dtype=object)[:n]


@st.composite
def chunks(draw) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    kinds = draw(st.lists(st.sampled_from(KINDS), min_size=1, max_size=5))
    n = draw(st.integers(0, 8))
    names = tuple(f"c{i}" for i in range(len(kinds)))
    return {name: _column(draw, kind, n) for name, kind in zip(names, kinds, strict=True)}, names


def _same(ours: pa.Table, theirs: pa.Table) -> None:
    assert ours.schema.equals(theirs.schema, check_metadata=True)
    assert ours.schema.metadata == theirs.schema.metadata
    assert ours.equals(theirs)


@settings(max_examples=200, deadline=None)
@given(chunks())
def test_arrow_table_is_what_from_pandas_makes(chunk):
    columns, names = chunk
    theirs = pa.Table.from_pandas(columns_frame(columns, names), preserve_index=False)
    _same(arrow_table(columns, names), theirs)


@settings(max_examples=50, deadline=None)
@given(chunks(), st.data())
def test_a_later_chunk_takes_the_first_chunks_schema(chunk, data):
    """FileSink passes the first chunk's schema for every later chunk, as to from_pandas."""
    first, names = chunk
    if any(c.dtype == object and all(v is None for v in c) for c in first.values()):
        return  # a null-typed first column takes no text later: from_pandas refuses too
    schema = arrow_table(first, names).schema
    kinds = [
        "int" if c.dtype.kind == "i" else "float" if c.dtype.kind == "f" else "text"
        for c in first.values()
    ]
    n = data.draw(st.integers(0, 8))
    later = {name: _column(data.draw, kind, n) for name, kind in zip(names, kinds, strict=True)}
    frame = columns_frame(later, names)
    theirs = pa.Table.from_pandas(frame, preserve_index=False, schema=schema)
    ours = arrow_table(later, names, schema)
    # from_pandas describes the later chunk in its metadata, but only the first chunk's
    # schema reaches a file (the Parquet footer); the columns are what must agree.
    assert ours.schema.equals(theirs.schema, check_metadata=False)
    assert ours.equals(theirs)


def _run_like_chunk(names: tuple[str, ...], n: int = 50) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    columns = {}
    for name in names:
        if name in ("state", "reason"):
            columns[name] = np.array(rng.choice(["finished", "stop", ""], n), dtype=object)
        elif name.endswith("_s"):
            values = rng.random(n)
            values[::7] = np.nan
            columns[name] = values
        else:
            columns[name] = rng.integers(0, 10**6, n)
    return columns


@pytest.mark.parametrize("names", [REQUEST_COLUMNS, STEP_COLUMNS], ids=["requests", "steps"])
def test_written_files_are_byte_identical(tmp_path, names):
    columns = _run_like_chunk(names)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_arrow_table(arrow_table(columns, names), tmp_path / "a", "t")
    write_table(columns_frame(columns, names), tmp_path / "b", "t")
    for suffix in ("csv", "parquet"):
        assert (tmp_path / "a" / f"t.{suffix}").read_bytes() == (
            tmp_path / "b" / f"t.{suffix}"
        ).read_bytes()


@pytest.mark.parametrize("names", [REQUEST_COLUMNS, tuple(VIOLATION_COLUMNS)])
def test_empty_table_files_are_byte_identical(tmp_path, names):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_arrow_table(empty_arrow_table(names), tmp_path / "a", "t")
    write_table(empty_frame(names), tmp_path / "b", "t")
    for suffix in ("csv", "parquet"):
        assert (tmp_path / "a" / f"t.{suffix}").read_bytes() == (
            tmp_path / "b" / f"t.{suffix}"
        ).read_bytes()


_CELL = {
    "int": st.integers(-(2**63), 2**63 - 1),
    "float": st.floats(allow_nan=False),
    "text": st.text(max_size=5),
}


@st.composite
def record_rows(draw):
    """Rows of dicts, each column drawn from a few kinds, each kind maybe with None."""
    n = draw(st.integers(0, 6))
    names = VIOLATION_COLUMNS
    columns = {}
    for name in names:
        kinds = draw(st.sets(st.sampled_from(["int", "float", "text", "none"]), min_size=1))
        cell = st.one_of(*[st.none() if k == "none" else _CELL[k] for k in sorted(kinds)])
        columns[name] = draw(st.lists(cell, min_size=n, max_size=n))
    return [{name: columns[name][i] for name in names} for i in range(n)]


@settings(max_examples=300, deadline=None)
@given(record_rows())
def test_records_columns_infer_what_from_records_infers(rows):
    columns = records_columns(rows, VIOLATION_COLUMNS)
    kinds = [{type(row[name]) for row in rows} - {type(None)} for name in VIOLATION_COLUMNS]
    if any(len(k) > 1 and k != {int, float} for k in kinds):
        assert columns is None  # mixed kinds: left to pandas
        return
    frame = pd.DataFrame.from_records(rows, columns=VIOLATION_COLUMNS)
    theirs = pa.Table.from_pandas(frame, preserve_index=False)
    assert columns is not None
    _same(arrow_table(columns, VIOLATION_COLUMNS), theirs)


def test_records_columns_leave_bools_to_pandas():
    assert records_columns([{"a": True}], ["a"]) is None


def test_violations_table_of_a_real_run_is_what_pandas_makes(tmp_path):
    from sim.engine.run import builtin_scenario_path, run

    result = run(builtin_scenario_path(), overrides={"workload.first_n": 1500})
    assert result.num_violations > 0  # the default scenario shows the v0-v2 undercount
    ours = result.violations_arrow()
    violation_list = list(result._violation_list or [])
    theirs = pa.Table.from_pandas(violations_frame(violation_list), preserve_index=False)
    assert ours is not None
    _same(ours, theirs)
    assert result.first_violations(2) == [
        (v.kind.value, v.time_s, v.message) for v in violation_list[:2]
    ]


def test_pandas_version_is_the_imported_ones():
    assert _pandas_version() == pd.__version__
