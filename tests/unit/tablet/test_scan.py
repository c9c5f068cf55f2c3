"""Snapshot scans: MVCC visibility, projection, pushed-down predicates, pruning, batching."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError, ServiceUnavailableError
from pyspark_kudu.schema import ColumnSchema, Predicate, Schema
from pyspark_kudu.tablet import OpType, Tablet, TabletOptions, encode_write_batch

SCHEMA = Schema(
    (
        ColumnSchema("id", "int64", nullable=False),
        ColumnSchema("grp", "string", nullable=False, default="g"),
        ColumnSchema("amount", pa.decimal128(12, 2)),
        ColumnSchema("at", pa.timestamp("us", tz="UTC")),
        ColumnSchema("day", "date32"),
        ColumnSchema("ok", "bool"),
    ),
    ("id",),
)
OPTIONS = TabletOptions(flush_threshold_bytes=0, row_group_rows=100)


@pytest.fixture
def tablet(tmp_path: Path, no_fsync: None) -> Tablet:
    return Tablet.create(str(tmp_path), "t1", SCHEMA, options=OPTIONS)


def write(tablet: Tablet, op: OpType, table: pa.Table) -> int:
    index = tablet.applied_index + 1
    assert tablet.apply(index, encode_write_batch(SCHEMA, op, table)).ok
    return index


def ids(tablet: Tablet, **kwargs: object) -> list[int]:
    return sorted(tablet.scan_table(**kwargs).column("id").to_pylist())  # type: ignore[arg-type]


def test_snapshot_sees_exactly_the_entries_at_or_below_it(tablet: Tablet) -> None:
    i1 = write(tablet, OpType.INSERT, pa.table({"id": [1, 2, 3]}))
    tablet.flush()
    i2 = write(tablet, OpType.DELETE, pa.table({"id": [2]}))
    i3 = write(tablet, OpType.INSERT, pa.table({"id": [2, 4]}))
    tablet.flush()
    i4 = write(tablet, OpType.UPSERT, pa.table({"id": [1], "grp": ["h"]}))
    assert ids(tablet, snapshot=i1) == [1, 2, 3]
    assert ids(tablet, snapshot=i2) == [1, 3]
    assert ids(tablet, snapshot=i3) == [1, 2, 3, 4]
    assert tablet.lookup(1, snapshot=i3) == {"id": 1, "grp": "g", "amount": None, "at": None,
                                             "day": None, "ok": None}
    assert tablet.lookup(1, ["grp"], snapshot=i4) == {"grp": "h"}
    assert tablet.lookup(9) is None


def test_snapshots_outside_the_servable_range_are_refused(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, pa.table({"id": [1]}))
    write(tablet, OpType.UPSERT, pa.table({"id": [1], "grp": ["x"]}))
    with pytest.raises(ServiceUnavailableError, match="retry later or scan another replica"):
        tablet.scan_table(snapshot=3)
    tablet.compact(history_retention_index=2)
    with pytest.raises(InvalidArgumentError, match="ancient history mark 2"):
        tablet.scan_table(snapshot=1)
    assert ids(tablet, snapshot=2) == [1]


def _rich_rows(n: int, start: int = 0) -> pa.Table:
    utc = dt.timezone.utc
    return pa.table({
        "id": list(range(start, start + n)),
        "grp": [f"g{i % 3}" for i in range(n)],
        "amount": [None if i % 5 == 0 else Decimal(i) / 4 for i in range(n)],
        "at": [dt.datetime(2024, 1, 1, tzinfo=utc) + dt.timedelta(hours=i) for i in range(n)],
        "day": [dt.date(2024, 1, 1) + dt.timedelta(days=i % 30) for i in range(n)],
        "ok": [i % 2 == 0 for i in range(n)],
    }, schema=SCHEMA.arrow_schema)


@pytest.mark.parametrize("flushed", [False, True])
@pytest.mark.parametrize("pred, want", [
    (Predicate.eq("grp", "g1"), lambda r: r["grp"] == "g1"),
    (Predicate.ne("grp", "g1"), lambda r: r["grp"] != "g1"),
    (Predicate.lt("id", 10), lambda r: r["id"] < 10),
    (Predicate.ge("amount", Decimal("30.5")), lambda r: r["amount"] is not None
     and r["amount"] >= Decimal("30.5")),
    (Predicate.in_("day", [dt.date(2024, 1, 2), dt.date(2024, 1, 5)]),
     lambda r: r["day"] in (dt.date(2024, 1, 2), dt.date(2024, 1, 5))),
    (Predicate.is_null("amount"), lambda r: r["amount"] is None),
    (Predicate.is_not_null("amount"), lambda r: r["amount"] is not None),
    (Predicate.gt("at", dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc)),
     lambda r: r["at"] > dt.datetime(2024, 1, 3, tzinfo=dt.timezone.utc)),
    (Predicate.eq("ok", True), lambda r: r["ok"]),
])
def test_predicates_filter_like_sql(tablet: Tablet, flushed: bool, pred: Predicate,
                                   want: object) -> None:
    table = _rich_rows(250)
    write(tablet, OpType.INSERT, table)
    if flushed:
        tablet.flush()
    expected = sorted(r["id"] for r in table.to_pylist() if want(r))  # type: ignore[operator]
    assert ids(tablet, predicates=[pred]) == expected


def test_projection_returns_requested_columns_in_order_with_exact_schema(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, _rich_rows(10))
    tablet.flush()
    write(tablet, OpType.INSERT, _rich_rows(10, start=10))
    for batch in tablet.scan(["day", "id"], [Predicate.eq("grp", "g0")]):
        assert batch.schema == pa.schema([pa.field("day", pa.date32()),
                                          pa.field("id", pa.int64(), nullable=False)])
    with pytest.raises(NotFoundError, match="column 'nope' not found"):
        tablet.scan(["nope"])


def test_batches_are_bounded(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, _rich_rows(1000))
    tablet.flush()
    write(tablet, OpType.INSERT, _rich_rows(500, start=1000))
    sizes = [b.num_rows for b in tablet.scan(batch_rows=64)]
    assert max(sizes) <= 64 and sum(sizes) == 1500


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(updated=st.sets(st.integers(0, 299)), deleted=st.sets(st.integers(0, 299)),
       columns=st.sampled_from([None, [], ["grp"], ["ok", "id"]]),
       pred=st.sampled_from([None, Predicate.eq("grp", "u"), Predicate.lt("id", 150)]),
       flush_again=st.booleans(), batch_rows=st.sampled_from([7, 64, 1000]))
def test_versions_ended_by_deltas_are_dropped_whatever_the_projection(
        tmp_path_factory: pytest.TempPathFactory, no_fsync: None, updated: set[int],
        deleted: set[int], columns: list[str] | None, pred: Predicate | None,
        flush_again: bool, batch_rows: int) -> None:
    """Updates and deletes of flushed rows end their versions through deltas, which the scan
    drops by file position after decoding (``scan.rowset_batches``): whatever the
    projection (none, or without ``id``), predicate and batch size, exactly the live
    versions come back, with their latest values."""
    t = Tablet.create(str(tmp_path_factory.mktemp("ended")), "t1", SCHEMA, options=OPTIONS)
    rows = _rich_rows(300)
    write(t, OpType.INSERT, rows)
    t.flush()
    if updated:
        new = rows.take(sorted(updated))
        write(t, OpType.UPSERT, new.set_column(1, "grp", pa.array(["u"] * len(updated))))
    if deleted:
        write(t, OpType.DELETE, pa.table({"id": sorted(deleted)}))
    if flush_again:
        t.flush()
    model = {r["id"]: r for r in rows.to_pylist() if r["id"] not in deleted}
    for i in updated - deleted:
        model[i] = {**model[i], "grp": "u"}
    want = [r for r in model.values()
            if pred is None or (r["grp"] == "u" if pred.column == "grp" else r["id"] < 150)]
    names = SCHEMA.names if columns is None else columns
    batches = list(t.scan(columns, [] if pred is None else [pred], batch_rows=batch_rows))
    assert all(0 < b.num_rows <= batch_rows and b.schema.names == list(names)
               for b in batches)
    got = pa.Table.from_batches(batches, schema=SCHEMA.project(list(names)))
    assert got.num_rows == len(want)
    key = sorted(str(v) for v in (tuple(r[c] for c in names) for r in want))
    assert sorted(str(v) for v in (tuple(r[c] for c in names) for r in got.to_pylist())) == key


def test_point_lookup_opens_only_the_rowset_whose_key_range_holds_the_key(
        tablet: Tablet) -> None:
    for start in range(0, 1000, 100):
        write(tablet, OpType.INSERT, _rich_rows(100, start))
        tablet.flush()
    assert len(tablet.rowsets) == 10
    before = tablet.metrics.rowset_files_opened
    assert tablet.lookup(547)["id"] == 547  # type: ignore[index]
    assert tablet.metrics.rowset_files_opened - before == 1
    before = tablet.metrics.rowset_files_opened
    assert tablet.lookup(5000) is None
    assert tablet.metrics.rowset_files_opened == before
    before = tablet.metrics.rowset_files_opened
    assert len(ids(tablet, predicates=[Predicate.ge("id", 150), Predicate.lt("id", 300)])) == 150
    assert tablet.metrics.rowset_files_opened - before == 2


def test_rowset_files_are_pk_sorted_with_row_group_statistics(tablet: Tablet) -> None:
    write(tablet, OpType.INSERT, _rich_rows(300).take(pa.array(list(range(299, -1, -1)))))
    tablet.flush()
    meta = tablet.rowsets[0]
    assert (meta.min_key, meta.max_key) == ((0,), (299,))
    pf = pq.ParquetFile(tablet.directory.path(meta.file))
    assert pf.read().column("id").to_pylist() == list(range(300))
    assert pf.metadata.num_row_groups == 3
    stats = pf.metadata.row_group(1).column(0).statistics
    assert (stats.min, stats.max) == (100, 199)


def test_scan_keeps_reading_pinned_files_while_a_compaction_replaces_them(
        tablet: Tablet) -> None:
    for start in (0, 100):
        write(tablet, OpType.INSERT, _rich_rows(100, start))
        tablet.flush()
    it = tablet.scan(["id"], batch_rows=10)
    first = next(it)
    old_files = [m.file for m in tablet.rowsets]
    tablet.compact()
    assert all(tablet.directory.exists(f) for f in old_files)  # pinned by the open scan
    got = first.column(0).to_pylist() + [i for b in it for i in b.column(0).to_pylist()]
    assert sorted(got) == list(range(200))
    assert not any(tablet.directory.exists(f) for f in old_files)  # deleted after the scan


def test_composite_key_lookup_prunes_on_whole_key_tuples(tmp_path: Path, no_fsync: None) -> None:
    schema = Schema((ColumnSchema("a", "int32", nullable=False),
                     ColumnSchema("b", "string", nullable=False),
                     ColumnSchema("v", "int64")), ("a", "b"))
    t = Tablet.create(str(tmp_path), "t", schema, options=OPTIONS)
    # Rowset 1 holds (1, "m".."z"), rowset 2 holds (1, "a".."l"): same first key column.
    for i, letters in enumerate(["mnopqrstuvwxyz", "abcdefghijkl"], start=1):
        rows = pa.table({"a": pa.array([1] * len(letters), pa.int32()), "b": list(letters),
                         "v": list(range(len(letters)))})
        t.apply(i, encode_write_batch(schema, OpType.INSERT, rows))
        t.flush()
    before = t.metrics.rowset_files_opened
    assert t.lookup((1, "c")) == {"a": 1, "b": "c", "v": 2}
    assert t.metrics.rowset_files_opened - before == 1
    before = t.metrics.rowset_files_opened
    assert t.lookup({"a": 2, "b": "c"}) is None
    assert t.metrics.rowset_files_opened == before
    with pytest.raises(InvalidArgumentError, match="primary key is"):
        t.lookup(1)


def test_memrowset_grows_past_its_initial_capacity(tablet: Tablet) -> None:
    for start in range(0, 3000, 1000):
        write(tablet, OpType.INSERT, pa.table({"id": list(range(start, start + 1000))}))
    write(tablet, OpType.DELETE, pa.table({"id": list(range(0, 3000, 2))}))
    assert tablet.memrowset_rows == 3000
    assert ids(tablet) == list(range(1, 3000, 2))
    assert len(ids(tablet, snapshot=2)) == 2000
