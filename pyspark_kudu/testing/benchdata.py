"""What the benchmarks share: the 5-column input they write, the same rows made by Python
(the floor of any scan whose rows come from Python), its key schema, the rows their small
upserts write, the ``deltalake`` MERGE they are compared with, and the commit id their
results record.

Thread-safety: functions only.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

__all__ = ["commit_id", "delta_copy", "delta_merge", "five_columns", "five_columns_from_python",
           "five_columns_from_python_source",
           "keyed_schema", "rack_mapping", "upsert_rows"]


def five_columns(spark: SparkSession, n: int, parts: int) -> DataFrame:
    """``n`` rows ``(id long, a long, b double, c string, d boolean)`` in ``parts``
    partitions, ``id`` = 0..n-1 (the benchmarks' long-keyed table)."""
    i = F.col("id")
    return (spark.range(n, numPartitions=parts)
            .select(i.cast("long").alias("id"), (i * 2).alias("a"),
                    (i % 1000).cast("double").alias("b"),
                    F.concat(F.lit("name-"), i.cast("string")).alias("c"),
                    (i % 7 == 0).alias("d")))


def five_columns_from_python(spark: SparkSession, n: int, parts: int,
                             batch_rows: int = 65536) -> DataFrame:
    """The rows of :func:`five_columns`, made in each task by Arrow's compute kernels and
    handed to Spark through ``mapInArrow`` in ``batch_rows``-row batches: the floor of any
    scan whose rows come from Python through ``mapInArrow`` (``read_table``), i.e. what
    Spark itself charges to move rows from a Python worker into the JVM.

    (``mapInArrow`` of ``spark.range(parts)``: task ``p`` makes ids
    ``[p * n // parts, (p + 1) * n // parts)``.)"""

    def make(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for p in b.column(0).to_pylist():
                yield from _five_column_batches(p * n // parts, (p + 1) * n // parts,
                                                batch_rows)

    schema = five_columns(spark, 1, 1).schema
    return spark.range(parts, numPartitions=parts).mapInArrow(make, schema)


def five_columns_from_python_source(spark: SparkSession, n: int, parts: int,
                                    batch_rows: int = 65536) -> DataFrame:
    """The same rows as :func:`five_columns_from_python`, read through a Python *data
    source* (``spark.read.format(...)``, as ``format("kudu")`` is) whose reader yields the
    same Arrow batches: the floor of any ``format(...)`` scan whose rows come from Python.
    Spark reads a Python data source row by row (its scan is not columnar, unlike
    ``mapInArrow``'s output), so this floor takes longer than
    :func:`five_columns_from_python`'s."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema

    struct = five_columns(spark, 1, 1).schema  # captured by value, not the session
    arrow = to_arrow_schema(struct)

    class _Part(InputPartition):
        def __init__(self, lo: int, hi: int) -> None:
            super().__init__((lo, hi))
            self.lo, self.hi = lo, hi

    class _Reader(DataSourceReader):
        def __init__(self, options: Mapping[str, str]) -> None:
            self.n, self.parts = int(options["rows"]), int(options["parts"])
            self.batch_rows = int(options["batch_rows"])

        def partitions(self) -> list[InputPartition]:
            return [_Part(p * self.n // self.parts, (p + 1) * self.n // self.parts)
                    for p in range(self.parts)]

        def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
            assert isinstance(partition, _Part)
            for b in _five_column_batches(partition.lo, partition.hi, self.batch_rows):
                yield pa.RecordBatch.from_arrays(b.columns, schema=arrow)  # Spark's nullability

    class FiveColumnsSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "pyspark_kudu_bench_five_columns"

        def schema(self) -> StructType:
            return struct

        def reader(self, schema: StructType) -> DataSourceReader:
            return _Reader(self.options)

    spark.dataSource.register(FiveColumnsSource)
    return (spark.read.format(FiveColumnsSource.name()).option("rows", str(n))
            .option("parts", str(parts)).option("batch_rows", str(batch_rows)).load())


def _five_column_batches(lo: int, hi: int, batch_rows: int) -> Iterator[pa.RecordBatch]:
    """Rows ``lo .. hi - 1`` of :func:`five_columns` as Arrow batches of ``batch_rows``."""
    for start in range(lo, hi, batch_rows):
        ids = pa.array(np.arange(start, min(hi, start + batch_rows), dtype=np.int64))
        yield pa.record_batch([
            ids, pc.multiply(ids, 2), pc.cast(pc.remainder(ids, 1000), pa.float64()),
            pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
            pc.equal(pc.remainder(ids, 7), 0)], names=["id", "a", "b", "c", "d"])


def keyed_schema(df: DataFrame, key: str = "id") -> StructType:
    """``df``'s schema with only ``key`` non-nullable (a Kudu table's primary key)."""
    return StructType([StructField(f.name, f.dataType, f.name != key) for f in df.schema])


def rack_mapping(repo: Path) -> str:
    """The location mapping command that puts the test cluster's hosts in three racks
    (``conf/location_mapping.sh`` over ``conf/topology.txt``)."""
    return f"{repo / 'conf' / 'location_mapping.sh'} {repo / 'conf' / 'topology.txt'}"


def commit_id(repo: Path) -> str:
    """The commit checked out in ``repo`` ("" without git)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=repo, check=False).stdout.strip()
    except OSError:
        return ""


def upsert_rows(lo: int, size: int, tag: int) -> list[tuple[int, int, float, str, bool]]:
    """``size`` rows of :func:`five_columns`' shape with keys ``lo..lo+size-1`` and values
    that differ per ``tag`` (each repetition of a benchmark's upsert changes the rows)."""
    return [(i, i * 3 + tag, float(i % 1000), f"upserted-{tag}-{i}", i % 2 == 0)
            for i in range(lo, lo + size)]


def delta_copy(parquet: Path, dest: Path) -> Path:
    """A Delta table at ``dest`` holding ``parquet``'s rows (files hard-linked)."""
    from deltalake import convert_to_deltalake

    shutil.copytree(parquet, dest, copy_function=os.link,
                    ignore=shutil.ignore_patterns("_SUCCESS", ".*"))
    convert_to_deltalake(str(dest))
    return dest


def delta_merge(delta: Path, rows: list[tuple[int, int, float, str, bool]]) -> float:
    """Seconds a ``deltalake`` MERGE (update matched, insert the rest) of ``rows`` into the
    Delta table at ``delta`` takes, in this process."""
    import pyarrow as pa
    from deltalake import DeltaTable

    names = ("id", "a", "b", "c", "d")
    src = pa.table({n: [r[k] for r in rows] for k, n in enumerate(names)})
    t0 = time.perf_counter()
    (DeltaTable(str(delta)).merge(src, "t.id = s.id", source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all().execute())
    return time.perf_counter() - t0
