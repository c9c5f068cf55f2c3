"""Embedded masters: 1 or 3 replicas in process, durable, with the seed's behaviours."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pyspark_kudu.consensus.types import Role
from pyspark_kudu.errors import (
    AlreadyPresentError,
    InvalidArgumentError,
    NotFoundError,
    NotLeaderError,
    ServiceUnavailableError,
)
from pyspark_kudu.master.catalog_replica import ReplicaOptions
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TableState, TabletState
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.schema import ColumnSchema

from .conftest import FAST, SCHEMA, register_tservers, wait_until


def test_single_replica_serves_ddl_and_a_new_driver_reopens_the_catalog(tmp_path: Path) -> None:
    root = str(tmp_path / "wh")
    with EmbeddedMaster(root, 1, options=FAST) as g:
        register_tservers(g, 3)
        with g.client() as c:
            c.create_table("events", SCHEMA, PartitionSchema((HashDimension(("id",), 4),)))
            c.alter_table("events", add_columns=[ColumnSchema("extra", "int32")])
            c.create_table("gone", SCHEMA, replication_factor=1)
            c.delete_table("gone")
            before = g.leader().catalog
    assert (Path(root) / "masters" / "m1" / "meta").exists()
    with EmbeddedMaster(root, 1, options=FAST) as g2, g2.client() as c2:
        assert c2.list_tables() == ["events"]
        loc = c2.get_table("events")
        assert len(loc.tablets) == 4 and loc.table.schema.has_column("extra")
        after = g2.leader().catalog
        assert after.tables == before.tables and after.tablets == before.tablets
        assert after.tables[before.names.get("events", "")].state is TableState.ALTERING


def test_reopening_with_another_replica_count_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "wh")
    EmbeddedMaster(root, 1, options=FAST).close()
    with pytest.raises(InvalidArgumentError, match="open it with replicas=1"):
        EmbeddedMaster(root, 3, options=FAST)


def test_three_replicas_reopen_after_restart_with_the_same_catalog(tmp_path: Path) -> None:
    root = str(tmp_path / "wh")
    with EmbeddedMaster(root, 3, options=FAST) as g:
        register_tservers(g, 3)
        with g.client() as c:
            for i in range(5):
                c.create_table(f"t{i}", SCHEMA)
    with EmbeddedMaster(root, 3, options=FAST) as g2, g2.client() as c2:
        assert c2.list_tables() == [f"t{i}" for i in range(5)]


def test_followers_reject_ddl_with_a_hint_naming_the_leader(group3: EmbeddedMaster) -> None:
    register_tservers(group3)
    leader = group3.leader()
    follower = next(m for m in group3.ids if m != leader.id)
    body = {"name": "t", "schema": SCHEMA.to_dict(), "replication_factor": 3}
    with pytest.raises(NotLeaderError) as info:
        group3.services[follower].handle("create_table", body)
    assert info.value.leader_hint == group3.addresses[leader.id]
    assert "not the leader" in str(info.value)


def test_followers_track_heartbeats_but_only_the_leader_registers(group3: EmbeddedMaster) -> None:
    from pyspark_kudu.master.entities import TServerMeta

    leader = group3.leader()
    follower = next(m for m in group3.ids if m != leader.id)
    ts = TServerMeta("lonely", "h", 7050, "/d")
    with group3.client() as c:
        out = c.heartbeat_to(group3.addresses[follower], ts)
    assert out["leader"] is False and out["leader_hint"] == group3.addresses[leader.id]
    assert "lonely" in group3.services[follower].tserver_liveness()
    assert "lonely" not in group3.replicas[follower].catalog.tservers


def test_follower_reads_need_a_staleness_bound(group3: EmbeddedMaster) -> None:
    register_tservers(group3)
    leader = group3.leader()
    follower = next(m for m in group3.ids if m != leader.id)
    with group3.client() as c:
        c.create_table("t", SCHEMA)
    svc = group3.services[follower]
    wait_until(lambda: "t" in group3.replicas[follower].catalog.names, 5, "replication to follower")
    with pytest.raises(NotLeaderError, match="accepts no staleness"):
        svc.handle("list_tables", {})
    wait_until(lambda: group3.replicas[follower].staleness() < 1.0, 5, "follower freshness")
    tables = svc.handle("list_tables", {"max_staleness_s": 1.0})["tables"]
    assert [t["name"] for t in tables] == ["t"]
    group3.network.isolate(follower)
    wait_until(lambda: group3.replicas[follower].staleness() > 0.3, 5, "follower going stale")
    with pytest.raises(NotLeaderError, match=r"stale, more than the 0\.30 s allowed"):
        svc.handle("list_tables", {"max_staleness_s": 0.3})
    assert svc.handle("list_tables", {"max_staleness_s": 60})["tables"]


def test_losing_the_leader_elects_another_and_the_old_one_catches_up(
    group3: EmbeddedMaster,
) -> None:
    register_tservers(group3)
    with group3.client() as c:
        c.create_table("before", SCHEMA)
        old = group3.leader().id
        group3.stop_replica(old)
        c.create_table("during", SCHEMA)  # retried until a new leader answers
        new = group3.leader()
        assert new.id != old
        group3.start_replica(old)
        wait_until(lambda: group3.replicas[old].status().applied >= new.status().applied, 10,
                   f"restarted master {old} catching up")
        assert set(group3.replicas[old].catalog.names) == {"before", "during"}


def test_readers_never_see_a_half_created_table(group3: EmbeddedMaster) -> None:
    register_tservers(group3)
    stop = threading.Event()
    problems: list[str] = []

    def watch() -> None:
        while not stop.is_set():
            for rep in list(group3.replicas.values()):
                cat = rep.catalog
                for name, tid in cat.names.items():
                    t = cat.tables[tid]
                    if len(t.tablet_ids) != 3 or any(x not in cat.tablets for x in t.tablet_ids):
                        problems.append(f"{rep.id} saw {name} with tablets {t.tablet_ids}")

    w = threading.Thread(target=watch)
    w.start()
    try:
        with group3.client() as c:
            for i in range(15):
                c.create_table(f"t{i}", SCHEMA, PartitionSchema((HashDimension(("id",), 3),)))
                if i % 3 == 0:
                    c.delete_table(f"t{i}")
    finally:
        stop.set()
        w.join()
    assert problems == []


def test_retried_ddl_ends_already_present_or_not_found(group3: EmbeddedMaster) -> None:
    register_tservers(group3)
    with group3.client() as c:
        c.create_table("t", SCHEMA)
        with pytest.raises(AlreadyPresentError, match="'t' already exists"):
            c.create_table("t", SCHEMA)
        c.alter_table("t", rename_to="u")
        with pytest.raises(NotFoundError, match="'t'"):
            c.alter_table("t", rename_to="u")
        c.delete_table("u")
        with pytest.raises(NotFoundError):
            c.delete_table("u")


def test_new_leader_asks_for_a_full_report_and_re_drives_deletes(group3: EmbeddedMaster) -> None:
    tss = register_tservers(group3)
    with group3.client() as c:
        c.create_table("doomed", SCHEMA)
        loc = c.get_table("doomed")
        tablet = loc.tablets[0].tablet_id
        report = {"tablet_id": tablet, "term": 1, "leader": tss[0].uuid}
        leader = group3.leader()
        first = c.heartbeat_to(group3.addresses[leader.id], tss[0], [report], full=True)
        assert first["leader"] and not first["needs_full_report"] and first["actions"] == []
        c.delete_table("doomed")
        old = leader.id
        group3.stop_replica(old)  # dies before telling ts0 to delete its replica
        new = group3.leader(timeout_s=10)
        addr = group3.addresses[new.id]
        hb = c.heartbeat_to(addr, tss[0])
        assert hb["leader"] and hb["needs_full_report"]
        full = c.heartbeat_to(addr, tss[0], [report], full=True)
        assert [(a["action"], a["tablet_id"]) for a in full["actions"]] == [
            ("delete_tablet", tablet)]
        assert not full["needs_full_report"]
        cat = new.catalog
        assert cat.tablets[tablet].state is TabletState.DELETED


def test_tablet_reports_are_one_entry_and_update_leader_and_config(
    group3: EmbeddedMaster,
) -> None:
    tss = register_tservers(group3)
    with group3.client() as c:
        c.create_table("t", SCHEMA)
        tb = c.get_table("t").tablets[0]
        leader = group3.leader()
        before = leader.status().commit
        rep = {"tablet_id": tb.tablet_id, "term": 3, "leader": tb.voters[0],
               "committed_index": 17, "config_index": 2,
               "replicas": [{"ts": u, "type": "VOTER"} for u in tb.voters]}
        c.heartbeat_to(group3.addresses[leader.id], tss[0], [rep])
        assert leader.status().commit == before + 1
        c.heartbeat_to(group3.addresses[leader.id], tss[0], [rep])  # unchanged: no entry
        assert leader.status().commit == before + 1
        got = c.get_table("t").tablets[0]
        assert (got.state, got.leader, got.committed_index, got.reported_term) == (
            TabletState.RUNNING, tb.voters[0], 17, 3)


def test_snapshots_compact_the_log_and_restore_on_restart(tmp_path: Path) -> None:
    opts = ReplicaOptions(tick_interval_s=0.02, election_ticks=15, snapshot_every=10,
                          keep_entries=3)
    root = str(tmp_path / "wh")
    with EmbeddedMaster(root, 3, options=opts) as g:
        register_tservers(g)
        with g.client() as c:
            lagging = next(m for m in g.ids if m != g.leader().id)
            g.stop_replica(lagging)
            for i in range(25):
                c.create_table(f"t{i}", SCHEMA)
            lead = g.leader()
            assert lead._storage.first_index() > 10  # compacted
            g.start_replica(lagging)  # needs entries that are gone: gets the snapshot
            wait_until(lambda: g.replicas[lagging].status().applied >= lead.status().applied,
                       10, f"{lagging} catching up from a snapshot")
            assert len(g.replicas[lagging].catalog.names) == 25
    with EmbeddedMaster(root, 3, options=opts) as g2, g2.client() as c2:
        assert len(c2.list_tables()) == 25


def test_an_isolated_leader_stops_serving_reads_before_another_can_be_elected(
    group3: EmbeddedMaster,
) -> None:
    """Raft §6.4.1 read lease: a leader that lost its quorum refuses leader reads (clients
    retry elsewhere) instead of serving a catalog a newer leader may already have changed."""
    register_tservers(group3)
    with group3.client() as c:
        c.create_table("t", SCHEMA)
    old = group3.leader()
    svc = group3.services[old.id]
    wait_until(lambda: old.status().read_lease, 5, "the leader's read lease")
    assert [t["name"] for t in svc.handle("list_tables", {})["tables"]] == ["t"]
    group3.network.isolate(old.id)
    wait_until(lambda: not old.status().read_lease, 5, "the isolated leader losing its lease")
    # The old leader may still believe it leads (check-quorum steps it down later), but it
    # must not answer a read that accepts no staleness.
    if old.status().role is Role.LEADER:
        with pytest.raises(ServiceUnavailableError, match="no read lease"):
            svc.handle("list_tables", {})
    new = wait_until(lambda: next((r for i, r in group3.replicas.items()
                                   if i != old.id and r.status().role is Role.LEADER), None),
                     10, "a new leader among the connected masters")
    assert new.id != old.id
