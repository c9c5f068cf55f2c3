"""``spark.read.format("kudu")`` on the standalone cluster: scan tasks that Spark places
anywhere read a replica they can reach, and say so clearly when they cannot.

The workers' data roots are directories of this one machine, so a task on any host can open
any tablet server's root once it knows the path. The context's discovery job learns each
root (``ensure_instance`` returns it) but ``KuduContext`` keeps roots only for local-mode
virtual servers today, so the ``kudu`` fixture records them in ``kudu.servers`` (what
``describe`` reports to the data source) after checking each root's ``instance`` file names
that server. Roots made unreachable are renamed away for the duration of one read, as a
disk that is not mounted would be, and always renamed back.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.identity import verify_instance
from pyspark_kudu.testing.cluster import StandaloneCluster
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
ROWS = [(i, f"v{i}") for i in range(200)]


@pytest.fixture(scope="module")
def kudu(cluster_spark: SparkSession, standalone_cluster: StandaloneCluster,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[KuduContext]:
    with KuduContext(cluster_spark, warehouse=str(tmp_path_factory.mktemp("dswh"))) as ctx:
        roots = {s.uuid: str(standalone_cluster.data_root(s.host)) for s in ctx.servers}
        for s in ctx.servers:
            assert verify_instance(roots[s.uuid], s.uuid) == "", (s, roots[s.uuid])
        ctx.servers = [replace(s, root=roots[s.uuid]) for s in ctx.servers]
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


@contextmanager
def unreachable(kudu: KuduContext, ts_uuids: list[str]) -> Iterator[None]:
    """The data roots of ``ts_uuids`` renamed away (no task can open them), then back."""
    roots = {s.uuid: Path(s.root) for s in kudu.servers if s.uuid in ts_uuids and s.root}
    assert set(roots) == set(ts_uuids)
    moved: list[tuple[Path, Path]] = []
    try:
        for root in roots.values():
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


def test_every_row_reads_back_exactly_wherever_spark_places_the_scan_tasks(
    cluster_spark: SparkSession, kudu: KuduContext, spread: str,
) -> None:
    everything = load(cluster_spark, spread)
    assert everything.rdd.getNumPartitions() == 4
    assert_df_equality(everything, expected(cluster_spark, ROWS), ignore_row_order=True,
                       ignore_metadata=True)
    assert_df_equality(load(cluster_spark, spread, **{"kudu.scanLocality": "leader_only"}),
                       expected(cluster_spark, ROWS), ignore_row_order=True,
                       ignore_metadata=True)
    assert_df_equality(everything, kudu.read_table(spread), ignore_row_order=True,
                       ignore_metadata=True)


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


def test_followers_serve_a_read_when_the_leader_root_is_gone_but_leader_only_fails(
    cluster_spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("one", STRUCT, keys=["id"], partitioning=PartitionSchema())
    rounds = kudu._service.settle_rounds
    kudu.upsert_rows(cluster_spark.createDataFrame(ROWS[:50], STRUCT), "one")
    wait_for_followers_to_apply(kudu, rounds)
    (tablet,) = kudu.master.get_table("one").tablets
    assert tablet.leader and tablet.committed_index
    with unreachable(kudu, [tablet.leader]):
        assert_df_equality(load(cluster_spark, "one"), expected(cluster_spark, ROWS[:50]),
                           ignore_row_order=True, ignore_metadata=True)
        with pytest.raises(Exception) as info:
            load(cluster_spark, "one", **{"kudu.scanLocality": "leader_only"}).collect()
    text = str(info.value)
    assert f"table one, tablet {tablet.tablet_id}: no replica is readable" in text
    assert f"{tablet.leader}: data root" in text and "is not on this host" in text
    assert "KuduContext.read_table()" in text


def test_a_tablet_with_no_reachable_replica_fails_naming_it_and_read_table(
    cluster_spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("lost", STRUCT, keys=["id"], partitioning=PartitionSchema())
    kudu.upsert_rows(cluster_spark.createDataFrame(ROWS[:10], STRUCT), "lost")
    (tablet,) = kudu.master.get_table("lost").tablets
    replicas = [r.ts_uuid for r in tablet.replicas]
    assert len(replicas) == 3
    with unreachable(kudu, replicas), pytest.raises(Exception) as info:
        load(cluster_spark, "lost").collect()
    text = str(info.value)
    assert "ServiceUnavailableError" in text
    assert f"table lost, tablet {tablet.tablet_id}: no replica is readable" in text
    for ts in replicas:
        assert f"{ts}: data root" in text
    assert "KuduContext.read_table()" in text
    # With the roots back, the same read succeeds.
    assert_df_equality(load(cluster_spark, "lost"), expected(cluster_spark, ROWS[:10]),
                       ignore_row_order=True, ignore_metadata=True)
