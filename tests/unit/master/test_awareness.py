"""Multi-dimensional awareness (KIP-708 seed), table constraints and forced awareness."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from pyspark_kudu.errors import NotFoundError
from pyspark_kudu.master.placement import (
    Placer,
    find_violations,
    place_extra_replica,
    place_tablets,
)
from pyspark_kudu.master.topology import (
    ClusterSnapshot,
    PlacementConfig,
    Table,
    TableConstraint,
    TabletServer,
)
from tests.unit.master.builders import cluster, servers_in, tablet

KIP = PlacementConfig(awareness=("zone", "cluster"))


def node(n: int, k8s: int, zone: str, load: int = 0) -> TabletServer:
    return TabletServer(
        f"Node-{n}",
        f"node{n}",
        tags={"cluster": f"K8s_Cluster{k8s}", "zone": f"eu-central-1{zone}"},
        num_live_replicas=load,
    )


def kip_cluster(nodes: list[TabletServer]) -> ClusterSnapshot:
    return cluster(nodes, [Table("t", "t", 3)], config=KIP)


def standbys(snap: ClusterSnapshot, seed: int) -> set[str]:
    """Place the two standbys of a task whose active replica is on Node-1."""
    placer = Placer(snap, random.Random(seed))
    table = snap.tables[0]
    first = placer.place_extra(table, ["Node-1"])
    assert first is not None
    second = placer.place_extra(table, ["Node-1", first])
    assert second is not None
    return {first, second}


def tags_of(snap: ClusterSnapshot, uuids: set[str], key: str) -> set[str]:
    return {snap.tserver_by_uuid[u].tags[key] for u in uuids}


ABSOLUTE = [node(1 + 3 * c + z, c + 1, "abc"[z]) for c in range(3) for z in range(3)]


@pytest.mark.parametrize("seed", range(10))
def test_kip708_absolute_preferred_differs_in_every_key(seed: int) -> None:
    snap = kip_cluster(ABSOLUTE)
    chosen = standbys(snap, seed) | {"Node-1"}
    assert len(tags_of(snap, chosen, "zone")) == 3
    assert len(tags_of(snap, chosen, "cluster")) == 3


def test_kip708_absolute_preferred_holds_for_new_tablets_too() -> None:
    snap = kip_cluster(ABSOLUTE)
    for p in place_tablets(snap, "t", 30, random.Random(0)):
        assert len(tags_of(snap, set(p), "zone")) == len(tags_of(snap, set(p), "cluster")) == 3


PARTIAL = [node(1 + 3 * c + z, c + 1, "abc"[z]) for c in range(2) for z in range(3)]


@pytest.mark.parametrize("seed", range(10))
def test_kip708_partially_preferred_spreads_zones_then_clusters(seed: int) -> None:
    snap = kip_cluster(PARTIAL)
    # KIP-708: Node-5 then LL(Node-3, Node-6), or Node-6 then LL(Node-2, Node-5).
    allowed = ({"Node-5", "Node-3"}, {"Node-5", "Node-6"}, {"Node-6", "Node-2"})
    assert standbys(snap, seed) in allowed


def test_kip708_partially_preferred_breaks_the_last_tie_by_least_load() -> None:
    nodes = [node(1 + 3 * c + z, c + 1, "abc"[z], load=50 if (c, z) == (1, 2) else 0)
             for c in range(2) for z in range(3)]
    for seed in range(5):
        assert standbys(kip_cluster(nodes), seed) == {"Node-5", "Node-3"}


LEAST = [node(1, 1, "a"), node(2, 1, "b"), node(3, 2, "a"), node(4, 2, "b")]


@pytest.mark.parametrize("seed", range(10))
def test_kip708_least_preferred_takes_the_least_loaded(seed: int) -> None:
    nodes = [*LEAST[:2], node(3, 2, "a", load=7), LEAST[3]]
    assert standbys(kip_cluster(nodes), seed) == {"Node-4", "Node-2"}
    nodes = [LEAST[0], node(2, 1, "b", load=7), *LEAST[2:]]
    assert standbys(kip_cluster(nodes), seed) == {"Node-4", "Node-3"}


def test_tag_dimensions_are_independent() -> None:
    # zone=a under two clusters is one zone: two replicas never share it.
    nodes = [TabletServer(f"{c}{z}", f"h{c}{z}", tags={"cluster": c, "zone": z})
             for c in ("c1", "c2") for z in ("a", "b")]
    snap = cluster(nodes, [Table("t", "t", 2)], config=PlacementConfig(awareness=("zone",)))
    for p in place_tablets(snap, "t", 40, random.Random(0)):
        assert tags_of(snap, set(p), "zone") == {"a", "b"}


def test_table_awareness_overrides_the_cluster_setting() -> None:
    nodes = [TabletServer(f"{c}{z}", f"h{c}{z}", tags={"cluster": c, "zone": z})
             for c in ("c1", "c2") for z in ("a", "b", "c")]
    tables = [Table("t", "t", 2, awareness=("cluster",))]
    snap = cluster(nodes, tables, config=PlacementConfig(awareness=("zone",)))
    for p in place_tablets(snap, "t", 40, random.Random(0)):
        assert tags_of(snap, set(p), "cluster") == {"c1", "c2"}


def test_location_levels_can_be_named_and_used_as_awareness_keys() -> None:
    layout = {f"/dc{d}/r{r}": 1 for d in range(2) for r in range(3)}
    cfg = PlacementConfig(location_levels=("dc", "rack"))
    snap = cluster(layout, config=cfg)
    ts = snap.tserver_by_uuid["dc1-r2-0"]
    assert {k: v for k, v in snap.tags_of(ts).items()} == {"dc": "/dc1", "rack": "/dc1/r2"}
    assert snap.awareness_for(snap.tables[0]) == ("dc", "rack")


PINNED = Table("eu", "eu", 3, constraint=TableConstraint(location_prefix="/dc1"))


def pinned_cluster(dead: tuple[str, ...] = ()) -> ClusterSnapshot:
    layout = {"/dc1/r0": 2, "/dc1/r1": 2, "/dc1/r2": 2, "/dc10/r0": 3, "/dc2/r0": 3}
    return cluster(servers_in(layout, dead=dead), [PINNED])


def test_pinned_table_stays_under_its_prefix_with_rack_spread() -> None:
    snap = pinned_cluster()
    for p in place_tablets(snap, "eu", 50, random.Random(0)):
        locs = [snap.tserver_by_uuid[u].location for u in p]
        assert all(loc is not None and loc.startswith("/dc1/") for loc in locs)
        assert len(set(locs)) == 3  # use case 4: rack-aware inside the pinned datacenter


def test_pinned_rereplication_never_leaves_the_prefix() -> None:
    snap = pinned_cluster(dead=("dc1-r0-0", "dc1-r0-1", "dc1-r1-0", "dc1-r1-1"))
    snap = snap.with_tablets([tablet("x", ["dc1-r0-0", "dc1-r1-0", "dc1-r2-0"], "eu")])
    got = place_extra_replica(snap, snap.tablets[0], random.Random(0), replacing=["dc1-r0-0"])
    assert got == "dc1-r2-1"
    full = snap.with_tablets([tablet("x", ["dc1-r2-1", "dc1-r1-0", "dc1-r2-0"], "eu")])
    got = place_extra_replica(full, full.tablets[0], random.Random(0), replacing=["dc1-r1-0"])
    assert got is None


def test_pinned_creation_fails_when_the_prefix_is_too_small() -> None:
    snap = pinned_cluster(dead=("dc1-r0-0", "dc1-r0-1", "dc1-r1-0", "dc1-r1-1"))
    with pytest.raises(NotFoundError):
        place_tablets(snap, "eu", 1, random.Random(0))


def test_pinning_by_tag_values() -> None:
    nodes = [TabletServer(f"n{k}", f"h{k}", tags={"disk": "ssd" if k % 2 else "hdd"})
             for k in range(8)]
    table = Table("t", "t", 3, constraint=TableConstraint(tags={"disk": {"ssd"}}))
    snap = cluster(nodes, [table])
    used = {u for p in place_tablets(snap, "t", 20, random.Random(0)) for u in p}
    assert used == {"n1", "n3", "n5", "n7"}


def test_replica_outside_the_constraint_is_a_violation() -> None:
    snap = pinned_cluster().with_tablets([tablet("x", ["dc1-r0-0", "dc1-r1-0", "dc2-r0-0"], "eu")])
    (v,) = find_violations(snap)
    assert (v.kind, v.ts_uuid, v.location) == ("constraint", "dc2-r0-0", "/dc2/r0")


def rack_loss(config: PlacementConfig) -> ClusterSnapshot:
    layout = servers_in({"/r0": 3, "/r1": 3, "/r2": 3}, dead=["r2-0", "r2-1", "r2-2"])
    return cluster(layout, tablets=[tablet("x", ["r0-0", "r1-0", "r2-0"])], config=config)


def test_forced_awareness_leaves_the_replica_missing() -> None:
    snap = rack_loss(PlacementConfig(forced=True))
    assert place_extra_replica(snap, snap.tablets[0], random.Random(0), replacing=["r2-0"]) is None


def test_without_forced_awareness_the_replica_piles_into_a_survivor() -> None:
    snap = rack_loss(PlacementConfig())
    got = place_extra_replica(snap, snap.tablets[0], random.Random(0), replacing=["r2-0"])
    assert got is not None and got[:2] in ("r0", "r1")


def test_forced_tag_values_wait_for_the_missing_zone() -> None:
    # Elasticsearch example: zones zone1 and zone2 expected, only zone1 nodes are up.
    nodes = [TabletServer(f"n{k}", f"h{k}", tags={"zone": "zone1"}) for k in range(2)]
    cfg = PlacementConfig(awareness=("zone",), forced_values={"zone": {"zone1", "zone2"}})
    snap = cluster(nodes, [Table("t", "t", 2)], config=cfg)
    placements = place_tablets(snap, "t", 5, random.Random(0))
    assert [len(p) for p in placements] == [1] * 5
    assert Counter(p[0] for p in placements).keys() <= {"n0", "n1"}
