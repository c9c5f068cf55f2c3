"""Tablet creation and re-replication under the location policy (seed: "Placement policies")."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import pytest

from pyspark_kudu.errors import InvalidArgumentError, NotFoundError
from pyspark_kudu.master.placement import (
    NOT_ENOUGH_TSERVERS,
    Placer,
    find_violations,
    max_replicas_per_group,
    overflow_threshold,
    place_extra_replica,
    place_tablets,
    validate_replication_factor,
)
from pyspark_kudu.master.topology import Table, TabletServer
from tests.unit.master.builders import cluster, per_location, servers_in, tablet


def place(layout: dict[str, int], rf: int, n: int = 50, seed: int = 0) -> list[tuple[str, ...]]:
    snap = cluster(layout, [Table("t", "t", rf)])
    return place_tablets(snap, "t", n, random.Random(seed))


def spread(layout: dict[str, int], rf: int, n: int = 50) -> set[tuple[int, ...]]:
    snap = cluster(layout, [Table("t", "t", rf)])
    return {tuple(per_location(snap, p)) for p in place(layout, rf, n)}


@pytest.mark.parametrize(
    ("rf", "groups", "limit"),
    [(3, 1, 3), (3, 2, 2), (4, 2, 3), (2, 2, 2), (5, 2, 3), (3, 3, 1), (5, 4, 2), (7, 3, 3),
     (1, 5, 1), (2, 3, 1)],
)
def test_group_limit_follows_the_seed(rf: int, groups: int, limit: int) -> None:
    assert max_replicas_per_group(rf, groups) == limit


@pytest.mark.parametrize(("rf", "groups", "limit"), [(4, 3, 1), (4, 5, 1), (6, 3, 2), (6, 7, 2)])
def test_half_of_an_even_replication_factor_is_a_violation_beyond_two_groups(
    rf: int, groups: int, limit: int
) -> None:
    # Losing a location with r/2 replicas leaves r/2, short of the majority r/2 + 1.
    assert max_replicas_per_group(rf, groups) == limit
    assert rf - limit >= rf // 2 + 1


@pytest.mark.parametrize(
    ("rf", "groups", "threshold"),
    [(3, 1, 3), (3, 2, 1), (4, 2, 2), (5, 2, 2), (1, 2, 1), (3, 3, 1), (4, 3, 1), (5, 3, 2)],
)
def test_overflow_threshold_is_half_with_two_groups_and_the_limit_beyond(
    rf: int, groups: int, threshold: int
) -> None:
    assert overflow_threshold(rf, groups) == threshold


def test_even_rf_with_three_locations_violates_unavoidably() -> None:
    snap = cluster({"/a": 3, "/b": 3, "/c": 3}, [Table("t", "t", 4)])
    placements = place_tablets(snap, "t", 20, random.Random(0))
    assert all(per_location(snap, p) == [2, 1, 1] for p in placements)
    found = find_violations(snap.with_tablets(tablet(f"x{k}", p) for k, p in enumerate(placements)))
    assert len(found) == 20 and all((v.count, v.limit, v.avoidable) == (2, 1, False) for v in found)


def test_even_rf_half_in_one_location_is_an_avoidable_violation_with_four() -> None:
    snap = cluster({"/a": 2, "/b": 2, "/c": 2, "/d": 2}, [Table("t", "t", 4)],
                   [tablet("x", ["a-0", "a-1", "b-0", "c-0"])])
    (v,) = find_violations(snap)
    assert (v.location, v.count, v.limit, v.avoidable) == ("/a", 2, 1, True)


@pytest.mark.parametrize(
    ("rf", "live", "kwargs", "message"),
    [
        (4, 5, {}, "illegal replication factor 4: replication factor must be odd"),
        (9, 9, {}, "illegal replication factor 9: maximum allowed replication factor is 7 "
                   "(controlled by --max_num_replicas)"),
        (0, 3, {}, "illegal replication factor 0: minimum allowed replication factor is 1 "
                   "(controlled by --min_num_replicas)"),
        (3, 2, {}, "not enough live tablet servers to create a table with the requested "
                   "replication factor 3; 2 tablet servers are alive"),
        (4, 3, {"allow_even": True}, "not enough live tablet servers to create a table with "
                                     "the requested replication factor 4; 3 tablet servers "
                                     "are alive"),
    ],
)
def test_replication_factor_checks_use_kudus_texts(
    rf: int, live: int, kwargs: dict[str, bool], message: str
) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        validate_replication_factor(rf, live, **kwargs)
    assert str(e.value) == message


def test_even_replication_factor_is_accepted_when_allowed() -> None:
    validate_replication_factor(4, 4, allow_even=True)
    validate_replication_factor(7, 7)


def test_never_two_replicas_of_a_tablet_on_one_server() -> None:
    for p in place({"/a": 2, "/b": 1, "/c": 5}, 5, n=200):
        assert len(set(p)) == 5


def test_three_locations_rf3_puts_one_replica_in_each() -> None:
    assert spread({"/a": 4, "/b": 4, "/c": 4}, 3) == {(1, 1, 1)}


@pytest.mark.parametrize(
    ("rf", "expected"), [(3, {(2, 1)}), (4, {(2, 2)}), (2, {(1, 1)}), (5, {(3, 2)})]
)
def test_two_locations_hold_at_most_half_plus_one(rf: int, expected: set[tuple[int, ...]]) -> None:
    assert spread({"/a": 5, "/b": 5}, rf) == expected


@pytest.mark.parametrize(
    ("layout", "rf", "expected"),
    [
        ({"/a": 3, "/b": 3, "/c": 3}, 5, {(2, 2, 1)}),
        # Load, not spread, decides within the limit (Kudu's SelectLocation): as earlier
        # tablets load some locations more, 3 + 3 + 1 and 2 + 2 + 1 comply too.
        ({"/a": 3, "/b": 3, "/c": 3}, 7, {(3, 2, 2), (3, 3, 1)}),
        ({"/a": 2, "/b": 2, "/c": 2, "/d": 2}, 5, {(2, 1, 1, 1), (2, 2, 1)}),
        ({"/a": 2, "/b": 2, "/c": 2, "/d": 2}, 4, {(1, 1, 1, 1)}),
    ],
)
def test_rf_above_number_of_locations_never_gives_a_majority(
    layout: dict[str, int], rf: int, expected: set[tuple[int, ...]]
) -> None:
    assert spread(layout, rf) == expected


def test_seed_example_100_servers_vs_2_keeps_every_tablet_spread() -> None:
    layout = {"/A": 100, "/B": 2, "/C": 2}
    assert spread(layout, 3, n=100) == {(1, 1, 1)}
    assert spread(layout, 5, n=100) == {(2, 2, 1)}


def test_best_effort_violates_only_to_keep_full_replication() -> None:
    snap = cluster({"/A": 5, "/B": 1, "/C": 1}, [Table("t", "t", 5)])
    placements = place_tablets(snap, "t", 10, random.Random(1))
    assert all(per_location(snap, p) == [3, 1, 1] for p in placements)
    found = find_violations(snap.with_tablets(tablet(f"x{k}", p) for k, p in enumerate(placements)))
    assert {(v.location, v.count, v.limit, v.avoidable) for v in found} == {("/A", 3, 2, False)}


def test_not_enough_servers_uses_kudus_text() -> None:
    snap = cluster(servers_in({"/a": 2, "/b": 1}, dead=["b-0"]), [Table("t", "t", 3)])
    with pytest.raises(NotFoundError, match=f"^{NOT_ENOUGH_TSERVERS}$"):
        place_tablets(snap, "t", 1, random.Random(0))


def test_dead_servers_get_no_replicas() -> None:
    snap = cluster(servers_in({"/a": 3, "/b": 3, "/c": 3}, dead=["a-0", "b-1"]))
    used = {u for p in place_tablets(snap, "t", 100, random.Random(0)) for u in p}
    assert used.isdisjoint({"a-0", "b-1"}) and len(used) == 7


def test_the_least_loaded_location_takes_new_replicas_until_it_catches_up() -> None:
    # Kudu's SelectLocation: the least-loaded location, not a power of two choices
    # between locations (which sent the empty one only half of the replicas).
    busy = [
        TabletServer(f"{loc}-{k}", f"h{loc}{k}", location=f"/{loc}", num_live_replicas=50)
        for loc in "abc" for k in range(2)
    ]
    fresh = [TabletServer(f"d-{k}", f"hd{k}", location="/d") for k in range(2)]
    snap = cluster(busy + fresh, [Table("t", "t", 1)])
    placed = [p[0] for p in place_tablets(snap, "t", 108, random.Random(3))]
    assert Counter(placed[:100]) == {"d-0": 50, "d-1": 50}  # power of two inside /d
    # Then every location is at 50 per server: they take turns.
    assert Counter(u[0] for u in placed[100:]) == {"a": 2, "b": 2, "c": 2, "d": 2}


def test_unequal_locations_are_compared_per_server() -> None:
    big = [TabletServer(f"a-{k}", f"ha{k}", location="/a", num_live_replicas=10)
           for k in range(4)]
    small = [TabletServer("b-0", "hb0", location="/b", num_live_replicas=12)]
    snap = cluster(big + small, [Table("t", "t", 1)])
    # /a holds 40 replicas on 4 servers (10 each): less loaded than /b's 12 on one.
    placed = [p[0][0] for p in place_tablets(snap, "t", 8, random.Random(0))]
    assert placed == ["a"] * 8


def test_rereplication_prefers_the_least_loaded_location_over_spreading() -> None:
    # RF 5 over 3 locations allows 2 per location: a second replica in the lightly
    # loaded /a beats a first one in the busy /c.
    light = [TabletServer(f"a-{k}", f"ha{k}", location="/a") for k in range(3)]
    busy = [TabletServer(f"{loc}-{k}", f"h{loc}{k}", location=f"/{loc}", num_live_replicas=9)
            for loc in "bc" for k in range(3)]
    snap = cluster(light + busy, [Table("t", "t", 5)])
    got = place_extra_replica(snap, tablet("x", ["a-0", "b-0", "b-1"]), random.Random(0))
    assert got is not None and got.startswith("a-")
    full = place_extra_replica(snap, tablet("x", ["a-0", "a-1", "b-0", "b-1"]), random.Random(0))
    assert full is not None and full.startswith("c-")


def test_consecutive_creations_account_for_earlier_ones() -> None:
    snap = cluster({"/a": 10, "/b": 10, "/c": 10})
    counts = Counter(u for p in place_tablets(snap, "t", 300, random.Random(5)) for u in p)
    assert max(counts.values()) - min(counts.values()) <= 8


def test_rereplication_goes_to_the_location_without_a_replica() -> None:
    snap = cluster({"/a": 3, "/b": 3, "/c": 3}, tablets=[tablet("x", ["a-0", "b-0", "b-1"])])
    for seed in range(10):
        got = place_extra_replica(snap, snap.tablets[0], random.Random(seed), replacing=["b-1"])
        assert got is not None and got.startswith("c-")


def test_rereplication_ignores_replicas_marked_replace() -> None:
    snap = cluster({"/a": 2, "/b": 2, "/c": 2}, tablets=[tablet("x", ["a-0", "b-0", "a-1"])])
    marked = snap.tablets[0].replicas
    tab = replace(snap.tablets[0], replicas=(*marked[:2], replace(marked[2], replace=True)))
    got = place_extra_replica(snap, tab, random.Random(0))
    assert got is not None and got.startswith("c-")


def test_rereplication_knowingly_violates_when_a_location_is_lost() -> None:
    layout = servers_in({"/a": 3, "/b": 3, "/c": 3}, dead=["c-0", "c-1", "c-2"])
    snap = cluster(layout, tablets=[tablet("x", ["a-0", "b-0", "c-0"])])
    got = place_extra_replica(snap, snap.tablets[0], random.Random(0), replacing=["c-0"])
    assert got is not None and got[0] in "ab"


def test_hierarchy_spreads_over_datacenters_first() -> None:
    layout = {f"/dc{d}/r{r}": 2 for d in range(3) for r in range(2)}
    snap = cluster(layout)
    for p in place_tablets(snap, "t", 100, random.Random(0)):
        dcs = {snap.tserver_by_uuid[u].location.split("/")[1] for u in p}  # type: ignore[union-attr]
        assert len(dcs) == 3


def test_hierarchy_with_two_datacenters_keeps_racks_within_their_limit_too() -> None:
    layout = {f"/dc{d}/r{r}": 2 for d in range(2) for r in range(3)}
    for rf, dc_split, per_rack in ((3, [2, 1], 1), (5, [3, 2], 2)):
        snap = cluster(layout, [Table("t", "t", rf)])
        for p in place_tablets(snap, "t", 60, random.Random(rf)):
            locs = [snap.tserver_by_uuid[u].location or "" for u in p]
            # 6 racks: no rack may hold a majority, but within that load decides.
            assert max(Counter(locs).values()) <= per_rack
            assert sorted(Counter(loc.split("/")[1] for loc in locs).values(), reverse=True) == (
                dc_split
            )


def test_same_rack_name_under_different_datacenters_is_a_different_rack() -> None:
    layout = {"/dc1/r1": 1, "/dc2/r1": 1, "/dc3/r1": 1}
    snap = cluster(layout, tablets=[tablet("x", ["dc1-r1-0", "dc2-r1-0", "dc3-r1-0"])])
    assert find_violations(snap) == []


def test_hierarchical_violation_is_reported_at_the_level_it_happens() -> None:
    layout = {"/dc1/r1": 1, "/dc1/r2": 1, "/dc2/r1": 1, "/dc3/r1": 1}
    snap = cluster(layout, tablets=[tablet("x", ["dc1-r1-0", "dc1-r2-0", "dc2-r1-0"])])
    (v,) = find_violations(snap)
    assert (v.kind, v.location, v.level, v.count, v.limit, v.avoidable) == (
        "placement", "/dc1", 1, 2, 1, True
    )


def test_servers_without_location_form_one_group() -> None:
    snap = cluster({"": 4})
    p = place_tablets(snap, "t", 5, random.Random(0))
    assert all(len(set(x)) == 3 for x in p)
    assert find_violations(snap.with_tablets([tablet("x", p[0])])) == []


def test_placer_tracks_its_own_load_between_calls() -> None:
    # With two candidates the power of two choices always compares both: a placer that
    # remembers its own placements alternates exactly.
    snap = cluster({"/a": 1, "/b": 1}, [Table("t", "t", 1)])
    placer = Placer(snap, random.Random(0))
    firsts = [placer.place_new(snap.tables[0])[0] for _ in range(40)]
    assert set(Counter(firsts).values()) == {20}
