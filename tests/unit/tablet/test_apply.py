"""Row operations on a replica: Kudu's per-row semantics and errors, vectorized."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.tablet import OpType, Tablet, TabletOptions, TabletState, encode_write_batch

SCHEMA = Schema(
    (
        ColumnSchema("id", "int64", nullable=False),
        ColumnSchema("v", "string"),
        ColumnSchema("n", "int32", nullable=False, default=7),
    ),
    ("id",),
)
NO_AUTO_FLUSH = TabletOptions(flush_threshold_bytes=0)


@pytest.fixture
def tablet(tmp_path: Path, no_fsync: None) -> Tablet:
    return Tablet.create(str(tmp_path), "t1", SCHEMA, options=NO_AUTO_FLUSH)


class Writer:
    def __init__(self, tablet: Tablet) -> None:
        self.tablet = tablet

    def __call__(self, ops: object, **cols: list[object]) -> list[tuple[int, str]]:
        index = self.tablet.applied_index + 1
        data = encode_write_batch(SCHEMA, ops, pa.table(cols))  # type: ignore[arg-type]
        return [(e.row, e.status) for e in self.tablet.apply(index, data).errors]


def rows(tablet: Tablet, snapshot: int | None = None) -> dict[int, tuple[object, object]]:
    t = tablet.scan_table(snapshot=snapshot).to_pylist()
    return {r["id"]: (r["v"], r["n"]) for r in t}


@pytest.mark.parametrize("flushed", [False, True], ids=["in-memrowset", "on-disk"])
@pytest.mark.parametrize("op, present_errors, absent_errors, present_after, absent_after", [
    (OpType.INSERT, [(0, "AlreadyPresent")], [], ("old", 1), ("new", 7)),
    (OpType.INSERT_IGNORE, [], [], ("old", 1), ("new", 7)),
    (OpType.UPSERT, [], [], ("new", 1), ("new", 7)),
    (OpType.UPDATE, [], [(0, "NotFound")], ("new", 1), None),
    (OpType.UPDATE_IGNORE, [], [], ("new", 1), None),
    (OpType.DELETE, [], [(0, "NotFound")], None, None),
    (OpType.DELETE_IGNORE, [], [], None, None),
])
def test_each_op_type_follows_kudu_semantics(
        tablet: Tablet, flushed: bool, op: OpType, present_errors: list[tuple[int, str]],
        absent_errors: list[tuple[int, str]], present_after: tuple[str, int] | None,
        absent_after: tuple[str, int] | None) -> None:
    w = Writer(tablet)
    assert w(OpType.INSERT, id=[1], v=["old"], n=[1]) == []
    if flushed:
        tablet.flush()
    cols: dict[str, list[object]] = {"id": [1]}
    if op not in (OpType.DELETE, OpType.DELETE_IGNORE):
        cols["v"] = ["new"]
    assert w(op, **cols) == present_errors
    assert rows(tablet).get(1) == present_after
    cols["id"] = [2]
    assert w(op, **cols) == absent_errors
    assert rows(tablet).get(2) == absent_after


def test_errors_report_the_rows_in_batch_order(tablet: Tablet) -> None:
    w = Writer(tablet)
    w(OpType.INSERT, id=[1, 2])
    errs = w([OpType.UPDATE, OpType.INSERT, OpType.DELETE, OpType.INSERT],
             id=[9, 1, 8, 3])
    assert errs == [(0, "NotFound"), (1, "AlreadyPresent"), (2, "NotFound")]
    assert sorted(rows(tablet)) == [1, 2, 3]


def test_repeated_keys_in_one_batch_apply_in_order(tablet: Tablet) -> None:
    w = Writer(tablet)
    errs = w([OpType.INSERT, OpType.UPDATE, OpType.INSERT, OpType.DELETE, OpType.INSERT,
              OpType.UPDATE],
             id=[5, 5, 5, 5, 5, 6], v=["a", "b", "c", "d", "e", "f"])
    assert errs == [(2, "AlreadyPresent"), (5, "NotFound")]
    assert rows(tablet) == {5: ("e", 7)}
    index = tablet.applied_index
    tablet.flush()
    # Intermediate versions of one entry are never visible and are not stored.
    assert rows(tablet, index) == {5: ("e", 7)}
    assert tablet.rowsets[0].num_rows == 1


def test_partial_update_keeps_unsupplied_columns(tablet: Tablet) -> None:
    w = Writer(tablet)
    w(OpType.INSERT, id=[1, 2, 3], v=["a", "b", "c"], n=[10, 20, 30])
    tablet.flush()
    w(OpType.UPDATE, id=[2], n=[21])  # old row on disk
    w(OpType.UPSERT, id=[2, 3, 4], v=["B", None, "D"])  # 2 in memory, 3 on disk, 4 new
    assert rows(tablet) == {1: ("a", 10), 2: ("B", 21), 3: (None, 30), 4: ("D", 7)}
    assert tablet.metrics.rows_fetched_for_update == 3


def test_reapplying_an_entry_is_a_no_op(tablet: Tablet) -> None:
    data = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [1]}))
    assert tablet.apply(1, data).ok
    again = tablet.apply(1, data)
    assert again.skipped and again.ok
    assert rows(tablet) == {1: (None, 7)}


def test_non_write_entries_advance_the_applied_index(tablet: Tablet) -> None:
    result = tablet.apply(4, b"")
    assert result.skipped and tablet.applied_index == 4


def test_write_result_index_is_the_snapshot_that_reads_the_write(tablet: Tablet) -> None:
    w = Writer(tablet)
    w(OpType.INSERT, id=[1], v=["a"])
    result = tablet.apply(2, encode_write_batch(SCHEMA, OpType.UPDATE,
                                                pa.table({"id": [1], "v": ["b"]})))
    assert tablet.lookup(1, snapshot=result.index) == {"id": 1, "v": "b", "n": 7}
    assert tablet.lookup(1, snapshot=result.index - 1) == {"id": 1, "v": "a", "n": 7}


def test_mismatched_schema_batch_fails_every_row_identically(tablet: Tablet) -> None:
    other = Schema((ColumnSchema("id", "int32", nullable=False),), ("id",))
    data = encode_write_batch(other, OpType.INSERT, pa.table({"id": [1, 2]}))
    result = tablet.apply(1, data)
    assert [(e.row, e.status) for e in result.errors] == [(0, "InvalidArgument"),
                                                           (1, "InvalidArgument")]
    assert rows(tablet) == {}


def test_composite_string_keys_hit_disk_rowsets(tmp_path: Path, no_fsync: None) -> None:
    schema = Schema((ColumnSchema("h", "string", nullable=False),
                     ColumnSchema("r", pa.timestamp("us"), nullable=False),
                     ColumnSchema("x", "int64")), ("h", "r"))
    t = Tablet.create(str(tmp_path), "t", schema, options=NO_AUTO_FLUSH)
    keys = {"h": ["a" * 20, "a" * 20, "b"], "r": pa.array([1, 2, 1], pa.timestamp("us"))}
    t.apply(1, encode_write_batch(schema, OpType.INSERT, pa.table(keys)))
    t.flush()
    res = t.apply(2, encode_write_batch(schema, OpType.INSERT, pa.table(keys)))
    assert [e.status for e in res.errors] == ["AlreadyPresent"] * 3
    res = t.apply(3, encode_write_batch(schema, OpType.UPDATE, pa.table({**keys, "x": [1, 2, 3]})))
    assert res.ok
    assert sorted(r["x"] for r in t.scan_table().to_pylist()) == [1, 2, 3]
    assert t.metrics.key_index_loads == 0  # the flush left the index in memory


def test_key_index_survives_hash_collisions(tmp_path: Path, no_fsync: None,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import numpy as np

    from pyspark_kudu.tablet import keys as keys_mod

    real = keys_mod.key_hash

    def weak(data: pa.Table, schema: Schema, seed: int = keys_mod.INDEX_SEED) -> np.ndarray:
        # 3 distinct values: collisions. The real signature: bloom filters hash with it too.
        return real(data, schema, seed) % np.uint64(3)

    monkeypatch.setattr(keys_mod, "key_hash", weak)
    schema = Schema((ColumnSchema("k", "string", nullable=False), ColumnSchema("n", "int32")),
                    ("k",))
    t = Tablet.create(str(tmp_path), "t1", schema, options=NO_AUTO_FLUSH)

    def write(index: int, op: OpType, keys: list[int], n: int | None = None) -> list[object]:
        cols: dict[str, list[object]] = {"k": [f"key{i}" for i in keys]}
        if n is not None:
            cols["n"] = [n] * len(keys)
        res = t.apply(index, encode_write_batch(schema, op, pa.table(cols)))
        return [(e.row, e.status) for e in res.errors]

    write(1, OpType.INSERT, list(range(50)))
    write(2, OpType.UPDATE, list(range(0, 50, 2)), n=1)
    t.flush()
    t = Tablet.open(str(tmp_path), "t1", options=NO_AUTO_FLUSH)  # index built from the file
    assert write(3, OpType.INSERT, [3, 60]) == [(0, "AlreadyPresent")]
    assert write(4, OpType.UPDATE, [4, 61], n=2) == [(1, "NotFound")]
    assert t.lookup("key4") == {"k": "key4", "n": 2}
    assert t.lookup("key6") == {"k": "key6", "n": 1}
    assert t.metrics.key_index_loads == 1


def test_failed_tablet_refuses_requests(tablet: Tablet, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark_kudu.tablet import tablet as tablet_mod

    def boom(*args: object, **kwargs: object) -> None:
        raise OSError("disk gone")

    monkeypatch.setattr(tablet_mod, "apply_batch", boom)
    with pytest.raises(OSError):
        tablet.apply(1, encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [1]})))
    assert tablet.state is TabletState.FAILED
    with pytest.raises(IllegalStateError, match="re-replicate"):
        tablet.scan_table()


def test_undecodable_write_entry_is_rejected_deterministically(tablet: Tablet) -> None:
    data = encode_write_batch(SCHEMA, OpType.INSERT, pa.table({"id": [1]}))
    result = tablet.apply(3, data[:-5])
    assert [(e.row, e.status) for e in result.errors] == [(-1, "Corruption")]
    assert tablet.state is TabletState.RUNNING and tablet.applied_index == 3
    assert rows(tablet) == {}
