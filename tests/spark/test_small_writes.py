"""The small-write path in local mode: a write whose staging tasks' batches fit the threshold
travels inside the Raft entries of one round (no shuffle stage, no staged file); one just
over it is staged and shuffled. Both land exactly and report per-row errors exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.errors import RowWriteError
from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.dataplane import InlineBatch, stage_batches
from pyspark_kudu.tablet import OpType

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
