"""Replication rounds as real Spark barrier stages, with virtual tablet servers (local mode)."""

from __future__ import annotations

import fcntl
import glob
import os
import tempfile
import threading
import time
from pathlib import Path

import google_crc32c
import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.spark.host import round_tasks
from pyspark_kudu.spark.host.dataplane import STAGING_DIR, StagedRef
from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind, replica_storage, tablet_dir
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.spark.replication import spark_rounds
from pyspark_kudu.spark.replication.spark_rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from tests.waiting import wait_until


def _virtual_servers(sc: SparkContext, tmp_path: Path, n: int = 3
                     ) -> list[TabletServerLocation]:
    """``n`` virtual tablet servers on the local executor host, each with its own root."""
    host = next(iter(executor_hosts(sc)))
    out = []
    for k in range(n):
        info = ensure_instance(str(tmp_path / f"ts{k}"))
        out.append(TabletServerLocation(info.uuid, host, info.data_root))
    return out


def test_tablet_writes_commit_through_barrier_stages_on_virtual_tablet_servers(
    spark: SparkSession, tmp_path: Path
) -> None:
    sc = spark.sparkContext
    servers = _virtual_servers(sc, tmp_path)
    transport = SparkTransport(sc, servers)
    tablet = TabletReplicas("tab-1", tuple(s.uuid for s in servers))
    TabletLeader(tablet, servers[0].uuid, transport).create()
    lead = TabletLeader(tablet, servers[0].uuid, transport)
    lead.elect()
    lead.propose([b"r1", b"r2"])
    lead.heartbeat()
    assert transport.failed_rounds == 0
    for s in servers:
        assert s.root is not None
        with replica_storage(s.root, "tab-1") as st:
            last = st.last_index()
            ents = st.entries(st.first_index(), last + 1)
            hs, _ = st.initial_state()
        assert [e.data for e in ents if e.type == EntryType.NORMAL and e.data] == [b"r1", b"r2"]
        assert hs.commit == last, f"replica {s.uuid} did not learn the commit index"


def test_a_large_staged_payload_is_landed_on_the_way_and_every_replica_gets_it_intact(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A payload of at least ``LAND_BYTES`` (a tablet copy part, a huge batch) crosses the
    shuffle and is landed in a private temporary file by the reduce side; the barrier task
    reads it back, the replicas log the real bytes, and no landed file is left behind."""
    sc = spark.sparkContext
    servers = _virtual_servers(sc, tmp_path)
    host = servers[0].host
    root0 = servers[0].root
    assert root0 is not None
    payload = os.urandom(round_tasks.LAND_BYTES + 12345)
    rel = os.path.join(STAGING_DIR, "w-large", "b.bin")
    os.makedirs(os.path.join(root0, os.path.dirname(rel)))
    with open(os.path.join(root0, rel), "wb") as f:
        f.write(payload)
    ref = StagedRef(host, root0, rel, len(payload), google_crc32c.value(payload), 0, 0)
    landed_before = set(glob.glob(os.path.join(tempfile.gettempdir(),
                                               "pyspark-kudu-delivered-*")))
    transport = SparkTransport(sc, servers)
    tablet = TabletReplicas("tab-big", tuple(s.uuid for s in servers))
    TabletLeader(tablet, servers[0].uuid, transport).create()
    lead = TabletLeader(tablet, servers[0].uuid, transport)
    lead.elect()
    lead.propose([ref.encode()])
    lead.heartbeat()
    assert transport.failed_rounds == 0, transport.last_error
    for s in servers:
        assert s.root is not None
        with replica_storage(s.root, "tab-big") as st:
            ents = st.entries(st.first_index(), st.last_index() + 1)
        logged = [e.data for e in ents if e.type == EntryType.NORMAL and e.data]
        assert logged == [payload], f"replica {s.uuid} logged {[len(d) for d in logged]}"
    left = set(glob.glob(os.path.join(tempfile.gettempdir(), "pyspark-kudu-delivered-*")))
    assert left <= landed_before, f"landed files left behind: {sorted(left - landed_before)}"


def test_land_writes_private_files_only_for_large_payloads_and_unland_removes_them() -> None:
    small, big = b"s" * 10, os.urandom(round_tasks.LAND_BYTES)
    (out,) = list(round_tasks.land(iter([(0, ("a", small)), (1, ("b", big))])))
    assert out[0] == (0, ("a", small))
    d, (path, landed) = out[1]
    assert (d, path) == (1, "b") and isinstance(landed, round_tasks.Landed)
    assert os.stat(landed.path).st_mode & 0o777 == 0o600
    with open(landed.path, "rb") as f:
        assert f.read() == big
    round_tasks.unland(out)
    assert not os.path.exists(landed.path)


def test_a_round_whose_job_does_not_finish_is_cancelled_and_counts_as_failed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A task blocked on a replica (here: its lock held by this process) would hold the
    round forever; the round's job is cancelled after ``round_timeout_s``, every tablet
    server counts as failed, and the next round, the lock released, commits."""
    sc = spark.sparkContext
    servers = _virtual_servers(sc, tmp_path)
    transport = SparkTransport(sc, servers, round_timeout_s=3.0)
    tablet = TabletReplicas("tab-t", tuple(s.uuid for s in servers))
    TabletLeader(tablet, servers[0].uuid, transport).create()
    lead = TabletLeader(tablet, servers[0].uuid, transport)
    lead.elect()
    sc.setLocalProperty("spark.jobGroup.id", "the-callers-group")
    blocked = servers[1].root
    assert blocked is not None
    lock = tablet_dir(blocked, "tab-t").local_path("lock")
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        before = transport.failed_rounds
        out = transport.run({s.uuid: [PeerRequest(RequestKind.READ_STATE, "tab-t", s.uuid)]
                             for s in servers})
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert out == {s.uuid: None for s in servers}, out
    assert transport.failed_rounds == before + 1 and transport.timed_out_rounds == 1
    assert "cancelled" in transport.last_error, transport.last_error
    # The caller's own job group is back; the cancelled round left nothing stuck.
    assert sc.getLocalProperty("spark.jobGroup.id") == "the-callers-group"
    sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    lead.propose([b"after"])
    assert transport.timed_out_rounds == 1
    with replica_storage(blocked, "tab-t") as st:
        ents = st.entries(st.first_index(), st.last_index() + 1)
    assert b"after" in [e.data for e in ents]


def test_a_round_blocked_for_many_watch_intervals_is_not_cancelled_before_its_timeout(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The round's watcher only cancels on the timeout or a lost executor: a round held up
    for many of its polling intervals (a replica lock held by this process) still ends
    normally once unblocked."""
    sc = spark.sparkContext
    servers = _virtual_servers(sc, tmp_path)
    transport = SparkTransport(sc, servers, round_timeout_s=120.0)
    transport.watch_interval_s = 0.05
    tablet = TabletReplicas("tab-slow", tuple(s.uuid for s in servers))
    TabletLeader(tablet, servers[0].uuid, transport).create()
    blocked = servers[1].root
    assert blocked is not None
    fd = os.open(tablet_dir(blocked, "tab-slow").local_path("lock"), os.O_RDWR)
    out: dict[str, object] = {}
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        runner = threading.Thread(target=lambda: out.update(transport.run({
            s.uuid: [PeerRequest(RequestKind.READ_STATE, "tab-slow", s.uuid)]
            for s in servers})), daemon=True)
        runner.start()
        wait_until(lambda: bool(sc.statusTracker().getActiveJobsIds()), 30,
                   "the round's job starting")
        since = time.monotonic()
        wait_until(lambda: time.monotonic() - since > 40 * transport.watch_interval_s
                   or not runner.is_alive(), 30, "40 watch intervals passing")
        assert runner.is_alive(), f"the blocked round ended early: {transport.last_error}"
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    runner.join(60)
    assert not runner.is_alive(), "the round did not finish once unblocked"
    assert transport.failed_rounds == 0, transport.last_error
    assert all(v is not None for v in out.values()) and len(out) == 3, out


def test_a_round_timeout_must_be_positive(spark: SparkSession) -> None:
    with pytest.raises(InvalidArgumentError, match="round timeout"):
        SparkTransport(spark.sparkContext, [], round_timeout_s=0)


def test_a_probe_asks_the_hosts_resident_server_and_a_silent_one_does_not_answer(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After a timed-out round a host is probed through its resident tablet server (no
    task slot needed): one that answers its ping is not suspect, one whose port accepts
    connections but never answers (a paused process) is, within the probe timeout."""
    import socket

    from pyspark_kudu.rpc.auth import SECRET_ENV
    from pyspark_kudu.spark.host.tablet_server import _make_server

    secret = "p" * 32
    monkeypatch.setenv(SECRET_ENV, secret)
    srv = _make_server("127.0.0.1", secret.encode())
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # accepts into the backlog, never answers
    try:
        sc = spark.sparkContext
        transport = SparkTransport(sc, _virtual_servers(sc, tmp_path), round_timeout_s=2.0)
        transport.secret = secret.encode()
        addresses = {"answering": f"127.0.0.1:{srv.port}",
                     "paused": f"127.0.0.1:{silent.getsockname()[1]}"}
        transport.pull_addresses = lambda: addresses
        def no_job(*_: object) -> None:
            raise AssertionError("a host with a resident server is probed without a job")

        monkeypatch.setattr(spark_rounds, "pinned_rdd", no_job)
        assert transport._probe("answering") is True
        assert transport._probe("paused") is False
    finally:
        silent.close()
        srv.shutdown()


def test_a_rounds_job_group_is_set_for_its_jobs_and_the_threads_own_properties_come_back(
    spark: SparkSession,
) -> None:
    """A round's jobs run in its own cancellable group; the calling thread's group,
    description, interrupt flag and other local properties are as before afterwards, also
    when the round raised."""
    sc = spark.sparkContext
    seen: dict[str, object] = {}

    def in_thread() -> None:  # its own thread: local properties are per thread
        sc.setJobGroup("users-group", "the user's jobs")
        sc.setLocalProperty("spark.scheduler.pool", "users-pool")
        with spark_rounds._job_group(sc, "round-group", "a round") as group:
            seen["inside"] = [sc.getLocalProperty(k) for k in (
                "spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel",
                "spark.scheduler.pool")]
            sc.parallelize([1], 1).count()
            seen["group"] = group
        with pytest.raises(ZeroDivisionError), spark_rounds._job_group(sc, "g2", "fails"):
            1 // 0  # noqa: B018
        seen["after"] = [sc.getLocalProperty(k) for k in (
            "spark.jobGroup.id", "spark.job.description", "spark.job.interruptOnCancel",
            "spark.scheduler.pool")]

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert seen["group"] == "round-group"
    assert seen["inside"] == ["round-group", "a round", "true", "users-pool"]
    assert seen["after"] == ["users-group", "the user's jobs", "false", "users-pool"]
    assert len(sc.statusTracker().getJobIdsForGroup("round-group")) == 1
    assert sc.statusTracker().getJobIdsForGroup("users-group") == []
