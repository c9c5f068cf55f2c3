"""Bad input through ``KuduContext`` and ``format("kudu")`` in local mode (issue 8).

Each refused call is checked for its error and for the absence of effects: no table in the
catalog, no replica directory in any tablet server's data root, no row changed.

Decision on a key repeated inside ONE write: its rows apply in DataFrame order -- within a
Spark partition in row order, and across partitions in partition order, because the staged
batches of a tablet are proposed in the order ``collect()`` returns them -- each with Kudu's
per-row semantics (see ``tests/unit/test_bad_input.py`` for the table).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.errors import FencedError, InvalidArgumentError, RowWriteError
from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.localcluster import free_ports
from pyspark_kudu.master.server import MasterServer, MasterServerConfig
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.handlers import replica_storage
from pyspark_kudu.tablet.ops import decode_write_batch

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
HASH2 = PartitionSchema((HashDimension(("id",), 2),))


@pytest.fixture(scope="module")
def kudu(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[KuduContext]:
    with KuduContext(spark, warehouse=str(tmp_path_factory.mktemp("bad") / "wh")) as ctx:
        yield ctx


_tables = iter(range(10_000))


def new_table(ctx: KuduContext, replicas: int = 3) -> str:
    name = f"b{next(_tables)}"
    ctx.create_table(name, STRUCT, keys=["id"], partitioning=HASH2, replicas=replicas)
    return name


def replica_dirs(ctx: KuduContext) -> set[str]:
    """Every tablet directory in every tablet server's data root."""
    out = set()
    for s in ctx.servers:
        assert s.root is not None
        tablets = Path(s.root, "tablets")
        if tablets.is_dir():
            out |= {f"{s.uuid}/{p.name}" for p in tablets.iterdir()}
    return out


def logged_ids(ctx: KuduContext, ts_uuid: str, tablet_id: str) -> set[int]:
    """Keys of every write batch in one replica's WAL (read under the replica lock)."""
    (root,) = [s.root for s in ctx.servers if s.uuid == ts_uuid]
    assert root is not None
    ids: set[int] = set()
    with replica_storage(root, tablet_id) as st:
        for e in st.entries(st.first_index(), st.last_index() + 1):
            wb = decode_write_batch(e.data) if e.type == EntryType.NORMAL else None
            if wb is not None:
                ids |= set(wb.rows.column("id").to_pylist())
    return ids


def contents(ctx: KuduContext, table: str) -> dict[int, str | None]:
    return {r["id"]: r["v"] for r in ctx.read_table(table).collect()}


def one_partition(spark: SparkSession, rows: list[tuple[object, ...]],
                  struct: StructType = STRUCT) -> DataFrame:
    return spark.createDataFrame(rows, struct).coalesce(1)


# -- DDL ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "match"), [
    ("../escape", "path separator '/'"),
    ("a/b", "path separator '/'"),
    ("..", r"contain '\.\.'"),
    ("", "must not be empty"),
    ("nul\x00byte", "control characters"),
])
def test_a_bad_table_name_creates_no_table_and_no_replica(
    kudu: KuduContext, name: str, match: str,
) -> None:
    tables, dirs = kudu.master.list_tables(), replica_dirs(kudu)
    with pytest.raises(InvalidArgumentError, match=match):
        kudu.create_table(name, STRUCT, keys=["id"], partitioning=HASH2)
    assert kudu.master.list_tables() == tables
    assert replica_dirs(kudu) == dirs
    assert not Path(kudu.warehouse, "escape").exists()


@pytest.mark.parametrize(("replicas", "match"), [
    (4, r"illegal replication factor 4: replication factor must be odd"),
    (9, r"illegal replication factor 9: maximum allowed replication factor is 7"),
    (5, r"not enough live tablet servers to create a table with the requested replication "
        r"factor 5; 3 tablet servers are alive"),
])
def test_a_bad_replication_factor_creates_no_table_and_no_replica(
    kudu: KuduContext, replicas: int, match: str,
) -> None:
    tables, dirs = kudu.master.list_tables(), replica_dirs(kudu)
    with pytest.raises(InvalidArgumentError, match=match):
        kudu.create_table("rf", STRUCT, keys=["id"], partitioning=HASH2, replicas=replicas)
    assert kudu.master.list_tables() == tables and "rf" not in tables
    assert replica_dirs(kudu) == dirs


# -- writes -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("struct", "row", "match"), [
    (StructType([StructField("id", StringType(), False), STRUCT[1]]), ("7", "a"),
     "DataFrame column 'id' has type string, the table column is int64"),
    (StructType([StructField("id", DoubleType(), False), STRUCT[1]]), (7.5, "a"),
     "DataFrame column 'id' has type double, the table column is int64"),
    (StructType([STRUCT[0], StructField("v", LongType(), True)]), (7, 1),
     "DataFrame column 'v' has type .*, the table column is string"),
    (StructType([STRUCT[0], StructField("v", BooleanType(), True)]), (7, True),
     "DataFrame column 'v' has type .*, the table column is string"),
])
def test_a_column_of_the_wrong_type_is_refused_and_nothing_is_written(
    spark: SparkSession, kudu: KuduContext, struct: StructType, row: tuple[object, ...],
    match: str,
) -> None:
    table = new_table(kudu)
    kudu.insert_rows(spark.createDataFrame([(1, "kept")], STRUCT), table)
    with pytest.raises(InvalidArgumentError, match=match):
        kudu.upsert_rows(spark.createDataFrame([row], struct), table)
    assert contents(kudu, table) == {1: "kept"}


def test_format_kudu_refuses_a_column_of_the_wrong_type(
    spark: SparkSession, tmp_path: Path,
) -> None:
    with KuduContext(spark, warehouse=str(tmp_path / "wh")) as ctx:  # binds format("kudu")
        table = new_table(ctx)
        bad = StructType([StructField("id", StringType(), False), STRUCT[1]])
        with pytest.raises(Exception, match="DataFrame column 'id' has type string"):
            (spark.createDataFrame([("1", "a")], bad).write.format("kudu")
             .option("kudu.table", table).mode("append").save())
        assert contents(ctx, table) == {}


def test_a_null_key_is_refused_for_every_operation_and_nothing_changes(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    table = new_table(kudu)
    kudu.insert_rows(spark.createDataFrame([(1, "a"), (2, "b")], STRUCT), table)
    nullable = StructType([StructField("id", LongType(), True), STRUCT[1]])
    df = spark.createDataFrame([(1, "x"), (None, "y"), (3, "z")], nullable)
    for op in ("insert", "insert_ignore", "upsert", "update", "update_ignore", "delete",
               "delete_ignore"):
        with pytest.raises(InvalidArgumentError, match="column 'id' is NOT NULL"):
            kudu.write(df, table, op)
    assert contents(kudu, table) == {1: "a", 2: "b"}


@pytest.mark.parametrize(("op", "existing", "errors", "after"), [
    ("insert", {}, [(1, "AlreadyPresent")], {1: "first", 2: "x"}),
    ("insert_ignore", {}, [], {1: "first", 2: "x"}),
    ("upsert", {1: "old"}, [], {1: "second", 2: "x"}),
    ("update", {1: "old", 2: "old"}, [], {1: "second", 2: "x"}),
    ("update_ignore", {2: "old"}, [], {2: "x"}),
    ("delete", {1: "old", 2: "old"}, [(1, "NotFound")], {}),
    ("delete_ignore", {1: "old"}, [], {}),
])
def test_a_key_repeated_in_one_write_applies_in_dataframe_order(
    spark: SparkSession, kudu: KuduContext, op: str, existing: dict[int, str],
    errors: list[tuple[int, str]], after: dict[int, str],
) -> None:
    table = new_table(kudu)
    if existing:
        kudu.insert_rows(spark.createDataFrame(list(existing.items()), STRUCT), table)
    df = one_partition(spark, [(1, "first"), (1, "second"), (2, "x")])
    if errors:
        with pytest.raises(RowWriteError) as info:
            kudu.write(df, table, op)
        assert [(r["id"], s) for _, r, s, _ in info.value.errors] == errors
    else:
        kudu.write(df, table, op)
    assert contents(kudu, table) == after


def test_a_key_repeated_across_partitions_of_one_upsert_ends_with_the_last(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    table = new_table(kudu)
    rows = [(1, "p0"), (2, "p0"), (1, "p1"), (1, "p2"), (2, "p2")]
    df = spark.createDataFrame(spark.sparkContext.parallelize(rows, 3), STRUCT)
    assert df.rdd.glom().map(len).collect() == [1, 2, 2]  # the split this test relies on
    assert kudu.upsert_rows(df, table).rows_written == 5
    assert contents(kudu, table) == {1: "p2", 2: "p2"}


# -- a second writer fences the first -----------------------------------------------------------


def test_a_fenced_writer_writes_nothing_and_the_next_write_elects_again(
    spark: SparkSession, tmp_path: Path,
) -> None:
    """Two KuduContexts of one application share a master and the tablet servers (same
    warehouse) and take no leadership leases (``lease_s=0``; with leases the second would
    forward to the first, ``test_leases.py``; without, as when a lease lapsed or the master
    lost its lease table): the second's election fences the first, whose write fails and
    leaves no row."""
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    fast = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
    master = MasterServer(MasterServerConfig("m1", {"m1": addr}, str(tmp_path / "master"),
                                             replica=fast)).start()
    wh = str(tmp_path / "wh")
    try:
        with KuduContext(spark, master=addr, warehouse=wh, lease_s=0) as first:
            first.create_table("shared", STRUCT, keys=["id"], replicas=3)  # one tablet
            first.insert_rows(spark.createDataFrame([(i, "a") for i in range(5)], STRUCT),
                              "shared")
            (lead_a,) = first._leaders.values()
            assert lead_a.node is not None
            term_a = lead_a.node.term
            with KuduContext(spark, master=addr, warehouse=wh, lease_s=0) as second:
                assert {s.uuid for s in second.servers} == {s.uuid for s in first.servers}
                second.upsert_rows(spark.createDataFrame([(i, "b") for i in range(5, 10)],
                                                         STRUCT), "shared")
                (lead_b,) = second._leaders.values()
                assert lead_b.node is not None and lead_b.node.term > term_a
                with pytest.raises(FencedError, match="not acknowledged"):
                    first.upsert_rows(spark.createDataFrame(
                        [(i, "stale") for i in range(100, 105)], STRUCT), "shared")
                got = contents(second, "shared")
                assert got == {**{i: "a" for i in range(5)}, **{i: "b" for i in range(5, 10)}}
                # No replica's log holds the fenced rows either: they were never appended.
                (tablet,) = second.master.get_table("shared").tablets
                for r in tablet.replicas:
                    assert logged_ids(second, r.ts_uuid, tablet.tablet_id) == set(range(10))
            # The next write of the first client elects it again, in a newer term.
            first.upsert_rows(spark.createDataFrame([(100, "late")], STRUCT), "shared")
            (lead_a,) = first._leaders.values()
            assert lead_a.node is not None and lead_b.node is not None
            assert lead_a.node.term > lead_b.node.term
            assert contents(first, "shared")[100] == "late"
    finally:
        master.stop()


# -- the data roots the context creates ---------------------------------------------------------


def test_the_warehouse_and_data_roots_are_not_writable_by_other_users(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    table = new_table(kudu)
    kudu.insert_rows(spark.createDataFrame([(1, "a")], STRUCT), table)
    root = Path(kudu.warehouse)
    seen = 0
    # The replicas may still be writing (the background applier, the settle round): an
    # atomic write's temporary file can be renamed between the listing and its lstat. What
    # exists when looked at is checked, the renamed file under its final name.
    for dirpath, dirs, files in os.walk(root):
        for n in [*dirs, *files]:
            p = Path(dirpath, n)
            try:
                mode = stat.S_IMODE(p.lstat().st_mode)
            except FileNotFoundError:
                continue
            assert not mode & 0o022, f"{p} has mode {mode:04o}"
            seen += 1
    assert seen > 20
    # The tablet servers' directories are private (created with 0700 by FileIO).
    for s in kudu.servers:
        assert s.root is not None
        for d in [Path(s.root), *Path(s.root, "tablets").rglob("*")]:
            if d.is_dir():
                assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
