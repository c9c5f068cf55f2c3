"""Random clusters with unequal location loads: placement follows Kudu's ``SelectLocation``.

Two properties, checked replica by replica against an oracle written from the rules (not
from the placer's indexes):

* the chosen location is a least-loaded one among the eligible locations -- those with a
  free live server the table may use whose group counts, after the replica, break the
  policy least and overflow least, top level first (then, with tag awareness, share the
  fewest tag values); load = replicas per live server the table may use, counting what
  the placer itself has placed so far, this tablet's replicas included;
* no location ever holds a majority (half, for an even replication factor) of a tablet's
  replicas when more than two locations make a compliant layout possible.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from fractions import Fraction

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyspark_kudu.errors import NotFoundError
from pyspark_kudu.master.placement import Placer, find_violations, place_tablets
from pyspark_kudu.master.topology import (
    ClusterSnapshot,
    PlacementConfig,
    Table,
    TableConstraint,
    TabletServer,
    location_prefix,
)
from tests.unit.master.builders import tablet

ZONES = ("z1", "z2", "z3")


def most_per_group(rf: int, groups: int) -> int:
    """Replicas one group may hold: losing it must leave a majority beyond two groups."""
    if groups <= 1:
        return rf
    if groups == 2:
        return rf // 2 + 1
    return max(1, rf - (rf // 2 + 1))


def overflow_at(rf: int, groups: int) -> int:
    """Replicas a group holds before it joins Kudu's overflow group."""
    return max(1, rf // 2) if groups == 2 else most_per_group(rf, groups)


@st.composite
def loaded_clusters(draw: st.DrawFn, *, hierarchical: bool | None = None,
                    forced: bool = False) -> ClusterSnapshot:
    """Locations of 1 to 4 servers with very different loads, one table."""
    if hierarchical is None:
        hierarchical = draw(st.booleans())
    locations = []
    for d in range(draw(st.integers(1, 4))):
        if hierarchical:
            locations += [f"/dc{d}/r{r}" for r in range(draw(st.integers(1, 3)))]
        else:
            locations.append(f"/L{d}")
    servers = []
    for loc in locations:
        base = draw(st.integers(0, 40))  # the location's load; servers differ a little
        for k in range(draw(st.integers(1, 4))):
            servers.append(TabletServer(
                f"{loc}#{k}", f"h{loc}{k}", location=loc,
                tags={"zone": draw(st.sampled_from(ZONES))},
                live=draw(st.integers(0, 9)) > 0,
                num_live_replicas=base + draw(st.integers(0, 3)),
            ))
    tops = sorted({"/" + loc.split("/")[1] for loc in locations})
    constraint = draw(st.one_of(
        st.none(),
        st.builds(TableConstraint, location_prefix=st.sampled_from(tops)),
        st.builds(TableConstraint, tags=st.just({"zone": {"z1", "z2"}})),
    ))
    table = Table("t", "t", draw(st.integers(1, 7)), constraint)
    config = PlacementConfig(awareness=draw(st.sampled_from([(), ("zone",)])), forced=forced)
    return ClusterSnapshot(tuple(servers), (table,), (), config)


class Oracle:
    """The rules, restated over locations and servers."""

    def __init__(self, snap: ClusterSnapshot) -> None:
        self.snap = snap
        self.table = snap.tables[0]
        cons = self.table.constraint
        self.allowed = [ts for ts in snap.tservers
                        if cons is None or cons.allows(ts.location, snap.tags_of(ts))]
        self.depth = snap.max_location_depth
        self.groups = [len({location_prefix(ts.location, d) for ts in self.allowed})
                       for d in range(1, self.depth + 1)]
        self.placed: Counter[str] = Counter()  # replicas the placer added, per server
        self.zone_aware = "zone" in snap.awareness_for(self.table)

    def location_load(self, location: str | None) -> Fraction:
        members = [ts for ts in self.allowed if ts.live and ts.location == location]
        total = sum(Fraction(self.snap.load_of(ts)) + self.placed[ts.uuid] for ts in members)
        return total / len(members)

    def badness(self, ts: TabletServer, present: Sequence[str]) -> tuple[int, ...]:
        rf = self.table.replication_factor
        by = self.snap.tserver_by_uuid
        over_limit, over_threshold = [], []
        for d, groups in enumerate(self.groups, start=1):
            group = location_prefix(ts.location, d)
            after = 1 + sum(location_prefix(by[u].location, d) == group for u in present)
            over_limit.append(max(0, after - most_per_group(rf, groups)))
            over_threshold.append(max(0, after - overflow_at(rf, groups)))
        zone = [sum(by[u].tags["zone"] == ts.tags["zone"] for u in present)] * self.zone_aware
        return (*over_limit, *over_threshold, *zone)

    def check(self, present: Sequence[str], chosen: str) -> None:
        free = [ts for ts in self.allowed if ts.live and ts.uuid not in present]
        scores = {ts.uuid: self.badness(ts, present) for ts in free}
        best = min(scores.values())
        eligible = {ts.location for ts in free if scores[ts.uuid] == best}
        loads = {loc: self.location_load(loc) for loc in eligible}
        ts = self.snap.tserver_by_uuid[chosen]
        assert scores.get(chosen) == best, (chosen, scores)
        assert loads[ts.location] == min(loads.values()), (ts.location, loads)
        self.placed[chosen] += 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=loaded_clusters(), seed=st.integers(0, 2**16), tablets=st.integers(1, 5))
def test_every_new_replica_goes_to_a_least_loaded_eligible_location(
    snap: ClusterSnapshot, seed: int, tablets: int
) -> None:
    placer = Placer(snap, random.Random(seed))
    oracle = Oracle(snap)
    for _ in range(tablets):
        try:
            placed = placer.place_new(snap.tables[0])
        except NotFoundError:
            return  # fewer live eligible servers than the replication factor
        assert len(placed) == snap.tables[0].replication_factor
        for k, uuid in enumerate(placed):
            oracle.check(placed[:k], uuid)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=loaded_clusters(), seed=st.integers(0, 2**16), data=st.data())
def test_rereplication_goes_to_a_least_loaded_eligible_location(
    snap: ClusterSnapshot, seed: int, data: st.DataObject
) -> None:
    # Existing replicas anywhere: dead servers, outside the constraint, piled up.
    uuids = [ts.uuid for ts in snap.tservers]
    rf = snap.tables[0].replication_factor
    existing = data.draw(st.lists(st.sampled_from(uuids), max_size=rf - 1, unique=True))
    placer = Placer(snap, random.Random(seed))
    oracle = Oracle(snap)
    chosen = placer.place_extra(snap.tables[0], existing)
    if chosen is None:
        assert all(ts.uuid in existing or not ts.live for ts in oracle.allowed)
        return
    oracle.check(existing, chosen)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=loaded_clusters(hierarchical=False, forced=False) | loaded_clusters(
    hierarchical=False, forced=True), seed=st.integers(0, 2**16))
def test_no_location_holds_a_majority_when_that_is_avoidable(
    snap: ClusterSnapshot, seed: int
) -> None:
    table = snap.tables[0]
    rf = table.replication_factor
    try:
        placements = place_tablets(snap, table, 8, random.Random(seed))
    except NotFoundError:
        return
    oracle = Oracle(snap)
    live = Counter(ts.location for ts in oracle.allowed if ts.live)
    most = rf - (rf // 2 + 1)  # the most a location may lose with the majority intact
    avoidable = (oracle.groups[0] > 2 and rf >= 3
                 and sum(min(n, most) for n in live.values()) >= rf)
    by = snap.tserver_by_uuid
    for p in placements:
        per_location = Counter(by[u].location for u in p)
        if avoidable:
            assert max(per_location.values()) <= most, (per_location, live)
    placed = snap.with_tablets(tablet(f"x{k}", p) for k, p in enumerate(placements))
    assert not [v for v in find_violations(placed) if v.avoidable]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(snap=loaded_clusters(hierarchical=True) | loaded_clusters(hierarchical=True, forced=True),
       seed=st.integers(0, 2**16))
def test_hierarchical_placement_leaves_no_avoidable_violation(
    snap: ClusterSnapshot, seed: int
) -> None:
    try:
        placements = place_tablets(snap, "t", 8, random.Random(seed))
    except NotFoundError:
        return
    placed = snap.with_tablets(tablet(f"x{k}", p) for k, p in enumerate(placements))
    assert not [v for v in find_violations(placed) if v.avoidable]
