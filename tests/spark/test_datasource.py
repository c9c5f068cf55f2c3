"""``format("kudu")`` in local mode: the Python data source against a real KuduContext.

One KuduContext (3 virtual tablet servers) serves the module; every test uses its own
tables. Errors raised in Spark's Python workers reach the caller wrapped by Spark, so the
tests match the pyspark-kudu class name and message in the exception text.
"""

from __future__ import annotations

import base64
import datetime as dt
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.flight as fl
import pytest
from chispa import assert_df_equality
from pyspark import cloudpickle
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from pyspark_kudu.errors import InvalidArgumentError, ServiceUnavailableError
from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema, RangePartition
from pyspark_kudu.spark.api.context import KuduContext, WriteProgress
from pyspark_kudu.spark.api.datasource import KuduDataSource
from pyspark_kudu.spark.api.repartition import repartition_by_tablet
from pyspark_kudu.spark.api.session_service import SessionService
from pyspark_kudu.spark.replication.session_client import SessionAddress, SessionClient
from tests.netcapture import CapturingProxy

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
HASH3 = PartitionSchema((HashDimension(("id",), 3),))


@pytest.fixture(scope="module")
def kudu(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[KuduContext, SessionService]]:
    with KuduContext(spark, warehouse=str(tmp_path_factory.mktemp("ds") / "wh")) as ctx:
        yield ctx, ctx.session_service  # the context registers the data source itself


@pytest.fixture
def ctx(kudu: tuple[KuduContext, SessionService]) -> KuduContext:
    return kudu[0]


_tables = iter(range(10_000))


def new_table(ctx: KuduContext, struct: StructType = STRUCT, keys: tuple[str, ...] = ("id",),
              partitioning: PartitionSchema = HASH3) -> str:
    name = f"t{next(_tables)}"
    ctx.create_table(name, struct, keys=list(keys), partitioning=partitioning)
    return name


def save(df: DataFrame, table: str, **options: str) -> None:
    w = df.write.format("kudu").option("kudu.table", table).mode("append")
    for k, v in options.items():
        w = w.option(k, v)
    w.save()


def load(spark: SparkSession, table: str, **options: str) -> DataFrame:
    r = spark.read.format("kudu").option("kudu.table", table)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def rows(df: DataFrame) -> list[tuple[object, ...]]:
    return sorted(tuple(r) for r in df.collect())


# -- round trips -------------------------------------------------------------------------------

ALL_TYPES = StructType([
    StructField("id", LongType(), False),
    StructField("tag", StringType(), False),
    StructField("i8", ByteType(), True),
    StructField("i16", ShortType(), True),
    StructField("i32", IntegerType(), True),
    StructField("i64", LongType(), True),
    StructField("f32", FloatType(), True),
    StructField("f64", DoubleType(), True),
    StructField("flag", BooleanType(), True),
    StructField("s", StringType(), True),
    StructField("req", StringType(), False),
    StructField("bin", BinaryType(), True),
    StructField("dec", DecimalType(18, 4), True),
    StructField("day", DateType(), True),
    StructField("ts", TimestampType(), True),
    StructField("wall", TimestampNTZType(), True),
])
ALL_ROWS = [
    (1, "a", -128, -32768, -2**31, -2**63, 1.5, -2.25, True, "héllo ✓", "r1", b"\x00\xff",
     Decimal("12345678901234.5678"), dt.date(1970, 1, 1),
     dt.datetime(2024, 2, 29, 12, 30, 45, 123456), dt.datetime(1999, 12, 31, 23, 59, 59)),
    (2, "b", 127, 32767, 2**31 - 1, 2**63 - 1, -0.0, 1e300, False, "", "r2", b"",
     Decimal("-0.0001"), dt.date(2262, 4, 11), dt.datetime(1900, 1, 1, 0, 0, 0, 1),
     dt.datetime(2000, 1, 1)),
    (3, "c", None, None, None, None, None, None, None, None, "r3", None, None, None, None,
     None),
]


def test_every_column_type_round_trips_exactly_nulls_included(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx, ALL_TYPES, keys=("id", "tag"))
    df = spark.createDataFrame(ALL_ROWS, ALL_TYPES)
    save(df, table)
    back = load(spark, table)
    assert [(f.name, f.dataType, f.nullable) for f in back.schema.fields] == [
        (f.name, f.dataType, f.nullable) for f in ALL_TYPES.fields]
    assert_df_equality(back, df, ignore_row_order=True, ignore_metadata=True)
    # The pinned scan of KuduContext.read_table sees the same rows.
    assert_df_equality(ctx.read_table(table), back, ignore_row_order=True)


def test_an_empty_dataframe_writes_nothing_and_reads_back_empty(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx, ALL_TYPES, keys=("id", "tag"))
    save(spark.createDataFrame([], ALL_TYPES), table)
    back = load(spark, table)
    assert back.count() == 0
    assert [(f.name, f.dataType, f.nullable) for f in back.schema.fields] == [
        (f.name, f.dataType, f.nullable) for f in ALL_TYPES.fields]


def test_reads_see_the_writes_this_session_committed_and_agree_with_read_table(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    for k in range(3):  # each write is visible to the very next read (read-your-writes)
        save(spark.createDataFrame([(k, f"v{k}")], STRUCT), table)
        assert rows(load(spark, table)) == [(i, f"v{i}") for i in range(k + 1)]
    ctx.upsert_rows(spark.createDataFrame([(0, "from-context")], STRUCT), table)
    assert rows(load(spark, table))[0] == (0, "from-context")
    assert rows(ctx.read_table(table)) == rows(load(spark, table))


def test_a_write_is_announced_when_planned_so_the_settle_round_waits_for_its_commit(
    spark: SparkSession, ctx: KuduContext, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The planner's ``describe`` announces the write (the write service then holds its
    settle round until the commit, ``ReplicationService.expect_write``); the commit ends
    the announcement; a read announces nothing. A ``KuduContext`` write announces itself
    with the thread that submits it (rounds then wait for it too)."""
    table = new_table(ctx)
    calls: list[tuple[str, int | None]] = []
    service = ctx._service
    ended = service.expected_write_ended
    monkeypatch.setattr(service, "expect_write",
                        lambda writer=None: calls.append(("expect", writer)))
    monkeypatch.setattr(service, "expected_write_ended",
                        lambda writer=None: (calls.append(("ended", writer)), ended(writer))[1])
    save(spark.createDataFrame([(1, "a")], STRUCT), table)
    assert calls and calls[0] == ("expect", None) and calls[-1][0] == "ended", calls
    calls.clear()
    assert rows(load(spark, table)) == [(1, "a")]
    assert calls == []
    ctx.upsert_rows(spark.createDataFrame([(2, "b")], STRUCT), table)
    me = threading.get_ident()
    assert calls == [("expect", me), ("ended", me)]


def test_each_task_of_a_read_is_handed_one_tablet_and_every_tablet_is_read_once(
    spark: SparkSession, kudu: tuple[KuduContext, SessionService],
) -> None:
    ctx, service = kudu
    table = new_table(ctx)
    save(spark.createDataFrame([(k, f"v{k}") for k in range(300)], STRUCT), table)
    before = set(service.scans.scan_ids())
    assert rows(load(spark, table)) == [(k, f"v{k}") for k in range(300)]
    (scan_id,) = set(service.scans.scan_ids()) - before
    given = service.scans.given(scan_id)
    assert sorted(given) == [0, 1, 2], "a partition did not ask for its tablet"
    assert sorted(given.values()) == [0, 1, 2], "a tablet was read twice or not at all"


# -- operations --------------------------------------------------------------------------------


def test_insert_of_a_duplicate_key_fails_with_already_present_and_loses_nothing_else(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    save(spark.createDataFrame([(1, "a"), (2, "b")], STRUCT), table, **{"kudu.operation": "insert"})
    with pytest.raises(Exception, match="AlreadyPresent") as info:
        save(spark.createDataFrame([(2, "dup"), (3, "c")], STRUCT), table,
             **{"kudu.operation": "insert"})
    assert "RowWriteError" in str(info.value)
    assert rows(load(spark, table)) == [(1, "a"), (2, "b"), (3, "c")]


def test_insert_ignore_and_ignore_duplicate_row_errors_skip_existing_keys(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    save(spark.createDataFrame([(1, "a")], STRUCT), table)
    save(spark.createDataFrame([(1, "x"), (2, "b")], STRUCT), table,
         **{"kudu.operation": "insert_ignore"})
    save(spark.createDataFrame([(1, "y"), (3, "c")], STRUCT), table,
         **{"kudu.operation": "insert", "kudu.ignoreDuplicateRowErrors": "true"})
    assert rows(load(spark, table)) == [(1, "a"), (2, "b"), (3, "c")]


def test_update_and_delete_change_existing_rows_and_report_missing_keys(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    save(spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], STRUCT), table)
    with pytest.raises(Exception, match="NotFound"):
        save(spark.createDataFrame([(2, "B"), (9, "missing")], STRUCT), table,
             **{"kudu.operation": "update"})
    save(spark.createDataFrame([(3, "C"), (8, "missing")], STRUCT), table,
         **{"kudu.operation": "update_ignore"})
    save(spark.createDataFrame([(1, None)], STRUCT), table, **{"kudu.operation": "delete"})
    save(spark.createDataFrame([(7, None)], STRUCT), table,
         **{"kudu.operation": "delete_ignore"})
    assert rows(load(spark, table)) == [(2, "B"), (3, "C")]


def test_ignore_null_keeps_stored_values_where_the_upsert_has_nulls(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    struct = StructType([*STRUCT.fields, StructField("n", LongType(), True)])
    table = new_table(ctx, struct)
    save(spark.createDataFrame([(1, "a", 10), (2, "b", 20), (3, "c", 30)], struct), table)
    save(spark.createDataFrame([(1, None, 11), (2, "B", None), (3, None, None), (4, None, 40)],
                               struct), table, **{"kudu.ignoreNull": "true"})
    assert rows(load(spark, table)) == [(1, "a", 11), (2, "B", 20), (3, "c", 30),
                                        (4, None, 40)]
    save(spark.createDataFrame([(1, None, 12)], struct), table)  # default: nulls are set
    assert rows(load(spark, table))[0] == (1, None, 12)


# -- refused writes ----------------------------------------------------------------------------


def test_bad_options_are_refused_with_kudu_spark_messages(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    df = spark.createDataFrame([(1, "a")], STRUCT)
    with pytest.raises(Exception, match=re.escape(
            "Kudu table name must be specified in create options using key 'kudu.table'")):
        df.write.format("kudu").mode("append").save()
    with pytest.raises(Exception, match="Unsupported operation type 'merge'"):
        save(df, table, **{"kudu.operation": "merge"})
    with pytest.raises(Exception, match=r"unknown option\(s\) \['kudu.batchsise'\]"):
        save(df, table, **{"kudu.batchSise": "10"})
    with pytest.raises(Exception, match=re.escape("kudu.batchSize must be >= 1")):
        save(df, table, **{"kudu.batchSize": "0"})
    with pytest.raises(Exception, match="save mode 'overwrite' is not supported"):
        df.write.format("kudu").option("kudu.table", table).mode("overwrite").save()
    with pytest.raises(Exception, match="differs from this session's master"):
        save(df, table, **{"kudu.master": "elsewhere:7051"})
    assert load(spark, table).count() == 0


def test_schema_mismatch_is_refused_and_nothing_is_written(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    extra = StructType([*STRUCT.fields, StructField("zzz", LongType(), True)])
    with pytest.raises(Exception, match=r"DataFrame columns \['zzz'\] are not in the table"):
        save(spark.createDataFrame([(1, "a", 3)], extra), table)
    with pytest.raises(Exception, match="ALTER TABLE"):
        save(spark.createDataFrame([(1, "a", 3)], extra), table,
             **{"kudu.handleSchemaDrift": "true"})
    with pytest.raises(Exception, match=r"lacks primary key columns \['id'\]"):
        save(spark.createDataFrame([("a",)], "v string"), table)
    nullable_key = StructType([StructField("id", LongType(), True), *STRUCT.fields[1:]])
    with pytest.raises(Exception, match="'id' is NOT NULL"):  # found in the writer tasks
        save(spark.createDataFrame([(1, "a"), (None, "b")], nullable_key), table)
    assert load(spark, table).count() == 0
    staging = Path(ctx.warehouse) / "staging"
    from tests.waiting import wait_until

    wait_until(lambda: not staging.exists() or not any(staging.iterdir()), 30,
               "the refused write's staging being removed")


# -- reads: pushdown, pruning, options ---------------------------------------------------------


RANGED_ROWS = [(i, f"s{i % 7}", None if i % 5 == 0 else i * 10) for i in range(60)]


@pytest.fixture(scope="module")
def ranged(spark: SparkSession, kudu: tuple[KuduContext, SessionService]) -> str:
    """A table with 4 hash buckets x 2 ranges on ``id`` and rows 0..59."""
    ctx = kudu[0]
    struct = StructType([*STRUCT.fields, StructField("n", IntegerType(), True)])
    ps = PartitionSchema((HashDimension(("id",), 4),),
                         range_columns=("id",),
                         ranges=(RangePartition((0,), (30,)), RangePartition((30,), (60,))))
    table = new_table(ctx, struct, partitioning=ps)
    save(spark.createDataFrame(RANGED_ROWS, struct), table)
    return table


@pytest.mark.parametrize("where, keep, partitions", [
    ("id = 7", lambda i, v, n: i == 7, 1),
    ("id in (7, 40)", lambda i, v, n: i in (7, 40), 4),  # 2 buckets x 2 ranges
    ("id >= 45", lambda i, v, n: i >= 45, 4),  # one range, every bucket
    ("id < 30 and id > 10", lambda i, v, n: 10 < i < 30, 4),
    ("id = 7 and n is null", lambda i, v, n: i == 7 and n is None, 1),
    ("id > 100", lambda i, v, n: False, 0),
    ("n is null", lambda i, v, n: n is None, 8),
    ("v = 's3' and id <= 30", lambda i, v, n: v == "s3" and i <= 30, 8),
    ("n <> 70 and id < 10", lambda i, v, n: n is not None and n != 70 and i < 10, 4),
    ("v like 's1%'", lambda i, v, n: v.startswith("s1"), 8),  # not pushed: Spark filters
    ("id < 10 or id > 55", lambda i, v, n: i < 10 or i > 55, 8),  # OR is never pushed
])
def test_pushed_filters_prune_tablets_and_match_spark_side_filtering(
    spark: SparkSession, ranged: str, where: str, keep: Callable[[int, str, int | None], bool],
    partitions: int,
) -> None:
    df = load(spark, ranged).where(where)
    # Every tablet pruned: Spark runs one empty stand-in partition.
    assert df.rdd.getNumPartitions() == max(partitions, 1)
    assert rows(df) == sorted(r for r in RANGED_ROWS if keep(*r))


def test_reads_work_without_pushdown_when_the_application_turns_it_off(
    spark: SparkSession, ranged: str,
) -> None:
    key = "spark.sql.python.filterPushdown.enabled"
    assert spark.conf.get(key) == "true"  # register() turned it on
    spark.conf.set(key, "false")
    try:
        df = load(spark, ranged).where("id = 7")
        assert df.rdd.getNumPartitions() == 8  # no pruning, but no error either
        assert rows(df) == [RANGED_ROWS[7]]
    finally:
        spark.conf.set(key, "true")


def test_filters_on_float_and_timestamp_columns_stay_exact(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    struct = StructType([StructField("id", LongType(), False), StructField("x", DoubleType()),
                         StructField("ts", TimestampType())])
    table = new_table(ctx, struct)
    t0 = dt.datetime(2024, 1, 1, 12, 0, 0)
    data = [(1, float("nan"), t0), (2, 1.0, t0 + dt.timedelta(hours=1)), (3, None, None)]
    save(spark.createDataFrame(data, struct), table)
    df = load(spark, table)
    assert [r.id for r in df.where("x > 0.5").orderBy("id").collect()] == [1, 2]  # NaN > all
    assert [r.id for r in df.where(df.ts > t0).collect()] == [2]
    assert [r.id for r in df.where(df.ts == t0).collect()] == [1]


def test_scan_options_leader_only_fault_tolerant_and_batch_size(
    spark: SparkSession, ranged: str,
) -> None:
    everything = rows(load(spark, ranged))
    assert len(everything) == 60
    assert rows(load(spark, ranged, **{"kudu.scanLocality": "leader_only"})) == everything
    assert rows(load(spark, ranged, **{"kudu.faultTolerantScan": "true"})) == everything
    assert rows(load(spark, ranged, **{"kudu.batchSize": "3"})) == everything
    with pytest.raises(Exception, match=re.escape("kudu.snapshotTimestampMicros is not supported")):
        load(spark, ranged, **{"kudu.snapshotTimestampMicros": "1"}).collect()
    with pytest.raises(Exception, match=re.escape("unknown kudu.scanLocality 'nearest'")):
        load(spark, ranged, **{"kudu.scanLocality": "nearest"}).collect()


def test_a_snapshot_index_reads_the_tablet_as_of_that_log_index(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx, partitioning=PartitionSchema())  # one tablet: one log
    save(spark.createDataFrame([(1, "a"), (2, "b")], STRUCT), table)
    (first,) = [t.committed_index for t in ctx.master.get_table(table).tablets]
    save(spark.createDataFrame([(2, "B"), (3, "c")], STRUCT), table)
    assert rows(load(spark, table, **{"kudu.snapshotIndex": str(first)})) == [(1, "a"), (2, "b")]
    latest = [(1, "a"), (2, "B"), (3, "c")]
    assert rows(load(spark, table)) == latest
    assert rows(load(spark, table, **{"kudu.faultTolerantScan": "true"})) == latest


def test_a_linearizable_read_commits_a_read_point_per_tablet_and_reads_the_leader_up_to_it(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    from pyspark_kudu.consensus.messages import EntryType
    from pyspark_kudu.spark.host.handlers import replica_storage

    table = new_table(ctx)
    everything = [(i, f"v{i}") for i in range(30)]
    save(spark.createDataFrame(everything, STRUCT), table)
    tablets = [t.tablet_id for t in ctx.master.get_table(table).tablets]
    before = {}
    roots = {s.uuid: s.root for s in ctx.servers}
    for tid in tablets:
        lead = ctx._leaders[tid]
        with replica_storage(roots[lead.leader_id] or "", tid) as st:
            before[tid] = st.last_index()
    got = load(spark, table, **{"kudu.readMode": "linearizable"}).where("id >= 0")
    assert rows(got) == everything
    for tid in tablets:
        lead = ctx._leaders[tid]
        assert lead.node is not None
        with replica_storage(roots[lead.leader_id] or "", tid) as st:
            last = st.entries(before[tid] + 1, st.last_index() + 1)
        # Planning committed one empty entry per tablet (one per query planned): the read
        # point each scan task read up to.
        assert last and all((e.type, e.data) == (EntryType.NORMAL, b"") for e in last), last
    with pytest.raises(Exception, match="cannot be combined"):
        load(spark, table, **{"kudu.readMode": "linearizable",
                              "kudu.snapshotIndex": "1"}).collect()


def test_a_narrower_read_schema_projects_columns(spark: SparkSession, ranged: str) -> None:
    df = spark.read.format("kudu").schema("id long, n int").option("kudu.table", ranged).load()
    got = rows(df.where("id < 3"))
    assert got == [(0, None), (1, 10), (2, 20)]
    with pytest.raises(Exception, match="column 'n' is int in the table, not string"):
        spark.read.format("kudu").schema("id long, n string").option(
            "kudu.table", ranged).load().collect()


# -- the session service and registration ------------------------------------------------------


def non_loopback_address() -> str | None:
    """This host's address on its default route (a UDP connect sends nothing), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
        try:
            u.connect(("10.255.255.255", 1))
        except OSError:
            return None
        ip = str(u.getsockname()[0])
    return None if ip.startswith("127.") else ip


def test_the_session_service_listens_on_loopback_and_refuses_a_wrong_secret(
    kudu: tuple[KuduContext, SessionService], ranged: str,
) -> None:
    address = kudu[1].address
    assert address.host == "127.0.0.1"
    other = non_loopback_address()
    if other is not None:  # the same port on another interface of this host is closed
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex((other, address.port)) != 0
    assert SessionClient(address).describe(ranged).table == ranged
    wrong = SessionAddress(address.host, address.port, "0" * len(address.secret))
    with pytest.raises(InvalidArgumentError, match="wrong secret"):
        SessionClient(wrong).describe(ranged)
    # A Flight client that does not authenticate is served nothing.
    raw = fl.FlightClient(f"grpc+tcp://{address.host}:{address.port}")
    try:
        with pytest.raises(fl.FlightUnauthenticatedError):
            list(raw.do_action(fl.Action("describe", b'{"body": {"table": "x"}}')))
    finally:
        raw.close()
    assert address.secret not in repr(address)
    # What an observer of the connection sees: the call, never the secret.
    proxy = CapturingProxy(address.port)
    try:
        via = SessionAddress("127.0.0.1", proxy.port, address.secret, address.masters)
        assert SessionClient(via).describe(ranged).table == ranged
    finally:
        proxy.close()
    wire = proxy.captured()
    assert ranged.encode() in wire, "the capture must have seen the call"
    for form in (address.secret.encode(), base64.b64encode(address.secret.encode()),
                 bytes.fromhex(address.secret)):
        assert form not in wire


def test_the_session_service_listens_on_the_configured_host_only(
    kudu: tuple[KuduContext, SessionService], ranged: str,
) -> None:
    # 127.0.0.2 stands for another address of the driver host (tests bind loopback only).
    ctx = kudu[0]
    with SessionService(ctx, host="127.0.0.2") as other:
        address = other.address
        assert address.host == "127.0.0.2"
        assert SessionClient(address).describe(ranged).table == ranged
        with socket.socket() as s:
            s.settimeout(2)
            assert s.connect_ex(("127.0.0.1", address.port)) != 0
    with pytest.raises(InvalidArgumentError, match=re.escape(
            "spark.kudu.sessionService.host='203.0.113.254': the kudu session service "
            "cannot listen there")):
        SessionService(ctx, host="203.0.113.254")  # TEST-NET-3: not an address of this host


def test_a_closed_session_is_reported_as_unreachable(
    kudu: tuple[KuduContext, SessionService],
) -> None:
    ctx = kudu[0]
    other = SessionService(ctx)
    address = other.address
    other.close()
    with pytest.raises(ServiceUnavailableError, match="not reachable"):
        SessionClient(address).describe("anything")


def test_the_registered_class_carries_its_session_by_value(
    kudu: tuple[KuduContext, SessionService], tmp_path: Path,
) -> None:
    from pyspark_kudu.spark.api.datasource import bound_source

    address = kudu[1].address
    pickled = tmp_path / "source.pkl"
    pickled.write_bytes(cloudpickle.dumps(bound_source(address)))  # type: ignore[no-untyped-call]
    # A fresh interpreter (like Spark's workers) rebuilds the class with its attributes.
    out = subprocess.run(
        [sys.executable, "-c", "import pickle, sys; c = pickle.load(open(sys.argv[1], 'rb')); "
         "print(c.name(), c.session.port, c.session.secret, c.__mro__[1].__name__)",
         str(pickled)], check=True, capture_output=True, text=True).stdout.split()
    assert out == ["kudu", str(address.port), address.secret, "KuduDataSource"]
    assert KuduDataSource.session is None  # the base stays unbound


def test_a_second_session_of_the_application_gets_its_own_binding(
    spark: SparkSession, kudu: tuple[KuduContext, SessionService], tmp_path: Path,
) -> None:
    jss = spark._jvm.org.apache.spark.sql.SparkSession  # type: ignore[union-attr]
    active = jss.getActiveSession().get()
    other = spark.newSession()
    with KuduContext(other, warehouse=str(tmp_path / "wh2")) as ctx2:
        # Registering in the new session neither failed nor changed the active session.
        assert jss.getActiveSession().get().equals(active)
        ctx2.create_table("only_in_two", STRUCT, keys=["id"], partitioning=HASH3)
        save(other.createDataFrame([(1, "x"), (2, "y")], STRUCT), "only_in_two")
        assert rows(load(other, "only_in_two")) == [(1, "x"), (2, "y")]
        # The first session's format("kudu") still talks to the first context.
        with pytest.raises(Exception, match="only_in_two"):
            load(spark, "only_in_two").collect()
    name = new_table(kudu[0])
    save(spark.createDataFrame([(7, "z")], STRUCT), name)
    assert rows(load(spark, name)) == [(7, "z")]


# -- kudu.repartition ---------------------------------------------------------------------------


def _batches_per_write(ctx: KuduContext, df: DataFrame, table: str, **kw: bool) -> int:
    """How many staged batches ``ctx.write`` replicated (from its progress reports)."""
    seen: list[WriteProgress] = []
    ctx.write(df, table, "upsert", progress=seen.append, **kw)
    return seen[-1].batches_total


def test_repartition_gives_each_tablet_one_staging_task_and_one_batch(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)  # 3 hash tablets
    data = [(i, f"v{i}") for i in range(120)]
    df = spark.createDataFrame(data, STRUCT).repartition(4)  # every partition hits every tablet
    assert _batches_per_write(ctx, df, table) == 12  # one batch per (input partition, tablet)
    assert _batches_per_write(ctx, df, table, repartition=True) == 3  # one per tablet
    assert _batches_per_write(ctx, df, table, repartition=True, repartition_sort=False) == 3
    assert_df_equality(load(spark, table), spark.createDataFrame(data, STRUCT),
                       ignore_row_order=True, ignore_metadata=True)


def test_repartition_by_tablet_puts_tablet_i_in_partition_i_sorted_by_key(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    struct = StructType([StructField("a", LongType(), False), StructField("b", StringType(), False),
                         StructField("v", IntegerType(), True)])
    ps = PartitionSchema((HashDimension(("a",), 2),), range_columns=("b",),
                         ranges=(RangePartition(None, ("m",)), RangePartition(("m",), None)))
    table = new_table(ctx, struct, keys=("a", "b"), partitioning=ps)
    locs = ctx.master.get_table(table)
    schema = locs.table.schema
    partitioner = Partitioner(schema, PartitionSchema.from_dict(locs.table.partition_schema,
                                                                schema))
    data = [(i % 17, chr(ord("a") + i % 26), i) for i in range(300, 0, -1)]
    df = spark.createDataFrame(data, struct).repartition(3)
    out = repartition_by_tablet(df, partitioner, schema.primary_key)
    parts = out.rdd.glom().collect()
    assert len(parts) == partitioner.num_partitions == 4
    for i, part in enumerate(parts):
        assert part, f"tablet {i} received no rows"
        routed = partitioner.route_batch(pa.table({"a": [r.a for r in part],
                                                   "b": [r.b for r in part]}))
        assert set(routed.tolist()) == {i}
        keys = [(r.a, r.b) for r in part]
        assert keys == sorted(keys)
    assert sorted(tuple(r) for p in parts for r in p) == sorted(data)
    ctx.write(df, table, repartition=True)
    assert rows(load(spark, table)) == sorted(data)


def test_repartition_options_are_validated_on_format_kudu_writes(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    df = spark.createDataFrame([(1, "a"), (2, "b")], STRUCT)
    save(df, table, **{"kudu.repartition": "true", "kudu.repartition.sort": "false"})
    assert rows(load(spark, table)) == [(1, "a"), (2, "b")]
    with pytest.raises(Exception, match=re.escape("kudu.repartition.sort must be true or false")):
        save(df, table, **{"kudu.repartition": "true", "kudu.repartition.sort": "maybe"})


def test_a_repartitioned_write_refuses_bad_rows_like_any_write(
    spark: SparkSession, ctx: KuduContext,
) -> None:
    table = new_table(ctx)
    nullable_key = StructType([StructField("id", LongType(), True), *STRUCT.fields[1:]])
    with pytest.raises(InvalidArgumentError, match="'id' is NOT NULL"):
        ctx.write(spark.createDataFrame([(1, "a"), (None, "b")], nullable_key), table,
                  repartition=True)
    assert load(spark, table).count() == 0
