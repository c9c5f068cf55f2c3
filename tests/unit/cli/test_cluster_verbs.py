"""``cluster ksck`` and ``cluster rebalance`` against real masters: output, JSON, exit codes."""

from __future__ import annotations

import json
from collections.abc import Callable

from pyspark_kudu.tools.cli_cluster import NOT_EXECUTED_NOTE

from .conftest import SCHEMA, Masters, Run


def test_ksck_on_a_compliant_cluster_lists_masters_servers_locations_and_says_ok(
    healthy: Masters, run: Callable[..., Run],
) -> None:
    r = run("cluster", "ksck", *healthy.args())
    assert r.code == 0 and r.err == ""
    lines = r.out.splitlines()
    assert lines[0] == f"Source: masters {healthy.address}"
    assert lines[2] == "Master Summary"
    assert [c.strip() for c in lines[3].split("|")] == [
        "Address", "Id", "Role", "Term", "Commit", "Status"]
    address, node, role, term, commit, status = (c.strip() for c in lines[5].split("|"))
    assert (address, node, role, status) == (healthy.address, "m1", "leader", "HEALTHY")
    assert int(term) >= 1 and int(commit) >= 1
    at = lines.index("Tablet Server Summary")
    assert lines[at + 1:at + 9] == [
        " UUID |    Address     | Status  |  Location",
        "------+----------------+---------+------------",
        " ts2  | 127.0.0.2:7050 | HEALTHY | /dc1/rack1",
        " ts3  | 127.0.0.3:7050 | HEALTHY | /dc1/rack1",
        " ts4  | 127.0.0.4:7050 | HEALTHY | /dc1/rack2",
        " ts5  | 127.0.0.5:7050 | HEALTHY | /dc1/rack2",
        " ts6  | 127.0.0.6:7050 | HEALTHY | /dc1/rack3",
        " ts7  | 127.0.0.7:7050 | HEALTHY | /dc1/rack3",
    ]
    assert " events  | 3  | HEALTHY | 4             | 4       |" in r.out
    assert "Placement policy violations" not in r.out and lines[-1] == "OK"


def test_ksck_json_reports_the_violations_of_a_rack_added_after_placement(
    rack_added: Masters, run: Callable[..., Run],
) -> None:
    r = run("cluster", "ksck", *rack_added.args(), "--format", "json")
    assert r.code == 1
    data = json.loads(r.out)
    assert data["ok"] is False and data["liveness_known"] is True
    assert data["masters"][0]["Status"] == "HEALTHY"
    assert [loc["Location"] for loc in data["locations"]] == [
        "/dc1/rack1", "/dc1/rack2", "/dc1/rack3"]
    assert len(data["violating_tablets"]) == 3  # every tablet: 2 replicas in one of 3 racks
    assert sum(v["Number of non-complying tablets"]
               for v in data["placement_policy_violations"]) == 3
    assert {v["Location"] for v in data["placement_policy_violations"]} <= {
        "/dc1/rack1", "/dc1/rack2"}


def test_ksck_reports_a_master_that_is_down_and_exits_1(
    masters_factory: Callable[..., Masters], run: Callable[..., Run],
) -> None:
    group = masters_factory(3)
    group.register(range(2, 8))
    with group.client() as c:
        c.create_table("t", SCHEMA)
        leader = c.leader_address()
    down = next(s for s in group.servers.values() if s.config.address != leader)
    down.stop()
    r = run("cluster", "ksck", *group.args(), "--format", "json")
    assert r.code == 1
    data = json.loads(r.out)
    status = {m["Address"]: m["Status"] for m in data["masters"]}
    assert status.pop(down.config.address) == "UNAVAILABLE"
    assert set(status.values()) == {"HEALTHY"}
    assert any(w.startswith(f"master {down.config.address} is UNAVAILABLE")
               for w in data["warnings"])
    assert data["unhealthy_tablets"] == [] and data["placement_policy_violations"] == []


def test_rebalance_report_only_shows_loads_and_the_planned_count_but_no_moves(
    rack_added: Masters, run: Callable[..., Run],
) -> None:
    r = run("cluster", "rebalance", "--report_only", *rack_added.args())
    assert r.code == 1
    assert "Per-location replica distribution" in r.out
    assert "Placement policy violations (after):\n  none" in r.out
    planned = next(line for line in r.out.splitlines() if line.startswith("Planned moves: "))
    assert int(planned.split(": ")[1]) >= 3
    assert " From | " not in r.out and NOT_EXECUTED_NOTE not in r.out


def test_rebalance_lists_moves_and_says_that_none_was_executed(
    rack_added: Masters, run: Callable[..., Run],
) -> None:
    r = run("cluster", "rebalance", *rack_added.args(), "--format", "json")
    assert r.code == 1
    data = json.loads(r.out)
    assert data["executed_moves"] == 0 and data["notes"] == [NOT_EXECUTED_NOTE]
    assert len(data["moves"]) == data["planned_moves"] >= 3
    assert data["violations_after"] == []
    text = run("cluster", "rebalance", *rack_added.args())
    assert f"NOTE: {NOT_EXECUTED_NOTE}" in text.out and " From | " in text.out
    # the same catalog and seed give the same plan
    assert json.loads(run("cluster", "rebalance", *rack_added.args(), "--format",
                          "json").out)["moves"] == data["moves"]


def test_rebalance_of_a_balanced_compliant_cluster_exits_0(
    masters_factory: Callable[..., Masters], run: Callable[..., Run],
) -> None:
    group = masters_factory()
    group.register((2, 4, 6))  # one server per rack: every tablet on all three
    with group.client() as c:
        c.create_table("t", SCHEMA)
    r = run("cluster", "rebalance", *group.args())
    assert r.code == 0
    assert r.out.splitlines()[-1] == (
        "The cluster is balanced and complies with the placement policy.")
