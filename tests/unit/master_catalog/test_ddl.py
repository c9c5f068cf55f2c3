"""Building DDL records on the leader, and the work it re-drives from tablet reports."""

from __future__ import annotations

import random

import pytest

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.master.catalog import Catalog, apply
from pyspark_kudu.master.ddl import build_alter_table, build_create_table
from pyspark_kudu.master.entities import ConstraintMeta, MemberType, ReplicaMeta
from pyspark_kudu.master.records import (
    AddColumn,
    AlterTable,
    DeleteTable,
    DropColumn,
    RenameTable,
    SetReplaceMark,
    TabletReport,
    UpdateTablets,
)
from pyspark_kudu.master.redrive import pending_actions
from pyspark_kudu.schema import ColumnSchema

from .helpers import HASH2_RANGE2, SCHEMA, create, id_factory, with_tservers


def test_tablets_are_the_partitions_with_bounds_and_distinct_replicas() -> None:
    rec = create(with_tservers(5), partition_schema=HASH2_RANGE2)
    bounds = [(t.partition.hash_buckets, t.partition.range_lower, t.partition.range_upper)
              for t in rec.tablets]
    assert bounds == [((0,), (0,), (100,)), ((0,), (100,), (200,)),
                      ((1,), (0,), (100,)), ((1,), (100,), (200,))]
    assert all(len(set(t.voters)) == 3 for t in rec.tablets)


@pytest.mark.parametrize(("rf", "text"), [
    (2, "illegal replication factor 2: replication factor must be odd"),
    (5, "not enough live tablet servers"),
])
def test_replication_factor_errors_use_kudu_texts(rf: int, text: str) -> None:
    with pytest.raises(InvalidArgumentError, match=text):
        create(with_tservers(3), rf=rf)


def test_only_live_servers_receive_replicas() -> None:
    c = with_tservers(4)
    rec = build_create_table(c, name="t", schema=SCHEMA, partition_schema=None,
                             replication_factor=3, constraint=None,
                             live={"ts0", "ts1", "ts3"}, rng=random.Random(1),
                             id_factory=id_factory())
    assert set(rec.tablets[0].voters) == {"ts0", "ts1", "ts3"}


def test_constraint_limits_the_eligible_servers() -> None:
    c = with_tservers(6)
    with pytest.raises(InvalidArgumentError, match="not enough live tablet servers"):
        build_create_table(c, name="t", schema=SCHEMA, partition_schema=None,
                           replication_factor=3, constraint=ConstraintMeta("/rack1"),
                           live=set(c.tservers), rng=random.Random(1), id_factory=id_factory())
    rec = build_create_table(c, name="t", schema=SCHEMA, partition_schema=None,
                             replication_factor=1, constraint=ConstraintMeta("/rack1"),
                             live=set(c.tservers), rng=random.Random(1), id_factory=id_factory())
    assert rec.tablets[0].voters[0] in {"ts1", "ts4"}


def test_bad_column_names_are_refused_before_anything_is_replicated() -> None:
    from pyspark_kudu.schema import Schema

    bad = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("a/b", "int8")),
                 ("id",))
    with pytest.raises(InvalidArgumentError, match="invalid column name 'a/b'"):
        build_create_table(with_tservers(3), name="t", schema=bad, partition_schema=None,
                           replication_factor=1, constraint=None, live={"ts0"},
                           rng=random.Random(0))


def test_alter_builder_orders_steps_and_needs_one() -> None:
    c = with_tservers(3)
    c = apply(c, create(c), 10)
    rec = build_alter_table(c, "t1", rename_to="t9", add_columns=[ColumnSchema("x", "int8")],
                            drop_columns=["v"])
    assert rec == AlterTable(c.names["t1"], (DropColumn("v"), AddColumn(ColumnSchema("x", "int8")),
                                             RenameTable("t9")))
    with pytest.raises(InvalidArgumentError, match="nothing to alter"):
        build_alter_table(c, "t1")
    with pytest.raises(NotFoundError, match="does not exist"):
        build_alter_table(c, "nope", rename_to="x")


def _one_tablet() -> tuple[Catalog, str, str]:
    c = with_tservers(4)
    c = apply(c, create(c), 10)
    tid = c.names["t1"]
    tb = c.tables[tid].tablet_ids[0]
    return c, tid, tb


def test_tombstoned_tablets_reported_are_deleted_but_orphans_are_left_alone() -> None:
    c, tid, tb = _one_tablet()
    c = apply(c, DeleteTable(tid), 11)
    acts = pending_actions(c, "ts0", [TabletReport(tb, 1), TabletReport("orphan", 1)],
                           full=False, live=set(c.tservers), rng=random.Random(0))
    assert [(a["action"], a["tablet_id"]) for a in acts] == [("delete_tablet", tb)]
    assert "was deleted" in acts[0]["reason"]


def test_old_schema_is_altered_and_missing_tablets_are_created_on_full_report() -> None:
    c, tid, tb = _one_tablet()
    c = apply(c, AlterTable(tid, (AddColumn(ColumnSchema("x", "int8")),)), 11)
    holder = c.tablets[tb].voters[0]
    acts = pending_actions(c, holder, [TabletReport(tb, 1, schema_version=0)], full=False,
                           live=set(c.tservers), rng=random.Random(0))
    assert [a["action"] for a in acts] == ["alter_tablet"] and acts[0]["schema_version"] == 1
    acts = pending_actions(c, holder, [], full=True, live=set(c.tservers), rng=random.Random(0))
    assert [a["action"] for a in acts] == ["create_tablet"]


def test_leader_of_under_replicated_tablet_gets_an_add_then_a_remove() -> None:
    c, _tid, tb = _one_tablet()
    voters = c.tablets[tb].voters
    leader, dead = voters[0], voters[1]
    c = apply(c, UpdateTablets(leader, (TabletReport(tb, 2, leader, 5, 1,
                                                      tuple(ReplicaMeta(v) for v in voters)),)),
              11)
    live = set(c.tservers) - {dead}
    acts = pending_actions(c, leader, [TabletReport(tb, 2, leader)], full=False, live=live,
                           rng=random.Random(0))
    (spare,) = set(c.tservers) - set(voters)
    assert acts == [{"action": "add_replica", "tablet_id": tb, "ts_uuid": spare,
                     "member_type": "NON_VOTER", "cas_config_index": 1, "replacing": dead}]
    four = (*(ReplicaMeta(v) for v in voters), ReplicaMeta(spare))
    c = apply(c, UpdateTablets(leader, (TabletReport(tb, 2, leader, 6, 2, four),)), 12)
    acts = pending_actions(c, leader, [TabletReport(tb, 2, leader)], full=False, live=live,
                           rng=random.Random(0))
    assert [(a["action"], a["ts_uuid"]) for a in acts] == [("remove_replica", dead)]


def test_replace_mark_triggers_re_replication_and_evicted_replicas_are_deleted() -> None:
    c, _tid, tb = _one_tablet()
    voters = c.tablets[tb].voters
    leader = voters[0]
    c = apply(c, UpdateTablets(leader, (TabletReport(tb, 2, leader, 5, 1,
                                                      tuple(ReplicaMeta(v) for v in voters)),)),
              11)
    c = apply(c, SetReplaceMark(tb, voters[2]), 12)
    acts = pending_actions(c, leader, [TabletReport(tb, 2, leader)], full=False,
                           live=set(c.tservers), rng=random.Random(0))
    assert [a["action"] for a in acts] == ["add_replica"]
    (spare,) = set(c.tservers) - set(voters)
    acts = pending_actions(c, spare, [TabletReport(tb, 2, leader)], full=False,
                           live=set(c.tservers), rng=random.Random(0))
    assert [a["action"] for a in acts] == ["delete_tablet"] and acts[0]["cas_config_index"] == 1
    assert MemberType.NON_VOTER.value == "NON_VOTER"
