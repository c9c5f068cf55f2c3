"""Applying committed writes in the background, in the resident tablet server (DESIGN §3).

A replica applies an entry once it learns the entry is committed. Without a resident server
that happens inside the request that tells it (a STEP to a follower, a PERSIST to the
leader's replica), holding the replica's ``flock``: after one large write the next round
applies the whole write on every replica. Measured at 50M rows (8M composite-key rows per
replica), such a round did not end within the 300 s round timeout, and every later round
needing those replicas waited on their locks.

In the resident server (:mod:`~pyspark_kudu.spark.host.tablet_server`) only the leader's
replica in a round collecting per-row results, which a write waits for, applies committed
entries inside the request, for up to ``leader_inline_s`` (at least one entry); every other
request (a follower's, or the leader's in a replication or settle round: nobody waits for
those applies) applies none and hands them all to this applier: the request records the
commit index and returns. A settle round after a 10M-row write took 5-17 s while followers
applied up to a second's worth of entries inline, a MemRowSet flush included, each.

The applier's thread applies each scheduled replica's backlog in chunks of about
``chunk_s``, taking the replica's tablet lock for one chunk at a time and its log lock only
to read a page of entries (:func:`~pyspark_kudu.spark.host.replica_apply.apply_in_background`):
rounds that apply nothing hold only the log lock, so they append meanwhile, even while a
chunk flushes a MemRowSet (:mod:`~pyspark_kudu.spark.host.replica_cache`, "Two locks per
replica"); scans, maintenance and a leader's apply for per-row results get the replica
between chunks. It lets the server's requests run first (it waits up to ``yield_s`` for a
moment with none in flight before each chunk). A chunk that started with no request in
flight also ends early, after the entry it is applying, when one arrives: a request that
needs the tablet then waits for one entry, not up to ``chunk_s``.
(A chunk that started after ``yield_s`` with requests still in flight runs its whole
``chunk_s``: under a steady stream of requests the backlog still shrinks.)

**Leaders first.** A write with insert, update or delete rows waits for its per-row
results, i.e. for the apply on the leader's replica; nobody waits for a follower's. So a
replica scheduled by a PERSIST (the leader's request) is applied before any scheduled by a
STEP, whatever their order; and while a leader's request applies for a write waiting on its
results (:meth:`BackgroundApplier.urgent`), this applier starts no chunk, however long it
has yielded: its chunks would share the process's GIL with that apply (a chunk runs at a
lower priority, and a thread holding the GIL while the kernel runs other processes stalls
the apply). (Holding the followers back on every server while a write
collects its results was tried too: on the shared 2-core test cluster the 10M-row inserts
were no faster with it, and the held work landed in the next write.)

**Deferred flushes.** The leader's inline apply in a round collecting results leaves a due
MemRowSet flush to this applier (:class:`~pyspark_kudu.spark.host.replica_apply.ApplyLimit`):
the request schedules the replica as the leader's, and the applier's next chunk for it
flushes (``apply_backlog``) when no entries are left to apply, so the flush runs after the
write got its results rather than in front of them.

Per-row results of the entries it applies are kept (at most ``max_results`` entries' per
replica, the oldest dropped first) until the next PERSIST or STEP to that replica returns
them: a write collecting its results
(:func:`~pyspark_kudu.spark.replication.multitablet.collect_results`) keeps asking while
they keep coming.

Nothing about correctness changes: the applied index is still the ``applied`` file written
under the lock, entries are applied in log order by the same code, a configuration entry is
still applied within the request that commits it (with everything before it), and a scan
still applies the rest itself before reading
(:func:`~pyspark_kudu.spark.host.replica_apply.catch_up`).
A server that dies loses only this queue: the next request or scan applies from the file.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from pyspark_kudu.errors import KuduError
from pyspark_kudu.tablet import WriteResult
from pyspark_kudu.tablet.memory import release_unused_memory
from pyspark_kudu.wal import WalOptions

__all__ = ["BackgroundApplier", "lower_thread_priority"]

_log = logging.getLogger(__name__)

_Key = tuple[str, str]  # (data root, tablet id)


def lower_thread_priority(nice: int) -> int:
    """Raise the calling thread's nice value by ``nice`` (Linux: a thread's own scheduling
    priority), so the machine's other work gets the CPU first and this thread what is left.
    Returns the thread's nice value after the change, or 0 when it changed nothing
    (``nice <= 0``, no per-thread priorities, or the change was refused: logged)."""
    if nice <= 0 or not sys.platform.startswith("linux"):
        return 0
    tid = threading.get_native_id()
    try:
        now = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(now + nice, 19))
        return os.getpriority(os.PRIO_PROCESS, tid)
    except OSError as e:
        _log.warning("could not lower the priority of thread %s: %s", tid, e)
        return 0


@dataclass
class _Stats:
    chunks: int = 0
    yielded: int = 0  # chunks that ended early for a request (module docstring)
    entries: int = 0
    seconds: float = 0.0
    results_dropped: int = 0
    failures: int = 0


class BackgroundApplier:
    """The resident server's queue of replicas with committed, unapplied entries (module
    docs). ``start=False`` runs no thread: the owner calls :meth:`run_once` (tests)."""

    def __init__(self, *, leader_inline_s: float = 10.0, chunk_s: float = 0.5,
                 yield_s: float = 2.0, max_results: int = 65536, nice: int = 0,
                 start: bool = True) -> None:
        self.leader_inline_s = leader_inline_s
        self.nice = nice
        self.chunk_s = chunk_s
        self.yield_s = yield_s
        self.max_results = max_results
        self._cv = threading.Condition()
        # scheduled replica -> (its WAL options, scheduled by the leader's request)
        self._queue: OrderedDict[_Key, tuple[WalOptions | None, bool]] = OrderedDict()
        self._results: dict[_Key, OrderedDict[int, WriteResult]] = {}
        self._foreground = 0
        self._urgent = 0
        self._running: _Key | None = None
        self._stopped = False
        self.stats = _Stats()
        self._thread: threading.Thread | None = None
        if start:
            self._thread = threading.Thread(target=self._loop, name="background-apply",
                                            daemon=True)
            self._thread.start()

    # -- called by requests --------------------------------------------------------------
    def schedule(self, root: str, tablet_id: str, options: WalOptions | None, *,
                 leader: bool = False) -> None:
        """The replica has committed entries it has not applied: apply them soon.
        ``leader``: it is the leader's replica (a PERSIST): it goes before the followers."""
        with self._cv:
            self._queue[(root, tablet_id)] = (options, leader)
            self._cv.notify_all()

    def take_results(self, root: str, tablet_id: str) -> list[WriteResult]:
        """Per-row results of entries this applier applied on the replica since the last
        call (a request returns them to the leader)."""
        with self._cv:
            got = self._results.pop((root, tablet_id), None)
        return list(got.values()) if got else []

    @contextlib.contextmanager
    def foreground(self) -> Iterator[None]:
        """Around a request the server serves: the applier lets it run first."""
        with self._cv:
            self._foreground += 1
        try:
            yield
        finally:
            with self._cv:
                self._foreground -= 1
                self._cv.notify_all()

    @contextlib.contextmanager
    def urgent(self) -> Iterator[None]:
        """Around a leader's apply that a write waits for (its per-row results): no chunk
        starts meanwhile (one running finishes), whatever ``yield_s`` says; such an apply
        ends within ``leader_inline_s``. Module docstring, "Leaders first"."""
        with self._cv:
            self._urgent += 1
        try:
            yield
        finally:
            with self._cv:
                self._urgent -= 1
                self._cv.notify_all()

    # -- the work ------------------------------------------------------------------------
    def pending(self) -> list[tuple[str, str]]:
        """Replicas scheduled or being applied now."""
        with self._cv:
            keys = list(self._queue)
            if self._running is not None and self._running not in keys:
                keys.append(self._running)
            return keys

    def _next(self) -> _Key | None:
        """(Under the condition's lock.) The replica to apply next: the oldest leader's
        replica scheduled, else the oldest follower."""
        for key, (_, leader) in self._queue.items():
            if leader:
                return key
        return next(iter(self._queue), None)

    def run_once(self) -> bool:
        """Apply one chunk of the next scheduled replica's backlog (:meth:`_next`); False
        if none was scheduled. A replica with more to apply goes to the back of the queue."""
        with self._cv:
            key = self._next()
            if key is None:
                return False
            options, leader = self._queue.pop(key)
            self._running = key
            preemptible = not self._foreground  # module docstring
        from pyspark_kudu.spark.host.handlers import apply_backlog

        started = time.monotonic()
        more = False
        try:
            more, results, entries = apply_backlog(
                key[0], key[1], options, self.chunk_s,
                self._request_waiting if preemptible else None)
        except (KuduError, OSError) as e:  # the next request meets the same and reports it
            _log.warning("background apply of tablet %s under %s failed: %s", key[1],
                         key[0], e)
            results, entries = [], 0
            with self._cv:
                self.stats.failures += 1
        with self._cv:
            self._running = None
            self.stats.chunks += 1
            if more and preemptible and self._foreground:
                self.stats.yielded += 1
            self.stats.entries += entries
            self.stats.seconds += time.monotonic() - started
            if results:
                kept = self._results.setdefault(key, OrderedDict())
                for r in results:
                    kept[r.index] = r
                while len(kept) > self.max_results:
                    kept.popitem(last=False)
                    self.stats.results_dropped += 1
            if more:
                self._queue.setdefault(key, (options, leader))
            self._cv.notify_all()
        if not more:  # a backlog done: hand its batches' pages back (as after a round)
            release_unused_memory()
        return True

    def _request_waiting(self) -> bool:
        """Whether a request is in flight (read without the lock: one int, and a stale
        answer only ends a chunk one entry later or sooner)."""
        return self._foreground > 0

    def wait_idle(self, timeout_s: float) -> bool:
        """Until nothing is scheduled or being applied (True), or ``timeout_s`` passed."""
        end = time.monotonic() + timeout_s
        with self._cv:
            while self._queue or self._running is not None:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def report(self) -> dict[str, float | int]:
        """Counters for the server's ``ping``."""
        with self._cv:
            s = self.stats
            return {"chunks": s.chunks, "yielded": s.yielded, "entries": s.entries,
                    "seconds": round(s.seconds, 3), "results_dropped": s.results_dropped,
                    "failures": s.failures,
                    "scheduled": len(self._queue) + (self._running is not None)}

    def stop(self) -> None:
        with self._cv:
            self._stopped = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        lower_thread_priority(self.nice)
        while True:
            with self._cv:
                while not self._queue and not self._stopped:
                    self._cv.wait()
                if self._stopped:
                    return
                end = time.monotonic() + self.yield_s
                while self._foreground and not self._stopped:
                    left = end - time.monotonic()
                    if left <= 0 and not self._urgent:
                        break
                    self._cv.wait(left if left > 0 else None)  # urgent: until it ends
            self.run_once()
