"""Replication rounds as real Spark barrier stages, with virtual tablet servers (local mode)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.spark.leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.peer import replica_storage
from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.spark.rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.tserver import ensure_instance


def test_tablet_writes_commit_through_barrier_stages_on_virtual_tablet_servers(
    spark: SparkSession, tmp_path: Path
) -> None:
    sc = spark.sparkContext
    host = next(iter(executor_hosts(sc)))
    servers = []
    for n in range(3):
        info = ensure_instance(str(tmp_path / f"ts{n}"))
        servers.append(TabletServerLocation(info.uuid, host, info.data_root))
    transport = SparkTransport(sc, servers)
    tablet = TabletReplicas("tab-1", tuple(s.uuid for s in servers))
    TabletLeader(tablet, servers[0].uuid, transport).create()
    lead = TabletLeader(tablet, servers[0].uuid, transport)
    lead.elect()
    lead.propose([b"r1", b"r2"])
    lead.heartbeat()
    assert transport.failed_rounds == 0
    for s in servers:
        assert s.root is not None
        with replica_storage(s.root, "tab-1") as st:
            last = st.last_index()
            ents = st.entries(st.first_index(), last + 1)
            hs, _ = st.initial_state()
        assert [e.data for e in ents if e.type == EntryType.NORMAL and e.data] == [b"r1", b"r2"]
        assert hs.commit == last, f"replica {s.uuid} did not learn the commit index"
