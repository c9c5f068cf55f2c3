"""``kudu.repartition``: a DataFrame repartitioned by destination tablet before a write.

kudu-spark's ``kudu.repartition=true`` shuffles the rows so that each Spark partition holds
the rows of exactly one tablet (and, with ``kudu.repartition.sort=true``, its default, sorts
them by primary key within the partition) before its writer tasks run. Each writer task
then talks to one tablet, and each tablet receives few, large batches instead of one small
batch from every input partition.

Here the same happens for :meth:`KuduContext.write(..., repartition=True)
<pyspark_kudu.spark.api.context.KuduContext.write>` in three narrow steps around one shuffle:

1. ``mapInArrow`` routes every Arrow batch with the table's
   :class:`~pyspark_kudu.partitioning.Partitioner` and emits, per tablet present in the
   batch, one row ``(tablet index, Arrow IPC stream of its rows)``: rows stay columnar and
   the shuffle moves one record per (batch, tablet), not one per row;
2. ``RDD.partitionBy(number of tablets, identity)`` puts tablet ``i`` in Spark partition
   ``i`` exactly (a DataFrame ``repartition(n, col)`` hashes the column, which may put two
   tablets in one partition and leave another empty). Rows no range partition covers go
   to partition 0: staging reports them per row (``NotFound``) wherever they are;
3. ``mapInArrow`` decodes the streams back into the DataFrame's own rows and schema;
   ``sortWithinPartitions`` on the key columns (Spark's sort, which spills) implements
   ``kudu.repartition.sort``.

Every step is narrow except the shuffle, so the staging ``mapInArrow`` that follows runs
one task per tablet. Routing here and in staging use the same partitioner, so the rows of
partition ``i`` are staged for tablet ``i`` only.

The ``kudu`` Python data source cannot do this: its writer receives the DataFrame's
partitions as Spark planned them (see :mod:`pyspark_kudu.spark.api.source_options`).

Thread-safety: functions only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame

from pyspark_kudu.partitioning import Partitioner

__all__ = ["ROUTED_SCHEMA", "repartition_by_tablet"]

ROUTED_SCHEMA = "tablet int, ipc binary"
_ROUTED = pa.schema([pa.field("tablet", pa.int32()), pa.field("ipc", pa.binary())])


def _router(partitioner: Partitioner
            ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def route(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            tablets: list[int] = []
            streams: list[bytes] = []
            for pidx, part in partitioner.split_batch(batch).items():
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as w:
                    w.write_table(part)
                tablets.append(max(pidx, 0))
                streams.append(sink.getvalue().to_pybytes())
            yield pa.RecordBatch.from_arrays(
                [pa.array(tablets, pa.int32()), pa.array(streams, pa.binary())],
                schema=_ROUTED)
    return route


def _decode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    for b in batches:
        for data in b.column(0).to_pylist():
            yield from pa.ipc.open_stream(data)


def _tablet_partition(tablet: int) -> int:
    return tablet


def repartition_by_tablet(df: DataFrame, partitioner: Partitioner,
                          sort_columns: Sequence[str] = ()) -> DataFrame:
    """``df`` with one Spark partition per tablet of ``partitioner``'s table, partition
    ``i`` holding exactly the rows routed to tablet ``i`` (see the module docstring), each
    sorted by ``sort_columns`` when given (the primary key for ``kudu.repartition.sort``).

    Lazy, like any DataFrame transformation: routing errors (e.g. a key column missing)
    surface when the result is computed.
    """
    n = max(partitioner.num_partitions, 1)
    routed = df.mapInArrow(_router(partitioner), ROUTED_SCHEMA)
    shuffled = routed.rdd.map(_pair).partitionBy(n, _tablet_partition).map(_ipc_only)
    spark = df.sparkSession
    out = spark.createDataFrame(shuffled, "ipc binary").mapInArrow(_decode, df.schema)
    if sort_columns:
        out = out.sortWithinPartitions(*sort_columns)
    return out


def _pair(row: Any) -> tuple[int, bytes]:
    return int(row[0]), bytes(row[1])


def _ipc_only(kv: tuple[int, bytes]) -> tuple[bytes]:
    return (kv[1],)
