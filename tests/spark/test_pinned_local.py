"""Pinned RDDs and the instance-file check in local mode (virtual tablet servers)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from pyspark_kudu.spark.host.identity import ensure_instance, run_pinned
from pyspark_kudu.spark.pinned import executor_hosts, pinned_rdd


def test_pinned_rdd_has_one_partition_per_payload_with_its_locations(spark: SparkSession) -> None:
    sc = spark.sparkContext
    rdd = pinned_rdd(sc, [({"n": 1}, ["ts-a"]), ({"n": 2}, ["ts-b", "ts-c"])])
    assert rdd.getNumPartitions() == 2
    jrdd = rdd._jrdd.rdd()
    prefs = [list(sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava(jrdd.preferredLocations(p)))
             for p in jrdd.partitions()]
    assert prefs == [["ts-a"], ["ts-b", "ts-c"]]
    assert rdd.map(lambda d: d["n"] * 10).collect() == [10, 20]
    assert rdd.barrier().mapPartitions(lambda it: [d["n"] for d in it]).collect() == [1, 2]


def test_local_mode_reports_the_driver_as_the_only_executor_host(spark: SparkSession) -> None:
    hosts = executor_hosts(spark.sparkContext)
    assert len(hosts) == 1
    assert next(iter(hosts.values())) == ["driver"]


def test_virtual_tablet_servers_refuse_work_aimed_at_another_server(
    spark: SparkSession, tmp_path: Path
) -> None:
    roots = [str(tmp_path / f"ts{i}") for i in range(3)]
    uuids = [ensure_instance(r).uuid for r in roots]
    assert len(set(uuids)) == 3
    payloads = [((roots[i], uuids[(i + 1) % 3]), [f"vhost-{i}"]) for i in range(3)]
    payloads.append(((roots[0], uuids[0]), ["vhost-0"]))
    results = pinned_rdd(spark.sparkContext, payloads).map(
        lambda p: run_pinned(p[0], p[1], lambda root: root)
    ).collect()
    assert [r.ok for r in results] == [False, False, False, True]
    assert results[3].value == roots[0]
    assert "belongs to tablet server" in results[0].misplaced_reason
