"""The harness's disk_full fault (pyspark_kudu.tools.faults.inject): planned like any other
fault, and filling / freeing a host's data root through the product's FileIO -- ENOSPC
injected by ``PYSPARK_KUDU_FULL_DISKS``, so it runs everywhere, without root or a tmpfs.
(A real tmpfs filled up: tests/unit/replication/test_failed_replicas.py.)"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.errors import DiskFullError
from pyspark_kudu.fileio import FULL_DISKS_ENV, FileIO
from pyspark_kudu.testing.standalone_cluster import StandaloneCluster, WorkerSpec
from pyspark_kudu.tools.faults.inject import fill_disk, free_disk, plan_schedule
from pyspark_kudu.wal import Log, SyncPolicy, WalOptions

HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]
KINDS = ("kill_executor", "restart_worker", "corrupt_replica", "disk_full")


def test_disk_full_faults_are_planned_on_any_host_and_last_a_while() -> None:
    plan = plan_schedule(random.Random(3), HOSTS, 300.0, kinds=KINDS, down_s=(8.0, 12.0))
    full = [e for e in plan if e.kind == "disk_full"]
    assert full, "a 300 s window with four kinds should plan a disk_full"
    assert all(8.0 <= e.duration_s <= 12.0 for e in full)
    hosts = {e.host for s in range(20)
             for e in plan_schedule(random.Random(s), HOSTS, 300.0, kinds=KINDS)
             if e.kind == "disk_full"}
    assert hosts == set(HOSTS)


def _cluster(tmp_path: Path) -> StandaloneCluster:
    c = StandaloneCluster(tmp_path / "spark", workers=2)
    for host in HOSTS[:2]:
        w = tmp_path / host
        c.worker_specs.append(WorkerSpec(host, w / "data", w / "work", w / "log", 0))
    return c


def test_a_full_data_root_fails_the_wal_with_disk_full_until_freed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(FULL_DISKS_ENV, str(tmp_path / "full-disks.json"))
    cluster = _cluster(tmp_path)
    full, other = HOSTS[0], HOSTS[1]
    opts = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC,
                      preallocate=False)

    def wal(host: str) -> Log:
        return Log.open(FileIO(str(cluster.data_root(host))).child("tablets", "t", "wal"),
                        opts)

    logs = {h: wal(h) for h in (full, other)}
    for log in logs.values():
        log.append([Entry(1, 1)])
    fill_disk(cluster, full)
    with pytest.raises(DiskFullError, match="no space left"):
        logs[full].append([Entry(1, 2)])  # the group sync meets ENOSPC, as on a real disk
    assert isinstance(logs[full].failure, DiskFullError), "the log is failed until reopened"
    logs[other].append([Entry(1, 2)])  # another host's disk is not full
    free_disk(cluster, full)
    logs[full].close()
    reopened = wal(full)  # recovery keeps what was durable (the failed entry may survive:
    assert reopened.last_index >= 1  # it was never acknowledged, Raft allows either)
    reopened.append([Entry(1, reopened.last_index + 1)])
    for log in (reopened, logs[other]):
        log.close()
