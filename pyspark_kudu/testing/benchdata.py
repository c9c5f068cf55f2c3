"""What the benchmarks share: the 5-column input they write, its key schema, and the commit
id their results record.

Thread-safety: functions only.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructField, StructType

__all__ = ["commit_id", "five_columns", "keyed_schema"]


def five_columns(spark: SparkSession, n: int, parts: int) -> DataFrame:
    """``n`` rows ``(id long, a long, b double, c string, d boolean)`` in ``parts``
    partitions, ``id`` = 0..n-1 (the benchmarks' long-keyed table)."""
    i = F.col("id")
    return (spark.range(n, numPartitions=parts)
            .select(i.cast("long").alias("id"), (i * 2).alias("a"),
                    (i % 1000).cast("double").alias("b"),
                    F.concat(F.lit("name-"), i.cast("string")).alias("c"),
                    (i % 7 == 0).alias("d")))


def keyed_schema(df: DataFrame, key: str = "id") -> StructType:
    """``df``'s schema with only ``key`` non-nullable (a Kudu table's primary key)."""
    return StructType([StructField(f.name, f.dataType, f.name != key) for f in df.schema])


def commit_id(repo: Path) -> str:
    """The commit checked out in ``repo`` ("" without git)."""
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=repo, check=False).stdout.strip()
    except OSError:
        return ""
