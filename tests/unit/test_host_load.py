"""The benchmarks' host load sampler: CPU shares and dirty page cache bytes over a window,
from ``/proc`` (Linux)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from pyspark_kudu.testing.host_load import HostLoad, process_cpu_now

pytestmark = [pytest.mark.unit,
              pytest.mark.skipif(not sys.platform.startswith("linux"),
                                 reason="the sampler reads /proc/stat and /proc/meminfo (Linux)")]


def test_a_window_shows_the_cpu_a_busy_thread_used_and_the_bytes_it_left_dirty(
        tmp_path: Path) -> None:
    load = HostLoad(period_s=0.02).start()
    t0 = time.time()
    spin_end = time.monotonic() + 0.5
    while time.monotonic() < spin_end:  # one core busy for the window's first half second
        pass
    with open(tmp_path / "dirty.bin", "wb") as f:  # 64 MB left in the page cache, unsynced
        f.write(os.urandom(64 << 20))
    t1 = time.time()
    load.stop()  # its last sample comes after the window
    got = load.window(t0, t1)
    assert got["seconds"] >= t1 - t0 - 0.001  # (rounded to ms)
    # One of the machine's cores was busy for most of the window (others may add to it).
    assert got["cpu_busy"] + got["cpu_steal"] >= 0.4 / (os.cpu_count() or 1), got
    assert 0.0 <= got["cpu_iowait"] <= 1.0 and 0.0 <= got["cpu_system"] <= got["cpu_busy"]
    # Dirty + writeback bytes: the file's, unless the kernel wrote them back at once.
    assert got["dirty_mb_peak"] >= got["dirty_mb_at_start"]
    # The CPU seconds per kind of process: this one spun for 0.5 s of it.
    assert got["process_cpu_s"]["this driver (Python)"] >= 0.3, got["process_cpu_s"]
    assert got["process_cpu_s"]["span_s"] >= t1 - t0 - 0.001
    # A window without samples on both sides says nothing rather than something wrong.
    assert load.window(t1 + 3600, t1 + 3601) == {}


def test_two_readings_of_process_cpu_give_what_each_kind_used_between_them() -> None:
    kinds: dict[int, str] = {}
    before = process_cpu_now(kinds)
    spun = time.process_time() + 0.3
    while time.process_time() < spun:  # 0.3 CPU-s of this process, however loaded the host
        pass
    after = process_cpu_now(kinds)
    me = "this driver (Python)"
    assert after[me] - before[me] >= 0.25, (before, after)
    assert os.getpid() in kinds  # the pids' kinds were cached for the next reading
