"""Streaming compaction: bounded memory, and the same files as the old full-memory merge."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import OpType, Tablet, TabletOptions, encode_write_batch
from pyspark_kudu.tablet.compaction import sort_versions, write_rowset
from pyspark_kudu.tablet.keys import END_COLUMN, ROW_COLUMN, TS_COLUMN
from pyspark_kudu.tablet.merge import MergeStats, merge_rowsets, write_merged
from pyspark_kudu.tablet.rowset import DiskRowSet

INT_KEY = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                 ("id",))
COMPOSITE_KEY = Schema((ColumnSchema("h", "string", nullable=False),
                        ColumnSchema("t", "timestamp[us, tz=UTC]", nullable=False),
                        ColumnSchema("id", "int64", nullable=False),
                        ColumnSchema("v", "string")), ("h", "t", "id"))
NO_FLUSH = TabletOptions(flush_threshold_bytes=0, row_group_rows=7)


# -- the full-memory merge compaction used before streaming, kept as the reference ----------
def reference_merge(schema: Schema, rowsets: Sequence[DiskRowSet], mark: int) -> pa.Table:
    parts = []
    for rs in rowsets:
        t = rs.read_all()
        end = np.array(t.column(END_COLUMN).to_numpy(), dtype=np.int64)
        rows, ends = rs.deltas()
        end[rows] = ends
        ts = np.asarray(t.column(TS_COLUMN).to_numpy(), dtype=np.int64)
        keep = (end > ts) & (end > mark)
        t = t.drop_columns([END_COLUMN, ROW_COLUMN]).append_column(
            pa.field(END_COLUMN, pa.int64(), nullable=False), pa.array(end, type=pa.int64()))
        parts.append(t.filter(pa.array(keep)))
    return sort_versions(pa.concat_tables(parts), schema)


def reference_split(table: pa.Table, schema: Schema, target_rows: int) -> list[pa.Table]:
    n = table.num_rows
    if n <= target_rows:
        return [table]
    keys = table.select(list(schema.primary_key))
    cuts = [0]
    at = target_rows
    while at < n:
        prev = keys.slice(at - 1, 1).to_pylist()[0]
        while at < n and keys.slice(at, 1).to_pylist()[0] == prev:
            at += 1
        if at < n:
            cuts.append(at)
        at += target_rows
    cuts.append(n)
    return [table.slice(a, b - a) for a, b in itertools.pairwise(cuts) if b > a]


# -- helpers ----------------------------------------------------------------------------
def _rows(schema: Schema, ids: list[int], tag: int) -> pa.Table:
    cols = {"id": ids, "v": [f"v{tag}-{i}" for i in ids]}
    if "h" in schema.names:
        t = pa.array([(i * 7) % 5 for i in ids], pa.int64()).cast(pa.timestamp("us", "UTC"))
        cols = {"h": [f"h{i % 3}" for i in ids], "t": t, **cols}
    return pa.table(cols)


def _tablet(root: Path, schema: Schema, steps: list[tuple[int, list[int], bool]]) -> Tablet:
    """Apply ``(op, ids, flush_after)`` steps; every flush adds an overlapping rowset."""
    t = Tablet.create(str(root), "t", schema, options=NO_FLUSH)
    ops = [OpType.UPSERT, OpType.DELETE_IGNORE, OpType.INSERT_IGNORE]
    for i, (op, ids, flush) in enumerate(steps, start=1):
        batch = _rows(schema, ids, i)
        if ops[op] is OpType.DELETE_IGNORE:
            batch = batch.select(list(schema.primary_key))
        assert t.apply(i, encode_write_batch(schema, ops[op], batch)).ok
        if flush:
            t.flush()
    t.flush()
    return t


def _content(rs: DiskRowSet) -> list[dict[str, object]]:
    t = rs.read_all()
    assert t.column(ROW_COLUMN).to_pylist() == list(range(t.num_rows))
    return t.drop_columns([ROW_COLUMN]).to_pylist()


_steps = st.lists(st.tuples(st.integers(0, 2), st.lists(st.integers(0, 40), min_size=1,
                                                           max_size=12, unique=True),
                            st.booleans()), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=_steps, composite=st.booleans(), batch_rows=st.integers(1, 6),
       target_rows=st.integers(1, 30), mark_share=st.floats(0, 1))
def test_streaming_merge_writes_the_files_the_full_memory_merge_wrote(
        tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[int, list[int], bool]],
        composite: bool, batch_rows: int, target_rows: int, mark_share: float) -> None:
    schema = COMPOSITE_KEY if composite else INT_KEY
    root = tmp_path_factory.mktemp("merge")
    t = _tablet(root, schema, steps)
    inputs = list(t._rowsets)
    mark = int(t.applied_index * mark_share)
    expected = reference_merge(schema, inputs, mark) if inputs else pa.table({})
    pieces = (reference_split(expected, schema, target_rows) if expected.num_rows else [])
    ref_dir = FileIO(str(root / "ref"))
    ref_dir.makedirs("rowsets")
    want = [write_rowset(ref_dir, 100 + i, p, schema, 7) for i, p in enumerate(pieces)]

    got = write_merged(t.directory, 100, merge_rowsets(schema, inputs, mark, batch_rows),
                       schema, 7, target_rows)

    assert [g.meta for g in got] == [w.meta for w in want]
    assert [_content(g) for g in got] == [_content(w) for w in want]
    # The bloom filters too, bit for bit (a merge fills each at the end, a flush at once).
    assert [t.directory.read_bytes(g.meta.bloom or "") for g in got] == [
        ref_dir.read_bytes(w.meta.bloom or "") for w in want]


def _interleaved_rowsets(root: Path, k: int, rows_each: int) -> Tablet:
    """``k`` rowsets of ``rows_each`` rows whose key ranges all overlap (key i in rowset
    i % k), with some updates so that deltas are folded in too."""
    t = Tablet.create(str(root), "t", INT_KEY, options=TabletOptions(
        flush_threshold_bytes=0, row_group_rows=1_000))
    index = 0
    for j in range(k):
        ids = list(range(j, k * rows_each, k))
        index += 1
        t.apply(index, encode_write_batch(INT_KEY, OpType.INSERT,
                                          pa.table({"id": ids, "v": ["x" * 40] * len(ids)})))
        t.flush()
    index += 1
    t.apply(index, encode_write_batch(INT_KEY, OpType.UPSERT,
                                      pa.table({"id": list(range(0, k * rows_each, 97)),
                                                "v": ["updated"] * len(range(0, k * rows_each,
                                                                             97))})))
    t.flush()
    return t


def test_merge_memory_is_bounded_by_batches_not_by_rowset_size(tmp_path: Path) -> None:
    k, rows_each, batch = 4, 40_000, 1_000
    t = _interleaved_rowsets(tmp_path, k, rows_each)
    inputs = list(t._rowsets)
    full = reference_merge(INT_KEY, inputs, 0)
    full_bytes = full.nbytes
    del full
    base = pa.total_allocated_bytes()
    stats = MergeStats()
    total = 0
    last = -1
    for chunk in merge_rowsets(INT_KEY, inputs, 0, batch, stats):
        ids = chunk.column("id").to_numpy()
        assert ids[0] > last and bool(np.all(np.diff(ids) >= 0))  # sorted across chunks
        last = int(ids[-1])
        total += chunk.num_rows
    assert total >= k * rows_each
    # About two batches per input at most, while the inputs hold 40 batches each.
    assert stats.peak_buffered_rows <= 2 * (k + 1) * batch + 2 * k, stats
    assert stats.chunks > 10
    assert stats.peak_arrow_bytes - base < full_bytes / 4, (stats, full_bytes)


def test_compaction_through_the_tablet_streams_and_keeps_keys_in_one_file(
        tmp_path: Path) -> None:
    t = Tablet.create(str(tmp_path), "t", INT_KEY, options=TabletOptions(
        flush_threshold_bytes=0, row_group_rows=50, compaction_target_rows=300,
        compaction_batch_rows=64))
    rng = random.Random(3)
    for i in range(1, 9):
        ids = rng.sample(range(2_000), 400)
        t.apply(i, encode_write_batch(INT_KEY, OpType.UPSERT, _rows(INT_KEY, ids, i)))
        t.flush()
    before = t.scan_table().sort_by("id")
    assert t.compact(history_retention_index=4) is True
    metas = t.rowsets
    assert len(metas) > 3 and all(m.num_rows >= 300 for m in metas[:-1])
    assert all(a.max_key < b.min_key for a, b in itertools.pairwise(metas))
    assert t.scan_table().sort_by("id").equals(before)
    for rs in t._rowsets:
        ids = rs.read_all(["id"]).column("id")
        assert pc.all(pc.greater_equal(ids.slice(1), ids.slice(0, len(ids) - 1))).as_py()
