"""The standalone test cluster (``cluster`` marker): a master plus 6 workers on 127.0.0.2-7.

Started once per test session and always torn down; only the processes it started are
killed. Each worker has 1 core, 1 GiB and its own data root (``PYSPARK_KUDU_DATA_ROOT``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.spark.daemon import SESSION_CONF
from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.spark.standalone import StandaloneCluster
from tests.conftest import stop_other_sessions

WORKERS = 6
_DEADLINE_S = 240.0


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("standalone"), workers=WORKERS)
    cluster.start(deadline_s=_DEADLINE_S)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def cluster_spark(standalone_cluster: StandaloneCluster) -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    stop_other_sessions(standalone_cluster.master_url)
    session = (
        SparkSession.builder.master(standalone_cluster.master_url)
        .appName("pyspark-kudu-cluster-tests")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.executor.memory", "640m")
        .config("spark.executor.cores", "1")
        .config("spark.sql.shuffle.partitions", "6")
        .config(map=dict(SESSION_CONF))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    want = set(standalone_cluster.hosts)
    end = time.monotonic() + _DEADLINE_S
    while set(executor_hosts(session.sparkContext)) != want:
        if time.monotonic() > end:
            session.stop()
            raise AssertionError(
                f"executors did not come up on every worker host within {_DEADLINE_S:.0f} s: "
                f"have {sorted(executor_hosts(session.sparkContext))}, want {sorted(want)}"
            )
        time.sleep(0.5)
    yield session
    session.stop()
