"""The rebalancer: stage 1 restores the policy, stage 2 balances (seed: "Rebalancing")."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.master.placement import find_violations, place_tablets
from pyspark_kudu.master.rebalancer import apply_moves, plan_rebalance, skews, violation_summary
from pyspark_kudu.master.topology import ClusterSnapshot, Table, TableConstraint, Tablet
from tests.unit.master.builders import cluster, per_location, servers_in, tablet


def placed(snap: ClusterSnapshot, table_id: str, n: int, seed: int = 0) -> list[Tablet]:
    return [
        tablet(f"{table_id}-{k}", p, table_id)
        for k, p in enumerate(place_tablets(snap, table_id, n, random.Random(seed)))
    ]


def test_stage1_moves_the_non_leader_on_the_busiest_server_out_of_the_majority() -> None:
    busy = [tablet(f"b{k}", ["a-1"]) for k in range(5)]  # a-1 carries extra load
    tabs = [tablet("x", ["a-0", "a-1", "b-0"], leader=0), *busy]
    snap = cluster({"/a": 2, "/b": 2, "/c": 2}, [Table("t", "t", 3), Table("one", "one", 1)],
                   tabs)
    snap = snap.with_tablets([tabs[0], *(Tablet(t.tablet_id, "one", t.replicas) for t in busy)])
    plan = plan_rebalance(snap, random.Random(0), balance=False)
    (move,) = plan.moves
    assert (move.tablet_id, move.from_uuid, move.stage) == ("x", "a-1", 1)
    assert move.to_uuid.startswith("c-")
    assert plan.report.violations_after == ()
    assert violation_summary(plan.report.violations_before) == [("/a", 1, 1)]


def test_stage1_brings_a_stray_replica_back_inside_the_constraint() -> None:
    table = Table("eu", "eu", 3, constraint=TableConstraint(location_prefix="/dc1"))
    layout = {"/dc1/r0": 1, "/dc1/r1": 1, "/dc1/r2": 1, "/dc2/r0": 2}
    snap = cluster(layout, [table], [tablet("x", ["dc1-r0-0", "dc1-r1-0", "dc2-r0-0"], "eu")])
    plan = plan_rebalance(snap, random.Random(0))
    assert [(m.from_uuid, m.to_uuid, m.reason) for m in plan.moves] == [
        ("dc2-r0-0", "dc1-r2-0", "constraint")
    ]


def test_unfixable_violation_is_left_alone() -> None:
    # Two locations and RF 3 with every server used: no move can help.
    snap = cluster({"/a": 3, "/b": 0}, tablets=[tablet("x", ["a-0", "a-1", "a-2"])])
    assert plan_rebalance(snap, random.Random(0)).moves == ()


def test_tables_do_not_pile_up_while_cluster_totals_look_even() -> None:
    layout = {"/a": 6}
    tabs = [tablet(f"p{k}", ["a-0", "a-1", "a-2"], "p") for k in range(6)]
    tabs += [tablet(f"q{k}", ["a-3", "a-4", "a-5"], "q") for k in range(6)]
    snap = cluster(layout, [Table("p", "p"), Table("q", "q")], tabs)
    assert skews(snap)["cluster"] == 0 and skews(snap)["table"] == 6
    plan = plan_rebalance(snap, random.Random(0))
    assert plan.report.skew_after["table"] <= 1 and plan.report.skew_after["cluster"] <= 1


def test_balances_across_locations_then_within() -> None:
    snap = cluster({"/a": 4, "/b": 4, "/c": 4, "/d": 4})
    tabs = [tablet(f"x{k}", [f"a-{k % 2}", f"b-{k % 2}", f"c-{k % 2}"]) for k in range(24)]
    snap = snap.with_tablets(tabs)
    plan = plan_rebalance(snap, random.Random(0))
    after = plan.report.skew_after
    assert after["location"] <= 0.25 and after["cluster"] <= 1 and after["table"] <= 1
    assert plan.report.violations_after == ()
    loads = {ll.location: ll.replicas for ll in plan.report.loads_after}
    assert loads == {"/a": 18, "/b": 18, "/c": 18, "/d": 18}


def test_seed_100_vs_2_never_moves_into_a_majority() -> None:
    snap = cluster({"/A": 100, "/B": 2, "/C": 2}, [Table("t", "t", 5)])
    snap = snap.with_tablets(placed(snap, "t", 40))
    plan = plan_rebalance(snap, random.Random(0))
    after = apply_moves(snap, plan.moves)
    assert find_violations(after) == []
    for t in after.tablets:
        assert max(per_location(after, t.ts_uuids)) <= 2
    # B and C stay as loaded as the policy forces them to be: 3 of every 5 replicas.
    loads = {ll.location: ll.replicas for ll in plan.report.loads_after}
    assert loads == {"/A": 80, "/B": 60, "/C": 60}


def test_pinned_table_is_never_moved_out_even_when_others_are_empty() -> None:
    table = Table("eu", "eu", 3, constraint=TableConstraint(location_prefix="/dc1"))
    snap = cluster({"/dc1/r0": 2, "/dc1/r1": 2, "/dc1/r2": 2, "/dc2/r0": 6}, [table])
    snap = snap.with_tablets(placed(snap, "eu", 30))
    plan = plan_rebalance(snap, random.Random(0))
    assert all(m.to_uuid.startswith("dc1-") for m in plan.moves)
    assert plan.report.skew_after["table"] <= 1


def test_leaders_move_only_when_nothing_else_can() -> None:
    snap = cluster({"/a": 4})
    tabs = [tablet(f"x{k}", ["a-0", "a-1", "a-2"], leader=k % 3) for k in range(9)]
    plan = plan_rebalance(snap.with_tablets(tabs), random.Random(0))
    leaders = {t.tablet_id: t.leader.ts_uuid for t in tabs if t.leader}
    assert plan.moves and all(leaders[m.tablet_id] != m.from_uuid for m in plan.moves)


def test_unhealthy_tablets_are_not_moved() -> None:
    snap = cluster(servers_in({"/a": 4}, dead=["a-3"]))
    tabs = [tablet(f"x{k}", ["a-0", "a-1", "a-3"]) for k in range(6)]
    assert plan_rebalance(snap.with_tablets(tabs), random.Random(0)).moves == ()


def test_max_moves_bounds_the_plan() -> None:
    snap = cluster({"/a": 6})
    tabs = [tablet(f"x{k}", ["a-0", "a-1", "a-2"]) for k in range(10)]
    plan = plan_rebalance(snap.with_tablets(tabs), random.Random(0), max_moves=3)
    assert len(plan.moves) == 3


def test_moves_are_add_then_remove_and_keep_roles() -> None:
    snap = cluster({"/a": 4}, tablets=[tablet(f"x{k}", ["a-0", "a-1", "a-2"]) for k in range(4)])
    plan = plan_rebalance(snap, random.Random(0))
    after = apply_moves(snap, plan.moves)
    for m in plan.moves:
        tab = next(t for t in after.tablets if t.tablet_id == m.tablet_id)
        assert m.to_uuid in tab.ts_uuids
    for t in after.tablets:
        assert len(set(t.ts_uuids)) == 3 and sum(r.is_leader for r in t.replicas) == 1
    assert Counter(after.replica_counts.values()) == Counter({3: 4})


def test_a_stale_plan_is_refused() -> None:
    snap = cluster({"/a": 4}, tablets=[tablet(f"x{k}", ["a-0", "a-1", "a-2"]) for k in range(4)])
    plan = plan_rebalance(snap, random.Random(0))
    moved = apply_moves(snap, plan.moves)
    with pytest.raises(IllegalStateError, match="plan again"):
        apply_moves(moved, plan.moves)


def test_stage1_moves_half_of_an_even_rf_out_of_one_location() -> None:
    # RF 4 over 4 locations: 2 in /a loses the majority with /a, so it is a violation.
    snap = cluster({"/a": 2, "/b": 2, "/c": 2, "/d": 2}, [Table("t", "t", 4)],
                   [tablet("x", ["a-0", "a-1", "b-0", "c-0"], leader=0)])
    plan = plan_rebalance(snap, random.Random(0), balance=False)
    (move,) = plan.moves
    assert (move.from_uuid, move.stage, move.reason) == ("a-1", 1, "placement policy")
    assert move.to_uuid.startswith("d-")
    assert violation_summary(plan.report.violations_before) == [("/a", 1, 1)]
    assert plan.report.violations_after == ()


def test_even_rf_over_three_locations_is_reported_but_not_moved() -> None:
    # Every layout of 4 replicas over 3 locations puts 2 in one: unfixable, left alone.
    snap = cluster({"/a": 2, "/b": 2, "/c": 2}, [Table("t", "t", 4)],
                   [tablet("x", ["a-0", "a-1", "b-0", "c-0"])])
    plan = plan_rebalance(snap, random.Random(0))
    assert plan.moves == ()
    (v,) = plan.report.violations_after
    assert (v.location, v.count, v.limit, v.avoidable) == ("/a", 2, 1, False)


def test_ksck_warns_about_half_of_an_even_rf_in_one_location() -> None:
    from pyspark_kudu.tools.cluster import ksck

    layout = {"/a": 3, "/b": 2, "/c": 2, "/d": 2}
    fine = cluster(layout, [Table("t", "t", 6)],
                   [tablet("x", ["a-0", "a-1", "b-0", "b-1", "c-0", "d-0"])])
    assert ksck(fine).violations == []  # 2 of 6 per location keeps 4 after any loss
    half = fine.with_tablets([tablet("z", ["a-0", "a-1", "a-2", "b-0", "c-0", "d-0"])])
    result = ksck(half)
    assert [(v.tablet_id, v.location, v.count, v.limit, v.avoidable)
            for v in result.violations] == [("z", "/a", 3, 2, True)]
    assert not result.ok
