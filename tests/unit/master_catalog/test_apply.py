"""The catalog state machine: one record per logical operation, applied by a pure function."""

from __future__ import annotations

import pytest

from pyspark_kudu.consensus.messages import ConfChange, ConfChangeType
from pyspark_kudu.errors import (
    AlreadyPresentError,
    IllegalStateError,
    InvalidArgumentError,
    NotFoundError,
)
from pyspark_kudu.master.catalog import Catalog, apply, apply_conf_change, apply_entry
from pyspark_kudu.master.entities import (
    MemberType,
    ReplicaMeta,
    TableState,
    TabletState,
    check_table_move,
    check_tablet_move,
)
from pyspark_kudu.master.records import (
    AddColumn,
    AlterTable,
    DeleteTable,
    DropColumn,
    RenameColumn,
    RenameTable,
    SetReplaceMark,
    TabletReport,
    UpdateTablets,
    encode_record,
)
from pyspark_kudu.schema import ColumnSchema

from .helpers import HASH2_RANGE2, create, with_tservers


@pytest.fixture
def base() -> Catalog:
    return with_tservers(3)


def test_create_table_adds_table_and_all_its_tablets_in_one_record(base: Catalog) -> None:
    rec = create(base, partition_schema=HASH2_RANGE2)
    c = apply(base, rec, 10)
    t = c.table_by_name("t1")
    assert c.index == 10
    assert len(t.tablet_ids) == 4
    assert [tb.state for tb in c.tablets_of(t)] == [TabletState.CREATING] * 4
    assert sum(c.replica_counts.values()) == 12
    assert t.partition_schema["range_columns"] == ["ts"]


def test_apply_never_mutates_its_input(base: Catalog) -> None:
    before = base.to_snapshot()
    apply(base, create(base), 10)
    assert base.to_snapshot() == before
    assert "t1" not in base.names


def test_duplicate_name_is_already_present_and_changes_nothing(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    again = create(base, prefix="other")  # built before the first one committed
    with pytest.raises(AlreadyPresentError, match="'t1' already exists"):
        apply(c, again, 11)
    after, err = apply_entry(c, encode_record(again), 11)
    assert isinstance(err, AlreadyPresentError)
    assert after.index == 11 and after.tables == c.tables and after.tablets == c.tablets


def test_create_on_unregistered_tserver_is_refused(base: Catalog) -> None:
    rec = create(base)
    with pytest.raises(NotFoundError, match="not registered"):
        apply(Catalog(), rec, 1)


def test_delete_keeps_tombstones_and_frees_the_name(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    tid = c.names["t1"]
    c = apply(c, DeleteTable(tid), 11)
    assert "t1" not in c.names
    assert c.tables[tid].state is TableState.DELETED
    assert all(c.tablets[x].state is TabletState.DELETED for x in c.tables[tid].tablet_ids)
    assert sum(c.replica_counts.values()) == 0
    with pytest.raises(NotFoundError, match="was deleted"):
        apply(c, DeleteTable(tid), 12)
    c2 = apply(c, create(c, prefix="new"), 12)
    assert c2.names["t1"] != tid and c2.tables[tid].state is TableState.DELETED


def test_alter_applies_all_steps_or_none(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    c = apply(c, create(c, name="t2", prefix="b"), 11)
    tid = c.names["t1"]
    bad = AlterTable(tid, (AddColumn(ColumnSchema("extra", "int32")), RenameTable("t2")))
    with pytest.raises(AlreadyPresentError, match="'t2'"):
        apply(c, bad, 12)
    good = AlterTable(tid, (AddColumn(ColumnSchema("extra", "int32")), RenameTable("t3")))
    c3 = apply(c, good, 12)
    t = c3.table_by_name("t3")
    assert "t1" not in c3.names and t.schema.has_column("extra")
    assert t.schema_version == 1 and t.state is TableState.ALTERING


def test_rename_only_keeps_schema_version_and_running_state(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    c = apply(c, AlterTable(c.names["t1"], (RenameTable("renamed"),)), 11)
    t = c.table_by_name("renamed")
    assert t.schema_version == 0 and t.state is TableState.RUNNING


@pytest.mark.parametrize(
    ("step", "error", "text"),
    [
        (AddColumn(ColumnSchema("v", "int32")), AlreadyPresentError, "already exists"),
        (AddColumn(ColumnSchema("nn", "int32", nullable=False)), InvalidArgumentError,
         "must have a default"),
        (DropColumn("id"), InvalidArgumentError, "cannot remove a key column: id"),
        (DropColumn("nope"), NotFoundError, "'nope' not found"),
        (RenameColumn("v", "ts"), AlreadyPresentError, "already exists"),
        (RenameColumn("nope", "x"), NotFoundError, "'nope' not found"),
    ],
)
def test_invalid_alter_steps_are_rejected_with_the_column_named(
    base: Catalog, step: object, error: type[Exception], text: str,
) -> None:
    c = apply(base, create(base), 10)
    with pytest.raises(error, match=text):
        apply(c, AlterTable(c.names["t1"], (step,)), 11)  # type: ignore[arg-type]


def test_renaming_a_key_column_renames_it_in_key_and_partition_schema(base: Catalog) -> None:
    c = apply(base, create(base, partition_schema=HASH2_RANGE2), 10)
    c = apply(c, AlterTable(c.names["t1"], (RenameColumn("ts", "time"), DropColumn("v"))), 11)
    t = c.table_by_name("t1")
    assert t.schema.primary_key == ("id", "time") and t.schema.names == ["id", "time"]
    assert t.partition_schema["range_columns"] == ["time"]


def test_table_returns_to_running_when_every_tablet_reports_the_new_schema(
    base: Catalog,
) -> None:
    c = apply(base, create(base, partition_schema=HASH2_RANGE2), 10)
    tid = c.names["t1"]
    c = apply(c, AlterTable(tid, (AddColumn(ColumnSchema("x", "int8")),)), 11)
    tablets = c.tables[tid].tablet_ids
    first = [TabletReport(x, 1, "ts0", 5, schema_version=1) for x in tablets[:3]]
    c = apply(c, UpdateTablets("ts0", tuple(first)), 12)
    assert c.tables[tid].state is TableState.ALTERING
    c = apply(c, UpdateTablets("ts0", (TabletReport(tablets[3], 1, "ts0", 5, schema_version=1),)),
              13)
    assert c.tables[tid].state is TableState.RUNNING


def test_reports_are_fenced_by_term_and_config_index(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    tb_id = c.tables[c.names["t1"]].tablet_ids[0]
    reps = (ReplicaMeta("ts0"), ReplicaMeta("ts1"))
    c = apply(c, UpdateTablets("ts0", (TabletReport(tb_id, 5, "ts0", 40, 7, reps),)), 11)
    tb = c.tablets[tb_id]
    assert (tb.state, tb.leader, tb.reported_term, tb.committed_index) == (
        TabletState.RUNNING, "ts0", 5, 40)
    assert tb.voters == ("ts0", "ts1") and c.replica_counts["ts2"] == 0
    stale = TabletReport(tb_id, 4, "ts2", 99, 9, (ReplicaMeta("ts2"),))
    assert apply(c, UpdateTablets("ts2", (stale,)), 12).tablets[tb_id] == tb
    old_config = TabletReport(tb_id, 5, "ts0", 41, 6, (ReplicaMeta("ts2"),))
    c2 = apply(c, UpdateTablets("ts0", (old_config,)), 12)
    assert c2.tablets[tb_id].voters == ("ts0", "ts1") and c2.tablets[tb_id].committed_index == 41


def test_reports_about_orphans_and_tombstones_change_nothing(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    tid = c.names["t1"]
    tb_id = c.tables[tid].tablet_ids[0]
    c = apply(c, DeleteTable(tid), 11)
    c2 = apply(c, UpdateTablets("ts0", (TabletReport(tb_id, 9, "ts0", 1),
                                        TabletReport("orphan", 1, "ts0", 1))), 12)
    assert c2.tablets == c.tablets and "orphan" not in c2.tablets


def test_replace_mark_survives_reports_until_the_replica_leaves(base: Catalog) -> None:
    c = apply(base, create(base), 10)
    tb_id = c.tables[c.names["t1"]].tablet_ids[0]
    c = apply(c, SetReplaceMark(tb_id, "ts1"), 11)
    assert c.tablets[tb_id].replica("ts1") == ReplicaMeta("ts1", MemberType.VOTER, True)
    same = tuple(ReplicaMeta(u) for u in ("ts0", "ts1", "ts2"))
    c = apply(c, UpdateTablets("ts0", (TabletReport(tb_id, 2, "ts0", 3, 4, same),)), 12)
    assert c.tablets[tb_id].replica("ts1").replace  # type: ignore[union-attr]
    with pytest.raises(NotFoundError, match="no replica on tablet server ts9"):
        apply(c, SetReplaceMark(tb_id, "ts9"), 13)


def test_snapshot_round_trip_rebuilds_every_index(base: Catalog) -> None:
    c = apply(base, create(base, partition_schema=HASH2_RANGE2), 10)
    c = apply(c, create(c, name="gone", prefix="g"), 11)
    c = apply(c, DeleteTable(c.names["gone"]), 12)
    c = apply_conf_change(c, ConfChange(ConfChangeType.ADD_VOTER, "m1", b"127.0.0.1:7051"), 13)
    back = Catalog.from_snapshot(c.to_snapshot())
    assert back == c
    assert back.to_snapshot() == c.to_snapshot()


def test_master_addresses_follow_conf_changes() -> None:
    c = apply_conf_change(Catalog(), ConfChange(ConfChangeType.ADD_LEARNER, "m4", b"h:7054"), 5)
    assert dict(c.masters) == {"m4": "h:7054"}
    c = apply_conf_change(c, ConfChange(ConfChangeType.ADD_VOTER, "m4"), 6)
    assert dict(c.masters) == {"m4": "h:7054"}
    c = apply_conf_change(c, ConfChange(ConfChangeType.REMOVE, "m4"), 7)
    assert dict(c.masters) == {} and c.index == 7


def test_the_same_log_gives_the_same_catalog_bytes(base: Catalog) -> None:
    recs = [create(base, name=f"t{i}", prefix=f"p{i}") for i in range(5)]

    def run() -> bytes:
        c = base
        for i, r in enumerate(recs):
            c, _ = apply_entry(c, encode_record(r), 10 + i)
        return c.to_snapshot()

    assert run() == run()


def test_lifecycle_tables_refuse_illegal_moves() -> None:
    with pytest.raises(IllegalStateError, match="was deleted"):
        check_table_move("t", TableState.DELETED, TableState.RUNNING)
    with pytest.raises(IllegalStateError, match="DELETED -> RUNNING"):
        check_tablet_move("x", TabletState.DELETED, TabletState.RUNNING)
    assert check_table_move("t", None, TableState.RUNNING) is TableState.RUNNING


def test_an_empty_entry_only_advances_the_index(base: Catalog) -> None:
    after, err = apply_entry(base, b"", 42)
    assert err is None and after.index == 42 and after.tservers == base.tservers
