"""Standalone master processes on loopback (no Spark needed): the ``quorum`` fixture.

Three ``pyspark-kudu master run`` processes on free ports, plus a heartbeater per fake
tablet server so the masters see 3 live tablet servers throughout. Only processes started
here are killed, by pid.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.heartbeater import TabletServerHeartbeater
from pyspark_kudu.master.localcluster import MasterProcessCluster
from pyspark_kudu.schema import ColumnSchema, Schema
from tests.waiting import wait_until

SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
TOKEN = "cluster-secret"


@pytest.fixture(scope="module")
def quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MasterProcessCluster]:
    root = Path(tmp_path_factory.mktemp("masters"))
    cluster = MasterProcessCluster(str(root), 3, token=TOKEN)
    beaters: list[TabletServerHeartbeater] = []
    try:
        cluster.start()
        cluster.wait_for_leader(60)
        client = cluster.client(timeout_s=30)
        beaters = [TabletServerHeartbeater(client, TServerMeta(f"ts{i}", f"127.0.0.{i + 2}",
                                                               7050, f"/data/ts{i}"),
                                           interval_s=0.5).start() for i in range(3)]
        wait_until(lambda: len(client.list_tservers()) == 3, 30, "registration of 3 tservers")
        yield cluster
    finally:
        for b in beaters:
            b.stop()
        cluster.stop()
