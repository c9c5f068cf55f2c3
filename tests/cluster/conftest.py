"""The standalone test cluster (``cluster`` marker): a master plus 6 workers on 127.0.0.2-7.

Started once per test session and always torn down; only the processes it started are
killed. Each worker has 1 core, 1 GiB and its own data root (``PYSPARK_KUDU_DATA_ROOT``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, cluster_session
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
    stop_other_sessions(standalone_cluster.master_url)
    session = cluster_session(standalone_cluster.master_url, "pyspark-kudu-cluster-tests",
                              len(standalone_cluster.hosts),
                              conf={"spark.sql.shuffle.partitions": "6"},
                              deadline_s=_DEADLINE_S)
    yield session
    session.stop()
