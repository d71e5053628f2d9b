"""A run's tables as files: Parquet (zstd) and CSV, whole (`write_table`) or chunk by chunk as
the run goes (`FileSink`); both give the same bytes for the same rows (CSV) and the same
content (Parquet; only the row groups differ).

CSV goes through Arrow's writer (about 6x faster than pandas' on a whole-trace `steps`):
floats in their shortest exact form, so the CSV reads back to the Parquet values; missing
values are empty fields; text is quoted only when it must be.

A new table is one more `FileSink(folder, "kv_events", names)` (or `write_table`) call: the
folder is whatever the caller writes into (the atomic staging folder of `sim.files.outdir` for
`kvsim run -o`), so a crash leaves no half-written table where the run's outputs go.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from sim.files.arrow import arrow_table, empty_arrow_table
from sim.output.records import Columns

if TYPE_CHECKING:  # the streamed tables are written without pandas (`sim.files.arrow`)
    import pandas as pd

_CSV_OPTIONS = pa_csv.WriteOptions(include_header=False, quoting_style="needed")
PARQUET_COMPRESSION = "zstd"


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """`frame` as CSV at `path` (header from the frame's columns)."""
    write_arrow_csv(pa.Table.from_pandas(frame, preserve_index=False), path)


def write_arrow_csv(table: pa.Table, path: Path) -> None:
    """`table` as CSV at `path` (header from the table's column names)."""
    with open(path, "wb") as sink:
        sink.write((",".join(table.column_names) + "\n").encode())
        pa_csv.write_csv(table, sink, _CSV_OPTIONS)


def write_table(frame: pd.DataFrame, folder: Path, name: str) -> None:
    """`frame` as `name.csv` and `name.parquet` in `folder`."""
    write_csv(frame, folder / f"{name}.csv")
    frame.to_parquet(folder / f"{name}.parquet", index=False, compression=PARQUET_COMPRESSION)


def write_arrow_table(table: pa.Table, folder: Path, name: str) -> None:
    """`table` (from `sim.files.arrow`) as `write_table` writes the frame pandas makes of it."""
    write_arrow_csv(table, folder / f"{name}.csv")
    pq.write_table(table, folder / f"{name}.parquet", compression=PARQUET_COMPRESSION)


class FileSink:
    """One table streamed to `folder/name.parquet` (a row group per chunk) and `name.csv`.

    The files are opened at the first chunk, with the Arrow schema (and pandas metadata) of
    that chunk (`sim.files.arrow.arrow_table`), which every chunk of a table shares. Encoding and compression run
    in one background thread (Arrow releases the GIL), at most one chunk behind the run, so
    the simulation goes on meanwhile and memory stays one chunk. A table that got no rows is
    written at `close()` as `write_table` writes an empty table.
    """

    def __init__(self, folder: Path, name: str, names: tuple[str, ...]) -> None:
        self.folder = Path(folder)
        self.name = name
        self.names = names
        self.parquet_path = self.folder / f"{name}.parquet"
        self.csv_path = self.folder / f"{name}.csv"
        self._schema: pa.Schema | None = None
        self._parquet: pq.ParquetWriter | None = None
        self._csv_file: BinaryIO | None = None
        self._csv: pa_csv.CSVWriter | None = None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"write-{name}")
        self._pending: Future | None = None
        self._closed = False

    def write(self, columns: Columns) -> None:
        self._write_table(arrow_table(columns, self.names, self._schema))

    def write_frame(self, frame: pd.DataFrame) -> None:
        """One chunk as a DataFrame (columns `names`, the same dtypes in every chunk)."""
        self._write_table(pa.Table.from_pandas(frame, preserve_index=False, schema=self._schema))

    def _write_table(self, table: pa.Table) -> None:
        if self._schema is None:
            self._schema = table.schema
        self._wait()
        self._pending = self._pool.submit(self._write, table)

    def _write(self, table: pa.Table) -> None:
        if self._parquet is None:
            self._parquet = pq.ParquetWriter(
                self.parquet_path, table.schema, compression=PARQUET_COMPRESSION
            )
            # Open across chunks; closed in `close()` / `abort()`.
            csv_file = open(self.csv_path, "wb")  # noqa: SIM115
            self._csv_file = csv_file
            csv_file.write((",".join(self.names) + "\n").encode())
            self._csv = pa_csv.CSVWriter(csv_file, table.schema, write_options=_CSV_OPTIONS)
        assert self._csv is not None
        self._parquet.write_table(table)
        self._csv.write_table(table)

    def _wait(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        """Finish the files (the last chunk written, footers); an error here propagates."""
        if self._closed:
            return
        self._closed = True
        try:
            self._wait()
        finally:
            self._pool.shutdown()
            self._close_files()
        if self._schema is None:
            write_arrow_table(empty_arrow_table(self.names), self.folder, self.name)

    def abort(self) -> None:
        """Stop without finishing: the caller discards the folder (a crashed or cut run)."""
        self._closed = True
        self._pool.shutdown(cancel_futures=True)
        self._close_files()

    def _close_files(self) -> None:
        if self._csv is not None:
            self._csv.close()
        if self._csv_file is not None:
            self._csv_file.close()
        if self._parquet is not None:
            self._parquet.close()
        self._parquet = self._csv = self._csv_file = None

    def frame(self) -> pd.DataFrame:
        """The table read back from its Parquet file."""
        import pandas as pd

        return pd.read_parquet(self.parquet_path)
