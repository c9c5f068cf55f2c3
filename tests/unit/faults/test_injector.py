"""The fault injector applies every fault of its schedule or fails the run saying which and
why (issue 19): preconditions are waited for under deadlines, never skipped.

No Spark: each "worker" is a small supervisor process in its own session that keeps one
"executor" child running (its command line names ``CoarseGrainedExecutorBackend``, like the
JVM the injector looks for) and restarts it when it dies, as a Spark worker does. Data roots
are real directories; WALs are written by the product's :class:`~pyspark_kudu.wal.log.Log`.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FULL_DISKS_ENV, FileIO
from pyspark_kudu.spark.host.handlers import mark_failed
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, WorkerSpec
from pyspark_kudu.tools.faults.inject import FaultEvent, executor_pids
from pyspark_kudu.tools.faults.injector import FaultInjector
from pyspark_kudu.wal import Log, SyncPolicy, WalOptions
from tests.waiting import wait_until

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
# A bound on waits that must succeed (never a claim about speed: they end on the condition).
PATIENCE_S = 120.0
_SUPERVISOR = """
import subprocess, sys, time
while True:
    subprocess.run([sys.executable, "-c", "import time; time.sleep(3600)",
                    "CoarseGrainedExecutorBackend"])
    time.sleep(0.1)
"""


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[StandaloneCluster]:
    c = StandaloneCluster(tmp_path / "spark", workers=len(HOSTS))
    for host in HOSTS:
        wdir = tmp_path / "spark" / f"worker-{host}"
        c.worker_specs.append(WorkerSpec(host, wdir / "data", wdir / "work", wdir / "log", 0))
        _start_supervisor(c, host)
    try:
        wait_until(lambda: all(executor_pids(c, h) for h in HOSTS), PATIENCE_S,
                   "the stand-in executors")
        yield c
    finally:
        c.stop()


def _start_supervisor(c: StandaloneCluster, host: str) -> None:
    spec = next(w for w in c.worker_specs if w.host == host)
    spec.data_root.mkdir(parents=True, exist_ok=True)
    spec.process = subprocess.Popen([sys.executable, "-c", _SUPERVISOR],
                                    start_new_session=True)


def _wal(cluster: StandaloneCluster, host: str, tablet: str) -> Log:
    io = FileIO(str(cluster.data_root(host))).child("tablets", tablet, "wal")
    return Log.open(io, WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC,
                                   preallocate=False))


def _injector(cluster: StandaloneCluster, events: list[FaultEvent], **kw: Any) -> FaultInjector:
    kw.setdefault("precondition_deadline_s", PATIENCE_S)
    kw.setdefault("detect_deadline_s", PATIENCE_S)
    kw.setdefault("recover_deadline_s", PATIENCE_S)
    has_executor: Callable[[str], bool] = kw.pop("has_executor",
                                                 lambda h: bool(executor_pids(cluster, h)))
    return FaultInjector(cluster, events, time.monotonic, has_executor, poll_s=0.05, **kw)


def _record(inj: FaultInjector, i: int) -> dict[str, Any]:
    snap = inj.snapshot()
    return snap[i] if len(snap) > i else {}


def test_a_precondition_never_met_fails_the_run_naming_the_fault_and_what_was_missing(
    cluster: StandaloneCluster,
) -> None:
    log = _wal(cluster, HOSTS[0], "t1")
    log.append([Entry(1, 1)])  # one group commit only: nothing acknowledged earlier to damage
    log.close()
    inj = _injector(cluster, [FaultEvent(0.0, "corrupt_replica", HOSTS[0]),
                              FaultEvent(0.1, "kill_executor", HOSTS[1])],
                    precondition_deadline_s=0.5, voters_on=lambda h: {"t1"})
    inj.start()
    assert inj.join(PATIENCE_S)
    first, second = inj.snapshot()
    assert first["start"] is None and first["note"].startswith("NOT APPLIED")
    assert second["start"] is None and "earlier fault was not applied" in second["note"]
    errors = inj.errors
    assert len(errors) == 2, errors
    assert errors[0].startswith(f"corrupt_replica on {HOSTS[0]} (planned at 0.0 s) was not "
                                f"applied: ") and "before its last group commit" in errors[0]
    assert "kill_executor" in errors[1]


def test_corruption_waits_for_an_acknowledged_group_then_strikes_and_is_detected(
    cluster: StandaloneCluster,
) -> None:
    host = HOSTS[1]
    log = _wal(cluster, host, "t1")
    log.append([Entry(1, 1)])
    inj = _injector(cluster, [FaultEvent(0.0, "corrupt_replica", host)],
                    voters_on=lambda h: {"t1"} if h == host else set())
    before = executor_pids(cluster, host)
    inj.start()
    wait_until(lambda: "before its last group commit" in _record(inj, 0).get("note", ""),
               PATIENCE_S, "the injector waiting for a WAL frame of an earlier group")
    assert _record(inj, 0)["start"] is None
    log.append([Entry(1, 2), Entry(1, 3)])  # the workload writes again: a second group
    log.close()
    wait_until(lambda: _record(inj, 0).get("start") is not None, PATIENCE_S,
               "the corruption being applied")
    # The record's start comes first; the SIGKILL and its delivery follow.
    wait_until(lambda: not set(before) & set(executor_pids(cluster, host)), PATIENCE_S,
               f"the executor on {host} being killed after the corruption")
    io = FileIO(str(cluster.data_root(host))).child("tablets", "t1")
    with pytest.raises(CorruptionError) as e:
        _wal(cluster, host, "t1")  # what the replica's next open meets
    mark_failed(io, f"CorruptionError: {e.value}")  # what the tablet server then does
    assert inj.join(PATIENCE_S)
    (rec,) = inj.snapshot()
    assert "found failed" in rec["note"] and rec["end"] is not None, rec
    assert inj.errors == []


def test_a_replica_fault_strikes_the_next_host_holding_a_voter_when_the_planned_has_none(
    cluster: StandaloneCluster,
) -> None:
    log = _wal(cluster, HOSTS[2], "t2")
    log.append([Entry(1, 1)])
    log.append([Entry(1, 2)])
    log.close()
    inj = _injector(cluster, [FaultEvent(0.0, "corrupt_replica", HOSTS[1])],
                    voters_on=lambda h: {"t2"} if h == HOSTS[2] else set())
    inj.start()
    wait_until(lambda: _record(inj, 0).get("start") is not None, PATIENCE_S,
               "the corruption being applied")
    rec = _record(inj, 0)
    assert rec["host"] == HOSTS[2] and rec["planned_host"] == HOSTS[1], rec
    mark_failed(FileIO(str(cluster.data_root(HOSTS[2]))).child("tablets", "t2"), "found")
    assert inj.join(PATIENCE_S) and inj.errors == []


def test_a_destructive_fault_waits_for_replication_whole_after_the_previous_fault(
    cluster: StandaloneCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FULL_DISKS_ENV, str(tmp_path / "full-disks.json"))
    host = HOSTS[0]
    asked: list[float] = []
    whole = threading.Event()

    def healthy_since(t: float) -> bool:
        asked.append(t)
        return whole.is_set()

    inj = _injector(cluster, [FaultEvent(0.0, "kill_executor", HOSTS[2]),
                              FaultEvent(0.0, "disk_full", host, duration_s=PATIENCE_S)],
                    voters_on=lambda h: {"t1"}, healthy_since=healthy_since)
    inj.start()
    wait_until(lambda: "full replication not shown" in _record(inj, 1).get("note", ""),
               PATIENCE_S, "disk_full waiting for full replication")
    killed = inj.snapshot()[0]
    assert killed["start"] is not None and killed["end"] is not None, killed
    assert asked and min(asked) >= killed["end"], "judged on samples after the kill ended"
    data = FileIO(str(cluster.data_root(host)))
    data.atomic_write(b"ok", "instance")
    whole.set()
    wait_until(lambda: _record(inj, 1).get("start") is not None, PATIENCE_S,
               "the disk filling once replication is whole")
    with pytest.raises(OSError, match="No space left"):
        data.atomic_write(b"more", "instance")  # the product's FileIO meets the full disk
    FileIO(str(cluster.data_root(HOSTS[1]))).atomic_write(b"ok", "instance")  # others fine
    inj.stop(PATIENCE_S)  # stopping mid-fault frees the disk
    data.atomic_write(b"more", "instance")
    assert inj.snapshot()[1]["end"] is not None and inj.errors == []


def test_a_killed_executor_is_over_when_a_new_one_runs_and_pause_needs_one(
    cluster: StandaloneCluster,
) -> None:
    host = HOSTS[1]
    before = executor_pids(cluster, host)
    listed = threading.Event()
    inj = _injector(cluster, [FaultEvent(0.0, "kill_executor", host),
                              FaultEvent(0.0, "pause_host", host, duration_s=0.2)],
                    has_executor=lambda h: listed.is_set())
    inj.start()
    wait_until(lambda: "lists no executor" in _record(inj, 0).get("note", ""), PATIENCE_S,
               "the kill waiting for the driver to list an executor")
    listed.set()
    assert inj.join(PATIENCE_S)
    kill, pause = inj.snapshot()
    assert kill["end"] is not None and pause["end"] is not None, (kill, pause)
    assert not set(before) & set(executor_pids(cluster, host))
    assert "SIGCONT" in pause["note"] and inj.errors == []
