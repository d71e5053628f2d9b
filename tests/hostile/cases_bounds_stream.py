"""Class 2, bounded memory: trace files are read in chunks (`sim.workload.trace_stream`).

Every case puts its fault where whole-file reading never had to look twice: beyond the first
chunk (65,536 rows), on a chunk boundary, after a run of blank lines longer than a chunk, in
a single huge line, in a truncated file. The answer must still be one line naming the file,
the line (or Parquet row) and the column, exactly as for a small file. The big files are
written by `setup` (a text file in `files` would be megabytes of source).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tests.hostile.harness import Case

#: Rows a trace chunk holds (`sim.workload.trace_stream.TRACE_CHUNK_ROWS`); a fault at row
#: index CHUNK is the first row of the second chunk, file line CHUNK + 2 in a CSV.
CHUNK = 65_536
VIDUR_HEADER = "arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\r\n"


def scenario(workload: str) -> str:
    """A tiny V1 scenario whose workload is `workload` (YAML flow mapping)."""
    return (
        "name: stream\nmodel: null\n"
        "cache: {block_size: 16, num_gpu_blocks: 64, num_cpu_blocks: 0, sliding_window: null}\n"
        "scheduler: {design: v1-engine, max_model_len: 256}\n"
        f"workload: {workload}\n"
        "step_time: {linear: {fixed_s: 0.01}}\n"
    )


VIDUR = scenario("{kind: trace, path: t.csv, format: vidur}")
VIDUR_FIRST_3 = scenario("{kind: trace, path: t.csv, format: vidur, first_n: 3}")


def vidur_row(i: int) -> str:
    return f"{i * 0.001!r},10,5,15,2\n"


def writes(name: str, build: Callable[[], str | bytes]) -> Callable[[Path], None]:
    """A `setup` that writes what `build` returns to `name` in the case's folder."""

    def setup(folder: Path) -> None:
        data = build()
        path = folder / name
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")

    return setup


def vidur(num_rows: int, replace: dict[int, str] | None = None, tail: str = "") -> str:
    """A Vidur trace of `num_rows` rows, row i replaced by `replace[i]`, then `tail`."""
    replace = replace or {}
    rows = [replace.get(i, vidur_row(i)) for i in range(num_rows)]
    return VIDUR_HEADER + "".join(rows) + tail


def jsonl(num_rows: int, replace: dict[int, str] | None = None, mooncake: bool = False) -> str:
    replace = replace or {}
    lines = []
    for i in range(num_rows):
        if mooncake:
            record = {"timestamp": i, "input_length": 10, "output_length": 5, "hash_ids": [i]}
        else:
            record = {"arrival_s": i * 0.001, "prompt_tokens": 10, "output_tokens": 5}
        lines.append(replace.get(i, json.dumps(record) + "\n"))
    return "".join(lines)


def azure(num_rows: int, replace: dict[int, str] | None = None) -> str:
    replace = replace or {}
    rows = [
        replace.get(
            i, f"2023-11-16 18:{i // 6000 % 60:02d}:{i // 100 % 60:02d}.{i % 100:07d},10,5\r\n"
        )
        for i in range(num_rows)
    ]
    return AZURE_HEADER + "".join(rows)


def parquet_setup(num_rows: int, bad_row: int | None, truncate: bool = False):
    def setup(folder: Path) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        prompt = [10] * num_rows
        if bad_row is not None:
            prompt[bad_row] = 0
        table = pa.table(
            {
                "arrival_s": [i * 0.001 for i in range(num_rows)],
                "prompt_tokens": prompt,
                "output_tokens": [5] * num_rows,
            }
        )
        path = folder / "t.parquet"
        pq.write_table(table, path, row_group_size=20_000)
        if truncate:
            data = path.read_bytes()
            path.write_bytes(data[: len(data) // 2])

    return setup


def run_case(fragment: str, setup, name: str, workload: str = VIDUR, exit: int = 2, **kw) -> Case:
    return Case(
        "bounds",
        ("run", "s.yaml", "--no-plots", "-o", "out"),
        exit,
        fragment,
        files={"s.yaml": workload},
        setup=setup,
        outputs=("out",),
        name=name,
        **kw,
    )


_LATE = 100_000  # a row index well inside the second chunk

CASES: list[Case] = [
    run_case(
        f"t.csv:{_LATE + 2}: column 'num_prefill_tokens': not a number: 'ten'",
        writes("t.csv", lambda: vidur(120_000, {_LATE: f"{_LATE * 0.001!r},ten,5,15,2\n"})),
        "stream: a bad value late in a big Vidur trace names its line",
    ),
    run_case(
        f"t.csv:{CHUNK + 2}: column 'num_decode_tokens': must be >= 1, got 0",
        writes("t.csv", lambda: vidur(CHUNK + 10, {CHUNK: f"{CHUNK * 0.001!r},10,0,10,2\n"})),
        "stream: a bad value in the first row of the second chunk names its line",
    ),
    run_case(
        f"t.csv:{CHUNK + 1}: column 'num_prefill_tokens': must be >= 1, got 0",
        writes(
            "t.csv", lambda: vidur(CHUNK + 10, {CHUNK - 1: f"{(CHUNK - 1) * 0.001!r},0,5,5,2\n"})
        ),
        "stream: a bad value in the last row of the first chunk names its line",
    ),
    run_case(
        f"t.csv:{CHUNK + 2}: column 'arrived_at': arrivals must be non-decreasing: "
        f"0.5 s comes after {(CHUNK - 1) * 0.001:.9g} s on line {CHUNK + 1}",
        writes("t.csv", lambda: vidur(CHUNK + 10, {CHUNK: "0.5,10,5,15,2\n"})),
        "stream: arrivals going back across a chunk boundary name both lines",
    ),
    run_case(
        "t.csv:90000: expected 5 fields, found 6",
        writes("t.csv", lambda: vidur(100_000, {89_998: "89.998,10,5,15,2,7\n"})),
        "stream: a row with too many fields late in the file names its line",
    ),
    run_case(
        f"t.csv:{CHUNK + 1}: column 'arrived_at': missing value",
        writes("t.csv", lambda: vidur(CHUNK + 10, {CHUNK - 1: "\n"})),
        "stream: a blank line ending the first chunk with data after it",
    ),
    run_case(
        f"t.csv:{CHUNK + 2}: column 'arrived_at': missing value",
        writes("t.csv", lambda: vidur(CHUNK, tail="\n" * 70_000 + vidur_row(CHUNK))),
        "stream: a run of blank lines longer than a chunk with data after it",
    ),
    run_case(
        "outputs",
        writes("t.csv", lambda: vidur(CHUNK + 5, tail="\n" * 70_000)),
        "stream: blank lines longer than a chunk at the end are dropped",
        workload=VIDUR_FIRST_3,
        exit=0,
    ),
    run_case(
        f"t.csv:{100_000 + 1}: column 'num_decode_tokens': missing value",
        writes("t.csv", lambda: vidur(99_999) + f"{99_999 * 0.001!r},10"),
        "stream: a truncated file (last row cut inside a field) names the cut line",
    ),
    run_case(
        "t.csv:70002: column 'num_prefill_tokens': not a number: 'xxxx",
        writes("t.csv", lambda: vidur(80_000, {70_000: "70.0," + "x" * 20_000_000 + ",5,15,2\n"})),
        "stream: a 20 MB single line names its line, bounded",
        subprocess=True,
        timeout_s=120,
    ),
    run_case(
        "file is empty (no header line)",
        writes("t.csv", lambda: ""),
        "stream: an empty Vidur trace",
    ),
    run_case(
        "no requests in file",
        writes("t.csv", lambda: VIDUR_HEADER),
        "stream: a Vidur trace with a header only",
    ),
    run_case(
        "no requests in file",
        writes("t.csv", lambda: VIDUR_HEADER + "\n" * (CHUNK * 2 + 3)),
        "stream: a header then more than two chunks of blank lines",
    ),
    run_case(
        "not UTF-8 text",
        writes("t.csv", lambda: vidur(90_000).encode() + b"\xff\xfe,1,1,2,1\n"),
        "stream: bytes that are not UTF-8 at the end of a big trace",
    ),
    run_case(
        "t.jsonl:80001: invalid JSON",
        writes("t.jsonl", lambda: jsonl(90_000, {80_000: '{"arrival_s": 80.0, \n'})),
        "stream: broken JSON late in a canonical JSONL trace names its line",
        workload=scenario("{kind: trace, path: t.jsonl, format: canonical}"),
    ),
    run_case(
        "t.jsonl:70001: line longer than 16,777,216 characters",
        writes(
            "t.jsonl",
            lambda: jsonl(
                70_005,
                {70_000: '{"arrival_s": 70.0, "pad": "' + "x" * (1 << 25) + '"}\n'},
            ),
        ),
        "stream: a 32 MB JSONL line is refused, not read whole",
        workload=scenario("{kind: trace, path: t.jsonl, format: canonical}"),
        subprocess=True,
        timeout_s=120,
    ),
    run_case(
        "t.csv:1: column 'arrival_s': missing required column",
        writes("t.csv", lambda: "x" * (1 << 25)),
        "stream: a 32 MB first line with no newline under format auto",
        workload=scenario("{kind: trace, path: t.csv}"),
        subprocess=True,
        timeout_s=120,
    ),
    run_case(
        f"t.jsonl:{CHUNK + 1}: blank line between records",
        writes("t.jsonl", lambda: jsonl(CHUNK + 5, {CHUNK: "\n"})),
        "stream: a blank JSONL line at the chunk boundary names its line",
        workload=scenario("{kind: trace, path: t.jsonl, format: canonical}"),
    ),
    run_case(
        f"t.jsonl:{CHUNK + 1}: column 'arrival_s': arrivals must be non-decreasing: 0 s comes "
        f"after {(CHUNK - 1) * 0.001:.9g} s on line {CHUNK}",
        writes(
            "t.jsonl",
            lambda: jsonl(
                CHUNK + 5,
                {CHUNK: '{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n'},
            ),
        ),
        "stream: JSONL arrivals going back across a chunk boundary",
        workload=scenario("{kind: trace, path: t.jsonl, format: canonical}"),
    ),
    run_case(
        "t.jsonl:70001: column 'hash_ids': has 2 ids but ceil(10 prompt tokens / 512) = 1",
        writes(
            "t.jsonl",
            lambda: jsonl(
                75_000,
                {
                    70_000: '{"timestamp": 70000, "input_length": 10, "output_length": 5, '
                    '"hash_ids": [1, 2]}\n'
                },
                mooncake=True,
            ),
        ),
        "stream: a bad hash_ids list late in a Mooncake trace names its line",
        workload=scenario("{kind: trace, path: t.jsonl, format: mooncake}"),
    ),
    run_case(
        "t.parquet:row 100001: column 'prompt_tokens': must be >= 1, got 0",
        parquet_setup(120_000, 100_000),
        "stream: a bad value in a late Parquet row group names its row",
        workload=scenario("{kind: trace, path: t.parquet, format: canonical}"),
    ),
    run_case(
        "cannot read Parquet",
        parquet_setup(120_000, None, truncate=True),
        "stream: a truncated Parquet trace",
        workload=scenario("{kind: trace, path: t.parquet, format: canonical}"),
    ),
    run_case(
        "t.csv:80002: column 'TIMESTAMP': expected 'YYYY-MM-DD HH:MM:SS[.fffffff]', got 'soon'",
        writes("t.csv", lambda: azure(90_000, {80_000: "soon,10,5\r\n"})),
        "stream: a bad Azure timestamp late in the file names its line",
        workload=scenario("{kind: trace, path: t.csv, format: azure}"),
    ),
    run_case(
        f"t.csv:{CHUNK + 2}: column 'TIMESTAMP': arrivals must be non-decreasing",
        writes("t.csv", lambda: azure(CHUNK + 5, {CHUNK: "2023-11-16 18:00:00.0000000,10,5\r\n"})),
        "stream: Azure timestamps going back across a chunk boundary",
        workload=scenario("{kind: trace, path: t.csv, format: azure}"),
    ),
    run_case(
        "t.csv:3: column 'TIMESTAMP': expected 'YYYY-MM-DD HH:MM:SS[.fffffff]', "
        "got '2263-01-01 00:00:00'",
        writes(
            "t.csv",
            lambda: (
                AZURE_HEADER
                + "2023-11-16 18:15:46,1,1\r\n2263-01-01 00:00:00,2,2\r\n2500-01-01 00:00:00,1,1\r\n"
            ),
        ),
        "stream: an Azure year past 2262 is refused, not wrapped in nanoseconds",
        workload=scenario("{kind: trace, path: t.csv, format: azure}"),
    ),
    run_case(
        "t.csv:90000: column 'num_total_tokens': 11 != 10 + 5",
        writes(
            "t.csv",
            lambda: (
                "num_prefill_tokens,num_decode_tokens,num_total_tokens\n"
                + "10,5,15\n" * 89_998
                + "10,5,11\n"
            ),
        ),
        "stream: a lengths file whose total disagrees late in the file",
        workload=scenario(
            "{kind: trace, path: t.csv, format: lengths, num_requests: 3, "
            "arrival: {process: poisson, rate_per_s: 1.0}}"
        ),
    ),
    run_case(
        "no request arrives in [1000, 2000) s (arrivals span 0 to 70.004 s)",
        writes("t.csv", lambda: vidur(70_005)),
        "stream: a time window past the end of a big trace",
        workload=scenario("{kind: trace, path: t.csv, format: vidur, time_range_s: [1000, 2000]}"),
    ),
    run_case(
        "outputs",
        writes("t.csv", lambda: vidur(CHUNK + 100)),
        "stream: a window inside the second chunk of a big trace runs",
        workload=scenario(
            "{kind: trace, path: t.csv, format: vidur, time_range_s: [65.6, 65.603]}"
        ),
        exit=0,
    ),
]
