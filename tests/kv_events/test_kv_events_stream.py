"""The `kv_events` table streamed (`engine.kv_events` with `kvsim run -o`): the recording
streams spill to temporary files as the run goes and the table is written piece by piece,
the same bytes (CSV) and the same table (Parquet) as the in-memory path, bounded memory."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sim.kv_events.stream as stream_module
from sim.engine.run import run
from sim.files.tables import write_table
from sim.kv_events import (
    KVEventStream,
    kv_events_chunks,
    kv_events_frame,
    write_kv_events,
)
from sim.kv_events.stream import RAW_COLUMNS
from sim.output.results import write_result, write_tables
from sim.scenario.overrides import apply_overrides
from sim.scenario.schema import load_scenario

ROOT = Path(__file__).resolve().parents[2]
MOONCAKE = ROOT / "sim/data/traces/mooncake_fast25/conversation_trace.jsonl"

# One operation on a stream: ("stored", n blocks), ("removed",), ("cleared",),
# ("tier_stored", n blocks) or ("tier_removed", n blocks).
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("stored"), st.integers(1, 5)),
        st.tuples(st.just("removed")),
        st.tuples(st.just("cleared")),
        st.tuples(st.sampled_from(["tier_stored", "tier_removed"]), st.integers(1, 4)),
    ),
    max_size=40,
)


def _record(ops, spill_rows: int | None) -> tuple[KVEventStream, list[int]]:
    """Apply `ops` to a fresh stream; returns it and the rows in memory after each event."""
    now = SimpleNamespace(t=0.0)
    stream = KVEventStream(3, 16, lambda: now.t, spill_rows=spill_rows)
    in_memory = []
    next_hash = 1
    for op in ops:
        now.t += 0.25
        hashes = list(range(next_hash, next_hash + (op[1] if len(op) > 1 else 1)))
        next_hash = hashes[-1] + 1
        if op[0] == "stored":
            stream.stored(hashes, None if hashes[0] == 1 else hashes[0] - 1)
        elif op[0] == "removed":
            stream.removed(hashes[0])
        elif op[0] == "cleared":
            stream.cleared()
        elif op[0] == "tier_stored" or stream.tier_block_size is None:
            # (A tier evicts only what it stored: its first event is a store.)
            stream.tier_stored(hashes, "CPU", 32)
        else:
            stream.tier_removed(hashes, "CPU")
        in_memory.append(len(stream.event))
    return stream, in_memory


@settings(max_examples=80, deadline=None)
@given(ops=_OPS, spill_rows=st.integers(1, 9))
def test_a_spilling_stream_keeps_the_same_rows_and_events(ops, spill_rows):
    whole, _ = _record(ops, None)
    spilled, in_memory = _record(ops, spill_rows)
    # Bounded: after each event, fewer than `spill_rows` rows stay in memory.
    assert all(n < spill_rows for n in in_memory)
    assert spilled.num_rows == whole.num_rows == sum(len(c["event"]) for c in whole.chunks())
    assert spilled.events() == whole.events()
    pd.testing.assert_frame_equal(kv_events_frame([spilled]), kv_events_frame([whole]))
    pieces = list(kv_events_chunks([None, spilled, whole]))
    assert all(len(piece) for piece in pieces)
    if pieces:
        joined = pd.concat(pieces, ignore_index=True)
        pd.testing.assert_frame_equal(joined, kv_events_frame([spilled, whole]))
    # Chunks end at event boundaries: no event's rows are split between two chunks.
    for chunk, following in zip(list(spilled.chunks()), list(spilled.chunks())[1:], strict=False):
        if len(chunk["event"]) and len(following["event"]):
            assert chunk["event"][-1] != following["event"][0]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=_OPS, spill_rows=st.integers(1, 9))
def test_written_pieces_are_the_bytes_of_the_whole_table(tmp_path_factory, ops, spill_rows):
    tmp = tmp_path_factory.mktemp("kv")
    spilled, _ = _record(ops, spill_rows)
    other, _ = _record(list(reversed(ops)), None)
    streams = [spilled, None, other]
    (tmp / "pieces").mkdir()
    (tmp / "whole").mkdir()
    num_rows = write_kv_events(streams, tmp / "pieces")
    whole = kv_events_frame(streams)
    write_table(whole, tmp / "whole", "kv_events")
    assert num_rows == len(whole)
    pieces_csv = (tmp / "pieces" / "kv_events.csv").read_bytes()
    assert pieces_csv == (tmp / "whole" / "kv_events.csv").read_bytes()
    back = pd.read_parquet(tmp / "pieces" / "kv_events.parquet")
    pd.testing.assert_frame_equal(back, pd.read_parquet(tmp / "whole" / "kv_events.parquet"))
    if len(whole):  # (an empty categorical reads back with no categories, either way)
        pd.testing.assert_frame_equal(back, whole)


def test_spill_rows_below_one_is_refused():
    with pytest.raises(ValueError, match="spill_rows must be >= 1"):
        KVEventStream(0, 16, lambda: 0.0, spill_rows=0)


def test_the_stream_docstring_spill_example():
    stream = KVEventStream(0, 16, lambda: 0.0, spill_rows=3)
    stream.stored([1, 2], None)
    stream.stored([3, 4], 2)
    stream.removed(4)
    assert [len(chunk["event"]) for chunk in stream.chunks()] == [4, 1]
    assert [name for name, _ in RAW_COLUMNS] == list(next(stream.chunks()))


def _mooncake_with_events() -> object:
    return apply_overrides(
        load_scenario(ROOT / "scenarios" / "mooncake_prefix_caching.yaml"),
        {
            "workload.path": str(MOONCAKE),
            "workload.first_n": 150,
            "workload.rate_scale": 4.0,
            "engine.num_replicas": 3,
            "engine.router": "prefix_cache_aware",
            "engine.kv_events": True,
        },
    )


def test_a_run_streaming_its_tables_writes_the_same_kv_events_files(tmp_path, monkeypatch):
    """`kvsim run -o` (tables streamed to the staging folder) spills the events every 500
    rows here and writes the table in pieces: the same CSV bytes and Parquet table as the
    in-memory run's `write_result`, and `result.kv_events` reads it back equal."""
    scenario = _mooncake_with_events()
    memory = run(scenario, base_dir=ROOT)
    write_result(memory, tmp_path / "memory")
    monkeypatch.setattr(stream_module, "SPILL_ROWS", 500)
    spilled: list[int] = []
    spill = KVEventStream._spill

    def counting_spill(self):
        spilled.append(len(self.event))
        spill(self)

    monkeypatch.setattr(KVEventStream, "_spill", counting_spill)
    streamed_dir = tmp_path / "streamed"
    streamed_dir.mkdir()
    streamed = run(scenario, base_dir=ROOT, tables_dir=streamed_dir)
    assert streamed.kv_events_streamed
    assert len(spilled) >= 3 and all(n >= 500 for n in spilled)
    write_tables(streamed, streamed_dir)
    for name in ("kv_events", "requests", "steps"):
        assert (streamed_dir / f"{name}.csv").read_bytes() == (
            tmp_path / "memory" / f"{name}.csv"
        ).read_bytes(), name
        pd.testing.assert_frame_equal(
            pd.read_parquet(streamed_dir / f"{name}.parquet"),
            pd.read_parquet(tmp_path / "memory" / f"{name}.parquet"),
        )
    assert memory.kv_events is not None and len(memory.kv_events) > 3 * 500
    pd.testing.assert_frame_equal(streamed.kv_events, memory.kv_events)
