"""KuduContext on the standalone cluster: RF=3 tables spread over the 3 racks, data only on
the replicas' hosts, read back through pinned scans."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.handlers import read_writers
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster

REPO = Path(__file__).resolve().parents[2]
STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
RACKS = {"127.0.0.2": "/dc1/rack1", "127.0.0.3": "/dc1/rack1", "127.0.0.4": "/dc1/rack2",
         "127.0.0.5": "/dc1/rack2", "127.0.0.6": "/dc1/rack3", "127.0.0.7": "/dc1/rack3"}


@pytest.fixture(scope="module")
def kudu(cluster_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[KuduContext]:
    cmd = f"{REPO / 'conf' / 'location_mapping.sh'} {REPO / 'conf' / 'topology.txt'}"
    with KuduContext(cluster_spark, warehouse=str(tmp_path_factory.mktemp("wh")),
                     location_mapping_cmd=cmd) as ctx:
        yield ctx


def test_rf3_tablets_have_one_replica_per_rack_and_data_only_there(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    kudu.create_table("spread", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 4),)))
    locs = kudu.master.get_table("spread")
    host_of = {s.uuid: s.host for s in kudu.servers}
    for t in locs.tablets:
        racks = [RACKS[host_of[r.ts_uuid]] for r in t.replicas]
        assert sorted(racks) == ["/dc1/rack1", "/dc1/rack2", "/dc1/rack3"], (t.tablet_id, racks)
    df = cluster_spark.createDataFrame([(i, f"v{i}") for i in range(100)], STRUCT)
    assert kudu.insert_rows(df, "spread").rows_written == 100
    got = sorted(tuple(r) for r in kudu.read_table("spread").collect())
    assert got == [(i, f"v{i}") for i in range(100)]
    for t in locs.tablets:
        replica_hosts = {host_of[r.ts_uuid] for r in t.replicas}
        for host in standalone_cluster.hosts:
            root = standalone_cluster.data_root(host)
            holds = (root / "tablets" / t.tablet_id).exists()
            assert holds == (host in replica_hosts), (t.tablet_id, host)
            if holds:
                assert {w[0] for w in read_writers(str(root), t.tablet_id)} == {host}
