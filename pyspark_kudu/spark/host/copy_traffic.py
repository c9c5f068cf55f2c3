"""Tablet copies in flight in this process, so that background work can step aside.

A copy restores a tablet's fault tolerance; a compaction or an idle flush only keeps scans
fast. On a host whose cores and disk are shared, the resident server's maintenance
(:mod:`~pyspark_kudu.spark.host.maintenance_manager`) running beside a copy's fetch slows
the fetch: in ``benchmarks/recovery.py`` at 1 GB, the targets still applying and compacting
the ingest fetched 2-3x slower than the one that was idle. So every fetch of a served copy
(:mod:`~pyspark_kudu.spark.host.copy_fetch`: a prefetch or an install's) is counted here
while it runs, and the maintenance manager waits for none to run before each operation and
before each merged chunk of a compaction, for a bounded time (a copy that takes longer
does not stop maintenance: it gets a chunk per wait). The background applier needs nothing
from here: a fetch holds the server's ``foreground`` gate, which it already waits for.

Thread-safety: every function may be called from any thread.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["copies_fetching", "fetching", "wait_for_copies"]

_cv = threading.Condition()
_running = 0


@contextlib.contextmanager
def fetching() -> Iterator[None]:
    """Around one fetch of tablet copies."""
    global _running
    with _cv:
        _running += 1
    try:
        yield
    finally:
        with _cv:
            _running -= 1
            _cv.notify_all()


def copies_fetching() -> int:
    """How many fetches of tablet copies run in this process now."""
    with _cv:
        return _running


def wait_for_copies(max_s: float) -> float:
    """Wait until no tablet copy is being fetched by this process, at most ``max_s``
    seconds; returns the seconds waited."""
    t0 = time.monotonic()
    end = t0 + max_s
    with _cv:
        while _running:
            left = end - time.monotonic()
            if left <= 0:
                break
            _cv.wait(left)
    return time.monotonic() - t0
