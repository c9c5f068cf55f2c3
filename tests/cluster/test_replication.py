"""DESIGN §3 on the standalone cluster: replication rounds are barrier stages of pinned tasks.

Each test uses its own tablet ids, so tests share the session's cluster without interfering.
"""

from __future__ import annotations

import threading
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.spark.leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.peer import read_writers, replica_storage
from pyspark_kudu.spark.pinned import executor_hosts, pinned_rdd
from pyspark_kudu.spark.rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.standalone import StandaloneCluster
from pyspark_kudu.spark.tserver import ensure_instance, local_data_root
from tests.waiting import wait_until


def _register(spark: SparkSession, cluster: StandaloneCluster) -> list[TabletServerLocation]:
    hosts = cluster.hosts
    infos = pinned_rdd(spark.sparkContext, [(h, [h]) for h in hosts]).map(
        lambda _: ensure_instance(local_data_root())).collect()
    return [TabletServerLocation(i.uuid, i.host) for i in infos]


def _elected(transport: SparkTransport, tablet_id: str,
             replicas: list[TabletServerLocation]) -> tuple[TabletReplicas, TabletLeader]:
    """Create an RF=3 tablet on ``replicas`` and elect a leader on the first one."""
    tablet = TabletReplicas(tablet_id, tuple(s.uuid for s in replicas))
    TabletLeader(tablet, replicas[0].uuid, transport).create()
    lead = TabletLeader(tablet, replicas[0].uuid, transport)
    lead.elect()
    return tablet, lead


def _writes(root: Path, tablet_id: str) -> list[bytes]:
    with replica_storage(str(root), tablet_id) as st:
        ents = st.entries(st.first_index(), st.last_index() + 1)
    return [e.data for e in ents if e.type == EntryType.NORMAL and e.data]


def test_rf3_writes_land_only_in_the_replicas_data_roots(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    servers = _register(cluster_spark, standalone_cluster)
    replicas = [servers[0], servers[2], servers[4]]  # 127.0.0.2, .4, .6
    transport = SparkTransport(cluster_spark.sparkContext, servers)
    tablet, lead = _elected(transport, "rf3-only-replicas", replicas)
    lead.propose([b"a", b"b"])
    lead.heartbeat()
    for s in servers:
        root = standalone_cluster.data_root(s.host)
        holds = (root / "tablets" / tablet.tablet_id).exists()
        assert holds == (s in replicas), f"{s.host} holds={holds}"
        if holds:
            assert _writes(root, tablet.tablet_id) == [b"a", b"b"]
            writers = read_writers(str(root), tablet.tablet_id)
            assert writers, f"no writer recorded on {s.host}"
            assert {w[0] for w in writers} == {s.host}, f"{s.host}'s log written by {writers}"
    assert transport.failed_rounds == 0


def test_a_write_still_commits_after_a_follower_host_is_killed(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    sc = cluster_spark.sparkContext
    servers = _register(cluster_spark, standalone_cluster)
    replicas = [servers[1], servers[3], servers[5]]  # 127.0.0.3, .5, .7
    transport = SparkTransport(sc, servers)
    tablet, lead = _elected(transport, "rf3-survives-kill", replicas)
    lead.propose([b"before"])
    victim = replicas[2].host
    standalone_cluster.kill_worker(victim)
    wait_until(lambda: victim not in executor_hosts(sc), 60,
               f"the driver noticing the executor loss on {victim}", poll_s=0.2)
    lead.propose([b"after"])
    for s in replicas[:2]:
        assert _writes(standalone_cluster.data_root(s.host), tablet.tablet_id)[:2] == [
            b"before", b"after"]
    standalone_cluster.start_worker(victim)
    wait_until(lambda: victim in executor_hosts(sc), 120,
               f"an executor coming back on {victim}", poll_s=0.5)
    lead.heartbeat()
    lead.heartbeat()
    assert _writes(standalone_cluster.data_root(victim), tablet.tablet_id) == [b"before", b"after"]


def test_killing_a_follower_host_during_a_round_still_commits_on_the_majority(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    sc = cluster_spark.sparkContext
    servers = _register(cluster_spark, standalone_cluster)
    replicas = [servers[0], servers[3], servers[4]]  # 127.0.0.2, .5, .6
    transport = SparkTransport(sc, servers)
    tablet, lead = _elected(transport, "rf3-kill-mid-round", replicas)
    victim = replicas[1].host
    outcome: list[object] = []

    def write() -> None:
        try:
            outcome.append(lead.propose([b"during-kill"]))
        except Exception as e:
            outcome.append(e)

    writer = threading.Thread(target=write)
    writer.start()
    standalone_cluster.kill_worker(victim)  # while the round's barrier stage is running
    writer.join(timeout=300)
    assert not writer.is_alive(), "the write did not finish within 300 s of the kill"
    assert outcome and not isinstance(outcome[0], Exception), f"write failed: {outcome}"
    survivors = [s for s in replicas if s.host != victim]
    for s in survivors:
        assert _writes(standalone_cluster.data_root(s.host), tablet.tablet_id) == [
            b"during-kill"]
    standalone_cluster.start_worker(victim)
    wait_until(lambda: victim in executor_hosts(sc), 120,
               f"an executor coming back on {victim}", poll_s=0.5)
