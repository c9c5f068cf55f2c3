"""The executor's Python daemon (``spark.python.daemon.module``): what its workers inherit."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

pytestmark = pytest.mark.spark


def _inherited(_: Iterator[int]) -> Iterator[tuple[int, bool]]:
    import gc
    import sys

    yield gc.get_freeze_count(), "pyspark_kudu.spark.host.round_tasks" in sys.modules


def test_workers_inherit_the_daemons_imports_frozen_so_their_collections_skip_them(
        spark: SparkSession) -> None:
    """PySpark's worker collects garbage after every task; objects the daemon froze before
    forking are skipped (and their pages stay shared). Without the freeze the count is 0."""
    got = spark.sparkContext.parallelize(range(4), 4).mapPartitions(_inherited).collect()
    assert len(got) == 4
    for frozen, imported in got:
        assert imported, "the worker did not inherit the daemon's pre-imported modules"
        assert frozen > 10_000, f"only {frozen} objects frozen in the worker"
