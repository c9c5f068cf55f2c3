"""The ``kudu`` data source's pure parts: options, filter translation, ignoreNull batches,
the session's table description and stream ledger. No SparkSession."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given
from hypothesis import strategies as hs
from pyspark.sql.datasource import (
    CaseInsensitiveDict,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    IsNotNull,
    IsNull,
    LessThan,
    LessThanOrEqual,
    Not,
    StringStartsWith,
)

from pyspark_kudu.errors import (
    InvalidArgumentError,
    NotSupportedError,
    RowWriteError,
    ServiceUnavailableError,
)
from pyspark_kudu.schema import ColumnSchema, Predicate, PredicateOp, Schema
from pyspark_kudu.spark.api.datasource import (
    KuduScanReader,
    TabletPartition,
    without_null_values,
)
from pyspark_kudu.spark.api.session_service import StreamLedger
from pyspark_kudu.spark.api.source_options import (
    DEFAULT_BATCH_SIZE,
    MISSING_TABLE_MESSAGE,
    ReadOptions,
    check_master,
    check_write_columns,
    parse_bool,
    parse_read_options,
    parse_write_options,
    stream_id_option,
    translate_filters,
)
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.replica_reader import ReplicaChoice, TabletScan, order_replicas
from pyspark_kudu.spark.replication.session_client import (
    TableInfo,
    TabletInfo,
    decode_error,
    encode_error,
)
from pyspark_kudu.tablet import OpType

SCHEMA = Schema((
    ColumnSchema("id", pa.int64(), False),
    ColumnSchema("name", pa.string(), False),
    ColumnSchema("n", pa.int32()),
    ColumnSchema("x", pa.float64()),
    ColumnSchema("ts", pa.timestamp("us", "UTC")),
    ColumnSchema("wall", pa.timestamp("us")),
    ColumnSchema("day", pa.date32()),
    ColumnSchema("dec", pa.decimal128(10, 2)),
    ColumnSchema("flag", pa.bool_()),
), ("id", "name"))


def opts(**kv: str) -> CaseInsensitiveDict:
    """Options as Spark hands them to a Python data source: keys lower-cased."""
    return CaseInsensitiveDict({"kudu.table": "t", **kv})


# -- write options -----------------------------------------------------------------------------


def test_write_defaults_follow_kudu_spark() -> None:
    w = parse_write_options(opts())
    assert (w.table, w.operation, w.ignore_null, w.batch_size, w.repartition,
            w.handle_schema_drift, w.master, w.stream_id) == (
        "t", OpType.UPSERT, False, DEFAULT_BATCH_SIZE, False, False, None, None)


@pytest.mark.parametrize("name, op", [
    ("insert", OpType.INSERT), ("INSERT_IGNORE", OpType.INSERT_IGNORE),
    ("upsert", OpType.UPSERT), ("update", OpType.UPDATE),
    ("update_ignore", OpType.UPDATE_IGNORE), ("delete", OpType.DELETE),
    ("delete_ignore", OpType.DELETE_IGNORE),
])
def test_every_kudu_operation_is_accepted(name: str, op: OpType) -> None:
    assert parse_write_options(opts(**{"kudu.operation": name})).operation is op


def test_ignore_duplicate_row_errors_turns_insert_into_insert_ignore_only() -> None:
    flag = {"kudu.ignoreDuplicateRowErrors": "true"}
    assert parse_write_options(opts(**flag)).operation is OpType.UPSERT
    assert parse_write_options(
        opts(**flag, **{"kudu.operation": "insert"})).operation is OpType.INSERT_IGNORE


def test_option_names_are_case_insensitive_as_spark_passes_them() -> None:
    w = parse_write_options(opts(**{"KUDU.IGNORENULL": "TRUE", "kudu.BatchSize": "10"}))
    assert w.ignore_null and w.batch_size == 10
    plain = parse_write_options({"kudu.table": "t", "kudu.ignoreNull": "true"})
    assert plain.ignore_null


@pytest.mark.parametrize("options, error, text", [
    ({}, InvalidArgumentError, MISSING_TABLE_MESSAGE),
    ({"kudu.table": " "}, InvalidArgumentError, MISSING_TABLE_MESSAGE),
    ({"kudu.operation": "merge"}, InvalidArgumentError, "Unsupported operation type 'merge'"),
    ({"kudu.batchSize": "0"}, InvalidArgumentError, "kudu.batchSize must be >= 1, got 0"),
    ({"kudu.batchSize": "ten"}, InvalidArgumentError, "kudu.batchSize must be an integer"),
    ({"kudu.ignoreNull": "yes"}, InvalidArgumentError, "kudu.ignoreNull must be true or false"),
    ({"kudu.batchSise": "1", "kudu.tabel": "x"}, InvalidArgumentError,
     "unknown option(s) ['kudu.batchsise', 'kudu.tabel']"),
    ({"kudu.master": "h1:notaport"}, InvalidArgumentError, "invalid master address"),
    ({"kudu.streamId": "../up"}, InvalidArgumentError, "kudu.streamId '../up' is not usable"),
])
def test_bad_write_options_are_refused_naming_the_problem(
    options: dict[str, str], error: type[Exception], text: str,
) -> None:
    base = {} if "kudu.table" in options or not options else {"kudu.table": "t"}
    with pytest.raises(error, match=re.escape(text)):
        parse_write_options(CaseInsensitiveDict({**base, **options}))


def test_options_of_spark_and_of_the_other_mode_are_left_alone() -> None:
    w = parse_write_options(opts(path="/x", checkpointLocation="/c",
                                 **{"kudu.scanLocality": "leader_only"}))
    assert w.table == "t"
    r = parse_read_options(opts(**{"kudu.operation": "insert"}))
    assert r.table == "t"


def test_parse_bool_accepts_only_true_and_false() -> None:
    assert parse_bool("o", "True") and not parse_bool("o", " false ")
    assert parse_bool("o", None, default=True)
    with pytest.raises(InvalidArgumentError, match="option o must be true or false"):
        parse_bool("o", "1")


# -- read options ------------------------------------------------------------------------------


def test_read_defaults_and_values() -> None:
    r = parse_read_options(opts())
    assert (r.scan_locality, r.snapshot_index, r.fault_tolerant, r.batch_size) == (
        "closest_replica", None, False, DEFAULT_BATCH_SIZE)
    r = parse_read_options(opts(**{
        "kudu.scanLocality": "LEADER_ONLY", "kudu.snapshotIndex": "12",
        "kudu.faultTolerantScan": "true"}))
    assert (r.scan_locality, r.snapshot_index, r.fault_tolerant) == ("leader_only", 12, True)
    assert r.read_mode == "read_latest"
    assert parse_read_options(opts(**{"kudu.readMode": " Linearizable"})).read_mode == (
        "linearizable")


def test_bad_read_options_are_refused() -> None:
    with pytest.raises(NotSupportedError, match=re.escape("use kudu.snapshotIndex")):
        parse_read_options(opts(**{"kudu.snapshotTimestampMicros": "1700000000000000"}))
    with pytest.raises(InvalidArgumentError,
                       match=re.escape("unknown kudu.scanLocality 'nearest'")):
        parse_read_options(opts(**{"kudu.scanLocality": "nearest"}))
    with pytest.raises(InvalidArgumentError, match=re.escape("unknown kudu.readMode 'latest'")):
        parse_read_options(opts(**{"kudu.readMode": "latest"}))
    for clash in ({"kudu.snapshotIndex": "3"}, {"kudu.faultTolerantScan": "true"}):
        with pytest.raises(InvalidArgumentError, match="cannot be combined"):
            parse_read_options(opts(**{"kudu.readMode": "linearizable", **clash}))
    # Accepted, it would change nothing: a scan is one partition per tablet.
    for size in ("1048576", "0"):
        with pytest.raises(NotSupportedError, match=re.escape(
                f"kudu.splitSizeBytes={size} is not supported: scans are one Spark partition "
                f"per tablet, and splitting a tablet by size is not supported yet")):
            parse_read_options(opts(**{"kudu.SPLITSIZEBYTES": size}))
    with pytest.raises(InvalidArgumentError, match=re.escape(MISSING_TABLE_MESSAGE)):
        parse_read_options({})


def test_only_the_sessions_master_may_be_named() -> None:
    check_master(None, ["a:7051"])
    check_master("b:7052, a", ["a:7051", "b:7052"])  # any order, default port
    with pytest.raises(InvalidArgumentError, match="differs from this session's master"):
        check_master("c:7051", ["a:7051"])


def test_stream_ids_must_be_file_name_safe() -> None:
    assert stream_id_option(" orders-v1.2_x ") == "orders-v1.2_x"
    for bad in ("", ".hidden", "a/b", "x" * 129, "ünï"):
        with pytest.raises(InvalidArgumentError, match="is not usable"):
            stream_id_option(bad)


# -- columns -----------------------------------------------------------------------------------


def test_columns_are_checked_like_kudu_context_write() -> None:
    check_write_columns(["id", "name", "n"], SCHEMA, "t")
    with pytest.raises(InvalidArgumentError,
                       match=re.escape("table t: DataFrame columns ['zzz'] are not in the table")):
        check_write_columns(["id", "name", "zzz"], SCHEMA, "t")
    with pytest.raises(InvalidArgumentError,
                       match=re.escape("the DataFrame lacks primary key columns ['name']")):
        check_write_columns(["id", "n"], SCHEMA, "t")
    with pytest.raises(NotSupportedError, match=r"\['zzz'\].*needs ALTER TABLE"):
        check_write_columns(["id", "name", "zzz"], SCHEMA, "t", handle_schema_drift=True)


# -- filters -----------------------------------------------------------------------------------

T0 = dt.datetime(2024, 1, 1, 12, tzinfo=dt.timezone.utc)


@pytest.mark.parametrize("f, expected", [
    (EqualTo(("id",), 5), Predicate.eq("id", 5)),
    (GreaterThan(("id",), 5), Predicate.gt("id", 5)),
    (GreaterThanOrEqual(("n",), 5), Predicate.ge("n", 5)),
    (LessThan(("name",), "m"), Predicate.lt("name", "m")),
    (LessThanOrEqual(("day",), dt.date(2024, 1, 1)), Predicate.le("day", dt.date(2024, 1, 1))),
    (In(("id",), (1, 2, 3)), Predicate.in_("id", (1, 2, 3))),
    (IsNull(("n",)), Predicate.is_null("n")),
    (IsNotNull(("x",)), Predicate.is_not_null("x")),  # null tests are exact on floats too
    (Not(EqualTo(("n",), 7)), Predicate("n", PredicateOp.NE, 7)),
    (EqualTo(("ts",), T0), Predicate.eq("ts", T0)),
    (EqualTo(("wall",), dt.datetime(2024, 1, 1)), Predicate.eq("wall", dt.datetime(2024, 1, 1))),
    (EqualTo(("dec",), Decimal("1.25")), Predicate.eq("dec", Decimal("1.25"))),
    (EqualTo(("flag",), True), Predicate.eq("flag", True)),
])
def test_supported_filters_become_predicates(f: Filter, expected: Predicate) -> None:
    handled, rest = translate_filters([f], SCHEMA)
    assert rest == [] and handled == [expected.bind(SCHEMA)]


@pytest.mark.parametrize("f", [
    EqualTo(("x",), 1.0),  # NaN orders differently in Spark and Arrow
    GreaterThan(("x",), 0.5),
    EqualTo(("ts",), dt.datetime(2024, 1, 1)),  # wall-clock value for an instant column
    EqualTo(("wall",), T0),  # instant for a wall-clock column
    EqualTo(("day",), dt.datetime(2024, 1, 1, 5)),  # a datetime would lose its time
    EqualTo(("n",), 2**40),  # not an int32
    EqualTo(("dec",), Decimal("1.255")),  # more scale than the column
    EqualTo(("missing",), 1),
    EqualTo(("id", "nested"), 1),
    EqualNullSafe(("id",), 1),
    StringStartsWith(("name",), "a"),
    In(("id",), ()),
    In(("id",), (1, None)),
    Not(GreaterThan(("id",), 1)),
    EqualTo(("flag",), 1),
])
def test_other_filters_are_left_to_spark_by_reference(f: Filter) -> None:
    handled, rest = translate_filters([f], SCHEMA)
    assert handled == [] and len(rest) == 1 and rest[0] is f


_OPS: dict[type[Filter], Any] = {
    EqualTo: lambda a, b: a == b, GreaterThan: lambda a, b: a > b,
    GreaterThanOrEqual: lambda a, b: a >= b, LessThan: lambda a, b: a < b,
    LessThanOrEqual: lambda a, b: a <= b,
}


@given(values=hs.lists(hs.one_of(hs.none(), hs.integers(-5, 5)), max_size=20),
       kind=hs.sampled_from([*_OPS, In, IsNull, IsNotNull, Not]),
       operand=hs.integers(-6, 6), members=hs.sets(hs.integers(-6, 6), min_size=1, max_size=4))
def test_translated_predicates_select_what_spark_would(
    values: list[int | None], kind: type[Filter], operand: int, members: set[int],
) -> None:
    schema = Schema((ColumnSchema("k", pa.int64(), False), ColumnSchema("n", pa.int32())), ("k",))
    f: Filter
    spark_keep: Callable[[int], bool]
    if kind is In:
        f, spark_keep = In(("n",), tuple(sorted(members))), lambda v: v in members
    elif kind is IsNull:
        f, spark_keep = IsNull(("n",)), lambda v: v is None
    elif kind is IsNotNull:
        f, spark_keep = IsNotNull(("n",)), lambda v: v is not None
    elif kind is Not:
        f, spark_keep = Not(EqualTo(("n",), operand)), lambda v: v != operand
    else:
        f = kind(("n",), operand)  # type: ignore[call-arg]
        def spark_keep(v: int) -> bool:
            return bool(_OPS[kind](v, operand))
    (pred,), rest = translate_filters([f], schema)
    assert rest == []
    table = pa.table({"n": pa.array(values, pa.int32())})
    got = table.filter(pred.to_expression(schema))["n"].to_pylist()
    # SQL: a comparison with null is unknown, and unknown rows are dropped.
    assert got == [v for v in values if (v is None and kind is IsNull)
                   or (v is not None and spark_keep(v))]


# -- ignoreNull --------------------------------------------------------------------------------


def test_without_null_values_drops_null_cells_and_keeps_every_row() -> None:
    batch = pa.record_batch({"id": [1, 2, 3, 4], "a": [None, "x", None, "y"],
                             "b": [10, None, None, 40], "c": [1, 2, 3, 4]})
    parts = without_null_values(batch, ("id",))
    seen = {}
    for p in parts:
        assert "id" in p.schema.names and "c" in p.schema.names
        for row in p.to_pylist():
            assert None not in row.values()
            seen[row["id"]] = row
    assert seen == {1: {"id": 1, "b": 10, "c": 1}, 2: {"id": 2, "a": "x", "c": 2},
                    3: {"id": 3, "c": 3}, 4: {"id": 4, "a": "y", "b": 40, "c": 4}}
    assert len(parts) == 4  # one batch per null pattern: keys are distinct


def test_without_null_values_keeps_order_when_a_key_repeats() -> None:
    batch = pa.record_batch({"id": [1, 1, 1], "a": ["x", None, "z"]})
    parts = without_null_values(batch, ("id",))
    assert [p.to_pylist() for p in parts] == [
        [{"id": 1, "a": "x"}], [{"id": 1}], [{"id": 1, "a": "z"}]]
    plain = pa.record_batch({"id": [1, 2], "a": ["x", "y"]})
    assert without_null_values(plain, ("id",)) == [plain]


# -- the session's records ---------------------------------------------------------------------


def test_table_info_survives_its_json_form() -> None:
    info = TableInfo("t", SCHEMA, {"hash_dimensions": []},
                     (TabletInfo("tab1", ("a", "b", "c"), "b", 17), TabletInfo("tab2", ("a",))),
                     {"a": ("127.0.0.1", "/r/a", "127.0.0.1:4000", "/dc1/r1"),
                      "b": ("h2", None, "", None)}, "/wh", None, True)
    assert TableInfo.from_dict(info.to_dict()) == info


def test_errors_cross_the_service_as_the_same_class() -> None:
    err = RowWriteError("failed to write 1 rows", [("tab", {"id": 2}, "AlreadyPresent", "dup")],
                        4)
    back = decode_error(encode_error(err))
    assert isinstance(back, RowWriteError) and str(back) == str(err)
    assert back.errors == err.errors and back.rows_written == 4
    nf = decode_error(encode_error(NotSupportedError("no")))
    assert type(nf) is NotSupportedError and str(nf) == "no"
    other = decode_error(encode_error(KeyError("boom")))
    assert "KeyError in the kudu session service" in str(other)


def test_the_stream_ledger_records_the_last_committed_batch(tmp_path: Path) -> None:
    ledger = StreamLedger(str(tmp_path))
    assert ledger.last_batch("a/../t.x", "s1") is None
    ledger.record("a/../t.x", "s1", 0)
    ledger.record("a/../t.x", "s1", 3)
    assert ledger.last_batch("a/../t.x", "s1") == 3
    assert ledger.last_batch("a/../t.x", "s2") is None
    # The table name is quoted into one directory under <warehouse>/streams.
    (d,) = (tmp_path / "streams").iterdir()
    assert d.name == "a%2F%2E%2E%2Ft%2Ex" and (d / "s1.json").exists()


def test_predicate_expressions_use_the_pushed_values(tmp_path: Path) -> None:
    handled, _ = translate_filters([GreaterThan(("ts",), T0)], SCHEMA)
    table = pa.table({"ts": pa.array([T0, T0 + dt.timedelta(seconds=1)],
                                     pa.timestamp("us", "UTC"))})
    assert pc.sum(table.filter(handled[0].to_expression(SCHEMA)).column(0).is_valid()
                  ).as_py() == 1


def test_a_scan_task_that_reaches_no_replica_says_why_for_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PYSPARK_KUDU_SECRET", "s" * 32)
    other = ensure_instance(str(tmp_path / "ts-other"))
    info = TableInfo("t", SCHEMA, {}, (TabletInfo("tab1", ("a", "b", "c")),),
                     {"a": ("h1", str(tmp_path / "absent"), "", None),
                      "b": ("h1", other.data_root, "", None),
                      "c": ("h9", None, "", None)}, None, None, True)
    reader = KuduScanReader(info, ReadOptions(table="t"), SCHEMA.to_spark())
    (part,) = reader.partitions()
    assert isinstance(part, TabletPartition)
    with pytest.raises(ServiceUnavailableError) as e:
        list(reader.read(part))
    text = str(e.value)
    assert "table t, tablet tab1: no replica served a scan from this task" in text
    assert "is not on this host" in text and f"belongs to tablet server {other.uuid}" in text
    assert "c: on h9, and its host has no known tablet server address" in text
    # Spark's stand-in partition (every tablet pruned) reads nothing.
    assert list(reader.read(InputPartition(None))) == []


def test_repartition_sort_follows_kudu_spark_defaults() -> None:
    w = parse_write_options(opts())
    assert (w.repartition, w.repartition_sort) == (False, True)
    w = parse_write_options(opts(**{"kudu.repartition": "true",
                                    "KUDU.REPARTITION.SORT": "false"}))
    assert (w.repartition, w.repartition_sort) == (True, False)
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "kudu.repartition.sort must be true or false")):
        parse_write_options(opts(**{"kudu.repartition.sort": "1"}))


def test_a_scan_task_tries_its_own_host_then_its_location_then_the_longest_prefix() -> None:
    lead = ReplicaChoice("a", None, True, "h1", location="/dc1/r1")
    f2 = ReplicaChoice("b", None, False, "h2", location="/dc1/r2")
    f3 = ReplicaChoice("c", None, False, "h3", location="/dc2/r1")
    hosts = {"h1": "/dc1/r1", "h2": "/dc1/r2", "h3": "/dc2/r1", "h4": "/dc1/r2",
             "h5": "/dc2/r9"}
    scan = TabletScan("t", "tab", (lead, f2, f3), None, host_locations=hosts)
    assert order_replicas(scan, "h3")[0] == f3
    assert order_replicas(scan, "h1")[0] == lead
    assert order_replicas(scan, "h4")[0] == f2  # same location as h4
    assert order_replicas(scan, "h5")[0] == f3  # longest common prefix (/dc2)
    assert scan.preferred_hosts() == ["h1", "h2", "h3"]  # every replica's host


def test_a_task_reads_the_replica_on_its_own_host_from_that_hosts_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    own = ensure_instance(str(tmp_path / "own"))
    monkeypatch.setenv("SPARK_LOCAL_IP", "h1")
    monkeypatch.setenv("PYSPARK_KUDU_DATA_ROOT", own.data_root)
    info = TableInfo("t", SCHEMA, {}, (TabletInfo("tab1", ("a", own.uuid), "a", 5),),
                     {"a": ("h2", None, "", None), own.uuid: ("h1", None, "", None)},
                     None, None, True)
    reader = KuduScanReader(info, ReadOptions(table="t"), SCHEMA.to_spark())
    (part,) = reader.partitions()
    with pytest.raises(ServiceUnavailableError) as e:
        list(reader.read(part))  # found under h1's root, but it holds no replica of tab1
    text = str(e.value)
    assert "tablet tab1: no replica served a scan from this task on h1" in text
    assert f"{own.uuid}: NotFoundError: tablet tab1 has no replica" in text
    assert "a: on h2, and its host has no known tablet server address" in text
