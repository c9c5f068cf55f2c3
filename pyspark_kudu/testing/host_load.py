"""What the machine was doing during a window of a benchmark: CPU busy / iowait / steal
shares from ``/proc/stat``, the page cache's dirty and writeback bytes from
``/proc/meminfo``, and (less often) the CPU seconds of each kind of process (Spark's JVMs,
executor Python, this driver, ...) from ``/proc/<pid>/stat``, sampled on a thread (Linux
only; elsewhere nothing is sampled).

A figure moved by the machine's own state (a disk still writing back an ingest, cores shared
by every "host" of a one-machine cluster) says so next to it. Thread-safe.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

from pyspark_kudu.testing import procfs

__all__ = ["HostLoad", "process_cpu_now"]

_CPU_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")


def _cpu() -> tuple[int, ...] | None:
    try:
        with open("/proc/stat", encoding="ascii") as f:
            parts = f.readline().split()
    except OSError:
        return None
    return tuple(int(v) for v in parts[1:1 + len(_CPU_FIELDS)])


def _dirty_bytes() -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kb = {k.rstrip(":"): int(v) for k, v, *_ in (line.split() for line in f)
                  if k in ("Dirty:", "Writeback:")}
    except (OSError, ValueError):
        return None
    return 1024 * sum(kb.values())


_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 0.01


def _kind(pid: int, me: int) -> str:
    """What a process is, from its command line."""
    if pid == me:
        return "this driver (Python)"
    raw = procfs.cmdline(pid)
    if raw is None:
        return "other"
    cmd = raw.replace(b"\0", b" ").decode("utf-8", "replace")
    if "CoarseGrainedExecutorBackend" in cmd:
        return "executor JVMs"
    if "deploy.worker.Worker" in cmd or "deploy.master.Master" in cmd:
        return "Spark daemons"
    if "java" in cmd.split(" ", 1)[0] and "pyspark-shell" in cmd:
        return "driver JVM"
    if "pyspark.daemon" in cmd or "spark.host.daemon" in cmd or "pyspark.worker" in cmd:
        return "executor Python (workers, tablet servers)"
    if "java" in cmd.split(" ", 1)[0]:
        return "other JVMs"
    return "other"


def _process_cpu(kinds: dict[int, str], me: int) -> dict[str, float]:
    """CPU seconds used so far by each kind of live process (``kinds`` caches pids)."""
    out: dict[str, float] = {}
    for pid in procfs.pids():
        fields = procfs.stat_fields(pid)
        if fields is None:
            continue
        kind = kinds.get(pid)
        if kind is None:
            kind = kinds[pid] = _kind(pid, me)
        ticks = int(fields[procfs.UTIME]) + int(fields[procfs.STIME])
        out[kind] = out.get(kind, 0.0) + ticks * _TICK_S
    return out


def process_cpu_now(kinds: dict[int, str] | None = None) -> dict[str, float]:
    """CPU seconds used so far by each kind of live process, read once (no sampling
    thread): two readings around a phase give what each kind used in it. ``kinds`` caches
    the pids' kinds between readings. Empty where there is no ``/proc``."""
    return _process_cpu({} if kinds is None else kinds, os.getpid())


class HostLoad:
    """Samples every ``period_s`` from :meth:`start` to :meth:`stop`; :meth:`window`
    summarises the samples between two ``time.time()`` instants."""

    def __init__(self, period_s: float = 0.05, process_period_s: float = 0.25) -> None:
        self.period_s = period_s
        self.process_period_s = process_period_s
        self._samples: list[tuple[float, tuple[int, ...], int]] = []
        self._processes: list[tuple[float, dict[str, float]]] = []
        self._kinds: dict[int, str] = {}
        self._next_processes = 0.0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._first = threading.Event()
        self._thread = threading.Thread(target=self._run, name="host-load", daemon=True)

    def start(self) -> HostLoad:
        """Start sampling; returns once the first sample is taken (or none can be)."""
        self._thread.start()
        self._first.wait(10)
        return self

    def stop(self) -> None:
        """Stop sampling, with one last sample now: a window that ended before has its
        sample after it."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._next_processes = 0.0  # the last sample has the processes too
        self._sample()

    def _sample(self) -> bool:
        cpu, dirty = _cpu(), _dirty_bytes()
        if cpu is None or dirty is None:
            return False
        now = time.time()
        with self._lock:
            self._samples.append((now, cpu, dirty))
        if now >= self._next_processes:
            self._next_processes = now + self.process_period_s
            used = _process_cpu(self._kinds, os.getpid())
            with self._lock:
                self._processes.append((time.time(), used))
        return True

    def _run(self) -> None:
        while True:
            ok = self._sample()
            self._first.set()
            if not ok or self._stop.wait(self.period_s):  # the sampling period
                return

    def window(self, t0: float, t1: float) -> dict[str, Any]:
        """CPU shares over ``[t0, t1]`` (the samples around it), and the dirty + writeback
        megabytes at its start and their peak inside it; empty without samples there."""
        with self._lock:
            samples = list(self._samples)
            processes = list(self._processes)
        before = [s for s in samples if s[0] <= t0]
        after = [s for s in samples if s[0] >= t1]
        inside = [s for s in samples if t0 <= s[0] <= t1]
        if not before or not after:
            return {}
        a, b = before[-1], after[0]
        delta = [y - x for x, y in zip(a[1], b[1], strict=True)]
        total = sum(delta) or 1
        share = dict(zip(_CPU_FIELDS, (d / total for d in delta), strict=True))
        busy = 1.0 - share["idle"] - share["iowait"] - share["steal"]
        return {"seconds": round(b[0] - a[0], 3), "cpu_busy": round(busy, 3),
                "cpu_iowait": round(share["iowait"], 3), "cpu_steal": round(share["steal"], 3),
                "cpu_system": round(share["system"] + share["irq"] + share["softirq"], 3),
                "dirty_mb_at_start": round(a[2] / 1e6, 1),
                "dirty_mb_peak": round(max(s[2] for s in [a, *inside, b]) / 1e6, 1),
                "process_cpu_s": _process_window(processes, t0, t1)}


def _process_window(processes: list[tuple[float, dict[str, float]]], t0: float, t1: float
                    ) -> dict[str, Any]:
    """CPU seconds per kind of process between the process samples around ``[t0, t1]``
    (a process that ended meanwhile is missing from the later one: its share is not
    counted), largest first, with the samples' own span."""
    before = [p for p in processes if p[0] <= t0]
    after = [p for p in processes if p[0] >= t1]
    if not before or not after:
        return {}
    (ta, a), (tb, b) = before[-1], after[0]
    used = {k: round(v - a.get(k, 0.0), 2) for k, v in b.items()}
    return {"span_s": round(tb - ta, 3),
            **dict(sorted(((k, v) for k, v in used.items() if v > 0),
                          key=lambda kv: -kv[1]))}
