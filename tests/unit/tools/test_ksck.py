"""``cluster ksck``: server, location and tablet summaries, placement violations, links."""

from __future__ import annotations

import json
from dataclasses import replace

from pyspark_kudu.master.topology import ClusterSnapshot, ReplicaRole
from pyspark_kudu.tools.cluster import (
    HEALTHY,
    RECOVERING,
    UNAVAILABLE,
    UNDER_REPLICATED,
    LinkStats,
    format_ksck,
    ksck,
    tablet_health,
)
from tests.unit.master.builders import cluster, servers_in, tablet


def healthy_cluster() -> ClusterSnapshot:
    return cluster(
        {"/a": 2, "/b": 2, "/c": 2},
        tablets=[tablet("x", ["a-0", "b-0", "c-0"]), tablet("y", ["a-1", "b-1", "c-1"])],
    )


def test_healthy_cluster_is_ok() -> None:
    result = ksck(healthy_cluster())
    assert result.ok
    text = format_ksck(result)
    assert text.splitlines()[:3] == [
        "Tablet Server Summary",
        " UUID |  Address   | Status  | Location",
        "------+------------+---------+----------",
    ]
    # Servers whose resident tablet server is not known yet show no invented port.
    assert "host-a-0:-" in text
    assert "Tablet Server Location Summary" in text and text.endswith("OK")


def test_tablet_health_follows_kudus_categories() -> None:
    snap = cluster(servers_in({"/a": 2, "/b": 2, "/c": 2}, dead=["a-0", "b-0"]))
    assert tablet_health(snap, tablet("x", ["a-1", "b-1", "c-1"])) == HEALTHY
    assert tablet_health(snap, tablet("x", ["a-0", "b-1", "c-1"])) == UNDER_REPLICATED
    assert tablet_health(snap, tablet("x", ["a-0", "b-0", "c-1"])) == UNAVAILABLE
    moving = tablet("x", ["a-1", "b-1", "c-1", "c-0"])
    moving = replace(moving, replicas=(*moving.replicas[:3],
                                       replace(moving.replicas[3], role=ReplicaRole.NON_VOTER)))
    assert tablet_health(snap, moving) == RECOVERING


def test_placement_violations_are_warned_with_kudus_table() -> None:
    snap = healthy_cluster().with_tablets([tablet("x", ["a-0", "a-1", "b-0"])])
    result = ksck(snap)
    assert not result.ok
    lines = format_ksck(result).splitlines()
    at = lines.index("WARNING: Placement policy violations:")
    assert lines[at + 1] == (
        " Location | Number of non-complying tables | Number of non-complying tablets"
    )
    assert lines[at + 3].split("|") == [" /a       ", " 1                              ",
                                        " 1"]
    assert "tablet x: 2 replicas in /a (at most 1)" in lines[at + 4]


def test_down_servers_and_unhealthy_tablets_are_reported() -> None:
    snap = cluster(servers_in({"/a": 2, "/b": 2, "/c": 2}, dead=["c-0"]),
                   tablets=[tablet("x", ["a-0", "b-0", "c-0"])])
    data = json.loads(format_ksck(ksck(snap), "json"))
    assert {s["UUID"]: s["Status"] for s in data["tservers"]}["c-0"] == "UNAVAILABLE"
    assert data["unhealthy_tablets"] == [
        {"Tablet": "x", "Table": "t", "Status": "UNDER_REPLICATED"}
    ]
    assert data["tables"][0]["Under-replicated"] == 1 and data["ok"] is False


def test_slow_or_lossy_links_between_locations_are_warned() -> None:
    links = {
        ("/a", "/b"): LinkStats(mean_ms=0.4, loss=0.0, samples=100),
        ("/a", "/c"): LinkStats(mean_ms=25.0, loss=0.0, samples=100),
        ("/b", "/c"): LinkStats(mean_ms=0.5, loss=0.2, samples=100),
    }
    result = ksck(healthy_cluster(), links=links)
    assert result.link_warnings == [
        "high latency between locations /a and /c: 25.0 ms (threshold 5.0 ms)",
        "unreliable connection between locations /b and /c: 20.0% of probes lost "
        "(threshold 1.0%)",
    ]
    assert "WARNING: high latency between locations /a and /c" in format_ksck(result)


def test_locations_without_servers_location_show_none() -> None:
    snap = cluster({"": 3}, tablets=[tablet("x", ["none-0", "none-1", "none-2"])])
    data = json.loads(format_ksck(ksck(snap), "json"))
    assert data["locations"] == [{"Location": "<none>", "Count": 3}]
    assert data["ok"] is True
