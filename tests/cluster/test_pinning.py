"""DESIGN §4 on the real standalone cluster: pinned tasks run on the host they were aimed at,
in normal and barrier stages, and a task that lands on the wrong tablet server refuses to work.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import SparkSession

from pyspark_kudu.spark.host.identity import (
    current_host,
    ensure_instance,
    local_data_root,
    run_pinned,
)
from pyspark_kudu.spark.pinned import executor_hosts, pinned_rdd
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster


def _where(_: Any) -> str:
    return current_host()


def test_executors_report_one_distinct_loopback_host_per_worker(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    assert sorted(executor_hosts(cluster_spark.sparkContext)) == sorted(standalone_cluster.hosts)


def test_pinned_tasks_run_on_their_hosts_in_normal_and_barrier_stages(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    sc = cluster_spark.sparkContext
    hosts = standalone_cluster.hosts
    for trial in range(3):
        order = hosts[trial:] + hosts[:trial]  # vary which partition goes where
        rdd = pinned_rdd(sc, [(h, [h]) for h in order])
        assert rdd.map(lambda h: (h, current_host())).collect() == [(h, h) for h in order]
        barrier = rdd.barrier().mapPartitions(lambda it: [(h, current_host()) for h in it])
        assert barrier.collect() == [(h, h) for h in order]


def test_each_worker_gets_its_own_tablet_server_and_a_misplaced_task_touches_nothing(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster
) -> None:
    sc = cluster_spark.sparkContext
    hosts = standalone_cluster.hosts
    infos = pinned_rdd(sc, [(h, [h]) for h in hosts]).map(
        lambda _: ensure_instance(local_data_root())
    ).collect()
    assert [i.host for i in infos] == hosts
    assert len({i.uuid for i in infos}) == len(hosts)
    assert all(str(standalone_cluster.data_root(i.host)) == i.data_root for i in infos)

    # Aim every task at host h but give it the UUID of the next host's tablet server.
    wrong = {h: infos[(k + 1) % len(infos)].uuid for k, h in enumerate(hosts)}

    def touch(root: str) -> str:
        with open(f"{root}/touched", "w") as f:
            f.write("x")
        return "written"

    results = pinned_rdd(sc, [((h, wrong[h]), [h]) for h in hosts]).map(
        lambda p: run_pinned(local_data_root(), p[1], touch)
    ).collect()
    assert [r.ok for r in results] == [False] * len(hosts)
    assert all("belongs to tablet server" in r.misplaced_reason for r in results)
    assert not any((standalone_cluster.data_root(h) / "touched").exists() for h in hosts)
