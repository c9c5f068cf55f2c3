"""Registration with location resolution, and heartbeats to every master with full reports."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.heartbeater import TabletServerHeartbeater

from .conftest import FAST, SCHEMA, wait_until


def test_a_tserver_is_registered_on_first_heartbeat_with_its_location(tmp_path: Path) -> None:
    topo = tmp_path / "topology.txt"
    topo.write_text("127.0.0.2 /dc1/rack1\n127.0.0.* /dc1/rack2\n")
    script = Path(__file__).resolve().parents[3] / "conf" / "location_mapping.sh"
    cmd = f"{script} {topo}"
    if not os.access(script, os.X_OK):  # pragma: no cover - depends on the checkout
        wrapper = tmp_path / "map.sh"
        wrapper.write_text(f"#!/bin/sh\nexec sh {script} \"$@\"\n")
        wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
        cmd = f"{wrapper} {topo}"
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        location_mapping_cmd=cmd) as g, g.client() as c:
        g.leader()
        for i in (2, 3):
            c.heartbeat_to(g.addresses["m1"], TServerMeta(f"ts{i}", f"127.0.0.{i}", 7050, "/d"))
        locs = {t["uuid"]: t["location"] for t in c.list_tservers()}
        assert locs == {"ts2": "/dc1/rack1", "ts3": "/dc1/rack2"}


def test_heartbeats_reach_every_master_and_a_new_leader_gets_a_full_report(
    tmp_path: Path,
) -> None:
    with EmbeddedMaster(str(tmp_path / "wh"), 3, options=FAST) as g, g.client() as c:
        g.leader()
        full_calls: list[bool] = []

        def reports(full: bool) -> list[dict[str, object]]:
            full_calls.append(full)
            return []

        beaters = [TabletServerHeartbeater(c, TServerMeta(f"ts{i}", "h", 7050, "/d"),
                                           reports=reports) for i in range(3)]
        for b in beaters:
            b.heartbeat_once()
        for m in g.ids:  # followers keep liveness too (KUDU-1358)
            assert set(g.services[m].tserver_liveness()) == {"ts0", "ts1", "ts2"}
        assert beaters[0].full_reports_sent == 1
        c.create_table("t", SCHEMA)
        old = g.leader().id
        g.stop_replica(old)
        new = g.leader(timeout_s=10)
        assert new.id != old
        sent = beaters[0].full_reports_sent
        wait_until(lambda: beaters[0].heartbeat_once() is not None
                   and beaters[0].full_reports_sent > sent, 10,
                   "a full report to the new leader")
        assert beaters[0].leader is not None and beaters[0].leader[0] == g.addresses[new.id]
        assert beaters[0].full_reports_sent == sent + 1
        assert full_calls.count(True) == 4  # one per server at first, then ts0 to the new leader


def test_a_replication_plan_says_when_the_next_silent_server_will_count_as_failed(
    tmp_path: Path,
) -> None:
    """``next_failure_in_s``: the threshold minus the longest silence among servers not yet
    failed (the healer asks again right then); None once every server counts as failed."""
    now = [1000.0]
    with EmbeddedMaster(str(tmp_path / "wh"), 1, options=FAST,
                        follower_unavailable_considered_failed_s=30.0) as g, g.client() as c:
        leader = g.leader()
        svc = g.services[leader.id]
        svc._clock = lambda: now[0]  # the service's time, moved by hand
        for i in range(3):
            c.heartbeat_to(g.addresses[leader.id], TServerMeta(f"ts{i}", "h", 7050, "/d"))
        now[0] += 10.0
        plan = c.call("replication_plan", {})
        assert plan["failed"] == [] and plan["next_failure_in_s"] == 20.0
        now[0] += 15.0
        for i in (1, 2):
            c.heartbeat_to(g.addresses[leader.id], TServerMeta(f"ts{i}", "h", 7050, "/d"))
        now[0] += 6.0  # ts0 silent for 31 s: failed; ts1 and ts2 for 6 s
        plan = c.call("replication_plan", {})
        assert plan["failed"] == ["ts0"] and plan["next_failure_in_s"] == 24.0
        now[0] += 100.0
        plan = c.call("replication_plan", {})
        assert plan["failed"] == ["ts0", "ts1", "ts2"] and plan["next_failure_in_s"] is None
