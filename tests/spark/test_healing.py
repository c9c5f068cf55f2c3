"""Self-healing in local mode: the master's plan carried out by the client's Spark jobs.

A REPLACE mark (what the rebalancer or an operator sets) makes the master plan a 3-4-3
replacement; the healer adds a NON_VOTER on another tablet server, copies the tablet to it
(pinned read, shuffle, pinned write), promotes it and evicts the marked replica, whose files
a sweep then deletes. Failure detection itself (a server going quiet) runs on the
standalone cluster (tests/cluster/test_healing.py).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.master.entities import MemberType, TabletMeta
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext
from pyspark_kudu.spark.host.replica_scan import scan_replica
from tests.waiting import wait_until

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])


@pytest.fixture
def kudu(spark: SparkSession, tmp_path: Path) -> Iterator[KuduContext]:
    with KuduContext(spark, warehouse=str(tmp_path / "wh"), local_tablet_servers=4) as ctx:
        ctx.healer.stop()  # the test drives passes itself
        yield ctx


def _rows_on(ctx: KuduContext, ts: str, tablet_id: str, known_commit: int | None = None
             ) -> list[tuple[int, str]]:

    root = {s.uuid: s.root for s in ctx.servers}[ts]
    assert root is not None
    out = []
    for batch in scan_replica(root, tablet_id, None, (), None, known_commit=known_commit):
        out.extend(batch.to_pylist())
    return sorted((r["id"], r["v"]) for r in out)


def _heal_until_quiet(ctx: KuduContext, what: str) -> None:
    def quiet() -> bool:
        ctx.healer.heal_once()
        return not ctx.replication_plan()

    try:
        wait_until(quiet, 120, what)
    except AssertionError as e:
        raise AssertionError(f"{e}; healer steps: {ctx.healer.history[-5:]}; plan now: "
                             f"{ctx.replication_plan()}") from e


def _to_replace(spark: SparkSession, kudu: KuduContext, table: str, rows: int
                ) -> tuple[TabletMeta, str, str]:
    """A new RF=3 table of ``rows`` rows: its first tablet, a follower voter to replace and
    the one tablet server without a replica (the replacement's destination)."""
    kudu.create_table(table, STRUCT, keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(spark.createDataFrame([(i, table) for i in range(rows)], STRUCT), table)
    tablet = kudu.master.get_table(table).tablets[0]
    marked = next(v for v in tablet.voters if v != tablet.leader)
    spare = next(s.uuid for s in kudu.servers if tablet.replica(s.uuid) is None)
    return tablet, marked, spare


def test_a_replace_marked_replica_is_replaced_3_4_3_and_its_files_swept(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("t", STRUCT, keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    df = spark.createDataFrame([(i, f"v{i}") for i in range(300)], STRUCT)
    kudu.upsert_rows(df, "t")
    tablet = kudu.master.get_table("t").tablets[0]
    leader = tablet.leader
    marked = next(v for v in tablet.voters if v != leader)
    spare = next(s.uuid for s in kudu.servers if tablet.replica(s.uuid) is None)
    # The write returned on commit; the leader replica's log holds it up to that index.
    before = _rows_on(kudu, leader, tablet.tablet_id, known_commit=tablet.committed_index)
    assert len(before) > 100

    kudu.master.set_replace(tablet.tablet_id, marked)
    plan = kudu.replication_plan()
    assert [(a["action"], a["tablet_id"], a["ts_uuid"], a["replacing"]) for a in plan] == [
        ("add_replica", tablet.tablet_id, spare, marked)]
    _heal_until_quiet(kudu, f"replacement of {marked} in tablet {tablet.tablet_id}")

    after = next(t for t in kudu.master.get_table("t").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert sorted(after.voters) == sorted({*tablet.voters, spare} - {marked})
    assert all(r.member_type is MemberType.VOTER for r in after.replicas)
    # One action: add, copy, promote, then evict the marked one (the plan named it).
    steps = [(a.action, a.outcome, a.replacing) for a in kudu.healer.history]
    assert steps == [("add_replica", "ok", marked)], steps
    # The new replica got a tablet copy: it holds every row, as the leader does.
    assert _rows_on(kudu, spare, tablet.tablet_id) == before
    # Writes go on with the new configuration, and reads see everything.
    kudu.upsert_rows(spark.createDataFrame([(1000, "new")], STRUCT), "t")
    assert kudu.read_table("t").count() == 301

    # The evicted replica's files are deleted by a sweep (the master decides).
    root = {s.uuid: s.root for s in kudu.servers}[marked]
    assert root is not None
    gone = os.path.join(root, "tablets", tablet.tablet_id)
    assert os.path.isdir(gone)
    assert kudu.sweep_replicas() == 1
    assert not os.path.exists(gone)
    # Live replicas are never swept.
    assert kudu.sweep_replicas() == 0


def test_a_replacement_whose_eviction_failed_after_the_promotion_is_finished(
    spark: SparkSession, kudu: KuduContext, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A CI fault run: the new replica was added and promoted (four voters, committed), then
    evicting the replaced one did not commit (a host of the majority was away). The catalog
    must hear of the new voter at once, and the next passes finish the replacement."""
    from pyspark_kudu.errors import RoundFailedError
    from pyspark_kudu.spark.replication.tablet_leader import TabletLeader

    tablet, marked, spare = _to_replace(spark, kudu, "e", 60)
    evict = TabletLeader.remove_replica

    def not_committed(self: TabletLeader, ts: str) -> None:
        raise RoundFailedError(f"tablet {self.tablet.tablet_id}: configuration change remove "
                               f"{ts} did not commit (injected)")

    monkeypatch.setattr(TabletLeader, "remove_replica", not_committed)
    kudu.master.set_replace(tablet.tablet_id, marked)
    (act,) = kudu.healer.heal_once()
    assert act.action == "add_replica" and "injected" in act.outcome, act
    mid = next(t for t in kudu.master.get_table("e").tablets if t.tablet_id == tablet.tablet_id)
    assert sorted(mid.voters) == sorted({*tablet.voters, spare}), (
        "the catalog must list the promoted replica although the eviction failed")
    monkeypatch.setattr(TabletLeader, "remove_replica", evict)
    _heal_until_quiet(kudu, "the end of a replacement whose eviction had failed")
    after = next(t for t in kudu.master.get_table("e").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert sorted(after.voters) == sorted({*tablet.voters, spare} - {marked})
    kudu.upsert_rows(spark.createDataFrame([(100, "after")], STRUCT), "e")
    assert sorted(r["id"] for r in kudu.read_table("e").collect()) == [*range(60), 100]


def test_a_leader_elected_after_a_change_reports_it_and_the_catalog_catches_up(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    """A CI fault run looped for minutes: the replicas had finished a replacement (the
    marked voter evicted) but the catalog still listed the marked voter; each pass's
    ``remove_replica`` found nothing to do on a leader elected since, and that leader's
    report (configuration index 0: it had made no change itself) was ignored by the
    master as older than the catalog's."""
    tablet, marked, spare = _to_replace(spark, kudu, "c", 40)
    lead = kudu._leaders[tablet.tablet_id]

    def replace_half_reported() -> None:
        lead.add_replica(spare)
        kudu._report_config(lead)  # the catalog: four voters, at the change's index
        lead.remove_replica(marked)  # the replicas' eviction, never reported

    kudu._service.call(replace_half_reported).result()
    lead.abandon("its client lost it before reporting")
    kudu.master.set_replace(tablet.tablet_id, marked)
    assert kudu.replication_plan(), "the catalog still lists the marked voter"
    _heal_until_quiet(kudu, "the catalog learning the configuration the replicas hold")
    after = next(t for t in kudu.master.get_table("c").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert sorted(after.voters) == sorted({*tablet.voters, spare} - {marked})
    assert len(kudu.healer.history) <= 3, kudu.healer.history
    assert sorted(r["id"] for r in kudu.read_table("c").collect()) == list(range(40))


def test_replacing_the_leaders_own_replica_moves_leadership_first(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("u", STRUCT, keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(spark.createDataFrame([(i, "x") for i in range(50)], STRUCT), "u")
    tablet = kudu.master.get_table("u").tablets[0]
    kudu.master.set_replace(tablet.tablet_id, tablet.leader)
    _heal_until_quiet(kudu, "replacement of the leader's replica")
    after = next(t for t in kudu.master.get_table("u").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert tablet.leader not in after.voters and len(after.voters) == 3
    assert after.leader != tablet.leader
    assert sorted(r["id"] for r in kudu.read_table("u").collect()) == list(range(50))


def test_a_rebalancer_move_adds_the_new_replica_then_removes_the_old(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    kudu.create_table("m", STRUCT, keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    kudu.upsert_rows(spark.createDataFrame([(i, "m") for i in range(80)], STRUCT), "m")
    tablet = kudu.master.get_table("m").tablets[1]
    src = next(v for v in tablet.voters if v != tablet.leader)
    dst = next(s.uuid for s in kudu.servers if tablet.replica(s.uuid) is None)
    kudu.execute_replication_action({
        "action": "move_replica", "tablet_id": tablet.tablet_id, "table_name": "m",
        "ts_uuid": src, "to_uuid": dst, "cas_config_index": tablet.config_index})
    after = next(t for t in kudu.master.get_table("m").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert sorted(after.voters) == sorted({*tablet.voters, dst} - {src})
    assert after.config_index > tablet.config_index
    # A stale move (the configuration changed since it was planned) does nothing.
    kudu.execute_replication_action({
        "action": "move_replica", "tablet_id": tablet.tablet_id, "table_name": "m",
        "ts_uuid": dst, "to_uuid": src, "cas_config_index": tablet.config_index})
    again = next(t for t in kudu.master.get_table("m").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert again.voters == after.voters
    assert sorted(r["id"] for r in kudu.read_table("m").collect()) == list(range(80))


def test_unsafe_recovery_from_the_last_survivor_then_healing_restores_rf3(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    import shutil

    from pyspark_kudu.errors import IllegalStateError

    kudu.create_table("r", STRUCT, keys=["id"], replicas=3,
                      partitioning=PartitionSchema((HashDimension(("id",), 2),)))
    rows = [(i, f"r{i}") for i in range(120)]
    kudu.upsert_rows(spark.createDataFrame(rows, STRUCT), "r")
    kudu.upsert_rows(spark.createDataFrame([(0, "r0")], STRUCT), "r")  # commits the first
    settled = kudu._service.settle_rounds
    tablet = kudu.master.get_table("r").tablets[0]
    with pytest.raises(IllegalStateError, match="majority"):
        kudu.recover_tablet("r", tablet.tablet_id)
    # The commit-only round that follows the last write by ``settle_delay_s`` writes the
    # followers' applied index: deleting their directories meanwhile races with it.
    wait_until(lambda: kudu._service.settle_rounds > settled, 60,
               "the settle round after the last write")
    # Two of its three replicas lose their disks.
    roots = {s.uuid: s.root for s in kudu.servers}
    lost = [v for v in tablet.voters if v != tablet.leader]
    for v in lost:
        shutil.rmtree(os.path.join(str(roots[v]), "tablets", tablet.tablet_id))
    report = kudu.recover_tablet("r", tablet.tablet_id)
    assert report["survivor"] == tablet.leader and sorted(report["lost"]) == sorted(lost)
    after = next(t for t in kudu.master.get_table("r").tablets
                 if t.tablet_id == tablet.tablet_id)
    assert after.voters == (tablet.leader,)
    _heal_until_quiet(kudu, "re-replication after the unsafe recovery")
    healed = next(t for t in kudu.master.get_table("r").tablets
                  if t.tablet_id == tablet.tablet_id)
    assert len(healed.voters) == 3 and tablet.leader in healed.voters
    assert sorted(tuple(r) for r in kudu.read_table("r").collect()) == rows
    kudu.upsert_rows(spark.createDataFrame([(500, "after")], STRUCT), "r")
    assert kudu.read_table("r").count() == 121


def test_the_fault_harness_diagnosis_shows_the_plan_the_catalog_and_the_raft_view(
    spark: SparkSession, kudu: KuduContext,
) -> None:
    """What a fault run records when replication does not come back: here a REPLACE mark
    left unhealed, so the plan has its action and each tablet its catalog and Raft view."""
    import json

    from pyspark_kudu.tools.faults.diagnose import replication_state

    tablet, marked, _ = _to_replace(spark, kudu, "d", 20)
    kudu.master.set_replace(tablet.tablet_id, marked)
    state = json.loads(json.dumps(replication_state(kudu), default=str))
    assert [a["tablet_id"] for a in state["plan"]] == [tablet.tablet_id], state["plan"]
    assert state["suspect_hosts"] == [] and len(state["servers"]) == 4, state["servers"]
    assert state["healer"]["running"] is False  # the fixture stopped the daemon
    row = next(t for t in state["tablets"] if t["tablet"] == tablet.tablet_id)
    assert {r["ts"] for r in row["replicas"] if r["replace"]} == {marked}
    assert sorted(row["raft_voters"]) == sorted(tablet.voters), row
