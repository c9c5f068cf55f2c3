"""The simulator: lose a rack or a DC, re-replicate, restore, rebalance."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pyspark_kudu.errors import NotFoundError
from pyspark_kudu.master.placement_sim import Simulation, build_servers, rack_loss_story
from pyspark_kudu.master.topology import (
    ClusterSnapshot,
    PlacementConfig,
    TableConstraint,
    is_under,
)


def test_topologies_of_any_shape() -> None:
    servers = build_servers((3, 10), 30)
    assert len(servers) == 900
    assert len({s.location for s in servers}) == 30
    assert servers[0].location == "/dc0/rack0" and servers[-1].location == "/dc2/rack9"
    assert {s.location for s in build_servers((50,), 20, ("loc",))} == {
        f"/loc{k}" for k in range(50)
    }


def test_rack_loss_story_violates_knowingly_then_restores_compliance(tmp_path: Path) -> None:
    png = tmp_path / "story.png"
    story = rack_loss_story(png=png, seed=1)
    by_event = {s.event.split(" ")[0]: s for s in story.timeline}
    failed, rerep = by_event["fail"], by_event["re-replicate"]
    assert failed.under_replicated > 0 and failed.violating == 0
    # Full replication kept, policy knowingly violated (it cannot be met with 2 racks).
    assert rerep.under_replicated == 0 and rerep.violating == rerep.unfixable > 0
    restored, final = by_event["restore"], by_event["rebalance"]
    assert restored.violating > 0 and restored.unfixable == 0
    assert final.violating == final.under_replicated == 0 and final.cluster_skew <= 1
    assert story.during["/rack0"] == 0 and story.after == story.before
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_forced_awareness_waits_for_the_rack_instead_of_piling_up() -> None:
    story = rack_loss_story(tablets=90, config=PlacementConfig(forced=True))
    by_event = {s.event.split(" ")[0]: s for s in story.timeline}
    assert by_event["re-replicate"].event.startswith("re-replicate (0 replicas added)")
    assert by_event["re-replicate"].under_replicated == 90
    assert all(s.violating == 0 for s in story.timeline)
    assert by_event["restore"].under_replicated == 0


def test_datacenter_loss_in_a_three_level_topology() -> None:
    story = rack_loss_story((3, 10), 30, 300, lost="/dc1")
    final = story.timeline[-1]
    assert max(s.violating for s in story.timeline) > 0
    assert final.violating == final.under_replicated == final.unavailable == 0
    assert final.cluster_skew <= 1 and final.table_skew <= 1


def test_single_server_failure_is_healed_inside_its_rack_without_violations() -> None:
    sim = Simulation(ClusterSnapshot(tuple(build_servers((3,), 4, ("rack",)))), random.Random(0))
    sim.create_table("t", 60)
    sim.fail("ts-rack0-0")
    sim.re_replicate()
    assert sim.timeline[-1].under_replicated == 0 and sim.timeline[-1].violating == 0


def test_pinned_table_is_re_replicated_only_inside_its_prefix() -> None:
    sim = Simulation(ClusterSnapshot(tuple(build_servers((2, 3), 2))), random.Random(0))
    sim.create_table("eu", 30, constraint=TableConstraint(location_prefix="/dc0"))
    sim.fail("/dc0/rack0")
    sim.re_replicate()
    sim.rebalance()
    by_uuid = sim.snapshot.tserver_by_uuid
    for tablet in sim.snapshot.tablets:
        assert all(is_under(by_uuid[u].location, "/dc0") for u in tablet.ts_uuids)


def test_failing_an_unknown_target_is_an_error() -> None:
    sim = Simulation(ClusterSnapshot(tuple(build_servers((2,), 1))), random.Random(0))
    with pytest.raises(NotFoundError, match="/nowhere"):
        sim.fail("/nowhere")
