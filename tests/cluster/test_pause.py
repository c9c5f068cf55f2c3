"""A host that stops answering while Spark still lists its executor (its processes paused
with SIGSTOP: what a network partition from the driver looks like): the replication round
waiting on it is cancelled after ``round_timeout_s``, a probe finds the host silent, and the
write commits on the majority without it. Resumed, the host's replica catches up once its
suspicion expires.

At the level of rounds, where the claim is deterministic: a full write also runs a staging
job, whose task on a paused executor waits like any Spark task until Spark declares the
executor lost (``spark.network.timeout``) -- Spark's behaviour, not a round's."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.spark.replication.spark_rounds import SparkTransport
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from pyspark_kudu.tools.faults.inject import pause_host, resume_host
from tests.cluster.test_replication import _elected, _register, _writes
from tests.waiting import wait_until


def test_a_round_waiting_on_a_paused_host_times_out_and_commits_without_it(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    sc = cluster_spark.sparkContext
    servers = _register(cluster_spark, standalone_cluster)
    replicas = [servers[1], servers[2], servers[4]]  # 127.0.0.3, .4, .6
    transport = SparkTransport(sc, servers, round_timeout_s=6.0)
    transport.suspect_s = 8.0
    tablet, lead = _elected(transport, "rf3-paused-follower", replicas)
    lead.propose([b"before"])
    victim = replicas[2].host

    def idle() -> bool:  # a task still running there would send the round's task elsewhere
        infos = sc._jsc.sc().statusTracker().getExecutorInfos()
        return all(i.numRunningTasks() == 0 for i in infos if i.host() == victim)

    wait_until(idle, 60, f"the executor on {victim} running no task", poll_s=0.1)
    pids = pause_host(standalone_cluster, victim)
    try:
        lead.propose([b"during-pause"])
        assert transport.timed_out_rounds >= 1, "no round timed out on the paused host"
        assert "cancelled" in transport.last_error, transport.last_error
        assert victim in transport.suspect_hosts(), transport.suspect_hosts()
        assert victim in executor_hosts(sc), "Spark dropped the paused executor"
        for s in replicas[:2]:
            assert _writes(standalone_cluster.data_root(s.host), tablet.tablet_id) == [
                b"before", b"during-pause"]
        assert _writes(standalone_cluster.data_root(victim), tablet.tablet_id) == [b"before"]
    finally:
        resume_host(pids)
    wait_until(lambda: victim not in transport.suspect_hosts(), 30,
               f"the suspicion of {victim} expiring", poll_s=0.5)

    def caught_up() -> bool:
        lead.heartbeat()
        return _writes(standalone_cluster.data_root(victim), tablet.tablet_id) == [
            b"before", b"during-pause"]

    wait_until(caught_up, 90, f"the resumed replica on {victim} catching up", poll_s=0.5)
