"""The driver's round-trip estimates from its rounds' task timings
(pyspark_kudu.spark.replication.latency), fed with recorded timings instead of Spark."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from pyspark_kudu.spark.replication.latency import (
    DEFAULT_WINDOW,
    MAX_HARVEST,
    PENDING_S,
    RoundTrip,
    RoundTrips,
)

#: Scheduler delays (ms) of 46 consecutive rounds' tasks, recorded in local mode on loopback
#: with 2 busy cores: the first task loads classes, the others swing with the load.
LOOPBACK_MS = [192, 10, 24, 7, 12, 14, 70, 13, 13, 18, 13, 6, 12, 7, 13, 25, 6, 4, 5, 10, 5, 10,
               8, 26, 12, 6, 157, 3, 32, 6, 4, 11, 11, 8, 3, 10, 6, 15, 5, 4, 6, 5, 12, 7, 10, 10]


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class RecordedDelays:
    """Spark's status store as the rounds left it: delays by job group, once recorded."""

    def __init__(self) -> None:
        self.by_group: dict[str, dict[int, float]] = {}
        self.reads = 0

    def __call__(self, group: str) -> Mapping[int, float] | None:
        self.reads += 1
        return self.by_group.get(group)


def test_the_estimate_is_the_lowest_recent_sample_so_load_spikes_do_not_raise_it() -> None:
    rt = RoundTrips()
    for ms in LOOPBACK_MS:
        rt.observe("h", ms / 1000)
    assert rt.estimates() == {"h": RoundTrip(3.0, len(LOOPBACK_MS))}


def test_a_slow_link_raises_every_sample_and_so_the_estimate() -> None:
    rt = RoundTrips()
    for ms in LOOPBACK_MS:
        rt.observe("near", ms / 1000)
        rt.observe("far", (ms + 60) / 1000)  # 60 ms more on the wire, both ways together
    est = rt.estimates()
    assert est["near"].ms == pytest.approx(3.0) and est["far"].ms == pytest.approx(63.0)


def test_only_the_last_window_of_samples_counts() -> None:
    rt = RoundTrips(window=4)
    for ms in (1, 50, 40, 30, 20):  # the link got slower: the 1 ms sample ages out
        rt.observe("h", ms / 1000)
    assert rt.estimates()["h"] == RoundTrip(20.0, 5)
    assert DEFAULT_WINDOW >= 16  # enough samples to see a quiet moment between load spikes


def test_noted_rounds_become_samples_once_spark_recorded_their_tasks() -> None:
    delays = RecordedDelays()
    rt = RoundTrips(delays)
    rt.note_round("round-1", ["h1", "h2"])
    assert rt.estimates() == {}  # the status store has not seen the job end yet
    delays.by_group["round-1"] = {0: 0.004, 1: 0.009}
    assert rt.estimates() == {"h1": RoundTrip(4.0, 1), "h2": RoundTrip(9.0, 1)}
    reads = delays.reads
    assert rt.estimates() == {"h1": RoundTrip(4.0, 1), "h2": RoundTrip(9.0, 1)}
    assert delays.reads == reads  # a round is sampled once


def test_a_heartbeat_reads_only_the_newest_rounds() -> None:
    """Under many writers the driver runs many rounds a second: each estimate reads the
    newest ``MAX_HARVEST`` of them (each read is ~20 Py4J calls), and forgets the rest."""
    delays = RecordedDelays()
    rt = RoundTrips(delays)
    for k in range(3 * MAX_HARVEST):
        delays.by_group[f"r{k}"] = {0: (k + 1) / 1000}
        rt.note_round(f"r{k}", ["h"])
    assert rt.estimates() == {"h": RoundTrip(2.0 * MAX_HARVEST + 1, MAX_HARVEST)}
    assert delays.reads == MAX_HARVEST
    assert rt.estimates() == {"h": RoundTrip(2.0 * MAX_HARVEST + 1, MAX_HARVEST)}
    assert delays.reads == MAX_HARVEST, "the older rounds were dropped, not kept for later"


def test_a_misplaced_task_or_one_spark_did_not_time_gives_no_sample() -> None:
    delays = RecordedDelays()
    rt = RoundTrips(delays)
    delays.by_group["r"] = {0: 0.005, 2: 0.007}  # partition 1 has no metrics
    rt.note_round("r", ["h1", "h2", ""])  # partition 2 ran on the wrong host
    assert rt.estimates() == {"h1": RoundTrip(5.0, 1)}


def test_a_round_spark_never_records_is_dropped_after_a_while() -> None:
    clock = FakeClock()
    delays = RecordedDelays()
    rt = RoundTrips(delays, clock=clock)
    rt.note_round("lost", ["h"])
    rt.estimates()
    clock.now += PENDING_S + 1
    rt.estimates()
    delays.by_group["lost"] = {0: 0.001}
    assert rt.estimates() == {}


def test_unreadable_timings_cost_the_samples_never_the_caller() -> None:
    def broken(group: str) -> Mapping[int, float] | None:
        raise AttributeError("'JavaObject' has no attribute 'statusStore'")

    rt = RoundTrips(broken)
    rt.note_round("r", ["h"])
    assert rt.estimates() == {}


def test_without_a_reader_rounds_are_not_kept() -> None:
    rt = RoundTrips()
    for k in range(10_000):
        rt.note_round(f"r{k}", ["h"])
    assert rt.estimates() == {}


def test_the_heartbeat_field_is_milliseconds_and_samples() -> None:
    assert RoundTrip(3.14159, 7).to_dict() == {"ms": 3.142, "samples": 7}
