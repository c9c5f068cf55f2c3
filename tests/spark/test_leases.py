"""Tablet leadership leases in local mode: two KuduContexts of one application write the same
tablets through one master; the second forwards to the first instead of fencing it
(:mod:`pyspark_kudu.spark.replication.lease_keeper`, the session service's ``lead_*`` methods)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.types import LongType, StringType, StructField, StructType

from pyspark_kudu.errors import RowWriteError
from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.localcluster import free_ports
from pyspark_kudu.master.server import MasterServer, MasterServerConfig
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.spark.api.context import KuduContext, WriteProgress
from pyspark_kudu.spark.replication.session_client import SessionAddress

STRUCT = StructType([StructField("id", LongType(), False), StructField("v", StringType(), True)])
HASH2 = PartitionSchema((HashDimension(("id",), 2),))


@pytest.fixture
def master_address(tmp_path: Path) -> Iterator[str]:
    (port,) = free_ports(1)
    addr = f"127.0.0.1:{port}"
    fast = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, heartbeat_ticks=2)
    master = MasterServer(MasterServerConfig("m1", {"m1": addr}, str(tmp_path / "master"),
                                             replica=fast)).start()
    try:
        yield addr
    finally:
        master.stop()


def terms(ctx: KuduContext) -> dict[str, int]:
    out = {}
    for tid, lead in ctx._leaders.items():
        assert lead.node is not None
        out[tid] = lead.node.term
    return out


def test_a_second_client_forwards_to_the_lease_holder_and_takes_over_when_it_closes(
    spark: SparkSession, master_address: str, tmp_path: Path,
) -> None:
    wh = str(tmp_path / "wh")
    first = KuduContext(spark, master=master_address, warehouse=wh, heal=False,
                        local_tablet_servers=4)
    try:
        first.create_table("shared", STRUCT, keys=["id"], replicas=3, partitioning=HASH2)
        first.upsert_rows(spark.createDataFrame([(i, "a") for i in range(10)], STRUCT),
                          "shared")
        led = terms(first)
        assert len(led) == 2
        with KuduContext(spark, master=master_address, warehouse=wh, heal=False,
                         local_tablet_servers=4) as second:
            assert second.client_id != first.client_id
            seen: list[WriteProgress] = []
            got = second.upsert_rows(spark.createDataFrame(
                [(i, "b") for i in range(10, 20)], STRUCT), "shared")
            assert got.rows_written == 10 and got.tablets == 2
            # Forwarded: the second client led nothing and the first was not fenced.
            assert second._leaders == {} and terms(first) == led
            # Writers take turns without a single fenced write.
            for k in range(3):
                first.upsert_rows(spark.createDataFrame([(100 + k, "a")], STRUCT), "shared")
                second.write(spark.createDataFrame([(200 + k, "b")], STRUCT), "shared",
                             "insert", progress=seen.append)
            assert seen and seen[-1].rows_done == seen[-1].rows_total == 1
            assert terms(first) == led and second._leaders == {}
            # Per-row errors travel back through the forward.
            with pytest.raises(RowWriteError) as info:
                second.insert_rows(spark.createDataFrame([(0, "dup"), (300, "new")], STRUCT),
                                   "shared")
            assert info.value.rows_written == 1
            assert [(r, s) for _, r, s, _ in info.value.errors] == [({"id": 0}, "AlreadyPresent")]
            # A linearizable read asks the leader for its read points: it sees the first
            # client's latest writes without electing the second.
            first.upsert_rows(spark.createDataFrame([(1, "a2")], STRUCT), "shared")
            lin = {r["id"]: r["v"] for r in second.read_table(
                "shared", read_mode="linearizable").collect()}
            assert lin[1] == "a2" and lin[0] == "a" and lin[15] == "b" and lin[300] == "new"
            assert len(lin) == 10 + 10 + 3 + 3 + 1
            assert second._leaders == {} and terms(first) == led
            # A replication action is carried out by the leading client.
            tablet = second.master.get_table("shared").tablets[0]
            src = next(v for v in tablet.voters if v != tablet.leader)
            dst = next(s.uuid for s in second.servers if tablet.replica(s.uuid) is None)
            second.execute_replication_action({
                "action": "move_replica", "tablet_id": tablet.tablet_id,
                "table_name": "shared", "ts_uuid": src, "to_uuid": dst,
                "cas_config_index": tablet.config_index})
            after = next(t for t in second.master.get_table("shared").tablets
                         if t.tablet_id == tablet.tablet_id)
            assert sorted(after.voters) == sorted({*tablet.voters, dst} - {src})
            assert second._leaders == {} and terms(first) == led
            # The first client closes: its leases are released and the second leads now.
            first.close()
            late = {400 + i: "c" for i in range(10)}  # rows of both tablets
            second.upsert_rows(spark.createDataFrame(list(late.items()), STRUCT), "shared")
            now = terms(second)
            assert set(now) == set(led) and all(now[t] > led[t] for t in led), (now, led)
            final = {r["id"]: r["v"] for r in second.read_table("shared").collect()}
            assert final == {**lin, **late}
    finally:
        first.close()


def test_a_holder_that_is_gone_or_no_longer_leads_is_routed_around_once_its_lease_lapses(
    spark: SparkSession, master_address: str, tmp_path: Path,
) -> None:
    """The holder's process died without releasing (nothing listens at its address), or the
    address answers but that client does not hold the lease (``NotLeaderError``): nothing is
    proposed there, and the writer routes again until the lease lapses, then leads."""
    wh = str(tmp_path / "wh")
    with KuduContext(spark, master=master_address, warehouse=wh, heal=False) as creator:
        for name in ("gone", "moved"):
            creator.create_table(name, STRUCT, keys=["id"], replicas=3, partitioning=HASH2)
    # The creator closed: its leases are released. Plant leases of clients that cannot lead.
    with KuduContext(spark, master=master_address, warehouse=wh, heal=False) as bystander, \
            KuduContext(spark, master=master_address, warehouse=wh, heal=False) as writer:
        gone = [t.tablet_id for t in writer.master.get_table("gone").tablets]
        moved = [t.tablet_id for t in writer.master.get_table("moved").tablets]
        (dead_port,) = free_ports(1)
        lapse_s = 4.0
        writer.master.tablet_lease("ghost", gone, ttl_s=lapse_s, endpoint=SessionAddress(
            "127.0.0.1", dead_port, "x").to_dict())
        writer.master.tablet_lease("ghost", moved, ttl_s=lapse_s,
                                   endpoint=bystander.session_service.address.to_dict())
        t0 = time.monotonic()
        for name in ("gone", "moved"):
            rows = [(i, name) for i in range(10)]
            got = writer.upsert_rows(spark.createDataFrame(rows, STRUCT), name)
            assert got.rows_written == 10
            assert {r["id"]: r["v"] for r in writer.read_table(name).collect()} == dict(rows)
        # Nothing could be written before the planted leases lapsed.
        assert time.monotonic() - t0 >= lapse_s - 0.5
        assert set(writer._leaders) == set(gone) | set(moved)
        assert bystander._leaders == {}  # it refused the forwarded write without leading
        holders = writer.master.tablet_lease("someone", gone + moved, ttl_s=1.0)
        assert {h["client"] for h in holders.values()} == {writer.client_id}


def test_a_lease_that_lapsed_idle_is_taken_back_without_an_election_unless_another_held_it(
    spark: SparkSession, master_address: str, tmp_path: Path,
) -> None:
    """A tablet idle past ``idle_s`` has its lease released; the writer's next write takes it
    back. If no other client held it meanwhile (the master's ``continued``) the leader kept
    from before goes on (same term: no election; at 50M rows an election cost a 1-row
    write 13-16 s); if another client held it, the writer elects again (a higher term)."""
    wh = str(tmp_path / "wh")
    with KuduContext(spark, master=master_address, warehouse=wh, heal=False) as writer:
        writer.create_table("idle", STRUCT, keys=["id"], replicas=3, partitioning=HASH2)
        writer.upsert_rows(spark.createDataFrame([(i, "a") for i in range(10)], STRUCT), "idle")
        led = terms(writer)
        tids = sorted(led)
        writer.leases.idle_s = 0.5

        def released() -> bool:
            return not any(writer.leases.holds(t) for t in tids)

        deadline = time.monotonic() + 30
        while not released():
            assert time.monotonic() < deadline, "the idle leases were not released in 30 s"
            time.sleep(0.1)  # polling a condition under a deadline
        writer.upsert_rows(spark.createDataFrame([(i, "b") for i in range(10)], STRUCT), "idle")
        assert terms(writer) == led, "no other client held the leases: no election"

        # Released again, and this time another client holds them for a moment.
        deadline = time.monotonic() + 30
        while not released():
            assert time.monotonic() < deadline, "the idle leases were not released in 30 s"
            time.sleep(0.1)
        other = writer.master.tablet_lease("other", tids, ttl_s=0.5,
                                           endpoint=SessionAddress("127.0.0.1", 1, "x").to_dict())
        assert {h["client"] for h in other.values()} == {"other"}
        # The write routes around the planted holder (nothing listens there) until its
        # lease lapses, then leads.
        writer.upsert_rows(spark.createDataFrame([(i, "c") for i in range(10)], STRUCT), "idle")
        now = terms(writer)
        assert set(now) == set(led) and all(now[t] > led[t] for t in led), (now, led)
        assert {r["id"]: r["v"] for r in writer.read_table("idle").collect()} == {
            i: "c" for i in range(10)}
