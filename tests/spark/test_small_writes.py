"""The small-write path in local mode: a write whose staging tasks' batches fit the threshold
travels inside the Raft entries of one round (no shuffle stage, no staged file); one just
over it is staged and shuffled. Both land exactly and report per-row errors exactly."""

from __future__ import annotations

import datetime as dt
import decimal
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DateType,
    DecimalType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from pyspark_kudu.errors import InvalidArgumentError, RowWriteError
from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.dataplane import InlineBatch, StagingJanitor, stage_batches
from pyspark_kudu.tablet import OpType
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
HASHED = PartitionSchema((HashDimension(("id",), 3),))


@pytest.fixture
def kudu(spark: SparkSession, tmp_path: Path) -> Iterator[KuduContext]:
    with KuduContext(spark, warehouse=str(tmp_path / "wh")) as ctx:
        yield ctx


def _df(spark: SparkSession, ids: range) -> DataFrame:
    # One partition: one staging task, whose batches the threshold is compared with.
    return spark.createDataFrame([(i, f"value-{i:06d}") for i in ids], STRUCT).coalesce(1)


def _inline_bytes(kudu: KuduContext, table: str, df: DataFrame, op: OpType) -> int:
    """What the single staging task of ``df`` would hold inline, computed as it does."""
    info = kudu.master.get_table(table).table
    part = Partitioner(info.schema, PartitionSchema.from_dict(info.partition_schema,
                                                              info.schema))
    fn = stage_batches(info.schema, part, op, "probe", kudu.warehouse, 65536, 1 << 30)
    items = [InlineBatch.decode(raw) for rb in fn(iter(df.toArrow().to_batches()))
             for raw in rb.column(0).to_pylist()]
    return sum(len(i.data) for i in items if i is not None)


def _staged_files(kudu: KuduContext) -> list[Path]:
    staging = Path(kudu.warehouse) / "staging"
    return [p for p in staging.rglob("*") if p.is_file()] if staging.exists() else []


def _path_taken(kudu: KuduContext, write: object) -> str:
    before = kudu.transport.data_rounds
    write()  # type: ignore[operator]
    return "staged" if kudu.transport.data_rounds > before else "inline"


@pytest.mark.parametrize("over", [False, True], ids=["just-under", "just-over"])
def test_a_write_at_the_threshold_lands_exactly_on_its_path(
        spark: SparkSession, kudu: KuduContext, over: bool) -> None:
    kudu.create_table("t", STRUCT, keys=["id"], partitioning=HASHED)
    df = _df(spark, range(500))
    size = _inline_bytes(kudu, "t", df, OpType.UPSERT)
    limit = size - 1 if over else size
    path = _path_taken(kudu, lambda: kudu.write(df, "t", "upsert", small_write_bytes=limit))
    assert path == ("staged" if over else "inline"), (size, limit)
    if not over:
        assert _staged_files(kudu) == []  # nothing was staged, so nothing to clean up
        # The leaders' log mirrors hold the batches themselves, not refs.
        sizes = [len(e.data) for lead in kudu._leaders.values()
                 for e in lead._view.entries(lead._view.first_index(),
                                             lead._view.last_index() + 1, None)]
        assert sum(sizes) >= size, (sizes, size)
    assert_df_equality(kudu.read_table("t").orderBy("id"), df.orderBy("id"),
                       ignore_metadata=True)


@pytest.mark.parametrize("small_write_bytes", [1 << 20, 0], ids=["inline", "staged"])
def test_per_row_errors_are_exact_on_both_paths(
        spark: SparkSession, kudu: KuduContext, small_write_bytes: int) -> None:
    kudu.create_table("e", STRUCT, keys=["id"], partitioning=HASHED)
    kudu.insert_rows(_df(spark, range(0, 130, 10)), "e")
    dup = _df(spark, range(95, 130))  # 100, 110, 120 exist already
    want = "staged" if small_write_bytes == 0 else "inline"

    def write() -> None:
        with pytest.raises(RowWriteError, match="AlreadyPresent") as info:
            kudu.write(dup, "e", "insert", small_write_bytes=small_write_bytes)
        assert info.value.rows_written == 35 - 3
        assert sorted((r["id"], s) for _, r, s, _ in info.value.errors) == [
            (100, "AlreadyPresent"), (110, "AlreadyPresent"), (120, "AlreadyPresent")]

    assert _path_taken(kudu, write) == want
    got = {r["id"] for r in kudu.read_table("e").collect()}
    assert got == set(range(0, 130, 10)) | set(range(95, 130))


@pytest.mark.parametrize("over", [False, True], ids=["just-under", "just-over"])
def test_format_kudu_takes_the_path_its_size_says(
        spark: SparkSession, kudu: KuduContext, over: bool) -> None:
    kudu.create_table("f", STRUCT, keys=["id"], partitioning=HASHED)
    df = _df(spark, range(300))
    size = _inline_bytes(kudu, "f", df, OpType.UPSERT)

    def write() -> None:
        (df.write.format("kudu").option("kudu.table", "f")
         .option("kudu.smallWriteBytes", str(size - 1 if over else size))
         .mode("append").save())

    assert _path_taken(kudu, write) == ("staged" if over else "inline")
    assert_df_equality(kudu.read_table("f").orderBy("id"), df.orderBy("id"),
                       ignore_metadata=True)


def test_a_small_write_of_large_batches_is_carried_whole(
        spark: SparkSession, kudu: KuduContext) -> None:
    """Batches of several MiB inline: the round's requests carry them to every replica."""
    kudu.create_table("big", STRUCT, keys=["id"], partitioning=HASHED)
    df = spark.createDataFrame([(i, "x" * 4000) for i in range(3000)], STRUCT).coalesce(1)
    path = _path_taken(kudu, lambda: kudu.write(df, "big", "upsert",
                                                small_write_bytes=64 << 20))
    assert path == "inline"
    back = kudu.read_table("big")
    assert back.count() == 3000
    assert back.where("length(v) = 4000").count() == 3000


TYPED = StructType([
    StructField("k", StringType(), False), StructField("ts", TimestampType(), False),
    StructField("id", LongType(), False), StructField("amount", DecimalType(12, 3), True),
    StructField("day", DateType(), True), StructField("blob", BinaryType(), True),
    StructField("flag", BooleanType(), True), StructField("x", DoubleType(), True)])


def _typed_rows(n: int) -> pa.Table:
    base = dt.datetime(2026, 3, 29, 0, 30, tzinfo=dt.timezone.utc)  # a DST change in Europe
    return pa.table({
        "k": [f"key-{i % 3}" for i in range(n)],
        "ts": pa.array([base + dt.timedelta(minutes=37 * i) for i in range(n)],
                       pa.timestamp("us", tz="UTC")),
        "id": pa.array(range(n), pa.int64()),
        "amount": pa.array([None if i % 4 == 0 else decimal.Decimal(i) / 8 for i in range(n)],
                           pa.decimal128(12, 3)),
        "day": pa.array([None if i % 5 == 0 else dt.date(2026, 1, 1) + dt.timedelta(days=i)
                         for i in range(n)], pa.date32()),
        "blob": pa.array([None if i % 3 == 0 else bytes([i % 256]) * (i % 7) for i in range(n)],
                         pa.binary()),
        "flag": pa.array([None if i % 6 == 0 else i % 2 == 0 for i in range(n)]),
        "x": pa.array([None if i % 7 == 0 else i * 0.25 for i in range(n)], pa.float64())})


def _caller_jobs(spark: SparkSession, write: Callable[[], object]) -> int:
    """Spark jobs the calling thread ran for ``write`` outside the replication rounds (which
    run in job groups of their own): the staging job, if any."""
    sc = spark.sparkContext
    group = f"caller-{uuid.uuid4().hex}"
    sc.setJobGroup(group, "a write under test")
    try:
        write()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        sc.setLocalProperty("spark.job.description", None)  # type: ignore[arg-type]
    return len(sc.statusTracker().getJobIdsForGroup(group))


def test_a_small_write_of_a_driver_side_dataframe_runs_no_staging_job_and_lands_exactly(
        spark: SparkSession, kudu: KuduContext) -> None:
    """A DataFrame made from an Arrow table (or pandas) is a LocalRelation, one made from a
    Python list a parallelized collection: the driver reads and encodes either's rows and one
    round carries them. A user's ``rdd.map(f)`` under the DataFrame takes the staging job."""
    kudu.create_table("typed", TYPED, keys=["k", "ts", "id"],
                      partitioning=PartitionSchema((HashDimension(("k", "id"), 3),)))
    rows = _typed_rows(300)
    local = spark.createDataFrame(rows.slice(0, 100))
    assert _caller_jobs(spark, lambda: kudu.upsert_rows(local, "typed")) == 0
    from_list = spark.createDataFrame(rows.slice(100, 100).to_pylist(), TYPED)
    assert _caller_jobs(spark, lambda: kudu.upsert_rows(from_list, "typed")) == 0, \
        "a list-built DataFrame should have been read in the driver"
    as_tuples = [tuple(r.values()) for r in rows.slice(200).to_pylist()]
    mapped = spark.createDataFrame(
        spark.sparkContext.parallelize(as_tuples, 2).map(lambda t: t), TYPED)
    assert _caller_jobs(spark, lambda: kudu.upsert_rows(mapped, "typed")) >= 1, \
        "a DataFrame over a user's map should have run its staging job (f on executors)"
    back = kudu.read_table("typed").select(*TYPED.fieldNames())
    want = spark.createDataFrame(rows.to_pylist(), TYPED)
    assert_df_equality(back.orderBy("id"), want.orderBy("id"), ignore_nullable=True,
                       ignore_metadata=True)
    # The instants, not only the wall-clock values, survived the driver-side encoding.
    got_ts = {r["id"]: r["ts"] for r in kudu.read_table("typed").toArrow().to_pylist()}
    assert got_ts == dict(zip(rows.column("id").to_pylist(), rows.column("ts").to_pylist(),
                                  strict=True))


@pytest.mark.parametrize("build", ["arrow", "list"])
def test_a_driver_side_dataframe_over_the_threshold_is_staged_by_a_job(
        spark: SparkSession, kudu: KuduContext, build: str) -> None:
    kudu.create_table("lt", STRUCT, keys=["id"], partitioning=HASHED)
    table = pa.table({"id": pa.array(range(2000), pa.int64()),
                      "v": [f"value-{i:06d}" for i in range(2000)]})
    local = (spark.createDataFrame(table) if build == "arrow"
             else spark.createDataFrame(table.to_pylist(), STRUCT))
    size = _inline_bytes(kudu, "lt", local, OpType.UPSERT)
    assert _caller_jobs(spark, lambda: kudu.write(local, "lt", "upsert",
                                                  small_write_bytes=size - 1)) >= 1
    assert _caller_jobs(spark, lambda: kudu.write(local, "lt", "upsert",
                                                  small_write_bytes=size)) == 0
    assert_df_equality(kudu.read_table("lt").orderBy("id"), local.orderBy("id"),
                       ignore_nullable=True, ignore_metadata=True)


def test_a_list_built_dataframe_without_schema_checks_falls_back_to_spark(
        spark: SparkSession, kudu: KuduContext) -> None:
    """Values that only ``verifySchema=False`` lets into a list-built DataFrame (a float in a
    LongType column) are left to Spark's own conversion, in the staging job: the table gets
    exactly the rows ``collect()`` shows, whatever Spark made of them."""
    kudu.create_table("vs", STRUCT, keys=["id"], partitioning=HASHED)
    odd = spark.createDataFrame([(1.5, "a"), (2, "b")], STRUCT, verifySchema=False)
    assert _caller_jobs(spark, lambda: kudu.upsert_rows(odd, "vs")) >= 1
    assert sorted(tuple(r) for r in kudu.read_table("vs").collect()) == \
        sorted(tuple(r) for r in odd.collect())
    good = spark.createDataFrame([(7, "c"), (8, "d")], STRUCT, verifySchema=False)
    assert _caller_jobs(spark, lambda: kudu.upsert_rows(good, "vs")) == 0
    assert {tuple(r) for r in kudu.read_table("vs").collect()} >= {(7, "c"), (8, "d")}


def test_a_local_dataframe_gets_exact_per_row_errors_and_bad_input_writes_nothing(
        spark: SparkSession, kudu: KuduContext) -> None:
    kudu.create_table("le", STRUCT, keys=["id"], partitioning=HASHED)
    kudu.insert_rows(_df(spark, range(0, 130, 10)), "le")
    dup = spark.createDataFrame(pa.table({"id": pa.array(range(95, 130), pa.int64()),
                                          "v": [f"n{i}" for i in range(95, 130)]}))
    with pytest.raises(RowWriteError, match="AlreadyPresent") as info:
        kudu.insert_rows(dup, "le")
    assert info.value.rows_written == 35 - 3
    assert sorted((r["id"], s) for _, r, s, _ in info.value.errors) == [
        (100, "AlreadyPresent"), (110, "AlreadyPresent"), (120, "AlreadyPresent")]
    before = sorted(tuple(r) for r in kudu.read_table("le").collect())
    bad = spark.createDataFrame(pa.table({"id": pa.array([1, None], pa.int64()),
                                          "v": ["a", "b"]}))
    with pytest.raises(InvalidArgumentError, match=r"table le: .*id"):
        kudu.upsert_rows(bad, "le")
    assert sorted(tuple(r) for r in kudu.read_table("le").collect()) == before


def test_a_staged_write_is_cleaned_up_by_the_resident_servers_without_a_spark_job(
        spark: SparkSession, kudu: KuduContext) -> None:
    """After a staged write returns, each host's resident tablet server removes its staging
    directory on a Flight action: no Spark task holds the executor slot that the next
    write's round needs (the pinned cleanup job used to delay it ~0.55 s on a cluster)."""
    assert kudu._current_addresses(), "local mode should have found its resident server"
    kudu.create_table("cl", STRUCT, keys=["id"], partitioning=HASHED)
    df = _df(spark, range(400))
    assert _path_taken(kudu, lambda: kudu.write(df, "cl", "upsert",
                                                small_write_bytes=0)) == "staged"
    wait_until(lambda: _staged_files(kudu) == [], 30, "the staged write's files being removed")
    wait_until(lambda: sum(kudu._janitor.by_server.values()) >= 1, 30,
               "a resident server reporting the cleanup")
    assert kudu._janitor.by_job == {}, "the cleanup should not have needed a Spark job"
    assert kudu.read_table("cl").count() == 400


def test_staging_on_a_host_whose_server_does_not_answer_is_removed_by_a_pinned_job(
        spark: SparkSession, kudu: KuduContext) -> None:
    host = kudu.servers[0].host
    with socket.socket() as s:  # a port nothing listens on: the server "does not answer"
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    staged = Path(kudu.warehouse) / "staging" / "w-orphan"
    staged.mkdir(parents=True)
    (staged / "batch-0").write_bytes(b"x" * 100)
    janitor = StagingJanitor(spark.sparkContext, [host], kudu.warehouse,
                             addresses=lambda: {host: dead}, secret=kudu.credential.encode())
    try:
        janitor.remove("w-orphan")
        wait_until(lambda: not staged.exists(), 60, "the orphaned staging directory removed")
        wait_until(lambda: janitor.by_job.get(host) == 1, 30, "the pinned job reporting it")
        assert janitor.by_server == {}
    finally:
        janitor.close()
