"""Bounded memory (issue #13): columnar records, tables streamed to files as the run goes, and
a lazy synthetic workload. The streamed tables equal the in-memory ones; a run holds the
requests in flight, not the trace; the lazy generator draws the same requests as the
whole-array one."""

from __future__ import annotations

import dataclasses
import gc
import itertools
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import sim.engine.run
import sim.output.records
from sim.ci.fuzz_cases import FUZZ_STEP_TIME
from sim.cli.main import EXIT_INTERRUPTED, app
from sim.engine.engine import Engine
from sim.engine.run import file_sinks, resolve
from sim.files.tables import write_table
from sim.output.records import (
    REQUEST_COLUMNS,
    REQUEST_DTYPE,
    STEP_COLUMNS,
    STEP_DTYPE,
    ColumnarTable,
    MemorySink,
    RequestRows,
)
from sim.output.results import build_result, write_result
from sim.output.stats import IN_MEMORY_MAX, chunked_mean, exact_percentiles
from sim.scenario.schema import scenario_from_dict
from sim.scheduler import Request
from sim.workload.config import ArrivalConfig, LengthsConfig
from sim.workload.request import RequestSpec
from sim.workload.synthetic import (
    _ARRIVAL_STREAM,
    _OUTPUT_STREAM,
    _PROMPT_STREAM,
    LazySpecs,
    arrival_times,
    sample_lengths,
    stream,
    workload_from_arrays,
)

runner = CliRunner()


def synthetic_case(num_requests: int = 40, rate_per_s: float = 40.0, **engine) -> dict:
    return {
        "name": "stream",
        "model": None,
        "cache": {"block_size": 16, "num_gpu_blocks": 40, "num_cpu_blocks": 0},
        "scheduler": {"design": "v0-v2", "max_num_seqs": 8, "max_model_len": 256},
        "engine": engine,
        "workload": {
            "kind": "synthetic",
            "num_requests": num_requests,
            "seed": 5,
            "arrival": {"process": "poisson", "rate_per_s": rate_per_s},
            "lengths": {
                "prompt": {"kind": "uniform", "min_tokens": 1, "max_tokens": 120},
                "output": {"kind": "uniform", "min_tokens": 1, "max_tokens": 40},
            },
        },
        "step_time": FUZZ_STEP_TIME,
    }


def make_engine(data: dict, **kwargs) -> Engine:
    resolved = resolve(scenario_from_dict(data, "stream case"))
    return Engine(resolved.engine, resolved.workload.requests, resolved.step_time, **kwargs)


def csv_bytes(frame: pd.DataFrame, folder: Path, name: str) -> bytes:
    folder.mkdir(exist_ok=True)
    write_table(frame, folder, name)
    return (folder / f"{name}.csv").read_bytes()


# ---------------------------------------------------------------- streamed == in memory
@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(chunk_rows=st.sampled_from([1, 2, 3, 7, 64, 100_000]), stop_s=st.sampled_from([None, 0.4]))
def test_streamed_tables_equal_the_in_memory_ones(tmp_path_factory, chunk_rows, stop_s):
    tmp = tmp_path_factory.mktemp("stream")
    data = synthetic_case(max_sim_time_s=stop_s) if stop_s else synthetic_case()
    memory = build_result(make_engine(data).run())
    streamed_dir = tmp / "streamed"
    streamed_dir.mkdir()
    engine = make_engine(data, sinks=file_sinks(streamed_dir), chunk_rows=chunk_rows)
    streamed = build_result(engine.run(), tables_dir=streamed_dir)
    for name in ("requests", "steps"):
        expected = getattr(memory, name)
        pd.testing.assert_frame_equal(pd.read_parquet(streamed_dir / f"{name}.parquet"), expected)
        assert (streamed_dir / f"{name}.csv").read_bytes() == csv_bytes(expected, tmp / "ref", name)
    assert streamed.summary == memory.summary
    assert memory.summary["num_requests"] == 40  # every request has its row
    if stop_s:
        assert memory.summary["stopped_early"] and memory.summary["states"]["aborted"] > 0


@given(chunk_rows=st.integers(1, 9))
@settings(max_examples=10, deadline=None)
def test_memory_sink_frames_do_not_depend_on_the_chunk_size(chunk_rows):
    data = synthetic_case(num_requests=25)
    whole = build_result(make_engine(data).run())
    chunked = build_result(make_engine(data, chunk_rows=chunk_rows).run())
    pd.testing.assert_frame_equal(chunked.requests, whole.requests)
    pd.testing.assert_frame_equal(chunked.steps, whole.steps)
    assert chunked.summary == whole.summary


def test_time_columns_are_float_even_when_all_zero():
    """Regression: every request first scheduled at SimPy's initial clock (the int 0) made
    `first_scheduled_s` an int64 column; it is float64 like every other time column."""
    data = synthetic_case(num_requests=1)
    requests = build_result(make_engine(data).run()).requests
    assert requests["first_scheduled_s"].tolist() == [0.0]
    assert requests["first_scheduled_s"].dtype == np.float64


# ---------------------------------------------------------------- whole or nothing
def test_crash_mid_run_leaves_no_half_written_table(tmp_path, monkeypatch):
    """Chunks already streamed into the staging folder vanish with it; the old run stays."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(synthetic_case(num_requests=60)))
    out = tmp_path / "out"
    assert runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(out)]).exit_code == 0
    before = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
    monkeypatch.setattr(
        sim.output.records, "DEFAULT_CHUNK_ROWS", 2
    )  # several chunks reach the files
    real = Engine.record_step
    calls = itertools.count()

    def record_then_interrupt(self, *args):
        real(self, *args)
        if next(calls) == 30:
            # Chunks are already in the staging folder, beside the old run.
            assert list(tmp_path.glob(".out.partial-*/steps.csv"))
            assert list(tmp_path.glob(".out.partial-*/steps.parquet"))
            raise KeyboardInterrupt

    monkeypatch.setattr(Engine, "record_step", record_then_interrupt)
    result = runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(out)])
    assert result.exit_code == EXIT_INTERRUPTED, result.output
    assert {p.name: p.read_bytes() for p in sorted(out.iterdir())} == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


# ---------------------------------------------------------------- bounded memory
def live_requests() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is Request)


def test_live_requests_stay_those_in_flight():
    """A request's row is written when it ends and the Request is dropped: the live Request
    objects never exceed the unfinished ones (and a few being handed over), far below the
    trace. Counted by the garbage collector's object list, at every 50th terminal request."""
    n = 1500
    engine_box: list[Engine] = []
    samples: list[tuple[int, int]] = []

    gc.collect()
    before = live_requests()  # left over by other tests in this process

    def progress(done: int, total: int) -> None:
        if done // 50 > len(samples):  # `done` moves by a step's worth at a time
            engine = engine_box[0]
            unfinished = sum(r.scheduler.num_unfinished() for r in engine.replicas)
            samples.append((live_requests() - before, unfinished))

    engine = make_engine(synthetic_case(num_requests=n, rate_per_s=8.0), progress=progress)
    engine_box.append(engine)
    result = build_result(engine.run())
    assert result.summary["states"]["finished"] == n
    assert len(samples) >= n // 50 - 1
    # The finished requests of the current step are still referenced by the step's update.
    assert all(live <= unfinished + 16 for live, unfinished in samples), samples
    assert max(live for live, _ in samples) < n // 10


def test_the_engine_pulls_specs_only_as_they_arrive():
    """A lazy source is consumed one spec at a time: never more than one spec ahead."""
    base = LazySpecs(200, ArrivalConfig(rate_per_s=50.0), _lengths("fixed"), 1, Path("."))
    pulled = []

    class Counting:
        in_arrival_order = True

        def __len__(self) -> int:
            return len(base)

        def __iter__(self):
            for spec in base:
                pulled.append(spec.request_id)
                yield spec

    resolved = resolve(scenario_from_dict(synthetic_case(), "stream case"))
    engine = Engine(resolved.engine, Counting(), resolved.step_time)
    arrived = []
    real_arrived = engine._rows.arrived

    def arrived_hook(request_id: int) -> None:
        assert len(pulled) <= request_id + 1  # only the arriving spec has been drawn
        arrived.append(request_id)
        real_arrived(request_id)

    engine._rows.arrived = arrived_hook  # type: ignore[method-assign]
    result = build_result(engine.run())
    assert arrived == list(range(200)) and result.requests["request_id"].tolist() == arrived


def test_never_arrived_requests_of_a_lazy_workload_are_accounted_for():
    result = build_result(make_engine(synthetic_case(num_requests=300, max_sim_time_s=1.0)).run())
    requests = result.requests
    assert requests["request_id"].tolist() == list(range(300))
    never = requests[requests["reason"].str.startswith("never arrived")]
    assert len(never) > 0 and (never["state"] == "aborted").all()
    assert (never["arrival_s"] >= 1.0).all()  # a request that arrived in time is not among them


# ---------------------------------------------------------------- request rows in id order
@given(order=st.permutations(list(range(12))), chunk_rows=st.integers(1, 5))
def test_request_rows_reach_the_table_in_id_order(order, chunk_rows):
    sink = MemorySink(REQUEST_COLUMNS)
    rows = RequestRows(ColumnarTable(REQUEST_DTYPE, sink, chunk_rows), ids_ascending=True)
    requests = {}
    for i in range(12):
        rows.arrived(i)
        requests[i] = _finished_request(i)
    for i in order:
        rows.terminal(requests[i])
    rows.close()
    assert sink.frame()["request_id"].tolist() == list(range(12))


def test_request_rows_out_of_arrival_order_are_sorted_at_close():
    sink = MemorySink(REQUEST_COLUMNS)
    rows = RequestRows(ColumnarTable(REQUEST_DTYPE, sink, 2), ids_ascending=False)
    for i in (5, 2, 9, 0):
        rows.arrived(i)
        rows.terminal(_finished_request(i))
    rows.close()
    assert sink.frame()["request_id"].tolist() == [0, 2, 5, 9]


def test_a_request_that_never_ends_is_an_internal_error():
    rows = RequestRows(ColumnarTable(REQUEST_DTYPE, MemorySink(REQUEST_COLUMNS)), True)
    rows.arrived(0)
    with pytest.raises(RuntimeError, match="request 0 arrived but never reached"):
        rows.close()


def _finished_request(request_id: int) -> Request:
    from sim.scheduler import RequestState

    request = Request.new(request_id, 0.0, RequestSpec(request_id, 0.0, 4, 2).prompt_content(), 2)
    request.finish(RequestState.FINISHED, "length", 1.0)
    return request


# ---------------------------------------------------------------- exact percentiles
finite = st.floats(-1e6, 1e6, allow_nan=False, allow_subnormal=False)


@settings(deadline=None)  # two passes with an 8 MB histogram each: slow on a busy machine
@given(
    values=st.lists(
        st.one_of(finite, st.sampled_from([0.0, 1.5, 1.5000000000000002])), max_size=60
    ),
    chunk=st.integers(1, 8),
    qs=st.lists(st.floats(0, 100), min_size=1, max_size=3),
    in_memory_max=st.sampled_from([0, 20, IN_MEMORY_MAX]),
)
def test_exact_percentiles_equal_numpy(values, chunk, qs, in_memory_max):
    """Both ways: the histogram's two passes (`in_memory_max` 0, or below the count) and the
    sort of every value."""
    array = np.array(values, dtype=np.float64)
    chunks = lambda: (array[i : i + chunk] for i in range(0, len(array), chunk))  # noqa: E731
    got = exact_percentiles(chunks, qs, in_memory_max)
    if not len(array):
        assert all(np.isnan(got))
        return
    assert got == [float(np.percentile(array, q)) for q in qs]


# ---------------------------------------------------------------- lazy synthetic workload
def _lengths(kind: str) -> LengthsConfig:
    dists = {
        "fixed": ({"kind": "fixed", "value": 30}, {"kind": "fixed", "value": 7}),
        "uniform": (
            {"kind": "uniform", "min_tokens": 1, "max_tokens": 500},
            {"kind": "uniform", "min_tokens": 3, "max_tokens": 90},
        ),
        "lognormal": (
            {"kind": "lognormal", "mean": 300, "cv": 1.5, "max_tokens": 4000},
            {"kind": "lognormal", "mean": 60, "cv": 0.5},
        ),
        "zipf": (
            {"kind": "zipf", "exponent": 1.2, "min_tokens": 2, "max_tokens": 300},
            {"kind": "uniform", "min_tokens": 1, "max_tokens": 9},
        ),
    }[kind]
    return LengthsConfig.model_validate({"prompt": dists[0], "output": dists[1]})


def whole_array_specs(n: int, arrival: ArrivalConfig, lengths: LengthsConfig, seed: int):
    """The requests as the generator drew them before it was lazy: every array at once."""
    arrivals = arrival_times(n, arrival, stream(seed, _ARRIVAL_STREAM))
    prompt = sample_lengths(
        lengths.prompt, n, stream(seed, _PROMPT_STREAM), column="prompt", base_dir=Path(".")
    )
    output = sample_lengths(
        lengths.output, n, stream(seed, _OUTPUT_STREAM), column="output", base_dir=Path(".")
    )
    return list(workload_from_arrays(arrivals, prompt, output, "synthetic", {}).requests)


arrivals = st.one_of(
    st.builds(ArrivalConfig, rate_per_s=st.floats(0.5, 100)),
    st.builds(
        ArrivalConfig,
        process=st.just("gamma"),
        rate_per_s=st.floats(0.5, 100),
        cv=st.sampled_from([0.0, 0.5, 2.0]),
    ),
)


@given(
    n=st.integers(1, 400),
    chunk=st.sampled_from([1, 2, 7, 64, 65_536]),
    arrival=arrivals,
    kind=st.sampled_from(["fixed", "uniform", "lognormal", "zipf"]),
    seed=st.integers(0, 2**32),
)
@settings(max_examples=40, deadline=None)
def test_lazy_synthetic_workload_draws_the_same_requests(n, chunk, arrival, kind, seed):
    lengths = _lengths(kind)
    lazy = LazySpecs(n, arrival, lengths, seed, Path("."), chunk=chunk)
    expected = whole_array_specs(n, arrival, lengths, seed)
    assert list(lazy) == expected
    assert len(lazy) == n and lazy[-1] == expected[-1] and lazy[n // 2] == expected[n // 2]
    assert list(lazy[: n // 2]) == expected[: n // 2]


def test_lazy_synthetic_workload_with_a_trace_for_both_lengths(tmp_path):
    trace = tmp_path / "lengths.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n10,3\n200,40\n55,9\n7,700\n")
    trace_dist = {"kind": "trace", "path": str(trace), "format": "lengths"}
    lengths = LengthsConfig.model_validate({"prompt": trace_dist, "output": trace_dist})
    arrival = ArrivalConfig(rate_per_s=3.0)
    lazy = list(LazySpecs(50, arrival, lengths, 9, tmp_path, chunk=3))
    rows = stream(9, _PROMPT_STREAM).integers(0, 4, size=50)
    pairs = [(10, 3), (200, 40), (55, 9), (7, 700)]
    assert [(s.prompt_tokens, s.output_tokens) for s in lazy] == [pairs[r] for r in rows]
    assert [s.arrival_s for s in lazy] == arrival_times(50, arrival, stream(9, 0)).tolist()


def test_synthetic_specs_are_request_specs():
    spec = next(iter(LazySpecs(3, ArrivalConfig(rate_per_s=2.0), _lengths("fixed"), 0, Path("."))))
    assert spec == RequestSpec(0, 0.0, 30, 7)
    assert dataclasses.is_dataclass(spec)


@given(
    used=st.lists(st.integers(0, 5000), min_size=1, max_size=3000),
    blocks=st.integers(1, 5000),
    chunk=st.integers(1, 700),
)
def test_chunked_mean_equals_pandas_mean(used, blocks, chunk):
    """The summary's kv_util_mean is pandas' mean of the whole column, bit for bit."""
    fractions = np.array(used, dtype=np.int64) / blocks
    chunks = (fractions[i : i + chunk] for i in range(0, len(fractions), chunk))
    expected = float((pd.Series(used, dtype="int64") / blocks).mean())
    assert chunked_mean(chunks, len(used)) == expected


def test_chunked_mean_of_a_long_column():
    values = np.random.default_rng(3).random(300_007) * 7
    chunks = (values[i : i + 65_536] for i in range(0, len(values), 65_536))
    assert chunked_mean(chunks, len(values)) == float(pd.Series(values).mean())


@given(num_rows=st.integers(0, 4_500), chunk_rows=st.sampled_from([1, 3, 1_000, 1_500, 5_000]))
@settings(max_examples=20, deadline=None)
def test_columnar_table_keeps_every_row_in_order(num_rows, chunk_rows):
    """Rows go through chunks that start small, double, and flush at `chunk_rows`."""
    sink = MemorySink(STEP_COLUMNS)
    table = ColumnarTable(STEP_DTYPE, sink, chunk_rows)
    rows = [(i % 3, i, i / 7, 0.5, *range(i, i + 12)) for i in range(num_rows)]
    for row in rows:
        table.append(row)
    table.close()
    assert all(len(chunk["step"]) <= chunk_rows for chunk in sink.chunks)
    frame = sink.frame()
    assert table.num_rows == num_rows == len(frame)
    if num_rows:
        assert list(frame.itertuples(index=False, name=None)) == rows


def test_kvsim_run_streams_the_same_files_the_api_writes(tmp_path):
    """`kvsim run -o` (tables streamed during the run) and `write_result` of the in-memory
    result give the same CSV bytes, Parquet frames and summary.json."""
    path = tmp_path / "case.yaml"
    path.write_text(yaml.safe_dump(synthetic_case(num_requests=80, max_sim_time_s=1.5)))
    cli_out = tmp_path / "cli"
    result = runner.invoke(app, ["run", str(path), "--no-plots", "-o", str(cli_out)])
    assert result.exit_code == 0, result.output
    api_out = write_result(sim.engine.run.run(path), tmp_path / "api")
    for name in ("requests", "steps", "violations"):
        assert (cli_out / f"{name}.csv").read_bytes() == (api_out / f"{name}.csv").read_bytes()
        pd.testing.assert_frame_equal(
            pd.read_parquet(cli_out / f"{name}.parquet"),
            pd.read_parquet(api_out / f"{name}.parquet"),
        )
    assert (cli_out / "summary.json").read_text() == (api_out / "summary.json").read_text()
    assert (
        '"stopped_early": "reached the simulated-time limit'
        in (cli_out / "summary.json").read_text()
    )


# ---------------------------------------------------------------- trace files stream too
def _vidur_trace(path: Path, num_rows: int) -> Path:
    with path.open("w") as fh:
        fh.write("arrived_at,num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n")
        for i in range(num_rows):
            p, o = 1 + i % 120, 1 + i % 40
            fh.write(f"{i * 0.01!r},{p},{o},{p + o},{p / o:.4g}\n")
    return path


def test_a_big_trace_streams_in_memory_of_a_chunk(tmp_path):
    """Reading and iterating a 20k-row trace holds a chunk, not the file: whole-file reading
    (one chunk) peaks at several times what 1,000-row chunks do (Python's allocations,
    tracemalloc; pandas is imported and warm before, so its import does not count)."""
    import tracemalloc

    import sim.workload.loaders as loaders

    path = _vidur_trace(tmp_path / "t.csv", 20_000)
    loaders.load_vidur(_vidur_trace(tmp_path / "warm.csv", 3), chunk_rows=1)  # imports
    peaks = {}
    for chunk_rows in (1_000, 1 << 40):
        tracemalloc.start()
        try:
            workload = loaders.load_vidur(path, chunk_rows=chunk_rows)
            count = sum(1 for _ in workload.requests)
            peaks[chunk_rows] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert count == 20_000
        del workload
    assert peaks[1_000] < 3 * 2**20, peaks
    assert peaks[1 << 40] > 3 * peaks[1_000], peaks


def test_a_streamed_trace_runs_to_the_same_tables(tmp_path, monkeypatch):
    """`kvsim run` on a trace read 7 rows at a time (windowed, cut, scaled as views) writes
    the tables of the same trace read whole, byte for byte."""
    import sim.workload.trace_stream as trace_stream

    _vidur_trace(tmp_path / "t.csv", 300)
    data = synthetic_case()
    data["workload"] = {
        "kind": "trace",
        "path": str(tmp_path / "t.csv"),
        "format": "vidur",
        "time_range_s": [0.3, 2.9],
        "first_n": 200,
        "rate_scale": 0.5,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data))
    outputs = {}
    for chunk_rows in (1 << 40, 7):
        monkeypatch.setattr(trace_stream, "TRACE_CHUNK_ROWS", chunk_rows)
        out = tmp_path / f"run{chunk_rows}"
        result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "--no-plots", "-o", str(out)])
        assert result.exit_code == 0, result.output
        outputs[chunk_rows] = {
            name: (out / name).read_bytes()
            for name in ("requests.csv", "steps.csv", "violations.csv", "summary.json")
        }
    assert outputs[7] == outputs[1 << 40]


def test_is_session_workload_does_not_read_a_streamed_trace_again(tmp_path, monkeypatch):
    """Regression: `is_session_workload` iterated every request, one more full reading of a
    streamed trace file only to learn it has no sessions; the metadata answers now."""
    import sim.workload.trace_stream as trace_stream
    from sim.output.sessions import is_session_workload
    from sim.workload import WorkloadConfig, load_workload

    _vidur_trace(tmp_path / "t.csv", 50)
    monkeypatch.setattr(trace_stream, "TRACE_CHUNK_ROWS", 7)
    config = WorkloadConfig(kind="trace", path=str(tmp_path / "t.csv"), format="vidur")
    workload = load_workload(config, tmp_path)
    assert isinstance(workload.requests, trace_stream.StreamedSpecs)
    readings = []
    monkeypatch.setattr(trace_stream.StreamedSpecs, "_chunks", lambda self: readings.append(1))
    assert not is_session_workload(workload)
    assert readings == []
