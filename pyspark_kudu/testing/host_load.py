"""What the machine was doing during a window of a benchmark: CPU busy / iowait / steal
shares from ``/proc/stat`` and the page cache's dirty and writeback bytes from
``/proc/meminfo``, sampled on a thread (Linux only; elsewhere nothing is sampled).

A figure moved by the machine's own state (a disk still writing back an ingest, cores shared
by every "host" of a one-machine cluster) says so next to it. Thread-safe.
"""

from __future__ import annotations

import threading
import time
from typing import Any

__all__ = ["HostLoad"]

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


class HostLoad:
    """Samples every ``period_s`` from :meth:`start` to :meth:`stop`; :meth:`window`
    summarises the samples between two ``time.time()`` instants."""

    def __init__(self, period_s: float = 0.05) -> None:
        self.period_s = period_s
        self._samples: list[tuple[float, tuple[int, ...], int]] = []
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
        self._sample()

    def _sample(self) -> bool:
        cpu, dirty = _cpu(), _dirty_bytes()
        if cpu is None or dirty is None:
            return False
        with self._lock:
            self._samples.append((time.time(), cpu, dirty))
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
                "dirty_mb_peak": round(max(s[2] for s in [a, *inside, b]) / 1e6, 1)}
