"""The benchmarks' Python floor (``five_columns_from_python``) is the same rows as their
input (``five_columns``), so the two can be timed through the same aggregate."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.testing.benchdata import five_columns, five_columns_from_python


@pytest.mark.parametrize("n, parts, batch_rows", [(10_007, 3, 1_000), (5, 4, 65_536)])
def test_the_python_floor_makes_exactly_the_benchmark_rows(
        spark: SparkSession, n: int, parts: int, batch_rows: int) -> None:
    want = five_columns(spark, n, parts)
    got = five_columns_from_python(spark, n, parts, batch_rows)
    assert got.schema == want.schema
    assert got.count() == n
    assert got.exceptAll(want).count() == 0
    assert want.exceptAll(got).count() == 0
