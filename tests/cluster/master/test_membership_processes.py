"""Adding a fourth master process and removing one, one at a time, on a live group."""

from __future__ import annotations

from pathlib import Path

from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.localcluster import MasterProcessCluster

from .conftest import SCHEMA, wait_until


def test_add_a_master_then_remove_the_leader_and_keep_serving(tmp_path: Path) -> None:
    with MasterProcessCluster(str(tmp_path), 3) as cluster:
        cluster.start()
        cluster.wait_for_leader(60)
        c = cluster.client(timeout_s=30, check_master_count=False)
        ts = TServerMeta("ts0", "127.0.0.2", 7050, "/d")
        for a in cluster.peers.values():  # heartbeats go to every master (seed)
            c.heartbeat_to(a, ts)
        c.create_table("before", SCHEMA, replication_factor=1)
        addr = cluster.add_peer("m4")
        cluster.start(["m4"], join=True)
        c.add_master("m4", addr, timeout_s=60)
        st = c.call("status")
        assert st["voters"] == ["m1", "m2", "m3", "m4"]
        with MasterClient(addr, check_master_count=False) as m4:
            wait_until(lambda: "before" in m4.list_tables(max_staleness_s=5), 30,
                       "m4 serving the catalog it learned")
        leader = cluster.wait_for_leader()
        c.remove_master(leader, timeout_s=60)  # leadership moves first, then the removal
        cluster.kill(leader)
        remaining = [m for m in cluster.peers if m != leader]
        with MasterClient([cluster.peers[m] for m in remaining]) as c3:
            for m in remaining:
                c3.heartbeat_to(cluster.peers[m], ts)
            assert c3.call("status")["voters"] == remaining
            c3.create_table("after", SCHEMA, replication_factor=1)
            assert c3.list_tables() == ["after", "before"]
