"""Self-healing on the standalone cluster: a tablet server whose worker dies is detected by
the master (no heartbeat for ``follower_unavailable_considered_failed_sec``) and its replicas
are re-created elsewhere by the client's healer -- add as NON_VOTER, tablet copy fetched by
the new replica's host from the source host's resident tablet server (no shuffle), promote,
evict (3-4-3) -- keeping one replica per rack. When the worker returns, a sweep deletes its
evicted replicas."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.tserver_client import ping
from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from tests.cluster.test_kudu_context import RACKS, REPO
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
FAILED_AFTER_S = 4.0


@pytest.fixture
def kudu(cluster_spark: SparkSession, tmp_path: Path) -> Iterator[KuduContext]:
    cmd = f"{REPO / 'conf' / 'location_mapping.sh'} {REPO / 'conf' / 'topology.txt'}"
    with KuduContext(cluster_spark, warehouse=str(tmp_path / "wh"), location_mapping_cmd=cmd,
                     heal=True, heal_interval_s=1.0, failed_after_s=FAILED_AFTER_S) as ctx:
        yield ctx


def test_a_dead_servers_replicas_are_re_replicated_and_swept_when_it_returns(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    sc = cluster_spark.sparkContext
    kudu.create_table("healme", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 3),)))
    rows = [(i, f"v{i}") for i in range(600)]
    kudu.upsert_rows(cluster_spark.createDataFrame(rows, STRUCT), "healme")
    host_of = {s.uuid: s.host for s in kudu.servers}
    locs = kudu.master.get_table("healme")
    first = locs.tablets[0]
    victim_ts = next(v for v in first.voters if v != first.leader)
    victim = host_of[victim_ts]
    on_victim = {t.tablet_id for t in locs.tablets if t.replica(victim_ts) is not None}
    secret = kudu.credential.encode()
    survivors = [s.address for s in kudu.servers if s.host != victim and s.address]

    def file_bytes_served() -> int:
        return sum(int(ping(a, secret)["file_bytes_served"]) for a in survivors)

    served_before, shuffles_before = file_bytes_served(), kudu.transport.data_rounds

    standalone_cluster.kill_worker(victim)
    killed_at = time.monotonic()
    try:
        wait_until(lambda: victim not in executor_hosts(sc), 60,
                   f"the driver noticing the executor loss on {victim}", poll_s=0.2)

        def healed() -> bool:
            tablets = kudu.master.get_table("healme").tablets
            return all(len(t.replicas) == 3 and len(t.voters) == 3
                       and victim_ts not in t.voters for t in tablets)

        try:
            wait_until(healed, 240, f"re-replication of the replicas on {victim}", poll_s=0.5)
        except AssertionError as e:
            raise AssertionError(
                f"{e}: healer passes {kudu.healer.passes}, steps {kudu.healer.history[-6:]}, "
                f"last error {kudu.healer.last_error!r}, plan {kudu.replication_plan()}, "
                f"servers {kudu.master.list_tservers()}") from None
        restored_s = time.monotonic() - killed_at
        print(f"full replication restored {restored_s:.1f} s after the kill "
              f"(failed after {FAILED_AFTER_S} s)")
        # The copies went host to host through the resident tablet servers: their file
        # streams carried bytes, and no round shuffled anything (no writes meanwhile).
        assert file_bytes_served() > served_before
        assert kudu.transport.data_rounds == shuffles_before
        # The driver asked each target's server to fetch its copy as soon as the source had
        # staged it (the ask is answered on a thread of its own, maybe after the install).
        wait_until(lambda: len(kudu.transport.prefetch_asks) >= len(on_victim), 60,
                   f"prefetch asks for the {len(on_victim)} copies answered", poll_s=0.2)
        asked = {host for _, host, _, _, _ in kudu.transport.prefetch_asks}
        assert victim not in asked and asked <= set(host_of.values()), asked
        steps = [(a.action, a.outcome, a.replacing) for a in kudu.healer.history]
        # Each add evicted the lost server's replica in the same action (3-4-3).
        assert ("add_replica", "ok", victim_ts) in steps, steps
        assert sum(1 for a in kudu.healer.history
                   if a.action == "add_replica" and a.outcome == "ok") >= len(on_victim)
        # Placement still has one replica per rack: the new one went to the victim's rack.
        for t in kudu.master.get_table("healme").tablets:
            racks = sorted(RACKS[host_of[v]] for v in t.voters)
            assert racks == ["/dc1/rack1", "/dc1/rack2", "/dc1/rack3"], (t.tablet_id, racks)
        # Every acknowledged row is there, and the healed table takes writes.
        got = sorted(tuple(r) for r in kudu.read_table("healme").collect())
        assert got == rows
        kudu.upsert_rows(cluster_spark.createDataFrame([(10_000, "after")], STRUCT), "healme")
        assert kudu.read_table("healme").count() == 601
    finally:
        standalone_cluster.start_worker(victim)
        wait_until(lambda: victim in executor_hosts(sc), 180,
                   f"an executor coming back on {victim}", poll_s=0.5)
    # The returned server's evicted replicas are deleted by a sweep (the healer's own, every
    # few passes, or this one).
    root = standalone_cluster.data_root(victim)
    wait_until(lambda: kudu.sweep_replicas() > 0 or not any(
        (root / "tablets" / t).exists() for t in on_victim), 60,
        f"a sweep deleting the evicted replicas on {victim}", poll_s=1.0)
    assert not any((root / "tablets" / t).exists() for t in on_victim)
