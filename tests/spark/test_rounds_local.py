"""Replication rounds as real Spark barrier stages, with virtual tablet servers (local mode)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pyspark_kudu.consensus.messages import EntryType
from pyspark_kudu.errors import InvalidArgumentError
from pyspark_kudu.spark.leader import TabletLeader, TabletReplicas
from pyspark_kudu.spark.peer import PeerRequest, RequestKind, replica_storage, tablet_dir
from pyspark_kudu.spark.pinned import executor_hosts
from pyspark_kudu.spark.rounds import SparkTransport, TabletServerLocation
from pyspark_kudu.spark.tserver import ensure_instance


def test_tablet_writes_commit_through_barrier_stages_on_virtual_tablet_servers(
    spark: SparkSession, tmp_path: Path
) -> None:
    sc = spark.sparkContext
    host = next(iter(executor_hosts(sc)))
    servers = []
    for n in range(3):
        info = ensure_instance(str(tmp_path / f"ts{n}"))
        servers.append(TabletServerLocation(info.uuid, host, info.data_root))
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


def test_a_round_whose_job_does_not_finish_is_cancelled_and_counts_as_failed(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A task blocked on a replica (here: its lock held by this process) would hold the
    round forever; the round's job is cancelled after ``round_timeout_s``, every tablet
    server counts as failed, and the next round, the lock released, commits."""
    sc = spark.sparkContext
    host = next(iter(executor_hosts(sc)))
    servers = []
    for n in range(3):
        info = ensure_instance(str(tmp_path / f"ts{n}"))
        servers.append(TabletServerLocation(info.uuid, host, info.data_root))
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


def test_a_round_timeout_must_be_positive(spark: SparkSession) -> None:
    with pytest.raises(InvalidArgumentError, match="round timeout"):
        SparkTransport(spark.sparkContext, [], round_timeout_s=0)
