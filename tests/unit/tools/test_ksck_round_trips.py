"""``cluster ksck``'s round trips: per server, between locations through the driver, and a
warning for every tablet whose replicas sit in two locations farther apart than the
threshold (issue 20, point 5)."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyspark_kudu.master.client import MasterClient
from pyspark_kudu.master.embedded import EmbeddedMaster
from pyspark_kudu.master.entities import TServerMeta
from pyspark_kudu.master.topology import ClusterSnapshot
from pyspark_kudu.partitioning import HashDimension, PartitionSchema
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.healing.liveness import LivenessReporter
from pyspark_kudu.spark.replication.latency import RoundTrips
from pyspark_kudu.tools.cli import main
from pyspark_kudu.tools.cli_cluster import ksck_report
from pyspark_kudu.tools.cluster import (
    DEFAULT_MAX_ROUND_TRIP_MS,
    MIN_ROUND_TRIP_SAMPLES,
    RoundTripStats,
    format_ksck,
    ksck,
    location_round_trips,
)
from pyspark_kudu.tools.connect import EXIT_USAGE, RemoteSource
from tests.unit.master.builders import cluster, tablet

SETTLED = MIN_ROUND_TRIP_SAMPLES


def three_racks() -> ClusterSnapshot:
    """Racks /a, /b, /c of two servers and /d of one; tablet x on /a, /b and /c, tablet y
    on /a, /b and /d."""
    return cluster({"/a": 2, "/b": 2, "/c": 2, "/d": 1}, tablets=[
        tablet("x", ["a-0", "b-0", "c-0"]), tablet("y", ["a-1", "b-1", "d-0"])])


def rtt(ms: float, samples: int = 32, age_s: float = 0.5) -> RoundTripStats:
    return RoundTripStats(ms, samples, age_s)


# /c sits 60 ms from the driver; the others a few ms (as on loopback).
FAR_C = {"a-0": rtt(3.0), "a-1": rtt(4.0), "b-0": rtt(5.0), "b-1": rtt(2.0),
         "c-0": rtt(60.0), "c-1": rtt(61.0), "d-0": rtt(1.0)}


def test_a_locations_estimate_is_its_slowest_server_and_a_pair_is_the_sum_through_the_driver(
) -> None:
    pairs = location_round_trips(three_racks(), FAR_C)
    assert pairs == {("/a", "/b"): 4.0 + 5.0, ("/a", "/c"): 4.0 + 61.0, ("/a", "/d"): 4.0 + 1.0,
                     ("/b", "/c"): 5.0 + 61.0, ("/b", "/d"): 5.0 + 1.0, ("/c", "/d"): 61.0 + 1.0}


def test_estimates_with_too_few_samples_do_not_count_for_their_location() -> None:
    # c-1's 900 ms is its first tasks' class loading: left out, c-0 speaks for /c.
    est = dict(FAR_C, **{"c-0": rtt(10.0), "c-1": rtt(900.0, samples=SETTLED - 1)})
    assert location_round_trips(three_racks(), est)[("/a", "/c")] == 4.0 + 10.0
    only_new = {u: rtt(e.ms, SETTLED - 1) for u, e in FAR_C.items()}
    assert location_round_trips(three_racks(), only_new) == {}


def test_tablets_spanning_a_slow_pair_of_locations_are_warned_with_their_worst_pair() -> None:
    result = ksck(three_racks(), round_trips=FAR_C)
    assert result.ok  # advisory: a warning, not a failed check
    # y (/a, /b, /d) is fine; x spans /c.
    assert result.slow_tablets == [
        {"Tablet": "x", "Table": "t", "Locations": "/b, /c", "Round trip (ms)": 66.0}]
    lines = format_ksck(result).splitlines()
    at = lines.index("WARNING: 1 tablet(s) have replicas in locations whose round trip "
                     f"exceeds {DEFAULT_MAX_ROUND_TRIP_MS:g} ms (advisory: the estimates "
                     f"include Spark's scheduling delay):")
    assert [c.strip() for c in lines[at + 1].split("|")] == [
        "Tablet", "Table", "Locations", "Round trip (ms)"]
    assert [c.strip() for c in lines[at + 3].split("|")] == ["x", "t", "/b, /c", "66.0"]
    assert lines[-1] == "OK"


def test_the_threshold_is_the_callers() -> None:
    assert ksck(three_racks(), round_trips=FAR_C, max_round_trip_ms=70.0).slow_tablets == []
    tight = ksck(three_racks(), round_trips=FAR_C, max_round_trip_ms=8.0)
    assert [t["Tablet"] for t in tight.slow_tablets] == ["x", "y"]


def test_round_trips_are_printed_per_server_and_between_locations() -> None:
    lines = format_ksck(ksck(three_racks(), round_trips=FAR_C)).splitlines()
    at = lines.index("Round trips from the driver (replication rounds)")
    assert [c.strip() for c in lines[at + 1].split("|")] == [
        "UUID", "Location", "Round trip (ms)", "Samples", "Age (s)"]
    assert [c.strip() for c in lines[at + 3].split("|")] == ["a-0", "/a", "3.0", "32", "0.5"]
    at = lines.index("Round trips between locations (through the driver)")
    assert [[c.strip() for c in line.split("|")] for line in lines[at + 3:at + 6]] == [
        ["/a", "/b", "9.0"], ["/a", "/c", "65.0"], ["/a", "/d", "5.0"]]


def test_the_json_report_carries_the_same_round_trips() -> None:
    data = json.loads(format_ksck(ksck(three_racks(), round_trips=FAR_C), "json"))
    assert data["ok"] is True and data["max_round_trip_ms"] == DEFAULT_MAX_ROUND_TRIP_MS
    assert data["round_trips"][0] == {"UUID": "a-0", "Location": "/a", "Round trip (ms)": 3.0,
                                      "Samples": 32, "Age (s)": 0.5}
    assert {(p["Location A"], p["Location B"]): p["Round trip (ms)"]
            for p in data["location_round_trips"]}[("/b", "/c")] == 66.0
    assert [t["Tablet"] for t in data["slow_tablets"]] == ["x"]


def test_without_estimates_the_section_says_none_and_the_verdict_is_unchanged() -> None:
    result = ksck(three_racks())
    assert result.ok and result.round_trips == [] and result.slow_tablets == []
    text = format_ksck(result)
    assert "Round trips from the driver (replication rounds)\n  none reported" in text
    assert "Round trips between locations" not in text and text.endswith("OK")


def test_one_location_has_no_pairs_to_warn_about() -> None:
    snap = cluster({"/a": 3}, tablets=[tablet("x", ["a-0", "a-1", "a-2"])])
    result = ksck(snap, round_trips={u: rtt(400.0) for u in ("a-0", "a-1", "a-2")})
    assert result.ok and result.location_round_trips == [] and len(result.round_trips) == 3


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf"])
def test_a_threshold_that_is_not_positive_is_a_usage_error_before_any_master_is_asked(
    value: str, capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["cluster", "ksck", "--master", "127.0.0.1:1", "--timeout-s", "0.1",
                 "--max_round_trip_ms", value])
    assert code == EXIT_USAGE
    assert "--max_round_trip_ms must be a positive number" in capsys.readouterr().err


# == from recorded round timings to the report, through real heartbeats (no Spark) ==========

ROOT = Path(__file__).resolve().parents[3]
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False),), ("id",))
#: The standalone test cluster's workers: 127.0.0.2-7 in racks /dc1/rack1-3 (conf/topology.txt).
WORKERS = [TServerMeta(f"ts{n}", f"127.0.0.{n}", 7050, f"/data/ts{n}") for n in range(2, 8)]
#: Scheduler delays (ms) recorded on loopback (tests/unit/replication/test_round_trips.py).
LOOPBACK_MS = [192, 10, 24, 7, 12, 14, 70, 13, 13, 18, 13, 6, 12, 7, 3, 10, 6, 15, 5]


def mapping_cmd(tmp: Path) -> str:
    script, topology = ROOT / "conf" / "location_mapping.sh", ROOT / "conf" / "topology.txt"
    if os.access(script, os.X_OK):
        return f"{script} {topology}"
    wrapper = tmp / "map.sh"  # pragma: no cover - a checkout without the exec bit
    wrapper.write_text(f"#!/bin/sh\nexec sh {script} \"$@\"\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    return f"{wrapper} {topology}"


@pytest.fixture
def racked(tmp_path: Path) -> Iterator[MasterClient]:
    with EmbeddedMaster(str(tmp_path / "wh"), 1,
                        location_mapping_cmd=mapping_cmd(tmp_path)) as master:
        client = master.client()
        client.leader_address(timeout_s=30)
        yield client


def test_round_timings_reach_ksck_through_the_heartbeats_and_a_far_rack_is_warned(
    racked: MasterClient,
) -> None:
    rounds = RoundTrips()
    for ms in LOOPBACK_MS:
        for w in WORKERS:
            far = 45 if w.host in ("127.0.0.6", "127.0.0.7") else 0  # /dc1/rack3
            rounds.observe(w.host, (ms + far) / 1000)
    reporter = LivenessReporter(racked, WORKERS, lambda: {w.host for w in WORKERS},
                                round_trips=rounds.estimates)
    reporter.beat_once()  # registers the servers (locations resolved) with their estimates
    racked.create_table("events", SCHEMA, PartitionSchema((HashDimension(("id",), 3),)))
    reporter.beat_once()

    state = RemoteSource(racked).state(masters=True)
    assert state.round_trips["ts2"].ms == 3.0 and state.round_trips["ts6"].ms == 48.0
    assert state.round_trips["ts2"].samples == len(LOOPBACK_MS)
    ok, out = ksck_report(state, "json")
    data = json.loads(out)
    assert ok and data["ok"] is True  # warned about below, advisory
    assert {(p["Location A"], p["Location B"]): p["Round trip (ms)"]
            for p in data["location_round_trips"]} == {
        ("/dc1/rack1", "/dc1/rack2"): 6.0, ("/dc1/rack1", "/dc1/rack3"): 51.0,
        ("/dc1/rack2", "/dc1/rack3"): 51.0}
    # Every tablet has one replica per rack, so every tablet spans the far rack.
    assert sorted(t["Tablet"] for t in data["slow_tablets"]) == sorted(
        tb.tablet_id for tb in racked.get_table("events").tablets)
    ok, text = ksck_report(state, max_round_trip_ms=60.0)
    assert ok and "Round trips between locations (through the driver)" in text, text
    assert "round trip exceeds" not in text, text


def test_a_heartbeat_without_an_estimate_keeps_the_last_one(racked: MasterClient) -> None:
    ts = WORKERS[0]
    racked.heartbeat_to(racked.leader_address(), ts, round_trip={"ms": 4.5, "samples": 9})
    racked.heartbeat_to(racked.leader_address(), ts)  # e.g. a client that ran no round yet
    (row,) = racked.list_tservers()
    assert (row["round_trip_ms"], row["round_trip_samples"]) == (4.5, 9)
    assert 0 <= row["round_trip_age_s"] < 30


@pytest.mark.parametrize("bad", [
    {"ms": "4"}, {"ms": -1.0, "samples": 3}, {"ms": 4.0, "samples": 0},
    {"ms": float("nan"), "samples": 3}, {"ms": True, "samples": 3}, {"samples": 3},
])
def test_a_malformed_estimate_is_ignored_and_the_server_stays_live(
    racked: MasterClient, bad: dict[str, object],
) -> None:
    racked.heartbeat_to(racked.leader_address(), WORKERS[0], round_trip=bad)
    (row,) = racked.list_tservers()
    assert row["live"] is True and "round_trip_ms" not in row
