"""Replica selection for reads (seed: "Location-aware clients")."""

from __future__ import annotations

from pyspark_kudu.master.locations import ReadMode, rank_replicas, select_replica
from pyspark_kudu.master.topology import Replica, TabletServer

SERVERS = {
    ts.uuid: ts
    for ts in [
        TabletServer("local", "client-host", location="/dc1/r1"),
        TabletServer("same-host-elsewhere", "client-host", location="/dc9/r9"),
        TabletServer("same-host-no-loc", "client-host"),
        TabletServer("same-loc", "h1", location="/dc1/r1"),
        TabletServer("same-dc", "h2", location="/dc1/r2"),
        TabletServer("far", "h3", location="/dc2/r1"),
        TabletServer("no-loc", "h4"),
        TabletServer("dead", "h5", location="/dc1/r1", live=False),
    ]
}


def replicas(*uuids: str, leader: str | None = None) -> list[Replica]:
    return [Replica(u, is_leader=u == leader) for u in uuids]


def test_closest_replica_prefers_host_then_location_then_longest_prefix() -> None:
    reps = replicas("far", "no-loc", "same-dc", "same-loc", "local")
    ranked = rank_replicas(
        reps, SERVERS, client_host="client-host", client_location="/dc1/r1", seed=1
    )
    assert [r.ts_uuid for r in ranked][:3] == ["local", "same-loc", "same-dc"]
    assert {r.ts_uuid for r in ranked[3:]} == {"far", "no-loc"}


def test_a_replica_on_the_clients_host_is_local_only_if_their_locations_agree() -> None:
    """Kudu's client rule: same host counts as local when the locations match or one of the
    two has none; a same-named host in another location ranks by location like any other."""
    reps = replicas("same-host-elsewhere", "same-loc", "far")
    ranked = rank_replicas(reps, SERVERS, client_host="client-host",
                           client_location="/dc1/r1", seed=1)
    assert ranked[0].ts_uuid == "same-loc"
    reps = replicas("same-host-no-loc", "same-loc")
    ranked = rank_replicas(reps, SERVERS, client_host="client-host",
                           client_location="/dc1/r1", seed=1)
    assert [r.ts_uuid for r in ranked] == ["same-host-no-loc", "same-loc"]
    ranked = rank_replicas(replicas("local", "same-dc"), SERVERS, client_host="client-host",
                           seed=1)  # a client without a location
    assert ranked[0].ts_uuid == "local"


def test_closest_replica_without_local_replica_reads_in_own_location() -> None:
    reps = replicas("far", "same-dc", "same-loc")
    got = select_replica(reps, SERVERS, client_host="elsewhere", client_location="/dc1/r1")
    assert got is not None and got.ts_uuid == "same-loc"


def test_closest_replica_uses_common_prefix_when_location_differs() -> None:
    reps = replicas("far", "same-dc")
    got = select_replica(reps, SERVERS, client_location="/dc1/r7")
    assert got is not None and got.ts_uuid == "same-dc"


def test_ties_are_random_per_process_but_stable_across_calls() -> None:
    servers = {f"ts{k}": TabletServer(f"ts{k}", f"h{k}", location="/x") for k in range(8)}
    reps = [Replica(u) for u in servers]
    first = select_replica(reps, servers, client_location="/y")
    for _ in range(20):
        assert select_replica(reps, servers, client_location="/y") == first
    picks = {select_replica(reps, servers, client_location="/y", seed=s) for s in range(40)}
    assert len(picks) > 1


def test_dead_servers_are_never_chosen() -> None:
    got = select_replica(replicas("dead", "far"), SERVERS, client_location="/dc1/r1")
    assert got is not None and got.ts_uuid == "far"


def test_leader_only_reads_the_leader_or_nothing() -> None:
    reps = replicas("local", "far", leader="far")
    got = select_replica(reps, SERVERS, ReadMode.LEADER_ONLY, client_host="client-host")
    assert got is not None and got.ts_uuid == "far"
    assert select_replica(replicas("local", "far"), SERVERS, ReadMode.LEADER_ONLY) is None
    assert select_replica(replicas("dead", leader="dead"), SERVERS, ReadMode.LEADER_ONLY) is None


def test_first_replica_keeps_config_order() -> None:
    reps = replicas("far", "local", "same-loc")
    ranked = rank_replicas(reps, SERVERS, ReadMode.FIRST_REPLICA, client_host="client-host")
    assert [r.ts_uuid for r in ranked] == ["far", "local", "same-loc"]
