"""Reads on the standalone cluster (DESIGN §1): ``spark.read.format("kudu")`` and
``KuduContext.read_table`` return exactly the rows written wherever Spark places their tasks
-- on a replica's host (a local read) or anywhere else (through that host's resident tablet
server) -- and fail, naming every replica's reason, only when no replica serves.

The context runs with the test topology's location mapping (three racks), as a user's would;
nothing here tells it the workers' data roots: tasks find their own host's root, and reach
other hosts' replicas over the network. Roots made unreachable are renamed away for the
duration of one read, as a disk that is not mounted would be, and always renamed back.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.identity import current_host
from pyspark_kudu.spark.host.replica_reader import order_replicas
from pyspark_kudu.spark.host.tserver_client import ping
from pyspark_kudu.spark.pinned import pinned_rdd
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
MAPPING = f"{REPO / 'conf' / 'location_mapping.sh'} {REPO / 'conf' / 'topology.txt'}"
STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
ROWS = [(i, f"v{i}") for i in range(200)]


@pytest.fixture(scope="module")
def kudu(cluster_spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[KuduContext]:
    with KuduContext(cluster_spark, warehouse=str(tmp_path_factory.mktemp("dswh")),
                     location_mapping_cmd=MAPPING) as ctx:
        assert all(s.root is None and s.address for s in ctx.servers), ctx.servers
        yield ctx


def load(spark: SparkSession, table: str, **options: str) -> DataFrame:
    r = spark.read.format("kudu").option("kudu.table", table)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def expected(spark: SparkSession, keep: list[tuple[int, str]]) -> DataFrame:
    return spark.createDataFrame(keep, STRUCT)


@pytest.fixture(scope="module")
def spread(cluster_spark: SparkSession, kudu: KuduContext) -> str:
    """4 hash tablets x 3 replicas over 6 hosts; half the rows written with repartition."""
    kudu.create_table("spread", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 4),)))
    df = cluster_spark.createDataFrame(ROWS, STRUCT)
    assert kudu.insert_rows(df.where("id < 100"), "spread").rows_written == 100
    assert kudu.write(df.where("id >= 100"), "spread", "insert",
                      repartition=True).rows_written == 100
    return "spread"


def _root(cluster: StandaloneCluster, kudu: KuduContext, ts: str) -> Path:
    return Path(cluster.data_root({s.uuid: s.host for s in kudu.servers}[ts]))


@contextmanager
def unreachable(cluster: StandaloneCluster, kudu: KuduContext, ts_uuids: list[str]
                ) -> Iterator[None]:
    """The data roots of ``ts_uuids`` renamed away (nothing can open them), then back."""
    moved: list[tuple[Path, Path]] = []
    try:
        for ts in ts_uuids:
            root = _root(cluster, kudu, ts)
            away = root.with_name(root.name + ".unmounted")
            os.rename(root, away)
            moved.append((away, root))
        yield
    finally:
        for away, root in moved:
            os.rename(away, root)


def wait_for_followers_to_apply(kudu: KuduContext, rounds_before: int) -> None:
    """Replicas learn a write's commit index in the commit-only round the replication
    service runs once writes pause (counted in ``settle_rounds``)."""
    wait_until(lambda: kudu._service.settle_rounds > rounds_before, 60,
               "a commit-only round telling followers the commit index")


def served(kudu: KuduContext) -> dict[str, int]:
    """Scans and file streams each host's resident tablet server served so far."""
    return {s.host: int(ping(s.address, kudu._secret.encode())["served"]) for s in kudu.servers}


def test_every_row_reads_back_exactly_wherever_spark_places_the_scan_tasks(
    cluster_spark: SparkSession, kudu: KuduContext, spread: str,
) -> None:
    everything = load(cluster_spark, spread)
    assert everything.rdd.getNumPartitions() == 4
    want = expected(cluster_spark, ROWS)
    for _ in range(3):  # tasks land on other hosts each time
        assert_df_equality(load(cluster_spark, spread), want, ignore_row_order=True,
                           ignore_metadata=True)
        assert_df_equality(kudu.read_table(spread), want, ignore_row_order=True,
                           ignore_metadata=True)
    assert_df_equality(load(cluster_spark, spread, **{"kudu.scanLocality": "leader_only"}),
                       want, ignore_row_order=True, ignore_metadata=True)
    assert_df_equality(kudu.read_table(spread, locality="leader_only"), want,
                       ignore_row_order=True, ignore_metadata=True)


@pytest.mark.parametrize("where, keep, partitions", [
    ("id = 7", lambda i: i == 7, 1),
    ("id in (3, 77, 150)", lambda i: i in (3, 77, 150), None),
    ("id >= 180 and v <> 'v190'", lambda i: i >= 180 and i != 190, 4),
    ("v like 'v1_'", lambda i: 10 <= i < 20, 4),  # not pushed: Spark filters
])
def test_pushed_predicates_prune_tablets_and_select_exactly_the_rows(
    cluster_spark: SparkSession, spread: str, where: str, keep: object,
    partitions: int | None,
) -> None:
    assert callable(keep)
    df = load(cluster_spark, spread).where(where)
    if partitions is not None:
        assert df.rdd.getNumPartitions() == partitions
    assert_df_equality(df, expected(cluster_spark, [r for r in ROWS if keep(r[0])]),
                       ignore_row_order=True, ignore_metadata=True)


def test_closest_replica_plans_every_voter_and_tasks_read_followers_leader_only_the_leader(
    kudu: KuduContext, spread: str,
) -> None:
    host_of = {s.uuid: s.host for s in kudu.servers}
    tokens = kudu.scan_tokens(spread)
    assert len(tokens) == 4
    chosen_followers = 0
    for tok in tokens:
        tablet = next(t for t in kudu.master.get_table(spread).tablets
                      if t.tablet_id == tok.tablet_id)
        assert {r.ts_uuid for r in tok.replicas} == set(tablet.voters)
        assert sorted(tok.preferred_hosts()) == sorted(host_of[v] for v in tablet.voters)
        leaders = [r for r in tok.replicas if r.leader]
        assert len(leaders) == 1
        for r in tok.replicas:  # a task on a replica's host reads that replica
            assert order_replicas(tok, r.host)[0] == r
            chosen_followers += not r.leader
        assert all(r.location for r in tok.replicas), tok.replicas
    assert chosen_followers == 8  # 2 followers x 4 tablets serve the tasks on their hosts
    # read_table's tasks are placed by those hosts: the scheduler's preferred locations of
    # its RDD (through the Arrow map that runs the scans) are each token's replica hosts.
    sc = kudu.spark.sparkContext
    rdd = kudu.read_table(spread)._jdf.queryExecution().toRdd()
    to_java = sc._jvm.scala.jdk.javaapi.CollectionConverters.asJava
    prefs = [sorted(loc.host() for loc in to_java(sc._jsc.sc().getPreferredLocs(rdd, k)))
             for k in range(len(rdd.partitions()))]
    assert prefs == [sorted(t.preferred_hosts()) for t in tokens], prefs
    for tok in kudu.scan_tokens(spread, locality="leader_only"):
        assert [r.leader for r in tok.replicas] == [True]
        assert len(tok.preferred_hosts()) == 1


def _occupy(spark: SparkSession, hosts: list[str], marks: Path) -> threading.Thread:
    """A job holding the only task slot of each of ``hosts`` until ``marks/release`` exists
    (each task says it runs by creating ``marks/running-<host>``; deadline 300 s)."""

    def hold(_: Any) -> str:
        import time

        host = current_host()
        (marks / f"running-{host}").touch()
        end = time.monotonic() + 300
        while not (marks / "release").exists() and time.monotonic() < end:
            time.sleep(0.05)  # a blocked executor slot, polled: this is the point
        return host

    t = threading.Thread(target=lambda: pinned_rdd(
        spark.sparkContext, [(h, [h]) for h in hosts]).map(hold).collect(), daemon=True)
    t.start()
    wait_until(lambda: all((marks / f"running-{h}").exists() for h in hosts), 120,
               f"blocking tasks running on {hosts}")
    return t


def test_reads_whose_tasks_run_off_the_replica_hosts_return_exactly_the_rows(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
    tmp_path: Path,
) -> None:
    kudu.create_table("far", STRUCT, keys=["id"], partitioning=PartitionSchema())
    kudu.upsert_rows(cluster_spark.createDataFrame(ROWS[:80], STRUCT), "far")
    (tablet,) = kudu.master.get_table("far").tablets
    host_of = {s.uuid: s.host for s in kudu.servers}
    replica_hosts = sorted(host_of[v] for v in tablet.voters)
    before = served(kudu)
    blocker = _occupy(cluster_spark, replica_hosts, tmp_path)
    try:
        # Every replica host's only slot is busy: Spark runs the scan task elsewhere (at
        # once for format("kudu"), after spark.locality.wait for read_table).
        assert_df_equality(load(cluster_spark, "far"), expected(cluster_spark, ROWS[:80]),
                           ignore_row_order=True, ignore_metadata=True)
        assert_df_equality(kudu.read_table("far"), expected(cluster_spark, ROWS[:80]),
                           ignore_row_order=True, ignore_metadata=True)
    finally:
        (tmp_path / "release").touch()
        blocker.join(timeout=120)
    after = served(kudu)
    remote = sum(after[h] - before[h] for h in replica_hosts)
    assert remote >= 2, f"replica hosts' servers served {remote} scans ({before} -> {after})"


def test_followers_serve_a_read_when_the_leader_root_is_gone_but_leader_only_fails(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    kudu.create_table("one", STRUCT, keys=["id"], partitioning=PartitionSchema())
    rounds = kudu._service.settle_rounds
    kudu.upsert_rows(cluster_spark.createDataFrame(ROWS[:50], STRUCT), "one")
    wait_for_followers_to_apply(kudu, rounds)
    (tablet,) = kudu.master.get_table("one").tablets
    assert tablet.leader and tablet.committed_index
    with unreachable(standalone_cluster, kudu, [tablet.leader]):
        assert_df_equality(load(cluster_spark, "one"), expected(cluster_spark, ROWS[:50]),
                           ignore_row_order=True, ignore_metadata=True)
        assert_df_equality(kudu.read_table("one"), expected(cluster_spark, ROWS[:50]),
                           ignore_row_order=True, ignore_metadata=True)
        with pytest.raises(Exception) as info:
            load(cluster_spark, "one", **{"kudu.scanLocality": "leader_only"}).collect()
    text = str(info.value)
    assert f"table one, tablet {tablet.tablet_id}: no replica served a scan" in text
    assert f"{tablet.leader}: " in text and "does not exist" in text


def test_a_tablet_with_no_reachable_replica_fails_naming_each_replica(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
) -> None:
    kudu.create_table("lost", STRUCT, keys=["id"], partitioning=PartitionSchema())
    kudu.upsert_rows(cluster_spark.createDataFrame(ROWS[:10], STRUCT), "lost")
    (tablet,) = kudu.master.get_table("lost").tablets
    replicas = [r.ts_uuid for r in tablet.replicas]
    assert len(replicas) == 3
    with unreachable(standalone_cluster, kudu, replicas), pytest.raises(Exception) as info:
        load(cluster_spark, "lost").collect()
    text = str(info.value)
    assert "ServiceUnavailableError" in text
    assert f"table lost, tablet {tablet.tablet_id}: no replica served a scan" in text
    for ts in replicas:
        assert f"{ts}: " in text
    # With the roots back, the same read succeeds.
    assert_df_equality(load(cluster_spark, "lost"), expected(cluster_spark, ROWS[:10]),
                       ignore_row_order=True, ignore_metadata=True)


def test_an_executor_killed_mid_scan_is_retried_and_every_row_comes_back_once(
    cluster_spark: SparkSession, standalone_cluster: StandaloneCluster, kudu: KuduContext,
    tmp_path: Path,
) -> None:
    """The scan task's own executor is SIGKILLed after its scanner returned a first batch:
    Spark runs the task again elsewhere and the result has every row exactly once. (Last in
    this module: the lost executor is replaced before it returns.)"""
    from pyspark_kudu.spark.pinned import executor_hosts
    from pyspark_kudu.tools.faults.inject import executor_pids

    kudu.create_table("killed", STRUCT, keys=["id"],
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(cluster_spark.createDataFrame(ROWS, STRUCT), "killed")
    # The read starts right after the write: the killed host may lead a tablet whose
    # followers do not know the commit yet. A follower that holds the entry learns it from
    # the scan token (the entry's term), so the retried task still finds a replica.
    marks = tmp_path

    def hold_first_batch(batches: Iterator[Any]) -> Iterator[Any]:
        import time

        for k, batch in enumerate(batches):
            if k == 0 and not (marks / "go").exists():
                (marks / f"scanning-{current_host()}").touch()
                end = time.monotonic() + 180
                while not (marks / "go").exists() and time.monotonic() < end:
                    time.sleep(0.05)  # the task holds its open scan until the kill
            yield batch

    got: list[Any] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            got.extend(load(cluster_spark, "killed").mapInArrow(hold_first_batch, STRUCT)
                       .collect())
        except BaseException as e:  # reported by the assertion below
            failure.append(e)

    reader = threading.Thread(target=run, daemon=True)
    reader.start()
    scanning = wait_until(lambda: sorted(marks.glob("scanning-*")), 120,
                          "a scan task holding its first batch")
    host = scanning[0].name.removeprefix("scanning-")
    pids = executor_pids(standalone_cluster, host)
    assert pids, f"no executor JVM found on {host}"
    for pid in pids:
        os.kill(pid, 9)
    wait_until(lambda: host not in executor_hosts(cluster_spark.sparkContext), 60,
               f"the driver noticing the lost executor on {host}")
    (marks / "go").touch()
    reader.join(timeout=300)
    assert not reader.is_alive(), "the read did not finish after the kill"
    assert not failure, f"the read failed: {failure[0]!r}"
    assert sorted(tuple(r) for r in got) == ROWS  # every row, none twice
    wait_until(lambda: host in executor_hosts(cluster_spark.sparkContext), 120,
               f"a new executor on {host}")
