"""Waiting for the tablet servers' deferred work (pyspark_kudu.testing.settle): the quiet
rule over a scripted CPU series, and the /proc CPU reading of a real busy process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from pyspark_kudu.testing.settle import process_cpu_s, wait_quiet
from tests.waiting import wait_until


class _Series:
    """A clock that ``sleep`` advances, and cumulative CPU given as a rate per second."""

    def __init__(self, rate: list[float]) -> None:
        self.rate = rate  # CPU seconds used during second i
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def cpu(self) -> float:
        whole = int(self.now)
        return sum(self.rate[:whole]) + (self.now - whole) * (
            self.rate[whole] if whole < len(self.rate) else 0.0)


def test_quiet_starts_where_the_cpu_stopped_and_counts_the_cpu_until_then() -> None:
    s = _Series([1.5] * 7 + [0.01] * 40)
    got = wait_quiet(s.cpu, window_s=5, idle_cpu_s=0.2, clock=s.clock, sleep=s.sleep)
    assert got.quiet
    assert got.seconds == pytest.approx(7, abs=1)
    assert got.cpu_s == pytest.approx(1.5 * 7, abs=1.6)
    assert s.now == pytest.approx(got.seconds + 5, abs=1)  # waited one window past it


def test_a_burst_after_a_lull_shorter_than_the_window_is_waited_for() -> None:
    # Busy 3 s, a 3-s lull (as a compaction waiting out the busy period), busy 4 s again.
    s = _Series([1.0] * 3 + [0.0] * 3 + [1.0] * 4 + [0.0] * 30)
    got = wait_quiet(s.cpu, window_s=5, idle_cpu_s=0.2, clock=s.clock, sleep=s.sleep)
    assert got.quiet and got.seconds == pytest.approx(10, abs=1)
    assert got.cpu_s == pytest.approx(7, abs=1.1)


def test_servers_that_never_go_quiet_are_reported_at_the_deadline() -> None:
    s = _Series([0.5] * 100)
    got = wait_quiet(s.cpu, window_s=5, idle_cpu_s=0.2, deadline_s=20, clock=s.clock,
                     sleep=s.sleep)
    assert not got.quiet
    assert got.seconds == pytest.approx(20, abs=1)
    assert got.cpu_s == pytest.approx(10, abs=0.6)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="window_s"):
        wait_quiet(lambda: 0.0, window_s=0)


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc on this platform")
def test_process_cpu_counts_a_busy_child_and_nothing_for_a_gone_one() -> None:
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        wait_until(lambda: process_cpu_s([child.pid]) >= 0.3, 60,
                   "a spinning child to use 0.3 CPU-s")
    finally:
        child.kill()
        child.wait()
    assert process_cpu_s([child.pid]) == 0.0  # reaped: gone from /proc
