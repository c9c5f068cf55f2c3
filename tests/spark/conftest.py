"""Local-mode Spark fixtures (``spark`` marker): one session for the whole run."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.spark.host.daemon import SESSION_CONF
from tests.conftest import stop_other_sessions


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    stop_other_sessions("local[2]")
    session = (
        SparkSession.builder.master("local[2]")
        .appName("pyspark-kudu-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config(map=dict(SESSION_CONF))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
