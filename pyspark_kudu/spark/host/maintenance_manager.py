"""Background maintenance of a host's replicas, run by its resident tablet server.

Each cycle (every ``interval_s``) visits the replicas under the data roots this server has
served, and runs at most one bounded operation per replica and ``max_ops`` per cycle, as
:mod:`pyspark_kudu.tablet.maintenance` chooses: a compaction of overlapping rowsets or of a
rowset full of ended versions, or a flush of an idle replica's MemRowSet. A replica whose
applied index moved within the last ``busy_s`` (or that this server has not watched that
long) is being written: it gets only the compaction of a tall stack (writes first, see that
module). A flush runs under the replica's tablet lock (scan planning and applies on the
replica wait for it, rounds appending to its log and scans already streaming do not). A
compaction holds the lock only to start and to commit, and merges without it
(:meth:`~pyspark_kudu.tablet.Tablet.prepare_compaction`): measured at 50M rows, compactions
of 8M-row tablets holding the lock made scans wait 87 s instead of 17 s. A merge whose
inputs a write changed meanwhile is dropped (``compact_conflict``); after ``max_conflicts``
of them in a row the replica's next compaction holds the lock throughout, as before. Every
operation marks the replica changed for other processes' caches first, and publishes its
result with the tablet's atomic superblock replace, so a crash at any point loses nothing
(the tablet's crash points cover flush and compaction).

**History**: versions ended before the *ancient history mark* are dropped by a compaction.
The mark is the newest applied index this server observed at least ``history_max_age_s``
ago (Kudu's ``--tablet_history_max_age_sec``, 15 minutes): a snapshot read older than that
may be refused afterwards, never answered wrongly. Observations live in this process; a new
server starts observing afresh (it keeps more history, never less).

**Memory pressure**: before its other operations, a cycle flushes the largest MemRowSets
held by this process while together they exceed half of its replica budget
(``PYSPARK_KUDU_REPLICA_CACHE_MB``, see :mod:`~pyspark_kudu.spark.host.replica_cache`).

Failed replicas, replicas being copied into and consensus-only replicas are skipped. While
this process fetches a tablet copy, operations wait (``pause``, bounded; see
:mod:`~pyspark_kudu.spark.host.copy_traffic`), a running compaction between merged chunks.

Thread-safety: :class:`MaintenanceManager` runs its cycles on one thread; ``note`` may be
called from any thread.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from pyspark_kudu.errors import KuduError
from pyspark_kudu.spark.host.background_apply import lower_thread_priority
from pyspark_kudu.spark.host.handlers import failed_reason, tablet_dir
from pyspark_kudu.spark.host.replica_apply import read_applied
from pyspark_kudu.spark.host.replica_cache import (
    cache_budget_bytes,
    cached_memory,
    close_cached,
    close_stale,
    open_replica,
)
from pyspark_kudu.spark.host.tabletcopy import COPYING_FILE
from pyspark_kudu.tablet.maintenance import MaintenancePolicy, choose_compaction
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE, Superblock
from pyspark_kudu.wal import WalOptions

__all__ = ["MaintenanceManager", "MaintenanceOp", "maintain_replica"]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenanceOp:
    """One operation a cycle ran: ``kind`` is "compact", "compact_conflict" (merged, then
    dropped: a write changed an input meanwhile) or "flush"."""

    root: str
    tablet_id: str
    kind: str
    rowsets: tuple[int, ...] = ()
    seconds: float = 0.0


def maintain_replica(root: str, tablet_id: str, policy: MaintenancePolicy, *,
                     history_mark: int | None = None, flush: bool = False,
                     compact: bool = True, busy: bool = False,
                     options: WalOptions | None = None,
                     locked: bool = False,
                     between: Callable[[], object] | None = None) -> MaintenanceOp | None:
    """Run the next maintenance operation of one replica, if any is due (module docstring).
    ``flush``: the replica has been idle long enough to flush its MemRowSet (or memory is
    short); ``compact=False``: flush only; ``busy``: the replica is being written (see
    :func:`~pyspark_kudu.tablet.maintenance.choose_compaction`).

    A compaction merges *without* the replica's lock (module docstring) unless ``locked``;
    one whose inputs a write changed meanwhile is dropped and reported as
    ``compact_conflict``. ``between`` is called before each merged chunk of an unlocked
    compaction is written (the manager's pause, see :class:`MaintenanceManager`)."""
    io = tablet_dir(root, tablet_id)
    if (not io.exists(SUPERBLOCK_FILE) or failed_reason(io) is not None
            or io.exists(COPYING_FILE)):
        return None
    t0 = time.perf_counter()
    with open_replica(root, io, tablet_id, options, mutate=False,
                      mode="tablet") as h:
        sb = Superblock.load(io)
        ids = choose_compaction(sb.rowsets, policy, busy=busy) if compact else ()
        applied = read_applied(io)
        if not ids and not (flush and applied > sb.last_flushed_index):
            return None
        h.will_mutate()
        tablet = h.open_tablet(root, tablet_id, applied)
        if not ids:
            if not tablet.flush():
                return None
            return MaintenanceOp(root, tablet_id, "flush", (), time.perf_counter() - t0)
        mark = None if history_mark is None else min(history_mark, applied)
        if locked:
            tablet.compact(mark, rowset_ids=ids)
            return MaintenanceOp(root, tablet_id, "compact", ids, time.perf_counter() - t0)
        job = tablet.prepare_compaction(mark, rowset_ids=ids)
    if job is None:
        return None
    # The merge, without the replica's lock: this process's rounds apply to the replica
    # and scans plan on it meanwhile (it is back in the cache). Other processes may open
    # it too; the commit below notices what matters.
    try:
        tablet.run_compaction(job, between=between)
    except BaseException:
        # As a failure under the lock would: the next request reopens the replica from its
        # files (and finds out what is wrong with them) instead of meeting a failed tablet.
        close_cached(root, tablet_id)
        raise
    with open_replica(root, io, tablet_id, options, mutate=False,
                      mode="tablet") as h2:
        if h2 is h and h2.tablet is tablet:
            h2.will_mutate()
            done = tablet.commit_compaction(job)
        else:  # closed and reopened meanwhile (changed by another process, or evicted)
            tablet.abandon_compaction(job)
            done = False
    return MaintenanceOp(root, tablet_id, "compact" if done else "compact_conflict", ids,
                         time.perf_counter() - t0)


class MaintenanceManager:
    """Runs maintenance cycles over the replicas of the data roots it was told about.

    ``pause`` (the resident server's: :func:`~pyspark_kudu.spark.host.copy_traffic.wait_for_copies`
    with a bound) is called before each operation and before each merged chunk of an
    unlocked compaction, and returns the seconds it waited (``paused_s`` adds them up):
    maintenance steps aside while more urgent work runs on the host. Never called while
    the replica's lock is held."""

    def __init__(self, policy: MaintenancePolicy | None = None, *, interval_s: float = 5.0,
                 max_ops: int = 4, clock: Callable[[], float] = time.monotonic,
                 pause: Callable[[], float] | None = None, nice: int = 0) -> None:
        if interval_s <= 0 or max_ops < 1:
            raise ValueError("interval_s must be positive and max_ops at least 1")
        self.nice = nice  # added to its thread's nice value (lower_thread_priority)
        self.policy = policy or MaintenancePolicy()
        self.interval_s = interval_s
        self.max_ops = max_ops
        self._clock = clock
        self._roots: dict[str, WalOptions | None] = {}
        self._history: dict[tuple[str, str], list[tuple[float, int]]] = {}
        self._changed: dict[tuple[str, str], tuple[int, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ops: list[MaintenanceOp] = []  # the most recent operations, newest last
        self.errors = 0
        self.closed_stale = 0  # cached replicas closed because another process changed them
        #: Replicas whose last unlocked compactions were dropped, and how many in a row: at
        #: ``max_conflicts`` the next one holds the lock (a tablet updated everywhere all
        #: the time would otherwise never be compacted).
        self._conflicts: dict[tuple[str, str], int] = {}
        self.max_conflicts = 2
        self._pause = pause
        self.paused_s = 0.0  # seconds operations waited for ``pause``

    def note(self, root: str, options: WalOptions | None = None) -> None:
        """This server serves replicas under ``root`` (with these WAL options)."""
        with self._lock:
            self._roots[root] = options

    def _mark(self, key: tuple[str, str], applied: int, now: float) -> int | None:
        """Record an observation; the history mark it allows (module docstring)."""
        obs = self._history.setdefault(key, [])
        if not obs or obs[-1][1] != applied:
            obs.append((now, applied))
        horizon = now - self.policy.history_max_age_s
        old = [k for k, (t, _) in enumerate(obs) if t <= horizon]
        if not old:
            return None
        del obs[:old[-1]]  # keep the newest old-enough observation and everything after
        return obs[0][1]

    def _quiet(self, key: tuple[str, str], applied: int, now: float) -> float | None:
        """Seconds since the replica's applied index last changed (0 if it changed since
        the last cycle), ``None`` on the first observation."""
        last = self._changed.get(key)
        if last is None or last[0] != applied:
            self._changed[key] = (applied, now)
            return None if last is None else 0.0
        return now - last[1]

    def _pressured(self, roots: dict[str, WalOptions | None]) -> list[MaintenanceOp]:
        """Flush the largest MemRowSets this process holds while they exceed half of its
        replica budget (module docstring of ``replica_cache``)."""
        done: list[MaintenanceOp] = []
        held = {k: mrs for k, (mrs, _) in cached_memory().items() if k[0] in roots}
        limit = cache_budget_bytes() // 2
        total = sum(held.values())
        for (root, tid), mrs in sorted(held.items(), key=lambda kv: -kv[1]):
            if total <= limit or len(done) >= self.max_ops or mrs == 0:
                break
            op = self._attempt(root, tid, functools.partial(
                maintain_replica, root, tid, self.policy, flush=True, compact=False,
                options=roots[root]))
            if op is not None:
                done.append(op)
                total -= mrs
        return done

    def _next_op(self, root: str, tid: str, options: WalOptions | None
                 ) -> MaintenanceOp | None:
        key = (root, tid)
        applied = read_applied(tablet_dir(root, tid))
        now = self._clock()
        quiet = self._quiet(key, applied, now)
        locked = self._conflicts.get(key, 0) >= self.max_conflicts
        op = maintain_replica(root, tid, self.policy,
                              history_mark=self._mark(key, applied, now),
                              flush=(quiet or 0.0) >= self.policy.flush_idle_s,
                              busy=(quiet or 0.0) < self.policy.busy_s,
                              options=options, locked=locked,
                              between=None if locked else self._step_aside)
        if op is not None and op.kind == "compact_conflict":
            self._conflicts[key] = self._conflicts.get(key, 0) + 1
        elif op is not None and op.kind == "compact":
            self._conflicts.pop(key, None)
        return op

    def _attempt(self, root: str, tid: str, op: Callable[[], MaintenanceOp | None]
                 ) -> MaintenanceOp | None:
        """Run one operation (after :meth:`_step_aside`); a failure is counted and logged,
        and the cycle goes on."""
        self._step_aside()
        try:
            return op()
        except (KuduError, OSError, ValueError) as e:
            self.errors += 1
            _log.warning("maintenance of tablet %s under %s failed: %s", tid, root, e)
            return None

    def _step_aside(self) -> None:
        if self._pause is not None:
            self.paused_s += self._pause()

    def run_once(self) -> list[MaintenanceOp]:
        """One cycle; returns the operations it ran. Replicas deleted or changed by another
        process are closed first (``replica_cache.close_stale``)."""
        with self._lock:
            roots = dict(self._roots)
        self.closed_stale += close_stale()
        done: list[MaintenanceOp] = self._pressured(roots)
        for root, options in roots.items():
            base = os.path.join(root, "tablets")
            try:
                tablets = sorted(n for n in os.listdir(base) if not n.startswith("."))
            except OSError:
                continue
            self._forget_gone(root, set(tablets))
            for tid in tablets:
                if len(done) >= self.max_ops:
                    break
                op = self._attempt(root, tid, functools.partial(
                    self._next_op, root, tid, options))
                if op is not None:
                    done.append(op)
        self.ops = (self.ops + done)[-100:]
        return done

    def _forget_gone(self, root: str, present: set[str]) -> None:
        """Drop what the cycles remember of ``root``'s replicas that are gone (deleted)."""
        for seen in (self._history, self._changed, self._conflicts):
            for key in [k for k in seen if k[0] == root and k[1] not in present]:
                del seen[key]

    def start(self) -> None:
        """Run cycles on a daemon thread until :meth:`stop`."""
        if self._thread is not None:
            return

        def loop() -> None:
            lower_thread_priority(self.nice)
            while not self._stop.wait(self.interval_s):
                self.run_once()

        self._thread = threading.Thread(target=loop, name="kudu-maintenance", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
