"""Runs a fault schedule (:mod:`.inject`) on its own thread, one fault at a time, and makes
sure every fault is applied.

Each fault, in schedule order:

1. waits for its planned time (``at_s`` after :meth:`FaultInjector.start`; later if the
   previous fault lasted longer);
2. waits for its **precondition**, polling under ``precondition_deadline_s``: a
   destructive fault (:data:`.inject.DESTRUCTIVE`) needs full replication again, judged on
   samples taken after the previous fault ended (``healthy_since``); ``kill_executor`` and
   ``pause_host`` need an executor on the host; a worker fault needs its worker running;
   ``corrupt_replica`` needs a voter replica with a WAL frame before its segment's last
   group commit (:func:`.inject.corrupt_replica` raises :class:`.inject.FaultNotReady`
   until then). A precondition still unmet at the deadline **fails the run**: the fault's
   record says which fault and what did not happen, :attr:`FaultInjector.errors` gets the
   same sentence, and the rest of the schedule is recorded as not applied. Nothing is
   skipped silently;
3. strikes, records ``start``, and waits for its aftermath: the duration of a timed fault,
   a new executor after a kill, the damaged replica found failed after a corruption (never
   found is an error too).

``corrupt_replica`` and ``disk_full`` strike a *voter* replica (``voters_on``, the
master's view): on the planned host, or -- when healing has moved every replica off it -- on
the first host after it, in cluster order, that holds one (``host`` in the record is the one
struck, ``planned_host`` the planned one).

Every wait polls a condition under a deadline; the only plain waits are the schedule's
pacing and a timed fault's duration.

Thread-safety: the injector runs on one thread of its own; :meth:`FaultInjector.stop`,
:meth:`~FaultInjector.snapshot` and :attr:`~FaultInjector.errors` may be called from
others. Only that thread calls the cluster's ``kill_worker`` / ``start_worker``.
"""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable, Collection, Sequence
from typing import Any

from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from pyspark_kudu.tools.faults.inject import (
    DESTRUCTIVE,
    FaultEvent,
    FaultNotReady,
    corrupt_replica,
    executor_pids,
    fill_disk,
    free_disk,
    kill_pids,
    pause_host,
    resume_host,
    worker_running,
)

__all__ = ["FaultInjector"]


class _Halt(Exception):
    """Ends the schedule: a fault failed (``failed``) or the injector was stopped."""

    def __init__(self, why: str, failed: bool) -> None:
        super().__init__(why)
        self.failed = failed


class FaultInjector:
    """Runs ``schedule`` on ``cluster``. :meth:`snapshot` lists one record per fault: kind,
    host, ``planned_at_s``, ``duration_s``, ``start`` / ``end`` (``clock`` seconds; ``start``
    None: not applied, ``end`` None while it lasts or for good) and ``note``.

    ``has_executor(host)``: the driver lists an executor there. ``voters_on(host)``: tablet
    ids of the voter replicas on ``host`` (None: every replica on disk counts).
    ``healthy_since(t)``: full replication, shown by samples taken at ``t`` or later (None:
    destructive faults do not wait for it).
    """

    def __init__(self, cluster: StandaloneCluster, schedule: Sequence[FaultEvent],
                 clock: Callable[[], float], has_executor: Callable[[str], bool], *,
                 voters_on: Callable[[str], Collection[str]] | None = None,
                 healthy_since: Callable[[float], bool] | None = None,
                 precondition_deadline_s: float = 150.0,
                 recover_deadline_s: float = 60.0,
                 detect_deadline_s: float = 150.0,
                 poll_s: float = 0.5) -> None:
        self.cluster = cluster
        self.schedule = sorted(schedule, key=lambda e: e.at_s)
        self.clock = clock
        self.has_executor = has_executor
        self.voters_on = voters_on
        self.healthy_since = healthy_since
        self.precondition_deadline_s = precondition_deadline_s
        self.recover_deadline_s = recover_deadline_s
        self.detect_deadline_s = detect_deadline_s
        self.poll_s = poll_s
        self.lost_hosts: set[str] = set()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._settled_at = 0.0  # when the previous fault ended (clock seconds)
        self._records: list[dict[str, Any]] = []
        self._errors: list[str] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)

    # -- control -----------------------------------------------------------------------------
    def start(self) -> FaultInjector:
        self.started_at = self._settled_at = self.clock()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """Stop after undoing the current fault (a paused host is resumed, a full disk
        freed, a restarted worker started); unapplied faults are recorded as such."""
        self._stop.set()
        self._thread.join(timeout_s)

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def bound_s(self) -> float:
        """How long the whole schedule may legitimately take, every wait at its deadline."""
        per_fault = self.precondition_deadline_s + max(self.recover_deadline_s,
                                                       self.detect_deadline_s)
        return (max((e.at_s for e in self.schedule), default=0.0)
                + sum(e.duration_s + per_fault for e in self.schedule) + 30.0)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(a) for a in self._records]

    @property
    def errors(self) -> list[str]:
        """Why the run must fail: faults not applied, corruption never detected."""
        with self._lock:
            return list(self._errors)

    # -- records -----------------------------------------------------------------------------
    def _record(self, ev: FaultEvent, **fields: Any) -> dict[str, Any]:
        rec = {"kind": ev.kind, "host": ev.host, "planned_at_s": ev.at_s,
               "duration_s": ev.duration_s, "start": None, "end": None, "note": "", **fields}
        with self._lock:
            self._records.append(rec)
        return rec

    def _update(self, rec: dict[str, Any], **fields: Any) -> None:
        with self._lock:
            rec.update(fields)

    def _error(self, msg: str) -> None:
        with self._lock:
            self._errors.append(msg)

    # -- the thread --------------------------------------------------------------------------
    def _pace(self, t: float) -> bool:
        """Wait until clock time ``t`` (schedule pacing, a timed fault's duration); False
        when stopped."""
        return not self._stop.wait(max(0.0, t - self.clock()))

    def _run(self) -> None:
        assert self.started_at is not None
        done = 0
        halted = "the injector was stopped before its turn (the run ended or ran out of budget)"
        try:
            for ev in self.schedule:
                if not self._pace(self.started_at + ev.at_s):
                    break
                rec = self._record(ev, note="waiting for its precondition")
                done += 1
                try:
                    self._run_fault(ev, rec)
                except _Halt as h:
                    self._update(rec, note=f"NOT APPLIED: {h}")
                    self._error(str(h))
                    if h.failed:
                        halted = f"an earlier fault was not applied ({h})"
                    break
                self._settled_at = self.clock()
        except Exception:  # a bug here must fail the run, with its traceback
            self._error(f"the fault injector crashed:\n{traceback.format_exc()}")
            halted = "the fault injector crashed"
        finally:
            for ev in self.schedule[done:]:
                self._record(ev, note=f"NOT APPLIED: {halted}")
                self._error(f"{_name(ev)} was not applied: {halted}")
            self.finished_at = self.clock()

    def _run_fault(self, ev: FaultEvent, rec: dict[str, Any]) -> None:
        struck = self._strike(ev, rec)
        if ev.kind == "kill_executor":
            self._await_executor(ev.host, struck, rec)
        elif ev.kind == "restart_worker":
            try:
                self._pace(float(rec["start"]) + ev.duration_s)
            finally:
                self.cluster.start_worker(ev.host)
            self._update(rec, note=f"worker restarted at {self.clock():.1f}")
            self._await_executor(ev.host, struck, rec)
        elif ev.kind == "pause_host":
            try:
                self._pace(float(rec["start"]) + ev.duration_s)
            finally:
                resume_host(struck)
            self._update(rec, end=self.clock(),
                         note=f"SIGSTOP pids {struck}; SIGCONT at {self.clock():.1f}")
        elif ev.kind == "disk_full":
            try:
                self._pace(float(rec["start"]) + ev.duration_s)
            finally:
                free_disk(self.cluster, rec["host"])
            self._update(rec, end=self.clock(), note=self._failed_on(rec["host"]))
        elif ev.kind == "corrupt_replica":
            self._await_detection(rec["host"], struck, rec)
        elif ev.kind == "lose_host":
            self._update(rec, note="worker killed for good")
        else:
            raise ValueError(f"unknown fault kind {ev.kind!r}")

    def _strike(self, ev: FaultEvent, rec: dict[str, Any]) -> Any:
        """Strike once the precondition holds, polling under ``precondition_deadline_s``;
        returns what :meth:`_strike_once` returned. :class:`_Halt` when it does not hold
        by the deadline, or when stopped."""
        if ev.host in self.lost_hosts and ev.kind not in ("corrupt_replica", "disk_full"):
            raise _Halt(f"{_name(ev)} cannot be applied: the host was lost for good earlier",
                        failed=True)
        end = time.monotonic() + self.precondition_deadline_s
        while True:
            why = self._not_ready(ev)
            if why is None:
                try:
                    return self._strike_once(ev, rec)
                except FaultNotReady as e:
                    why = str(e)
            if time.monotonic() >= end:
                raise _Halt(f"{_name(ev)} was not applied: {why} (still so "
                            f"{self.precondition_deadline_s:.0f} s after its turn came)",
                            failed=True)
            self._update(rec, note=f"waiting: {why}")
            if self._stop.wait(self.poll_s):  # polling the precondition under the deadline
                raise _Halt(f"{_name(ev)} was not applied: the injector was stopped while "
                            f"waiting ({why})", failed=False)

    def _not_ready(self, ev: FaultEvent) -> str | None:
        if ev.kind in DESTRUCTIVE and self.healthy_since is not None \
                and not self.healthy_since(self._settled_at):
            return (f"full replication not shown by two samples since the previous fault "
                    f"ended at {self._settled_at:.1f} s")
        if ev.kind in ("kill_executor", "pause_host") and not self.has_executor(ev.host):
            return f"the driver lists no executor on {ev.host}"
        if ev.kind in ("restart_worker", "lose_host") and not worker_running(self.cluster,
                                                                             ev.host):
            return f"the worker on {ev.host} is not running"
        return None

    def _strike_once(self, ev: FaultEvent, rec: dict[str, Any]) -> Any:
        """Apply ``ev`` now (:class:`FaultNotReady` if it cannot); sets ``start``."""
        if ev.kind == "kill_executor":
            pids = executor_pids(self.cluster, ev.host)
            if not pids:
                raise FaultNotReady(f"no executor JVM of this cluster running on {ev.host}")
            kill_pids(pids)
            self._update(rec, start=self.clock(), note=f"SIGKILL executor pids {pids}")
            return pids
        if ev.kind == "restart_worker":
            pids = executor_pids(self.cluster, ev.host)
            self._update(rec, start=self.clock(), note="worker killed")
            self.cluster.kill_worker(ev.host)
            return pids
        if ev.kind == "pause_host":
            pids = pause_host(self.cluster, ev.host)
            self._update(rec, start=self.clock(), note=f"SIGSTOP pids {pids}")
            return pids
        if ev.kind == "lose_host":
            self._update(rec, start=self.clock())
            self.lost_hosts.add(ev.host)
            self.cluster.kill_worker(ev.host)
            return None
        host, voters = self._replica_host(ev)
        if ev.kind == "corrupt_replica":
            tablet = corrupt_replica(self.cluster, host, voters)
            self._update(rec, start=self.clock(), host=host, planned_host=ev.host,
                         note=f"tablet {tablet}: a WAL frame flipped, executor killed")
            return tablet
        if ev.kind == "disk_full":
            fill_disk(self.cluster, host)
            self._update(rec, start=self.clock(), host=host, planned_host=ev.host,
                         note=f"the data root of {host} is full (voters there: "
                              f"{sorted(voters or ())})")
            return None
        raise ValueError(f"unknown fault kind {ev.kind!r}")

    def _replica_host(self, ev: FaultEvent) -> tuple[str, Collection[str] | None]:
        """The host a replica fault strikes and its voters (see the module docstring)."""
        if self.voters_on is None:
            return ev.host, None
        hosts = list(self.cluster.hosts)
        i = hosts.index(ev.host) if ev.host in hosts else 0
        for host in [*hosts[i:], *hosts[:i]]:
            if host in self.lost_hosts or not worker_running(self.cluster, host):
                continue
            voters = self.voters_on(host)
            if voters:
                return host, voters
        raise FaultNotReady("no running host holds a voter replica (per the master)")

    def _failed_on(self, host: str) -> str:
        base = self.cluster.data_root(host) / "tablets"
        failed = sorted(t.name for t in base.iterdir() if (t / "failed").exists()) \
            if base.is_dir() else []
        return f"disk full, then freed; replicas marked failed on {host}: {failed or 'none'}"

    def _await_detection(self, host: str, tablet: str, rec: dict[str, Any]) -> None:
        """The fault lasts until the damaged replica is found failed (its ``failed`` marker)
        or deleted (already replaced), at most ``detect_deadline_s``; never found is an
        error. The next destructive fault then waits for replication whole again, which the
        harness's samples deny while a voter is marked failed."""
        tdir = self.cluster.data_root(host) / "tablets" / tablet
        end = time.monotonic() + self.detect_deadline_s
        while not ((tdir / "failed").exists() or not tdir.exists()):
            if time.monotonic() >= end:
                msg = (f"corrupt_replica on {host}: the damaged replica of tablet {tablet} "
                       f"was not found failed within {self.detect_deadline_s:.0f} s")
                self._update(rec, end=self.clock(), note=msg)
                self._error(msg)
                return
            if self._stop.wait(0.2):  # polling under the deadline above
                return
        self._update(rec, end=self.clock(), note=f"tablet {tablet}: replica found failed")

    def _await_executor(self, host: str, old: Sequence[int], rec: dict[str, Any]) -> None:
        """End the span when a new executor (a JVM not in ``old``) runs on ``host`` and
        the driver lists one there, waiting at most ``recover_deadline_s``. Not getting
        there is not an error by itself: a later fault on the host waits for an executor."""
        end = time.monotonic() + self.recover_deadline_s
        while time.monotonic() < end:
            new = set(executor_pids(self.cluster, host)) - set(old)
            if new and self.has_executor(host):
                self._update(rec, end=self.clock())
                return
            if self._stop.wait(0.2):  # polling under the deadline above
                return
        self._update(rec, note=str(rec["note"]) + f"; no new executor on the host within "
                     f"{self.recover_deadline_s:.0f} s (span drawn to the end)")


def _name(ev: FaultEvent) -> str:
    return f"{ev.kind} on {ev.host} (planned at {ev.at_s:.1f} s)"
