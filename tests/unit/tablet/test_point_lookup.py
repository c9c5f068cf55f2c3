"""Point lookups: a write that reads only the row groups that may hold its keys answers exactly
as the whole key index does, and small writes on big tablets hold no index."""

from __future__ import annotations

import dataclasses
import datetime as dt
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import MemoryLog, OpType, Tablet, TabletOptions, encode_write_batch
from pyspark_kudu.tablet.keys import LIVE, ROW_COLUMN, TS_COLUMN
from pyspark_kudu.tablet.memory import KEY_INDEXES

from .model import Model

INT_KEY = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "int64"),
                  ColumnSchema("s", "string")), ("id",))
COMPOSITE = Schema((ColumnSchema("h", "string", nullable=False),
                    ColumnSchema("r", pa.timestamp("us"), nullable=False),
                    ColumnSchema("n", "int64", nullable=False),
                    ColumnSchema("v", "int64"), ColumnSchema("s", "string")), ("h", "r", "n"))
T0 = dt.datetime(2024, 1, 1)
DOMAINS: dict[str, list[Any]] = {
    "id": list(range(12)),
    "h": ["a", "b", "c-a-longer-host"],
    "r": [T0, T0 + dt.timedelta(microseconds=1), T0 + dt.timedelta(days=400)],
    "n": [-1, 0, 2**40],
    "v": [None, 0, 7, -2**40],
    "s": [None, "", "x", "a longer string"],
}
POINT, WHOLE = 1.0, 0.0  # TabletOptions.point_lookup_max_fraction: always / never


@pytest.fixture
def restore_budget() -> Iterator[None]:
    before = KEY_INDEXES.budget
    yield
    KEY_INDEXES.set_budget(before)


# -- differential: point path == whole index == model --------------------------------------

@st.composite
def _batches(draw: st.DrawFn, schema: Schema
             ) -> tuple[list[OpType], pa.Table, list[dict[str, Any]]]:
    n = draw(st.integers(1, 10))
    values = sorted(draw(st.sets(st.sampled_from(["v", "s"]))))
    ops = draw(st.lists(st.sampled_from(list(OpType)), min_size=n, max_size=n))
    rows = []
    for _ in range(n):  # a small key space: repeated keys inside and across batches
        row = {k: draw(st.sampled_from(DOMAINS[k])) for k in schema.primary_key}
        rows.append(row | {c: draw(st.sampled_from(DOMAINS[c])) for c in values})
    cols = [*schema.primary_key, *values]
    table = pa.table({c: pa.array([r[c] for r in rows], type=schema.column(c).type)
                      for c in cols})
    return ops, table, rows


def _read(t: Tablet, snapshot: int) -> list[dict[str, Any]]:
    rows = t.scan_table(snapshot=snapshot).to_pylist()
    return sorted(rows, key=lambda r: tuple(r[k] for k in t.schema.primary_key))


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_point_lookups_answer_exactly_as_the_whole_key_index(
        data: st.DataObject, no_fsync: None, restore_budget: None) -> None:
    schema = data.draw(st.sampled_from([INT_KEY, COMPOSITE]), label="schema")
    # Row groups of 2-3 rows and many versions per key: versions straddle group boundaries.
    options = TabletOptions(flush_threshold_bytes=0,
                            row_group_rows=data.draw(st.sampled_from([2, 3, 5])),
                            compaction_target_rows=data.draw(st.sampled_from([4, 1000])))
    # A budget of one byte drops every index after each entry: the point tablet then never
    # has one, the whole-index tablet rebuilds them from file + deltas each time.
    KEY_INDEXES.set_budget(data.draw(st.sampled_from([1, 256 << 20]), label="budget"))
    fractions = {"point": POINT, "whole": WHOLE,
                 "default": TabletOptions().point_lookup_max_fraction}
    model = Model(schema)
    mark = 0
    with tempfile.TemporaryDirectory() as root:
        log = MemoryLog()
        opts = {name: dataclasses.replace(options, point_lookup_max_fraction=f)
                for name, f in fractions.items()}
        tablets = {name: Tablet.create(f"{root}/{name}", "t", schema, log=log, options=o)
                   for name, o in opts.items()}
        index = 0
        for _ in range(data.draw(st.integers(6, 25))):
            action = data.draw(st.sampled_from(["write"] * 5 + ["flush", "flush", "compact",
                                                                "reopen"]))
            if action == "write":
                ops, table, rows = data.draw(_batches(schema))
                index += 1
                payload = encode_write_batch(schema, ops, table)
                log.append((index, payload))
                got = {name: [(e.row, e.status) for e in t.apply(index, payload).errors]
                       for name, t in tablets.items()}
                want = model.apply(index, ops, rows)
                assert got == {name: want for name in tablets}
            elif action == "flush":
                for t in tablets.values():
                    t.flush()
            elif action == "compact":
                retain = data.draw(st.integers(0, index))
                for t in tablets.values():
                    t.compact(history_retention_index=retain)
                mark = max(mark, min(retain, index))
            else:  # no key index in memory after this
                tablets = {name: Tablet.open(f"{root}/{name}", "t", log=log, options=o)
                           for name, o in opts.items()}
        for snap in range(mark, index + 1):
            scans = {name: _read(t, snap) for name, t in tablets.items()}
            assert scans["point"] == scans["whole"] == scans["default"]
        final = sorted(model.read(index).values(),
                       key=lambda r: tuple(r[k] for k in schema.primary_key))
        assert _read(tablets["point"], index) == final
        if tablets["point"].rowsets and KEY_INDEXES.budget_bytes == 1:
            assert tablets["point"].metrics.key_index_loads == 0
            assert tablets["whole"].metrics.point_lookups == 0


def test_a_key_whose_versions_span_row_groups_is_found_at_its_newest(
        tmp_path: Path, no_fsync: None) -> None:
    options = TabletOptions(flush_threshold_bytes=0, row_group_rows=2,
                            point_lookup_max_fraction=POINT)
    t = Tablet.create(str(tmp_path), "t", INT_KEY, options=options)
    t.apply(1, encode_write_batch(INT_KEY, OpType.INSERT, pa.table({"id": [1, 5, 9]})))
    for i in range(2, 9):  # key 5: seven versions, over four row groups
        t.apply(i, encode_write_batch(INT_KEY, OpType.UPDATE, pa.table({"id": [5], "v": [i]})))
    t.flush()
    t = Tablet.open(str(tmp_path), "t", options=options)
    rs = t._rowsets[0]
    ranges = rs.key_ranges()
    qkeys = pa.table({"id": pa.array([5], pa.int64())})
    groups = ranges.groups_for(qkeys)
    table = rs.read_all()
    holding = np.unique(np.searchsorted(ranges.starts, np.nonzero(
        table.column("id").to_numpy() == 5)[0], side="right") - 1)
    assert len(holding) >= 3 and set(holding) <= set(groups.tolist())
    rows, ts, end = rs.point_lookup(qkeys, groups)
    assert end[0] == LIVE
    assert table.column(TS_COLUMN).to_numpy()[rows[0]] == ts[0] == 8
    assert table.column(ROW_COLUMN).to_numpy()[rows[0]] == rows[0]
    res = t.apply(9, encode_write_batch(INT_KEY, OpType.UPSERT, pa.table({"id": [5]})))
    assert res.ok and t.lookup(5) == {"id": 5, "v": 8, "s": None}
    assert t.metrics.point_lookups == 1 and t.metrics.key_index_loads == 0


# -- small writes on a big tablet ------------------------------------------------------------

ROWSETS, PER_ROWSET = 4, 50_000
BIG = TabletOptions(flush_threshold_bytes=0, row_group_rows=4096)
INDEX_BYTES_PER_ROW = 24  # an int64-keyed KeyIndex: key, ts and end


def _write(t: Tablet, op: OpType, ids: Any, v: int | None = None) -> list[str]:
    ids = np.asarray(ids, dtype=np.int64)
    cols: dict[str, Any] = {"id": ids}
    if v is not None:
        cols["v"] = np.full(len(ids), v, dtype=np.int64)
    res = t.apply(t.applied_index + 1, encode_write_batch(INT_KEY, op, pa.table(cols)))
    return [e.status for e in res.errors]


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, np.ndarray]:
    """A tablet of 4 flushed rowsets x 50,000 random keys (13 row groups each)."""
    root = str(tmp_path_factory.mktemp("big"))
    keys = np.random.default_rng(7).choice(1 << 40, size=ROWSETS * PER_ROWSET, replace=False)
    t = Tablet.create(root, "t", INT_KEY, options=BIG)
    for r in range(ROWSETS):
        assert _write(t, OpType.INSERT, keys[r * PER_ROWSET:(r + 1) * PER_ROWSET], v=0) == []
        t.flush()
    return root, keys


def _copy(big: tuple[str, np.ndarray], tmp_path: Path) -> Tablet:
    """A private copy of the big tablet, opened: no key index in memory."""
    import shutil

    root, _ = big
    shutil.copytree(root, tmp_path / "t", dirs_exist_ok=True)
    return Tablet.open(str(tmp_path / "t"), "t", options=BIG)


def test_single_row_writes_on_a_big_tablet_read_row_groups_not_indexes(
        big: tuple[str, np.ndarray], tmp_path: Path, no_fsync: None) -> None:
    _, keys = big
    t = _copy(big, tmp_path)
    a, b, c = (int(k) for k in keys[[10, PER_ROWSET + 20, 3 * PER_ROWSET + 30]])
    assert _write(t, OpType.UPSERT, [a], v=1) == []
    assert _write(t, OpType.DELETE, [b]) == []
    assert _write(t, OpType.UPDATE, [b], v=2) == ["NotFound"]
    assert _write(t, OpType.INSERT, [c]) == ["AlreadyPresent"]
    assert _write(t, OpType.UPDATE_IGNORE, [c], v=3) == []
    assert t.metrics.key_index_loads == 0
    assert t.metrics.point_lookups >= 5
    full_index = ROWSETS * PER_ROWSET * INDEX_BYTES_PER_ROW
    # Only the bloom filters (~29 bits per row) stay; one loaded index would pass this.
    assert t.memory_bytes()[1] < full_index // 4
    assert t.lookup(a) == {"id": a, "v": 1, "s": None}
    assert t.lookup(b) is None
    assert t.lookup(c) == {"id": c, "v": 3, "s": None}
    t.flush()
    t = Tablet.open(str(tmp_path / "t"), "t", options=BIG)
    assert _write(t, OpType.INSERT, [b]) == []  # its ended version is in a delta file now
    assert _write(t, OpType.DELETE, [a]) == []
    # The two-row rowset the flush wrote has one row group: its (tiny) index is loaded, as
    # the rule says; the big ones are still read by row group.
    assert t.metrics.key_index_loads == 1 and t.metrics.point_lookups == 2
    assert t.memory_bytes()[1] < full_index // 4
    assert t.lookup(a) is None and t.lookup(b) == {"id": b, "v": None, "s": None}


def test_a_large_batch_of_existing_keys_loads_the_index_and_sees_earlier_point_writes(
        big: tuple[str, np.ndarray], tmp_path: Path, no_fsync: None) -> None:
    _, keys = big
    t = _copy(big, tmp_path)
    gone, changed = int(keys[5]), int(keys[PER_ROWSET + 5])
    assert _write(t, OpType.DELETE, [gone]) == []  # point path: ends set, no index loaded
    assert _write(t, OpType.UPSERT, [changed], v=9) == []
    assert t.metrics.key_index_loads == 0
    points = t.metrics.point_lookups
    batch = np.concatenate([[gone], keys[::40]])  # 5,000 keys over every row group
    errors = _write(t, OpType.UPDATE, batch, v=4)
    assert errors == ["NotFound"]  # the index built now has the point path's ends
    assert t.metrics.key_index_loads == ROWSETS
    assert t.metrics.point_lookups == points
    assert t.lookup(changed) == {"id": changed, "v": 9, "s": None}  # not in the batch
    assert t.lookup(int(keys[40])) == {"id": int(keys[40]), "v": 4, "s": None}


def test_composite_keys_take_the_point_path_and_prune_by_later_key_columns(
        tmp_path: Path, no_fsync: None) -> None:
    options = TabletOptions(flush_threshold_bytes=0, row_group_rows=1024)
    n = 30_000
    rng = np.random.default_rng(3)
    hosts = np.array(["h1", "h2", "h3"])[np.arange(n) % 3]  # few values: the first column
    r = pa.array((np.arange(n) // 3 * 1_000_000).astype(np.int64), pa.timestamp("us"))
    nn = rng.integers(-2**40, 2**40, size=n)
    t = Tablet.create(str(tmp_path), "t", COMPOSITE, options=options)
    for part in np.array_split(np.arange(n), 2):
        take = pa.array(part)
        tab = pa.table({"h": pa.array(hosts).take(take), "r": r.take(take),
                        "n": pa.array(nn).take(take), "v": pa.array(part)})
        assert t.apply(t.applied_index + 1, encode_write_batch(COMPOSITE, OpType.INSERT,
                                                               tab)).ok
        t.flush()
    t = Tablet.open(str(tmp_path), "t", options=options)
    i = 20_001
    key = {"h": pa.array([str(hosts[i])]), "r": r.slice(i, 1), "n": pa.array([int(nn[i])])}
    # Both rowsets span h1..h3, and a third of each one's row groups hold only h1: by the
    # first column alone 5 or more groups would qualify, the timestamps leave 1 or 2.
    holding = []
    for rs in t._rowsets:
        ranges = rs.key_ranges()
        groups = ranges.groups_for(pa.table(key))
        assert ranges.num_groups >= 10 and len(groups) <= 2
        v = rs.read_all(["v"]).column("v").to_numpy()
        for row in np.nonzero(v == i)[0]:  # where the key really is
            holding.append(int(row))
            assert np.searchsorted(ranges.starts, row, side="right") - 1 in groups
    assert len(holding) == 1

    def write(op: OpType, key: dict[str, pa.Array], v: int | None = None) -> list[str]:
        cols = dict(key) | ({} if v is None else {"v": pa.array([v], pa.int64())})
        res = t.apply(t.applied_index + 1,
                      encode_write_batch(COMPOSITE, op, pa.table(cols)))
        return [e.status for e in res.errors]

    absent = key | {"n": pa.array([int(nn[i]) + 1])}
    assert write(OpType.INSERT, key) == ["AlreadyPresent"]
    assert write(OpType.UPSERT, key, v=-5) == []
    assert write(OpType.UPDATE, absent, v=1) == ["NotFound"]
    assert write(OpType.DELETE, key) == []
    assert write(OpType.DELETE, key) == ["NotFound"]
    assert write(OpType.INSERT, absent) == []
    assert t.metrics.key_index_loads == 0 and t.metrics.point_lookups >= 2
    got = t.scan_table().to_pylist()
    assert len(got) == n
    assert {"h": str(hosts[i]), "r": r[i].as_py(), "n": int(nn[i]) + 1, "v": None,
            "s": None} in got
