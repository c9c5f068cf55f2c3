"""The benchmarks' Python floors (``five_columns_from_python`` through ``mapInArrow``,
``five_columns_from_python_source`` through a Python data source) are the same rows as their
input (``five_columns``), so they can be timed through the same aggregate."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.testing.benchdata import (
    five_columns,
    five_columns_from_python,
    five_columns_from_python_source,
)


@pytest.mark.parametrize("n, parts, batch_rows", [(10_007, 3, 1_000), (5, 4, 65_536)])
@pytest.mark.parametrize("floor", [five_columns_from_python, five_columns_from_python_source],
                         ids=["mapInArrow", "data-source"])
def test_the_python_floors_make_exactly_the_benchmark_rows(
        spark: SparkSession, n: int, parts: int, batch_rows: int, floor: object) -> None:
    want = five_columns(spark, n, parts)
    got = floor(spark, n, parts, batch_rows)  # type: ignore[operator]
    assert got.schema == want.schema
    assert got.count() == n
    assert got.exceptAll(want).count() == 0
    assert want.exceptAll(got).count() == 0
