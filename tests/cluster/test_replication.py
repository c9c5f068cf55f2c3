"""DESIGN §3 on the standalone cluster: replication rounds are barrier stages of pinned tasks.

Each test uses its own tablet ids, so tests share the session's cluster without interfering.
"""

from __future__ import annotations

import threading
from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.spark.host.handlers import read_writers, replica_storage
from pyspark_kudu.spark.host.identity import ensure_instance, local_data_root
from pyspark_kudu.spark.pinned import executor_hosts, pinned_rdd
from pyspark_kudu.spark.replication.spark_rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
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


def test_a_round_that_cannot_launch_is_cancelled_when_a_host_of_it_loses_its_executor(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, tmp_path: Path
) -> None:
    """A barrier stage launches all its tasks at once or none. Here the round's task for the
    victim cannot launch (other jobs hold the victim's and every spare core), so the stage
    waits; when the victim's worker dies, the slot it waits for never comes. The round's
    watcher cancels it as soon as the driver loses the victim's executor -- not after the
    round timeout (set far out) -- and the write commits on the majority."""
    sc = cluster_spark.sparkContext
    servers = _register(cluster_spark, standalone_cluster)
    replicas = [servers[0], servers[1], servers[2]]  # 127.0.0.2, .3, .4
    transport = SparkTransport(sc, servers, round_timeout_s=240.0)
    tablet, lead = _elected(transport, "rf3-lost-while-waiting", replicas)
    victim = replicas[2].host
    busy = [victim, *(s.host for s in servers[3:])]  # every core but the two survivors'
    flag = str(tmp_path / "release")

    def hold(_: object) -> None:  # occupies its executor's only core until the flag exists
        import os
        import time
        end = time.monotonic() + 200
        while not os.path.exists(flag) and time.monotonic() < end:
            time.sleep(0.1)

    occupier = threading.Thread(
        target=lambda: pinned_rdd(sc, [(h, [h]) for h in busy]).foreach(hold), daemon=True)
    occupier.start()

    def held() -> bool:
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        running = {i.host() for i in infos if i.numRunningTasks() > 0}
        return set(busy) <= running

    outcome: list[object] = []
    try:
        wait_until(held, 60, f"the occupying tasks running on {busy}", poll_s=0.1)

        def write() -> None:
            try:
                outcome.append(lead.propose([b"while-waiting"]))
            except Exception as e:
                outcome.append(e)

        rounds_before = transport.rounds
        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        # Submitted: the round started and its job is active next to the occupying one.
        wait_until(lambda: transport.rounds > rounds_before
                   and len(sc.statusTracker().getActiveJobsIds()) >= 2, 30,
                   "the round's job being submitted", poll_s=0.05)
        standalone_cluster.kill_worker(victim)
        wait_until(lambda: transport.lost_executor_rounds >= 1 or not writer.is_alive(), 120,
                   f"the waiting round being cancelled after {victim}'s executor was lost",
                   poll_s=0.2)
    finally:
        open(flag, "w").close()  # the survivors' retry round needs no spare core, but free them
    writer.join(timeout=200)
    assert not writer.is_alive(), "the write did not finish"
    assert outcome and not isinstance(outcome[0], Exception), f"write failed: {outcome}"
    assert transport.lost_executor_rounds >= 1, transport.last_error
    assert transport.timed_out_rounds == 0, "a round waited for its timeout"
    for s in replicas[:2]:
        assert _writes(standalone_cluster.data_root(s.host), tablet.tablet_id) == [
            b"while-waiting"]
    occupier.join(timeout=200)
    standalone_cluster.start_worker(victim)
    wait_until(lambda: victim in executor_hosts(sc), 120,
               f"an executor coming back on {victim}", poll_s=0.5)
