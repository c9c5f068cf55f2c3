"""Waiting for the tablet servers to finish a write's deferred work, for benchmarks.

A write returns once a majority of each tablet's replicas made it durable (and, for insert,
once the leaders applied it for the per-row results); the followers' applies, the leaders'
deferred flushes and the compactions the new rowsets call for run afterwards in the
resident tablet servers. On this project's 2-core test machine that work shares the cores
with whatever the benchmark measures next, so ``benchmarks/scale.py`` waits for the servers
to be quiet before each timed write and records what the wait took: the write's *deferred*
time and server CPU, reported next to the time the caller waited.

"Quiet" is measured, not assumed: the servers' CPU (``/proc``) grew by less than
``idle_cpu_s`` over a whole ``window_s``. The window is longer than the maintenance's busy
period plus one cycle (10 s + 5 s by default, see
:mod:`~pyspark_kudu.spark.host.maintenance_manager`), so a compaction that waits for a
replica to stop being written is not mistaken for the end.

Linux only (``/proc``). Thread-safety: none needed (one caller).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pyspark_kudu.spark.host.tserver_client import ping
from pyspark_kudu.testing import procfs

if TYPE_CHECKING:
    from pyspark_kudu.spark.api.context import KuduContext

__all__ = ["Settled", "process_cpu_s", "server_pids", "wait_quiet"]

_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Settled:
    """The outcome of :func:`wait_quiet`: ``seconds`` from the call until the quiet window
    began, the watched processes' ``cpu_s`` meanwhile, and whether they went ``quiet``
    before the deadline (if not, both figures run to the deadline)."""

    seconds: float
    cpu_s: float
    quiet: bool


def wait_quiet(cpu: Callable[[], float], *, window_s: float = 16.0, idle_cpu_s: float = 0.4,
               poll_s: float = 1.0, deadline_s: float = 900.0,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], object] = time.sleep) -> Settled:
    """Poll ``cpu()`` (the watched processes' cumulative CPU seconds) every ``poll_s`` until
    it grew by less than ``idle_cpu_s`` over the last ``window_s``, or ``deadline_s``
    passed."""
    if window_s <= 0 or poll_s <= 0 or idle_cpu_s < 0:
        raise ValueError("window_s and poll_s must be positive, idle_cpu_s not negative")
    t0, c0 = clock(), cpu()
    samples: deque[tuple[float, float]] = deque([(t0, c0)])
    while True:
        sleep(poll_s)
        now, c = clock(), cpu()
        samples.append((now, c))
        # The oldest sample still inside the window is where the window starts.
        while len(samples) > 1 and samples[1][0] <= now - window_s:
            samples.popleft()
        start, c_start = samples[0]
        if now - start >= window_s and c - c_start < idle_cpu_s:
            return Settled(start - t0, c_start - c0, True)
        if now - t0 >= deadline_s:
            return Settled(now - t0, c - c0, False)


def process_cpu_s(pids: Iterable[int]) -> float:
    """User + system CPU seconds of ``pids`` (all their threads) so far; a process that is
    gone counts as 0 (its CPU is then missing from later readings)."""
    total = 0
    for pid in pids:
        f = procfs.stat_fields(pid)
        if f is not None:
            total += int(f[procfs.UTIME]) + int(f[procfs.STIME])
    return total * _TICK_S


def server_pids(kudu: KuduContext) -> list[int]:
    """The process ids of the cluster's resident tablet servers, as their ``ping`` says."""
    secret = kudu.credential.encode()
    return sorted(int(ping(a, secret)["pid"]) for a in kudu.server_addresses().values())
