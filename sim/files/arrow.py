"""A run's table columns as the Arrow table pandas would make of them, without importing pandas.

The `requests`, `steps` and (empty) `violations` files were always written from a DataFrame
through `pa.Table.from_pandas(frame, preserve_index=False)`, whose schema carries a ``pandas``
metadata entry (column dtypes, pandas and pyarrow versions) that `pd.read_parquet` uses to
rebuild the frame. `arrow_table` builds the same table, byte for byte in the files, straight
from numpy columns, so `kvsim run` writes its tables without loading pandas (~0.2 s);
tests/output/test_arrow_tables.py compares the two for every kind of column the tables have.

Column kinds (those of `sim.output.records.STEP_DTYPE` / `REQUEST_DTYPE`):

* int64 -> int64 (pandas_type "int64");
* float64 -> double, NaN stored as null, as `from_pandas` does (pandas_type "float64");
* object holding text -> large_string, None as null (pandas 3's ``str`` dtype: pandas_type
  "object", numpy_type "str"); an object column with no value at all (every row None, or no
  rows) -> null (pandas_type "empty"), as pandas leaves it ``object``.

Example: {"step": int64 [0, 1], "start_s": float64 [0.0, nan]} -> step: int64 [0, 1],
start_s: double [0.0, null], metadata ``{"index_columns": [], "column_indexes": [],
"columns": [{"name": "step", "field_name": "step", "pandas_type": "int64", ...}], ...}``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import cache
from importlib import metadata

import numpy as np
import pyarrow as pa


@cache
def _pandas_version() -> str:
    """The installed pandas' version, as `pandas.__version__` says, read without importing it."""
    return metadata.version("pandas")


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    """Arrow's validity bitmap (bit i set: row i has a value); None when every row has one."""
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _column(values: np.ndarray) -> tuple[pa.Array, str, str]:
    """(the Arrow array, pandas_type, numpy_type) of one column.

    Made from buffers: `pa.array` of anything but Arrow data imports pandas (pyarrow checks
    whether the input is a pandas object), which is what this module is for avoiding.
    """
    n = len(values)
    kind = values.dtype.kind
    if kind == "i" and values.dtype.itemsize == 8:
        data = pa.py_buffer(np.ascontiguousarray(values, dtype=np.int64))
        return pa.Array.from_buffers(pa.int64(), n, [None, data]), "int64", "int64"
    if kind == "f" and values.dtype.itemsize == 8:
        data = np.ascontiguousarray(values, dtype=np.float64)
        valid = ~np.isnan(data)  # NaN is stored as null, as `from_pandas` does
        buffers = [_validity(valid), pa.py_buffer(data)]
        nulls = n - int(np.count_nonzero(valid))
        array = pa.Array.from_buffers(pa.float64(), n, buffers, null_count=nulls)
        return array, "float64", "float64"
    if kind == "O":
        return _text_column(values)
    raise TypeError(f"no pandas-equivalent Arrow column for numpy dtype {values.dtype}")


def _text_column(values: np.ndarray) -> tuple[pa.Array, str, str]:
    """An object column of str (None: missing) as large_string; all missing: null-typed."""
    n = len(values)
    valid = values != None  # noqa: E711 - elementwise on an object array
    if not valid.any():  # nothing to infer a type from: pandas keeps it `object`
        return pa.nulls(n), "empty", "object"
    texts = values.tolist() if valid.all() else ["" if v is None else v for v in values]
    joined = "".join(texts)
    data = joined.encode("utf-8")
    lengths = np.fromiter(map(len, texts), dtype=np.int64, count=n)
    if len(data) != len(joined):  # not all ASCII: the offsets count bytes, not characters
        lengths = np.fromiter((len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    buffers = [_validity(valid), pa.py_buffer(offsets), pa.py_buffer(data)]
    nulls = n - int(np.count_nonzero(valid))
    array = pa.Array.from_buffers(pa.large_string(), n, buffers, null_count=nulls)
    return array, "object", "str"


def pandas_metadata(columns: Sequence[tuple[str, str, str]]) -> bytes:
    """The ``pandas`` schema metadata `from_pandas` writes for (name, pandas_type, numpy_type)."""
    entries = [
        {
            "name": name,
            "field_name": name,
            "pandas_type": pandas_type,
            "numpy_type": numpy_type,
            "metadata": None,
        }
        for name, pandas_type, numpy_type in columns
    ]
    return json.dumps(
        {
            "index_columns": [],
            "column_indexes": [],
            "columns": entries,
            "attributes": {},
            "creator": {"library": "pyarrow", "version": pa.__version__},
            "pandas_version": _pandas_version(),
        }
    ).encode("utf8")


def arrow_table(
    columns: Mapping[str, np.ndarray], names: Sequence[str], schema: pa.Schema | None = None
) -> pa.Table:
    """`pa.Table.from_pandas(pd.DataFrame(columns)[names], preserve_index=False, schema=schema)`.

    With `schema` (a table's first chunk's), the columns are cast to it, as `from_pandas` does.
    """
    arrays, kinds = [], []
    for name in names:
        array, pandas_type, numpy_type = _column(columns[name])
        arrays.append(array)
        kinds.append((name, pandas_type, numpy_type))
    if schema is not None:
        cast = [
            a if a.type == field.type else a.cast(field.type)
            for a, field in zip(arrays, schema, strict=True)
        ]
        return pa.Table.from_arrays(cast, schema=schema)
    fields = [pa.field(name, array.type) for name, array in zip(names, arrays, strict=True)]
    return pa.Table.from_arrays(
        arrays, schema=pa.schema(fields, metadata={b"pandas": pandas_metadata(kinds)})
    )


def empty_arrow_table(names: Sequence[str]) -> pa.Table:
    """`sim.output.records.empty_frame(names)` as Arrow: every column null-typed, no rows."""
    return arrow_table({name: np.empty(0, dtype=object) for name in names}, names)


def records_columns(
    rows: Sequence[Mapping[str, object]], names: Sequence[str]
) -> dict[str, np.ndarray] | None:
    """The numpy columns `pd.DataFrame.from_records(rows, columns=names)` infers, or None.

    For each column, by the types of its values (None: missing):

    * ints alone -> int64; ints and None -> float64 with NaN;
    * floats (and ints, and None) -> float64 with NaN;
    * str (and None) -> object, which `arrow_table` makes large_string (pandas 3's `str`);
    * None alone -> object (a null column, pandas_type "empty").

    None for anything else (bools, numpy scalars, ints beyond int64, mixed kinds): the caller
    lets pandas infer those. Example: request_id [3, None] -> float64 [3.0, nan].
    """
    columns = {}
    for name in names:
        values = [row[name] for row in rows]
        column = _inferred(values)
        if column is None:
            return None
        columns[name] = column
    return columns


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


def _inferred(values: list) -> np.ndarray | None:
    kinds = {type(v) for v in values}
    has_none = type(None) in kinds
    kinds.discard(type(None))
    if not kinds or kinds == {str}:
        return np.array(values, dtype=object)
    if kinds == {int} and all(_INT64_MIN <= v <= _INT64_MAX for v in values if v is not None):
        if not has_none:
            return np.array(values, dtype=np.int64)
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    if kinds <= {int, float}:
        return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
    return None
