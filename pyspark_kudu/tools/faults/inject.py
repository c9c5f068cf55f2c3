"""Fault schedules and their injection into a :class:`StandaloneCluster`.

Fault kinds (all on real processes; nothing is mocked):

* ``kill_executor`` -- SIGKILL the application's executor JVM on a host. Spark launches a
  replacement on the same worker in ~3 s (DESIGN §4); the span lasts until the driver sees
  an executor on that host again.
* ``restart_worker`` -- SIGKILL the worker daemon and everything it launched (its process
  group), restart it after ``duration_s``; the data root stays, so the same tablet server
  comes back (with replicas that missed writes).
* ``lose_host`` -- SIGKILL the worker for good: its tablet server never returns, so full
  replication comes back only if the client re-replicates its tablets elsewhere (the
  background healer). Planned at most once, last, and only when the remaining
  hosts can still hold ``rf`` replicas.
* ``pause_host`` -- SIGSTOP the application's executor on a host and the Python processes
  it started, SIGCONT them after ``duration_s``: the host stops answering while Spark still
  lists its executor (heartbeats time out only after ``spark.network.timeout``), which is
  what a network partition between the driver and that host looks like -- the closest this
  machine allows (no ``iptables``; every host is a loopback address). Rounds that include
  the host time out (``spark.kudu.roundTimeoutSec``), the host is probed and left out as
  suspect, and writes go on with the majority.
* ``corrupt_replica``: a byte flipped inside a replica's WAL, then its executor killed so the
  replica is reopened (:func:`corrupt_replica`); it must be marked failed and replaced.
* ``disk_full`` -- fill the file system under the host's data root (a filler file taking
  every free byte) for ``duration_s``, then remove it (:func:`fill_disk`). Only a host whose
  data root is a small file system of its own is filled: the harness mounts a tmpfs there
  for the whole run (``HarnessConfig.small_disk_mb``; mounting needs CAP_SYS_ADMIN). Where
  there is none the fault is recorded as ``skipped`` with the reason. Replicas on the host
  then fail their next durable write (``ENOSPC``), are reported failed and replaced, and no
  acknowledged write may be lost. A full disk is also covered by
  ``tests/unit/replication/test_failed_replicas.py`` on a real 1 MiB tmpfs.

Executor pids are found under ``/proc``: a JVM running ``CoarseGrainedExecutorBackend``
whose process group is the worker's (the worker is started in its own session by
:class:`StandaloneCluster`), so only processes this run started are ever signalled.

Thread-safety: :class:`FaultInjector` runs on one thread of its own; :meth:`stop` may be
called from another. It only calls the cluster's ``kill_worker`` / ``start_worker`` from
that thread.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from pyspark_kudu.wal.format import HEADER_SIZE, parse_frame

__all__ = [
    "CORRUPTED",
    "FAULT_HOOKS",
    "KINDS",
    "FaultEvent",
    "FaultInjector",
    "FaultSkipped",
    "executor_pids",
    "fill_disk",
    "free_disk",
    "pause_host",
    "plan_schedule",
    "resume_host",
    "small_disk",
]

KINDS = ("kill_executor", "restart_worker", "lose_host", "disk_full", "corrupt_replica",
         "pause_host")


@dataclass(frozen=True)
class FaultEvent:
    """One planned fault: ``kind`` on ``host`` at ``at_s`` seconds into the fault window."""

    at_s: float
    kind: str
    host: str
    duration_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> FaultEvent:
        if d["kind"] not in KINDS:
            raise ValueError(f"unknown fault kind {d['kind']!r}; use one of {KINDS}")
        return FaultEvent(float(d["at_s"]), str(d["kind"]), str(d["host"]),
                          float(d.get("duration_s", 0.0)))


def plan_schedule(rng: random.Random, hosts: Sequence[str], window_s: float, *,
                  kinds: Sequence[str] = ("kill_executor", "restart_worker"),
                  lose_host: bool = False, rf: int = 3,
                  down_s: tuple[float, float] = (8.0, 14.0),
                  gap_s: tuple[float, float] = (4.0, 8.0),
                  disk_host: str | None = None) -> list[FaultEvent]:
    """Faults one at a time (a fault ends, a gap, the next starts) planned within
    ``window_s`` (the injector may start one later: it waits for the previous to heal);
    with ``lose_host``, one host is lost for good at the end if ``len(hosts) > rf``.
    The first faults are every kind once, in a random order (a short window still covers
    them all if it is long enough), then kinds at random.
    ``disk_full`` faults go to ``disk_host`` (the one with a small disk of its own), and are
    not planned without one."""
    events: list[FaultEvent] = []
    t = rng.uniform(*gap_s) / 2
    reserve = 2.0 if lose_host and len(hosts) > rf else 0.0
    kinds = [k for k in kinds if k != "disk_full" or disk_host is not None]
    first = rng.sample(kinds, len(kinds))
    while True:
        kind = first.pop(0) if first else rng.choice(list(kinds))
        dur = (rng.uniform(*down_s) if kind in ("restart_worker", "disk_full", "pause_host")
               else 0.0)
        if t + dur > window_s - reserve:
            break
        host = rng.choice(list(hosts))
        if kind == "disk_full" and disk_host is not None:
            host = disk_host
        events.append(FaultEvent(round(t, 2), kind, host, round(dur, 2)))
        t += dur + rng.uniform(*gap_s)
    if reserve:
        events.append(FaultEvent(round(min(t, window_s - reserve), 2), "lose_host",
                                 rng.choice(list(hosts))))
    return events


def executor_pids(cluster: StandaloneCluster, host: str) -> list[int]:
    """Pids of executor JVMs launched by this cluster's worker on ``host``."""
    return [pid for pid, cmd in _worker_group(cluster, host)
            if b"CoarseGrainedExecutorBackend" in cmd]


def _worker_group(cluster: StandaloneCluster, host: str) -> list[tuple[int, bytes]]:
    """(pid, command line) of every process the worker on ``host`` started, but not the
    worker itself: the members of its process group (executors) and their descendants (the
    Python daemon puts itself in a process group of its own)."""
    spec = next(w for w in cluster.worker_specs if w.host == host)
    if spec.process is None or spec.process.poll() is not None:
        return []
    worker = spec.process.pid
    parent: dict[int, int] = {}
    cmds: dict[int, bytes] = {}
    members: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                # "pid (comm) state ppid pgrp ...": comm may hold spaces; split after it.
                fields = f.read().rsplit(b")", 1)[1].split()
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmds[pid] = f.read()
        except OSError:
            continue  # exited meanwhile
        parent[pid] = int(fields[1])
        if int(fields[2]) == worker and pid != worker:
            members.add(pid)
    grew = True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in members and pid not in members}
        members |= more
        grew = bool(more)
    members.discard(worker)
    return sorted((pid, cmds[pid]) for pid in members)


def pause_host(cluster: StandaloneCluster, host: str) -> list[int]:
    """SIGSTOP the executors of ``host`` and the processes they started (not the worker
    daemon: the Spark master must not lose the worker). Returns the pids, for
    :func:`resume_host`. :class:`FaultSkipped` if no executor runs there."""
    if not executor_pids(cluster, host):
        raise FaultSkipped(f"no executor running on {host}")
    pids = [pid for pid, _ in _worker_group(cluster, host)]
    for pid in pids:
        try:
            os.kill(pid, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    return pids


def resume_host(pids: Sequence[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


class FaultSkipped(RuntimeError):
    """A fault hook cannot strike this host (nothing to damage, no disk of its own); the
    injector records the fault as skipped, with this reason."""


_DESTRUCTIVE = frozenset({"corrupt_replica", "lose_host", "disk_full"})

FILLER = ".disk-full-filler"


def small_disk(cluster: StandaloneCluster, host: str) -> bool:
    """Whether ``host``'s data root is a mount point of its own (the harness's tmpfs)."""
    root = cluster.data_root(host)
    return root.is_dir() and os.path.ismount(root)


def fill_disk(cluster: StandaloneCluster, host: str) -> None:
    """Take every free byte of the file system under ``host``'s data root with a filler
    file (undone by :func:`free_disk`). Refuses (:class:`FaultSkipped`: the run records it
    skipped) unless that root is a mount point of its own: never fill a shared disk."""
    root = cluster.data_root(host)
    if not small_disk(cluster, host):
        raise FaultSkipped(
            f"the data root of {host} ({root}) is not a file system of its own; the harness "
            f"mounts one only where it may (HarnessConfig.small_disk_mb, CAP_SYS_ADMIN)")
    path = root / FILLER
    with open(path, "wb") as f:
        block = b"\0" * (1 << 20)
        try:
            while True:
                f.write(block)
                f.flush()
        except OSError:
            pass  # ENOSPC: full
        st = os.statvfs(root)
        left = st.f_bavail * st.f_frsize
        try:
            f.write(b"\0" * left)  # the last partial block
            f.flush()
        except OSError:
            pass


def free_disk(cluster: StandaloneCluster, host: str) -> None:
    (cluster.data_root(host) / FILLER).unlink(missing_ok=True)

CORRUPTED: list[tuple[str, str]] = []
"""(host, tablet id) of every replica :func:`corrupt_replica` damaged in this process."""


def corrupt_replica(cluster: StandaloneCluster, host: str) -> None:
    """Flip one byte inside a WAL frame of one replica on ``host`` that belongs to an earlier
    group commit than the segment's last (corruption, not a torn write, DESIGN §5), then
    SIGKILL the host's executor so that the replica is reopened -- and its WAL recovered and
    checked -- by the next task, as after a crash. The replica must then be marked failed,
    never serve, and be replaced; the checker proves no acknowledged write was lost."""
    base = cluster.data_root(host) / "tablets"
    candidates = []
    if base.is_dir():
        for t in sorted(base.iterdir()):
            wal = t / "wal"
            if t.name.startswith(".") or (t / "failed").exists() or not wal.is_dir():
                continue
            candidates.extend(sorted(p for p in wal.iterdir() if p.is_file()
                                     and p.stat().st_size > HEADER_SIZE))
    if not candidates:
        raise FaultSkipped(f"no replica with a WAL worth corrupting on {host}")
    for seg in candidates:
        data = seg.read_bytes()
        frames = []
        pos = HEADER_SIZE
        while True:
            f = parse_frame(data, pos, len(data))
            if isinstance(f, str):
                break
            frames.append(f)
            pos = f.offset + f.size
        # A frame of the last group commit may be a torn write, which recovery rightly
        # truncates; corruption is damage to a frame of an earlier, acknowledged group.
        early = [f for f in frames if frames and f.group_start < frames[-1].group_start]
        if early:
            break
    else:
        raise FaultSkipped(f"no replica on {host} has a WAL frame before its last "
                                  f"group commit to corrupt")
    victim = early[len(early) // 2]
    at = victim.offset + victim.size // 2
    with open(seg, "r+b") as fh:
        fh.seek(at)
        fh.write(bytes([data[at] ^ 0xFF]))
        fh.flush()
        os.fsync(fh.fileno())
    CORRUPTED.append((host, seg.parent.parent.name))
    for pid in executor_pids(cluster, host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


FAULT_HOOKS: dict[str, Callable[[StandaloneCluster, str], None]] = {
    "disk_full": fill_disk,
    "corrupt_replica": corrupt_replica,
}
"""Faults without a built-in implementation: ``kind -> fn(cluster, host)``."""


class FaultInjector:
    """Runs a schedule on its own thread. ``applied`` lists what happened: kind, host,
    ``start`` / ``end`` (history seconds; ``end`` None while the fault lasts or for good),
    ``note``. ``has_executor(host)`` tells when an executor is back on a host."""

    def __init__(self, cluster: StandaloneCluster, schedule: Sequence[FaultEvent],
                 clock: Callable[[], float], has_executor: Callable[[str], bool],
                 recover_deadline_s: float = 60.0,
                 healthy: Callable[[], bool] | None = None,
                 heal_deadline_s: float = 120.0) -> None:
        self.cluster = cluster
        # RF=3 survives one failure at a time: a fault that may take a replica for good
        # (corruption, a lost host) waits until the cluster is back to full replication.
        self.healthy = healthy
        self.heal_deadline_s = heal_deadline_s
        self.schedule = sorted(schedule, key=lambda e: e.at_s)
        self.clock = clock
        self.has_executor = has_executor
        self.recover_deadline_s = recover_deadline_s
        self.applied: list[dict[str, Any]] = []
        self.lost_hosts: set[str] = set()
        self.started_at: float | None = None
        self.finished_at: float | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="fault-injector", daemon=True)

    def start(self) -> FaultInjector:
        self.started_at = self.clock()
        self._thread.start()
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        self._stop.set()
        self._thread.join(timeout_s)

    def join(self, timeout_s: float) -> bool:
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(a) for a in self.applied]

    # -- the thread --------------------------------------------------------------------------
    def _wait_until(self, t: float) -> bool:
        """Pace the schedule (not a correctness wait); False when stopped."""
        return not self._stop.wait(max(0.0, t - self.clock()))

    def _record(self, ev: FaultEvent, **fields: Any) -> dict[str, Any]:
        rec = {"kind": ev.kind, "host": ev.host, "planned_at_s": ev.at_s,
               "duration_s": ev.duration_s, "start": None, "end": None, "note": "", **fields}
        with self._lock:
            self.applied.append(rec)
        return rec

    def _update(self, rec: dict[str, Any], **fields: Any) -> None:
        with self._lock:
            rec.update(fields)

    def _run(self) -> None:
        assert self.started_at is not None
        try:
            for ev in self.schedule:
                if not self._wait_until(self.started_at + ev.at_s):
                    return
                if ev.host in self.lost_hosts:
                    self._record(ev, note="skipped: host already lost")
                    continue
                if ev.kind in _DESTRUCTIVE and self.healthy is not None:
                    end = time.monotonic() + self.heal_deadline_s
                    while not self.healthy() and time.monotonic() < end:
                        if self._stop.wait(0.5):  # pacing a deadline-bounded wait
                            return
                self._apply(ev)
        finally:
            self.finished_at = self.clock()

    def _apply(self, ev: FaultEvent) -> None:
        if ev.kind in FAULT_HOOKS:
            rec = self._record(ev, start=self.clock())
            try:
                FAULT_HOOKS[ev.kind](self.cluster, ev.host)
            except FaultSkipped as e:
                self._update(rec, start=None, note=f"skipped: {e}")
                return
            if ev.kind == "corrupt_replica":
                self._await_detection(rec)
            elif ev.kind == "disk_full":
                self._wait_until(float(rec["start"]) + ev.duration_s)
                free_disk(self.cluster, ev.host)
                self._update(rec, note=self._failed_on(ev.host))
            self._update(rec, end=self.clock())
            return
        if ev.kind == "kill_executor":
            pids = executor_pids(self.cluster, ev.host)
            if not pids:
                self._record(ev, note="skipped: no executor running on the host")
                return
            rec = self._record(ev, start=self.clock(), note=f"SIGKILL executor pid {pids}")
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self._await_executor(ev.host, rec)
        elif ev.kind == "restart_worker":
            rec = self._record(ev, start=self.clock())
            self.cluster.kill_worker(ev.host)
            self._wait_until(float(rec["start"]) + ev.duration_s)
            self.cluster.start_worker(ev.host)
            self._update(rec, note=f"worker restarted at {self.clock():.1f}")
            self._await_executor(ev.host, rec)
        elif ev.kind == "pause_host":
            rec = self._record(ev, start=self.clock())
            try:
                pids = pause_host(self.cluster, ev.host)
            except FaultSkipped as e:
                self._update(rec, start=None, note=f"skipped: {e}")
                return
            try:
                self._update(rec, note=f"SIGSTOP pids {pids}")
                self._wait_until(float(rec["start"]) + ev.duration_s)
            finally:
                resume_host(pids)
            self._update(rec, end=self.clock(), note=f"SIGSTOP pids {pids}; SIGCONT at "
                         f"{self.clock():.1f}")
        elif ev.kind == "lose_host":
            self._record(ev, start=self.clock(), note="worker killed for good")
            self.lost_hosts.add(ev.host)
            self.cluster.kill_worker(ev.host)
        else:
            raise ValueError(f"unknown fault kind {ev.kind!r}")

    def _failed_on(self, host: str) -> str:
        base = self.cluster.data_root(host) / "tablets"
        failed = sorted(t.name for t in base.iterdir() if (t / "failed").exists()) \
            if base.is_dir() else []
        return f"disk full; replicas marked failed on {host}: {failed or 'none'}"

    def _await_detection(self, rec: dict[str, Any]) -> None:
        """The fault lasts until the damaged replica is found failed (its ``failed`` marker)
        or already deleted, at most ``heal_deadline_s``: the next destructive fault must not
        strike the same tablet before its replacement even started."""
        host, tid = CORRUPTED[-1]
        tdir = self.cluster.data_root(host) / "tablets" / tid
        end = time.monotonic() + self.heal_deadline_s
        while time.monotonic() < end and not self._stop.is_set():
            if (tdir / "failed").exists() or not tdir.exists():
                self._update(rec, note=f"tablet {tid}: replica found failed")
                # ...and reported: ksck shows the tablet RECOVERING (REPLACE mark) before a
                # later destructive fault checks that replication is whole again.
                seen = time.monotonic() + 30.0
                while (self.healthy is not None and self.healthy()
                       and time.monotonic() < seen and not self._stop.is_set()):
                    self._stop.wait(0.2)
                return
            self._stop.wait(0.2)
        self._update(rec, note=f"tablet {tid}: the damaged replica was not found failed "
                     f"within {self.heal_deadline_s:.0f} s")

    def _await_executor(self, host: str, rec: dict[str, Any]) -> None:
        """End the span when the driver sees an executor on ``host`` again, waiting at most
        ``recover_deadline_s``: faults come one at a time, so the next one starts at its
        planned time or when this one is over, whichever is later (``start`` vs
        ``planned_at_s`` in :attr:`applied`). The kill is seen by the driver within a
        fraction of a second (DESIGN §4); wait for that first so the old executor does not
        count as the new one."""
        start = time.monotonic()
        end = start + self.recover_deadline_s
        gone = False
        while time.monotonic() < end and not self._stop.is_set():
            up = self.has_executor(host)
            if not up:
                gone = True
            elif gone or time.monotonic() > start + 5.0:
                self._update(rec, end=self.clock())
                return
            self._stop.wait(0.2)
        self._update(rec, note=str(rec["note"]) + "; no executor back on the host within "
                     f"{time.monotonic() - start:.0f} s (span drawn to the end)")
