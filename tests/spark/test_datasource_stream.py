"""``writeStream.format("kudu")``: every micro-batch committed exactly once, across restarts.

The source is a directory of Parquet files read with ``trigger(availableNow=True)``; the
sink writes with ``kudu.operation=insert``, so a micro-batch written twice would fail with
``AlreadyPresent`` instead of passing unnoticed.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, Partitioner, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.api.session_service import SessionService
from pyspark_kudu.spark.host.dataplane import stage_batches
from pyspark_kudu.spark.replication.session_client import SessionClient
from pyspark_kudu.tablet import OpType

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
ARROW = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])


@pytest.fixture(scope="module")
def kudu(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[tuple[KuduContext, SessionService]]:
    with KuduContext(spark, warehouse=str(tmp_path_factory.mktemp("st") / "wh")) as ctx:
        yield ctx, ctx.session_service  # the context registers the data source itself


def add_file(directory: Path, name: str, ids: range) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    table = pa.table({"id": list(ids), "v": [f"v{i}" for i in ids]}, schema=ARROW)
    pq.write_table(table, directory / f"{name}.parquet")


def run_stream(spark: SparkSession, source: Path, table: str, checkpoint: Path,
               **options: str) -> None:
    w = (spark.readStream.schema(STRUCT).parquet(str(source)).writeStream.format("kudu")
         .option("kudu.table", table).option("kudu.operation", "insert")
         .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True))
    for k, v in options.items():
        w = w.option(k, v)
    query = w.start()
    try:
        assert query.awaitTermination(300), "the streaming query did not finish"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()


def ids(spark: SparkSession, table: str) -> list[int]:
    df = spark.read.format("kudu").option("kudu.table", table).load()
    return sorted(r.id for r in df.collect())


def ledger(ctx: KuduContext, table: str, stream_id: str) -> dict[str, object]:
    path = Path(ctx.warehouse) / "streams" / table / f"{stream_id}.json"
    doc: dict[str, object] = json.loads(path.read_text())
    return doc


def test_micro_batches_commit_exactly_once_across_restarts_and_replays(
    spark: SparkSession, kudu: tuple[KuduContext, SessionService], tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    ctx, service = kudu
    ctx.create_table("events", STRUCT, keys=["id"],
                     partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    source, checkpoint = tmp_path / "in", tmp_path / "ckpt"
    add_file(source, "a", range(0, 10))
    run_stream(spark, source, "events", checkpoint)
    assert ids(spark, "events") == list(range(10))

    # Restart from the checkpoint with a new file: only the new rows are written.
    add_file(source, "b", range(10, 20))
    run_stream(spark, source, "events", checkpoint)
    assert ids(spark, "events") == list(range(20))
    query_id = json.loads((checkpoint / "metadata").read_text())["id"]
    stream_id = f"q-{query_id}"
    assert ledger(ctx, "events", stream_id)["last_batch_id"] == 1

    # Spark crashed after the sink committed batch 1 but before its own commit log said so:
    # the restarted query replays batch 1, which the sink acknowledges without writing
    # (an insert written twice would fail with AlreadyPresent).
    for f in (checkpoint / "commits").iterdir():
        if f.name.lstrip(".").startswith("1"):
            f.unlink()
    with caplog.at_level(logging.INFO, logger="pyspark_kudu.spark.api.session_service"):
        run_stream(spark, source, "events", checkpoint)
    assert "batch 1 already committed" in caplog.text  # Spark did replay it
    assert (checkpoint / "commits" / "1").exists()
    assert ids(spark, "events") == list(range(20))

    # The same through the session API: a replayed batch id writes nothing, a new one writes.
    locs = ctx.master.get_table("events")
    schema = locs.table.schema
    partitioner = Partitioner(schema, PartitionSchema.from_dict(locs.table.partition_schema,
                                                                schema))
    client = SessionClient(service.address)

    def staged(write_id: str, new_ids: range) -> list[bytes]:
        batch = pa.record_batch({"id": list(new_ids), "v": ["late"] * len(new_ids)},
                                schema=ARROW)
        out = stage_batches(schema, partitioner, OpType.INSERT, write_id, ctx.warehouse,
                            1000)(iter([batch]))
        return [r for rb in out for r in rb.column(0).to_pylist() if r is not None]

    assert client.commit_stream("events", stream_id, 1, staged("w-replay", range(100, 103)),
                                [], ["w-replay"]) is None
    assert ids(spark, "events") == list(range(20))
    summary = client.commit_stream("events", stream_id, 2, staged("w-new", range(100, 103)),
                                   [], ["w-new"])
    assert summary is not None and summary.rows_written == 3
    assert ids(spark, "events") == [*range(20), 100, 101, 102]
    assert ledger(ctx, "events", stream_id)["last_batch_id"] == 2


def test_an_explicit_stream_id_names_the_record_and_survives_a_new_checkpoint(
    spark: SparkSession, kudu: tuple[KuduContext, SessionService], tmp_path: Path,
) -> None:
    ctx = kudu[0]
    ctx.create_table("named", STRUCT, keys=["id"],
                     partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    source = tmp_path / "in"
    add_file(source, "a", range(5))
    run_stream(spark, source, "named", tmp_path / "ck1", **{"kudu.streamId": "orders-v1"})
    assert ids(spark, "named") == list(range(5))
    assert ledger(ctx, "named", "orders-v1")["last_batch_id"] == 0
    # A new checkpoint re-reads the same file as batch 0; the stream id says it is done.
    run_stream(spark, source, "named", tmp_path / "ck2", **{"kudu.streamId": "orders-v1"})
    assert ids(spark, "named") == list(range(5))


def test_a_stream_without_a_checkpoint_option_or_stream_id_is_refused(
    spark: SparkSession, kudu: tuple[KuduContext, SessionService], tmp_path: Path,
) -> None:
    ctx = kudu[0]
    ctx.create_table("nockpt", STRUCT, keys=["id"],
                     partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    source = tmp_path / "in"
    add_file(source, "a", range(3))
    key = "spark.sql.streaming.checkpointLocation"
    spark.conf.set(key, str(tmp_path / "ckroot"))
    try:
        with pytest.raises(Exception, match=re.escape("needs a stable stream id")):
            query = (spark.readStream.schema(STRUCT).parquet(str(source)).writeStream
                     .format("kudu").option("kudu.table", "nockpt").queryName("nockpt")
                     .trigger(availableNow=True).start())
            try:
                query.awaitTermination(300)
            finally:
                query.stop()
            raise AssertionError(f"no error; query exception: {query.exception()}")
    finally:
        spark.conf.unset(key)
    assert ids(spark, "nockpt") == []


def test_every_column_type_round_trips_exactly_through_the_streaming_sink(
    spark: SparkSession, kudu: tuple[KuduContext, SessionService], tmp_path: Path,
) -> None:
    from chispa import assert_df_equality

    from tests.spark.test_datasource import ALL_ROWS, ALL_TYPES

    ctx, _ = kudu
    ctx.create_table("typed_stream", ALL_TYPES, keys=["id", "tag"], replicas=3,
                     partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    expected = spark.createDataFrame(ALL_ROWS, ALL_TYPES)
    source = tmp_path / "typed-src"
    expected.write.parquet(str(source))
    query = (spark.readStream.schema(ALL_TYPES).parquet(str(source)).writeStream
             .format("kudu").option("kudu.table", "typed_stream")
             .option("checkpointLocation", str(tmp_path / "typed-ck"))
             .trigger(availableNow=True).start())
    try:
        assert query.awaitTermination(300), "the streaming query did not finish"
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    back = spark.read.format("kudu").option("kudu.table", "typed_stream").load()
    assert_df_equality(back, expected, ignore_row_order=True, ignore_metadata=True)
