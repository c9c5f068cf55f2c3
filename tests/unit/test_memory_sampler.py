"""The benchmarks' memory sampler: finds its cluster's executor Python processes (and only
those), and a phase's peak RSS is that phase's own (the high-water mark is reset at its start,
where the kernel lets us)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pyspark_kudu.spark.host.identity import DATA_ROOT_ENV
from pyspark_kudu.testing.memory_sampler import MemorySampler

# Holds 300 MiB, frees it, then says so and waits (named like a PySpark worker).
_CHILD = ("import sys, time\n"
          "b = bytearray(300 << 20)\n"
          "b[::4096] = b'x' * len(b[::4096])\n"
          "del b\n"
          "print('freed', flush=True)\n"
          "time.sleep(60)\n")


def _spawn(root: Path) -> subprocess.Popen[str]:
    env = dict(os.environ, **{DATA_ROOT_ENV: str(root / "data")})
    p = subprocess.Popen([sys.executable, "-c", _CHILD, "pyspark.daemon"], env=env,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "freed"
    return p


@pytest.fixture
def children(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    ours = _spawn(tmp_path / "ours")
    other = _spawn(tmp_path / "another-cluster")
    try:
        yield tmp_path / "ours", ours
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()


def test_a_phase_sees_its_own_clusters_processes_and_its_own_peak(
        children: tuple[Path, subprocess.Popen[str]]) -> None:
    within, _ = children
    sampler = MemorySampler(str(within), period_s=0.05, pss_every=1)
    try:
        with sampler.phase("idle"):
            deadline = time.monotonic() + 30
            while not sampler.phases["idle"]["processes"]:
                assert time.monotonic() < deadline, "the sampler never saw the child process"
                time.sleep(0.05)
            time.sleep(0.2)  # a few more samples
    finally:
        sampler.close()
    p = sampler.phases["idle"]
    assert p["processes"] == 1  # the other cluster's process is not counted
    assert p["max_worker_rss_mb"] > 5 and "max_server_rss_mb" not in p
    assert p["max_total_pss_mb"] > 0
    # The 300 MiB the child held before the phase is not the phase's peak, where the peak
    # could be reset; without that right, the lifetime peak is all /proc offers.
    try:
        with open(f"/proc/{os.getpid()}/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        assert p["max_worker_rss_mb"] >= 300
    else:
        assert p["max_worker_rss_mb"] < 250
