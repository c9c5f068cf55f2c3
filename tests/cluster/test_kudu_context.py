"""KuduContext on the standalone cluster: RF=3 tables spread over the 3 racks, data only on
the replicas' hosts, read back through pinned scans."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.errors import RoundFailedError
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.dataplane import Staged, StagedRef
from pyspark_kudu.spark.host.handlers import read_writers
from pyspark_kudu.spark.host.tserver_client import ping
from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.spark.replication.session_client import SessionClient
from pyspark_kudu.spark.replication.write_service import WriteSummary
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from tests.waiting import wait_until

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


def _restart(cluster: StandaloneCluster, sc: SparkContext, hosts: list[str]) -> None:
    for h in hosts:
        cluster.start_worker(h)
    for h in hosts:
        wait_until(lambda h=h: h in executor_hosts(sc), 180,  # type: ignore[misc]
                   f"an executor coming back on {h}", poll_s=0.5)


def _written_table(kudu: KuduContext, spark: SparkSession, name: str, tablets: int,
                   rows: int) -> list[str]:
    """A table of ``tablets`` hash tablets holding ids 0..rows-1 with value "a"; its tablet
    ids (the write elected this client's leaders of all of them)."""
    kudu.create_table(name, STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), tablets),)))
    kudu.upsert_rows(spark.createDataFrame([(i, "a") for i in range(rows)], STRUCT), name)
    return [t.tablet_id for t in kudu.master.get_table(name).tablets]


def test_a_write_rides_through_the_loss_of_its_leaders_host(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    """The leader replica's executor dies between two writes: the second write's round
    fails there, and the write finishes under a leader elected among the live replicas
    instead of raising; every row is there exactly once."""
    sc = cluster_spark.sparkContext
    tablet = _written_table(kudu, cluster_spark, "ride", 2, 50)[0]
    host_of = {s.uuid: s.host for s in kudu.servers}
    victim = host_of[kudu._leaders[tablet].leader_id]
    standalone_cluster.kill_worker(victim)
    try:
        wait_until(lambda: victim not in executor_hosts(sc), 60,
                   f"the driver noticing the executor loss on {victim}", poll_s=0.2)
        rows = [(i, "b") for i in range(25, 100)]
        summary = kudu.upsert_rows(cluster_spark.createDataFrame(rows, STRUCT), "ride")
        assert summary.rows_written == 75 and summary.row_errors == 0
        assert host_of[kudu._leaders[tablet].leader_id] != victim
        got = sorted(tuple(r) for r in kudu.read_table("ride").collect())
        assert got == [(i, "a") for i in range(25)] + rows
    finally:
        _restart(standalone_cluster, sc, [victim])


def test_tablets_led_from_a_lost_host_fail_over_before_the_next_write(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    """Kudu's followers elect a new leader a few heartbeats after theirs goes quiet. Here the
    driver sees the executor go (liveness) and elects new leaders at once for the tablets it
    led from that host's replicas: no write has to find the leader gone, long before the
    master would declare the server failed (300 s); the next write and read see every row."""
    sc = cluster_spark.sparkContext
    tablets = _written_table(kudu, cluster_spark, "failover", 3, 60)
    host_of = {s.uuid: s.host for s in kudu.servers}
    victim_ts = kudu._leaders[tablets[0]].leader_id
    victim = host_of[victim_ts]
    moved = [t for t in tablets if kudu._leaders[t].leader_id == victim_ts]
    writes = kudu._service.writes

    def failed_over() -> bool:
        leads = [kudu._leaders.get(t) for t in moved]
        return all(x is not None and x.node is not None and x.leader_id != victim_ts
                   for x in leads)

    standalone_cluster.kill_worker(victim)
    try:
        wait_until(failed_over, 120, f"new leaders for tablets {moved} after {victim}'s "
                   f"executor was lost (leaders now: "
                   f"{ {t: getattr(kudu._leaders.get(t), 'leader_id', None) for t in moved} })",
                   poll_s=0.2)
        assert kudu._service.writes == writes, "a write, not the fail-over, elected them"
        plan = kudu.replication_plan()
        assert plan == [], f"the master declared the lost server failed already: {plan}"
        rows = [(i, "b") for i in range(30, 90)]
        summary = kudu.upsert_rows(cluster_spark.createDataFrame(rows, STRUCT), "failover")
        assert summary.rows_written == 60 and summary.row_errors == 0
        got = sorted(tuple(r) for r in kudu.read_table("failover").collect())
        assert got == [(i, "a") for i in range(30)] + rows
    finally:
        _restart(standalone_cluster, sc, [victim])


def test_batches_staged_on_a_host_lost_before_the_round_are_staged_again(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    """The worker that staged some of a write's batches dies after staging, before they
    were replicated: the write stages those input partitions again from the DataFrame's
    lineage on live executors and returns with every row there exactly once."""
    caplog.set_level(logging.WARNING, logger="pyspark_kudu.spark.api.ride_through")
    sc = cluster_spark.sparkContext
    kudu.create_table("restage", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    rows = [(i, f"v{i}") for i in range(120)]
    df = cluster_spark.createDataFrame(sc.parallelize(rows, 6), STRUCT)
    real = kudu.commit_staged
    victims: list[str] = []

    def kill_a_staging_host(table: str, staged: Sequence[Staged], *args: Any, **kw: Any
                            ) -> WriteSummary:
        hosts = sorted({r.host for r in staged if isinstance(r, StagedRef)})
        assert hosts, "the write staged no file (it should not take the small-write path)"
        victims.append(hosts[0])
        standalone_cluster.kill_worker(hosts[0])
        wait_until(lambda: hosts[0] not in executor_hosts(sc), 60,
                   f"the driver noticing the executor loss on {hosts[0]}", poll_s=0.2)
        # The test hosts share one disk: a task on another host could still read the dead
        # host's files, which a real lost host's disk would not allow.
        shutil.rmtree(standalone_cluster.data_root(hosts[0]) / "staging")
        return real(table, staged, *args, **kw)

    monkeypatch.setattr(kudu, "commit_staged", kill_a_staging_host)
    try:
        summary = kudu.write(df, "restage", "upsert", small_write_bytes=0)
        assert summary.rows_written == 120 and summary.row_errors == 0, summary
        assert "staged again" in caplog.text, caplog.text
        got = sorted(tuple(r) for r in kudu.read_table("restage").collect())
        assert got == rows
    finally:
        _restart(standalone_cluster, sc, victims)


def _staging_dirs(cluster: StandaloneCluster) -> set[Path]:
    return {d for h in cluster.hosts if (cluster.data_root(h) / "staging").is_dir()
            for d in (cluster.data_root(h) / "staging").iterdir()}


def test_staged_batches_are_pulled_server_to_server_and_the_shuffle_still_delivers(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    """A staged write's round is one barrier stage whose hosts' resident servers pull the
    batches (from the staging hosts' servers: RF=3 puts two replicas off each staging
    host); with pulling off, the two-stage shuffle delivers them. Rows land exactly, and
    every host's resident server removes the writes' staging afterwards (no Spark job)."""
    sc = cluster_spark.sparkContext
    left_before = _staging_dirs(standalone_cluster)
    kudu.create_table("pulled", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 3),)))
    secret = kudu.credential.encode()

    def staged_bytes_served() -> int:
        # Refreshed addresses: an earlier test of this module replaced an executor.
        return sum(int(ping(a, secret).get("staged_bytes_served", 0))
                   for a in kudu.server_addresses().values())

    t = kudu.transport
    first = {i: f"v{i}" for i in range(3000)}
    data, pulled, served = t.data_rounds, t.pulled_rounds, staged_bytes_served()
    kudu.write(cluster_spark.createDataFrame(sc.parallelize(list(first.items()), 6), STRUCT),
               "pulled", "upsert", small_write_bytes=0)
    assert t.data_rounds > data, "the write carried no staged batch"
    assert t.pulled_rounds - pulled == t.data_rounds - data, (
        f"{t.data_rounds - data} rounds carried batches, {t.pulled_rounds - pulled} pulled")
    assert staged_bytes_served() > served, "no batch crossed hosts server to server"
    second = {i: f"w{i}" for i in range(1500, 4500)}
    t.pull_batches = False
    try:
        data, pulled = t.data_rounds, t.pulled_rounds
        kudu.write(cluster_spark.createDataFrame(sc.parallelize(list(second.items()), 6),
                                                 STRUCT), "pulled", "upsert", small_write_bytes=0)
        assert t.data_rounds > data and t.pulled_rounds == pulled
    finally:
        t.pull_batches = True
    got = sorted(tuple(r) for r in kudu.read_table("pulled").collect())
    assert got == sorted({**first, **second}.items())
    wait_until(lambda: _staging_dirs(standalone_cluster) <= left_before, 60,
               "the writes' staging directories being removed on every host")
    janitor = kudu._janitor
    wait_until(lambda: all(janitor.by_server.get(h, 0) >= 1 for h in standalone_cluster.hosts),
               60, "every host's resident server removing staging (not a Spark job)")


def test_a_write_without_a_live_majority_fails_naming_the_tablet_and_its_hosts(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    sc = cluster_spark.sparkContext
    kudu.create_table("minority", STRUCT, keys=["id"])  # one tablet
    kudu.upsert_rows(cluster_spark.createDataFrame([(1, "a")], STRUCT), "minority")
    host_of = {s.uuid: s.host for s in kudu.servers}
    (tablet,) = kudu.master.get_table("minority").tablets
    # The leader's host and one more: the fail-over at executor loss finds no majority, so
    # the write finds no leader to route to; it still waits ride_through_s, then names the
    # tablet and its hosts.
    leader = kudu._leaders[tablet.tablet_id].leader_id
    victims = sorted({host_of[leader], next(host_of[v] for v in tablet.voters if v != leader)})
    for h in victims:
        standalone_cluster.kill_worker(h)
    kudu.ride_through_s = 5.0
    try:
        for h in victims:
            wait_until(lambda h=h: h not in executor_hosts(sc), 60,  # type: ignore[misc]
                       f"the driver noticing the executor loss on {h}", poll_s=0.2)
        with pytest.raises(RoundFailedError) as info:
            kudu.upsert_rows(cluster_spark.createDataFrame([(2, "b")], STRUCT), "minority")
        text = str(info.value)
        assert tablet.tablet_id in text and "had no leader that could commit" in text, text
        assert all(h in text for h in victims), text
    finally:
        kudu.ride_through_s = 60.0
        _restart(standalone_cluster, sc, victims)
    kudu.upsert_rows(cluster_spark.createDataFrame([(3, "c")], STRUCT), "minority")
    got = {r["id"] for r in kudu.read_table("minority").collect()}
    assert {1, 3} <= got <= {1, 2, 3}  # 2's outcome is unknown, as the error said


def _count_discovery_jobs(kudu: KuduContext, monkeypatch: pytest.MonkeyPatch
                          ) -> list[Sequence[str]]:
    """The hosts of every discovery job ``kudu`` runs from now on, in order."""
    real = kudu._discover_hosts
    jobs: list[Sequence[str]] = []

    def counted(hosts: Sequence[str]) -> Any:
        jobs.append(tuple(hosts))
        return real(hosts)

    monkeypatch.setattr(kudu, "_discover_hosts", counted)
    return jobs


def test_concurrent_address_refreshes_after_an_executor_is_replaced_agree(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An executor is replaced (its resident tablet server listens on a new port) and many
    scan tasks ask the session service for fresh addresses at once: one discovery job runs,
    every caller gets the new address, and the master's registration moves to it and stays
    there (unserialized refreshes could apply an older job's address after a newer one's)."""
    sc = cluster_spark.sparkContext
    # Callers only: the context's own look-up of returned executors is the next test's.
    monkeypatch.setattr(kudu.liveness, "_on_found", None)
    victim = sorted(standalone_cluster.alive_workers())[-1]
    (ts,) = [s for s in kudu.servers if s.host == victim]
    old = kudu.server_addresses()[ts.uuid]
    standalone_cluster.kill_worker(victim)
    wait_until(lambda: victim not in executor_hosts(sc), 60,
               f"the driver noticing the executor loss on {victim}", poll_s=0.2)
    _restart(standalone_cluster, sc, [victim])
    jobs = _count_discovery_jobs(kudu, monkeypatch)
    client = SessionClient(kudu.session_service.address)
    with ThreadPoolExecutor(8) as pool:
        seen = list(pool.map(lambda _: client.server_addresses(), range(8)))
    assert jobs == [(victim,)], f"discovery jobs run: {jobs}"
    new = seen[0][ts.uuid]
    assert all(s == seen[0] for s in seen), seen
    assert new != old, f"the address of {victim}'s tablet server did not change ({old})"
    assert ping(new, kudu.credential.encode())["host"] == victim

    def registered() -> int:
        meta = {m["uuid"]: m for m in kudu.master.list_tservers()}[ts.uuid]
        return int(meta["port"])

    port = int(new.rpartition(":")[2])
    wait_until(lambda: registered() == port, 30,
               f"the master registering {ts.uuid} at its new port {port}", poll_s=0.2)
    for _ in range(3):  # and it stays there across heartbeats
        kudu.liveness.beat_once()
        assert registered() == port


def test_a_returned_executors_tablet_server_is_looked_up_before_anyone_asks(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """When an executor comes back, the context runs the discovery job for its host by
    itself (which also starts the new executor's Python daemon and resident server): the
    new address is known, and serves, without a scan or a round having asked for it; then
    a warm-up task starts the daemon Spark SQL's Python tasks use there."""
    sc = cluster_spark.sparkContext
    victim = sorted(standalone_cluster.alive_workers())[0]
    (ts,) = [s for s in kudu.servers if s.host == victim]
    old = kudu.server_addresses()[ts.uuid]
    jobs = _count_discovery_jobs(kudu, monkeypatch)
    standalone_cluster.kill_worker(victim)
    wait_until(lambda: victim not in executor_hosts(sc), 60,
               f"the driver noticing the executor loss on {victim}", poll_s=0.2)
    _restart(standalone_cluster, sc, [victim])

    def current() -> str:
        return next(s.address for s in kudu.servers if s.uuid == ts.uuid) or ""

    wait_until(lambda: current() not in ("", old), 120,
               f"the context looking up {victim}'s new tablet server by itself (discovery "
               f"jobs so far: {jobs})", poll_s=0.2)
    assert jobs and all(j == (victim,) for j in jobs), f"discovery jobs run: {jobs}"
    assert ping(current(), kudu.credential.encode())["host"] == victim
    # And a SQL Python task ran there (the daemon of a format("kudu") writer's tasks).
    wait_until(lambda: victim in kudu.warmed, 120,
               f"a warm-up task of Spark SQL's Python workers running on {victim} "
               f"(warmed: {kudu.warmed})", poll_s=0.2)
