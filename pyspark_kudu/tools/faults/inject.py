"""Fault schedules and the faults themselves, on the real processes of a
:class:`StandaloneCluster` (nothing is mocked). :mod:`.injector` runs a schedule.

Fault kinds:

* ``kill_executor`` -- SIGKILL the application's executor JVM on a host. Spark launches a
  replacement on the same worker in ~3 s (DESIGN §4); the span lasts until a new executor
  runs on that host.
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
* ``corrupt_replica`` -- a byte flipped inside a WAL frame of a voter replica on the host,
  then its executor killed so the replica is reopened (:func:`corrupt_replica`); it must be
  marked failed and replaced.
* ``disk_full`` -- the file system under the host's data root is full for ``duration_s``:
  ENOSPC injected through the product's FileIO (:func:`fill_disk`,
  :func:`pyspark_kudu.fileio.set_disk_full`; no mount, no root). Replicas on the host fail
  their next durable write, are reported failed and replaced, and no acknowledged write may
  be lost.

A fault that cannot strike yet raises :class:`FaultNotReady` saying what is missing; the
injector retries it until its precondition deadline and then fails the run -- it never
skips a fault.

Executor pids are found under ``/proc``: a JVM running ``CoarseGrainedExecutorBackend``
whose process group is the worker's (the worker is started in its own session by
:class:`StandaloneCluster`), so only processes this run started are ever signalled.

Thread-safety: functions only; :func:`plan_schedule` uses only the ``rng`` it is given.
"""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pyspark_kudu.fileio import clear_disk_full, set_disk_full
from pyspark_kudu.testing import procfs
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster
from pyspark_kudu.wal.format import HEADER_SIZE, FrameView, parse_frame, parse_segment_name

__all__ = [
    "DESTRUCTIVE",
    "KINDS",
    "FaultEvent",
    "FaultNotReady",
    "corrupt_replica",
    "executor_pids",
    "fill_disk",
    "free_disk",
    "kill_pids",
    "pause_host",
    "plan_schedule",
    "resume_host",
    "worker_running",
]

KINDS = ("kill_executor", "restart_worker", "lose_host", "disk_full", "corrupt_replica",
         "pause_host")
DESTRUCTIVE = frozenset({"corrupt_replica", "lose_host", "disk_full"})
"""Faults that may take a replica for good: RF=3 survives one at a time, so each waits for
full replication first."""


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


class FaultNotReady(RuntimeError):
    """A fault cannot strike this host yet (no executor running, no replica WAL with an
    acknowledged group to damage, ...); the message says what is missing. The injector
    retries until its deadline, then fails the run with this message."""


def plan_schedule(rng: random.Random, hosts: Sequence[str], window_s: float, *,
                  kinds: Sequence[str] = ("kill_executor", "restart_worker"),
                  lose_host: bool = False, rf: int = 3,
                  down_s: tuple[float, float] = (8.0, 14.0),
                  gap_s: tuple[float, float] = (4.0, 8.0)) -> list[FaultEvent]:
    """Faults one at a time (a fault ends, a gap, the next starts) planned within
    ``window_s`` (the injector may start one later: it waits for the previous to heal);
    with ``lose_host``, one host is lost for good at the end if ``len(hosts) > rf``.
    The first faults are every kind once, in a random order (a short window still covers
    them all if it is long enough), then kinds at random."""
    events: list[FaultEvent] = []
    t = rng.uniform(*gap_s) / 2
    reserve = 2.0 if lose_host and len(hosts) > rf else 0.0
    first = rng.sample(list(kinds), len(kinds))
    while True:
        kind = first.pop(0) if first else rng.choice(list(kinds))
        dur = (rng.uniform(*down_s) if kind in ("restart_worker", "disk_full", "pause_host")
               else 0.0)
        if t + dur > window_s - reserve:
            break
        host = rng.choice(list(hosts))
        events.append(FaultEvent(round(t, 2), kind, host, round(dur, 2)))
        t += dur + rng.uniform(*gap_s)
    if reserve:
        events.append(FaultEvent(round(min(t, window_s - reserve), 2), "lose_host",
                                 rng.choice(list(hosts))))
    return events


# == processes ====================================================================================


def worker_running(cluster: StandaloneCluster, host: str) -> bool:
    """Whether this cluster's worker process on ``host`` is running."""
    spec = next(w for w in cluster.worker_specs if w.host == host)
    return spec.process is not None and spec.process.poll() is None


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
    for pid in procfs.pids():
        fields = procfs.stat_fields(pid)
        cmd = procfs.cmdline(pid)
        if fields is None or cmd is None:
            continue  # exited meanwhile
        cmds[pid] = cmd
        parent[pid] = int(fields[procfs.PPID])
        if int(fields[procfs.PGRP]) == worker and pid != worker:
            members.add(pid)
    grew = True
    while grew:
        more = {pid for pid, pp in parent.items() if pp in members and pid not in members}
        members |= more
        grew = bool(more)
    members.discard(worker)
    return sorted((pid, cmds[pid]) for pid in members)


def kill_pids(pids: Sequence[int]) -> None:
    """SIGKILL ``pids`` (gone already is fine)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def pause_host(cluster: StandaloneCluster, host: str) -> list[int]:
    """SIGSTOP the executors of ``host`` and the processes they started (not the worker
    daemon: the Spark master must not lose the worker). Returns the pids, for
    :func:`resume_host`. :class:`FaultNotReady` if no executor runs there."""
    if not executor_pids(cluster, host):
        raise FaultNotReady(f"no executor running on {host}")
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


# == disks ========================================================================================


def fill_disk(cluster: StandaloneCluster, host: str) -> None:
    """Make the file system under ``host``'s data root full (undone by :func:`free_disk`):
    every write the tablet server opens or syncs there fails with ENOSPC. Needs
    ``PYSPARK_KUDU_FULL_DISKS`` set before the cluster started (the harness does), so the
    executors check the same full-disk file."""
    set_disk_full(str(cluster.data_root(host)))


def free_disk(cluster: StandaloneCluster, host: str) -> None:
    clear_disk_full(str(cluster.data_root(host)))


def corrupt_replica(cluster: StandaloneCluster, host: str,
                    tablets: Collection[str] | None = None) -> str:
    """Flip one byte inside a WAL frame of one replica on ``host`` (one of ``tablets``, the
    voters there, when given) that belongs to an earlier group commit than its segment's
    last (corruption, not a torn write, DESIGN §5), then SIGKILL the host's executor so that
    the replica is reopened -- and its WAL recovered and checked -- by the next task, as
    after a crash. Returns the tablet id. The replica must then be marked failed, never
    serve, and be replaced; the checker proves no acknowledged write was lost.

    Raises:
        FaultNotReady: no such frame yet. A replica's appends go to a new segment whenever
            it is reopened (an executor was killed), so a frame of an *earlier* group exists
            only once the workload wrote to the replica twice since: timing, which is why
            the injector waits for it instead of trying once.
    """
    base = cluster.data_root(host) / "tablets"
    dirs = [t for t in sorted(base.iterdir()) if not t.name.startswith(".")
            and (t / "wal").is_dir() and not (t / "failed").exists()] if base.is_dir() else []
    if tablets is not None:
        dirs = [t for t in dirs if t.name in tablets]
    if not dirs:
        which = f"voter replica (voters there: {sorted(tablets)})" if tablets is not None \
            else "replica"
        raise FaultNotReady(f"no healthy {which} with a WAL on {host}")
    for tdir in dirs:
        for seg in _segments_newest_first(tdir / "wal"):
            data = seg.read_bytes()
            victim = _frame_of_an_earlier_group(data)
            if victim is None:
                continue
            at = victim.offset + victim.size // 2
            with open(seg, "r+b") as fh:
                fh.seek(at)
                fh.write(bytes([data[at] ^ 0xFF]))
                fh.flush()
                os.fsync(fh.fileno())
            kill_pids(executor_pids(cluster, host))
            return tdir.name
    raise FaultNotReady(
        f"no WAL segment of the replicas on {host} ({[t.name for t in dirs]}) holds a frame "
        f"before its last group commit yet (written to fewer than twice since last opened)")


def _segments_newest_first(wal: Path) -> list[Path]:
    """The WAL's segment files, newest first (a newer segment is the one recovery reads
    for sure: older ones may be obsolete after a tablet copy)."""
    segs = [(seq, p) for p in wal.iterdir()
            if (seq := parse_segment_name(p.name)) is not None and p.is_file()
            and p.stat().st_size > HEADER_SIZE]
    return [p for _, p in sorted(segs, reverse=True)]


def _frame_of_an_earlier_group(data: bytes) -> FrameView | None:
    """A frame in the middle of those before the segment's last group commit, if any (a
    frame of the last group may be a torn write, which recovery rightly truncates)."""
    frames = []
    pos = HEADER_SIZE
    while True:
        f = parse_frame(data, pos, len(data))
        if isinstance(f, str):
            break
        frames.append(f)
        pos = f.offset + f.size
    early = [f for f in frames if f.group_start < frames[-1].group_start] if frames else []
    return early[len(early) // 2] if early else None
