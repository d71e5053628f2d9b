"""Run records -> pandas DataFrames and a summary, and writing them to an output directory.

The frames are made when asked for: `kvsim run` writes `requests`, `steps` and `violations`
straight from the run's records through Arrow (`sim.files.arrow`, the bytes pandas wrote), so
only a run with a `sessions` or `kv_events` table imports pandas.

Tables (each as Parquet and CSV):

* ``requests``: one row per workload request, whatever happened to it;
* ``steps``: one row per engine step (batch composition, blocks, queue lengths);
* ``violations``: one row per auditor finding;
* ``kv_events``: one row per block of each replica's KV cache events, only when the run
  records them (`engine.kv_events`; layout in `sim.kv_events.table`).

Latencies: TTFT = first token - arrival; TPOT = (finish - first token) / (generated - 1);
end-to-end = finish - arrival; queueing = first scheduled - arrival.
Example: arrival 1.0 s, first token 1.5 s, finish 3.5 s with 5 tokens -> TTFT 0.5 s,
TPOT 0.5 s, end-to-end 2.5 s.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from sim.audit.violations import Violation
from sim.engine.engine import RunRecords
from sim.files.arrow import arrow_table, records_columns
from sim.files.tables import write_arrow_table
from sim.files.tables import write_csv as _write_csv
from sim.output.records import REQUEST_COLUMNS as _REQUEST_COLUMNS

if TYPE_CHECKING:  # pandas loads when a frame is asked for: `kvsim run` needs none
    import pandas as pd
    import pyarrow as pa

REQUEST_COLUMNS = list(_REQUEST_COLUMNS)
VIOLATION_COLUMNS = [
    "kind",
    "call",
    "request_id",
    "message",
    "counted_blocks",
    "needed_blocks",
    "free_blocks",
    "time_s",
    "step",
    "recovered_blocks",
]
#: The tables a run writes, each as `NAME.parquet` and `NAME.csv`.
TABLES = ("steps", "requests", "violations", "sessions", "kv_events")


def requests_frame(records: RunRecords) -> pd.DataFrame:
    return records.requests.sink.frame()


def steps_frame(records: RunRecords) -> pd.DataFrame:
    return records.steps.sink.frame()


def violations_frame(violations: list[Violation]) -> pd.DataFrame:
    import pandas as pd

    return pd.DataFrame.from_records([v.to_row() for v in violations], columns=VIOLATION_COLUMNS)


class RunResult:
    """Everything one run produced: DataFrames, the summary, and the run's inputs.

    `requests` and `steps` are DataFrames; a run whose tables were streamed to files
    (`tables_dir`) reads them back from its Parquet files on first use. `violations` is a
    DataFrame too, made on first use from the run's `Violation` list when given that
    (`violation_list`), so that a run nobody asks for frames imports no pandas.
    """

    def __init__(
        self,
        requests: pd.DataFrame | None,
        steps: pd.DataFrame | None,
        violations: pd.DataFrame | None,
        summary: dict,
        inputs: dict | None = None,
        *,
        tables_dir: Path | None = None,
        violation_list: list[Violation] | None = None,
    ) -> None:
        if tables_dir is None and (requests is None or steps is None):
            raise ValueError("RunResult needs the requests and steps frames, or tables_dir")
        if violations is None and violation_list is None:
            raise ValueError("RunResult needs the violations frame, or violation_list")
        self._requests = requests
        self._steps = steps
        self._violations = violations
        self._violation_list = violation_list
        self.summary = summary
        self.inputs = inputs if inputs is not None else {}
        #: The folder the `requests` and `steps` tables were streamed to (None: in memory).
        self.tables_dir = tables_dir
        #: One row per session of a multi-turn workload (`sim.output.sessions`); None otherwise.
        self.sessions: pd.DataFrame | None = None
        self._kv_events: pd.DataFrame | None = None
        #: The `kv_events` table was streamed to `tables_dir` (read back on first use).
        self.kv_events_streamed = False

    @property
    def requests(self) -> pd.DataFrame:
        if self._requests is None:
            import pandas as pd

            assert self.tables_dir is not None
            self._requests = pd.read_parquet(self.tables_dir / "requests.parquet")
        return self._requests

    @property
    def steps(self) -> pd.DataFrame:
        if self._steps is None:
            import pandas as pd

            assert self.tables_dir is not None
            self._steps = pd.read_parquet(self.tables_dir / "steps.parquet")
        return self._steps

    @property
    def violations(self) -> pd.DataFrame:
        if self._violations is None:
            assert self._violation_list is not None
            self._violations = violations_frame(self._violation_list)
        return self._violations

    @property
    def num_violations(self) -> int:
        if self._violations is None:
            assert self._violation_list is not None
            return len(self._violation_list)
        return len(self._violations)

    def first_violations(self, limit: int) -> list[tuple[str, float | None, str]]:
        """(kind, time_s, message) of the first `limit` violations."""
        if self._violations is None:
            assert self._violation_list is not None
            return [(v.kind.value, v.time_s, v.message) for v in self._violation_list[:limit]]
        head = self._violations.head(limit)
        return list(zip(head["kind"], head["time_s"], head["message"], strict=True))

    def violations_arrow(self) -> pa.Table | None:
        """The `violations` table as Arrow, made without pandas, or None where only pandas
        knows its column types (a frame given, or values `records_columns` does not infer)."""
        if self._violations is not None:
            return None
        assert self._violation_list is not None
        rows = [v.to_row() for v in self._violation_list]
        columns = records_columns(rows, VIOLATION_COLUMNS)
        return None if columns is None else arrow_table(columns, VIOLATION_COLUMNS)

    @property
    def kv_events(self) -> pd.DataFrame | None:
        """None unless the run recorded KV events (`engine.kv_events`)."""
        if self._kv_events is None and self.kv_events_streamed:
            import pandas as pd

            assert self.tables_dir is not None
            self._kv_events = pd.read_parquet(self.tables_dir / "kv_events.parquet")
        return self._kv_events

    @kv_events.setter
    def kv_events(self, frame: pd.DataFrame | None) -> None:
        self._kv_events = frame

    @property
    def violation_kinds(self) -> set[str]:
        if self._violations is None:
            assert self._violation_list is not None
            return {v.kind.value for v in self._violation_list}
        return set(self._violations["kind"]) if len(self._violations) else set()


def summarize(records: RunRecords) -> dict:
    """The run's summary, from the statistics gathered while its tables were written."""
    numbers = records.stats.summary_numbers(records.end_s)
    return {
        "num_requests": numbers["num_requests"],
        "states": numbers["states"],
        "num_violations": len(records.violations),
        "violation_kinds": sorted({v.kind.value for v in records.violations}),
        "simulated_s": numbers["simulated_s"],
        "num_steps": numbers["num_steps"],
        "throughput_req_per_s": numbers["throughput_req_per_s"],
        "throughput_tok_per_s": numbers["throughput_tok_per_s"],
        "ttft_p50_s": numbers["ttft_p50_s"],
        "ttft_p99_s": numbers["ttft_p99_s"],
        "tpot_p50_s": numbers["tpot_p50_s"],
        "tpot_p99_s": numbers["tpot_p99_s"],
        "e2e_p50_s": numbers["e2e_p50_s"],
        "e2e_p99_s": numbers["e2e_p99_s"],
        "num_preemptions": numbers["num_preemptions"],
        "kv_util_mean": numbers["kv_util_mean"],
        "kv_util_max": numbers["kv_util_max"],
        "fatal_error": records.fatal_error,
        "stopped_early": records.stopped_early,
    }


def build_result(
    records: RunRecords,
    inputs: dict | None = None,
    step_time_band: dict | None = None,
    tables_dir: Path | None = None,
) -> RunResult:
    """The run's tables and summary. `step_time_band` (a `StepTimeBand.as_dict()`) says how
    sure the step times behind every latency are; it goes into the summary as is.
    `tables_dir`: the folder the tables were streamed to (they are read back when used)."""
    summary = summarize(records)
    summary["step_time_band"] = step_time_band
    violation_list = list(records.violations)
    if tables_dir is not None:
        result = RunResult(
            None,
            None,
            None,
            summary,
            inputs,
            tables_dir=tables_dir,
            violation_list=violation_list,
        )
    else:
        result = RunResult(
            requests_frame(records),
            steps_frame(records),
            None,
            summary,
            inputs,
            violation_list=violation_list,
        )
    if records.kv_events is not None:
        from sim.kv_events import kv_events_frame, write_kv_events

        if tables_dir is not None:
            # Piece by piece from the streams' spill files (`sim.kv_events.stream`): the
            # table is never whole in memory, like `requests` and `steps`.
            write_kv_events(records.kv_events, tables_dir)
            result.kv_events_streamed = True
        else:
            result.kv_events = kv_events_frame(records.kv_events)
    return result


def _json_default(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    raise TypeError(f"not JSON serialisable: {value!r}")


def summary_json(result: RunResult) -> str:
    clean = {
        k: (None if isinstance(v, float) and math.isnan(v) else v)
        for k, v in result.summary.items()
    }
    return json.dumps(
        {"summary": clean, "inputs": result.inputs}, indent=2, sort_keys=True, default=_json_default
    )


def write_result(result: RunResult, out_dir: str | Path) -> Path:
    """Write every table as Parquet and CSV plus summary.json; byte-identical for equal results.

    Atomic (`sim.files.outdir.staged_folder`): `out_dir` ends up holding the earlier run or this
    one, whole, never a mix; an interrupted write leaves it as it was.
    """
    from sim.files.outdir import staged_folder

    with staged_folder(Path(out_dir)) as staging:
        write_tables(result, staging)
    return Path(out_dir)


def write_tables(result: RunResult, out: Path) -> None:
    """The six tables and summary.json into the existing folder `out` (not atomic).

    Tables already streamed there during the run (`result.tables_dir == out`) are kept as
    they are; the others are written from the frames.
    """
    streamed = {"requests", "steps"} if result.tables_dir == Path(out) else set()
    if streamed and result.kv_events_streamed:
        streamed.add("kv_events")
    # Arrow encodes and compresses outside the GIL, so the files are written by two
    # threads at once (each file by one thread: the bytes do not depend on the schedule).
    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = []
        for name in TABLES:
            if name in streamed:
                continue
            table = result.violations_arrow() if name == "violations" else None
            if table is not None:  # no frame, no pandas
                jobs.append(pool.submit(write_arrow_table, table, out, name))
                continue
            frame = getattr(result, name)
            if frame is None:  # `sessions` / `kv_events` of a run without them
                continue
            jobs.append(pool.submit(_write_csv, frame, out / f"{name}.csv"))
            jobs.append(
                pool.submit(
                    frame.to_parquet, out / f"{name}.parquet", index=False, compression="zstd"
                )
            )
        for job in jobs:
            job.result()
    (out / "summary.json").write_text(summary_json(result) + "\n", encoding="utf-8")
