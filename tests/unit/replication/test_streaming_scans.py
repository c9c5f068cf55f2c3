"""Replica scans stream (issue "scale", point 1): batches are read as they are consumed,
from files pinned and opened under the replica's lock, which a scan does not hold while it
streams; a replica that has not applied what it knows committed catches up instead of
rebuilding a tablet from the WAL; a follower learns a commit index from a reader that
names the entry's term (Log Matching)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_kudu.errors import ServiceUnavailableError
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host import tserver_client
from pyspark_kudu.spark.host.handlers import tablet_dir
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.replica_apply import catch_up, read_applied
from pyspark_kudu.spark.host.replica_cache import clear_cache, open_replica
from pyspark_kudu.spark.host.replica_scan import scan_replica
from pyspark_kudu.spark.host.tablet_server import _make_server
from pyspark_kudu.spark.host.tserver_protocol import ScanRequest
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, encode_write_batch
from tests.waiting import wait_until

pytestmark = pytest.mark.unit

TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
ROWSETS = 6
ROWS_PER_ROWSET = 20_000
SECRET = b"s" * 32
REPO = Path(__file__).resolve().parents[3]


def _batch(lo: int, n: int, tag: str = "v") -> bytes:
    ids = list(range(lo, lo + n))
    return encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
        "id": ids, "v": [f"{tag}{i:08d}-{'x' * 40}" for i in ids]}))


def _flush(root: str) -> int:
    """Flush the replica's tablet under its lock; returns its number of rowsets."""
    io = tablet_dir(root, "t")
    with open_replica(root, io, "t", None, mutate=True) as h:
        tablet = h.open_tablet(root, "t", catch_up(root, "t", io, h))
        tablet.flush()
        return len(tablet.rowsets)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[dict[str, str], TabletLeader]]:
    """Three replicas of "t"; the leader's (ts-a) holds ROWSETS rowsets of fresh rows."""
    clear_cache()
    roots = {ts: str(tmp_path / ts) for ts in TS}
    for r in roots.values():
        ensure_instance(r)
    transport = DirectTransport(roots)
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    for k in range(ROWSETS):
        lead.propose([_batch(k * ROWS_PER_ROWSET, ROWS_PER_ROWSET)])
        lead.heartbeat()
        assert _flush(roots["ts-a"]) == k + 1
    yield roots, lead
    clear_cache()


def _lock_is_free(root: str) -> bool:
    fd = os.open(os.path.join(root, "tablets", "t", "lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def _scan_peak(root: str) -> tuple[int, int, int]:
    """Rows, peak Arrow memory above the start, and total output bytes of a full scan; the
    replica's lock must be free while the scan is suspended after its first batch."""
    base = pa.total_allocated_bytes()
    it = scan_replica(root, "t", None, (), None, batch_rows=2_000)
    first = next(it)
    assert first.num_rows <= 2_000
    assert _lock_is_free(root), "the scan held the replica's lock while streaming"
    peak = pa.total_allocated_bytes() - base
    rows, full = first.num_rows, first.nbytes
    for b in it:
        rows += b.num_rows
        full += b.nbytes
        peak = max(peak, pa.total_allocated_bytes() - base)
    return rows, peak, full


def test_a_scans_memory_does_not_grow_with_the_tablet_and_it_streams_unlocked(
        cluster: tuple[dict[str, str], TabletLeader]) -> None:
    roots, lead = cluster
    rows, small_peak, small_full = _scan_peak(roots["ts-a"])
    assert rows == ROWSETS * ROWS_PER_ROWSET
    for k in range(ROWSETS, 8 * ROWSETS):  # eight times the data
        lead.propose([_batch(k * ROWS_PER_ROWSET, ROWS_PER_ROWSET)])
        lead.heartbeat()
        _flush(roots["ts-a"])
    rows, peak, full = _scan_peak(roots["ts-a"])
    assert rows == 8 * ROWSETS * ROWS_PER_ROWSET
    assert full > 7.5 * small_full
    # What a scan holds is a row group's decoded columns and a few batches, whatever the
    # tablet's size (a materialising scan would hold all ``full`` bytes). Decoding threads
    # make the peak vary a little between runs, hence the margins.
    assert peak < 2.5 * small_peak, (peak, small_peak)
    assert peak < full / 6, (peak, full)


def test_a_compaction_by_another_process_does_not_change_what_a_running_scan_returns(
        cluster: tuple[dict[str, str], TabletLeader]) -> None:
    roots, lead = cluster
    it = scan_replica(roots["ts-a"], "t", ("id", "v"), (), None, batch_rows=5_000)
    got = [next(it)]
    # Another process (another Python worker, or the host's tablet server) overwrites rows
    # and compacts the replica: the scan's input files are deleted under it.
    lead.propose([_batch(0, 1_000, tag="new")])
    lead.heartbeat()
    script = textwrap.dedent(f"""
        from pyspark_kudu.spark.host.handlers import tablet_dir
        from pyspark_kudu.spark.host.replica_apply import catch_up
        from pyspark_kudu.spark.host.replica_cache import open_replica
        from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
        from pyspark_kudu.tablet import Tablet
        root = {roots["ts-a"]!r}
        io = tablet_dir(root, "t")
        with open_replica(root, io, "t", None, mutate=True) as h:
            applied = catch_up(root, "t", io, h)
            h.tablet = Tablet.open(root, "t", log=WalCommittedLog(h.storage, upto=applied))
            assert h.tablet.compact(), "nothing compacted"
            print(len(h.tablet.rowsets))
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names = os.listdir(os.path.join(roots["ts-a"], "tablets", "t", "rowsets"))
    assert "00000000.parquet" not in names, "the compaction did not replace the old files"
    got.extend(it)
    table = pa.Table.from_batches(got)
    assert table.num_rows == ROWSETS * ROWS_PER_ROWSET
    assert not any(v.startswith("new") for v in table.column("v").to_pylist()), (
        "the scan saw a write made after it started")
    # A new scan sees the overwrite, from the compacted files.
    after = pa.Table.from_batches(list(scan_replica(roots["ts-a"], "t", ("v",), (), None)))
    assert sum(v.startswith("new") for v in after.column("v").to_pylist()) == 1_000


def test_a_replica_catches_up_instead_of_rebuilding_from_the_wal(
        cluster: tuple[dict[str, str], TabletLeader]) -> None:
    roots, lead = cluster
    lead.propose([_batch(10**7, 500)])  # the followers are not told the commit yet
    commit = lead.node.commit_index if lead.node else 0
    io = tablet_dir(roots["ts-a"], "t")
    before = read_applied(io)
    rows = sum(b.num_rows for b in scan_replica(roots["ts-a"], "t", ("id",), (), None,
                                                known_commit=commit, trusted=True))
    assert rows == ROWSETS * ROWS_PER_ROWSET + 500
    assert before <= commit and read_applied(io) == commit, (
        "the scan read a rebuilt tablet instead of applying the commit to the replica")


def test_a_follower_serves_a_write_it_holds_once_told_the_entrys_term(
        cluster: tuple[dict[str, str], TabletLeader]) -> None:
    roots, lead = cluster
    lead.propose([_batch(10**7, 500)])  # committed; the followers hold it, not its commit
    assert lead.node is not None
    commit = lead.node.commit_index
    term = lead.node.log.term(commit)
    io = tablet_dir(roots["ts-b"], "t")
    assert read_applied(io) < commit
    # Without the term, or with a wrong one, the follower cannot know the entry committed.
    for wrong in (None, term + 1):
        with pytest.raises(ServiceUnavailableError, match=r"not \d+ yet"):
            scan_replica(roots["ts-b"], "t", ("id",), (), commit, known_commit=commit,
                         trusted=False, commit_term=wrong)
    assert read_applied(io) < commit
    rows = sum(b.num_rows for b in scan_replica(roots["ts-b"], "t", ("id",), (), commit,
                                                known_commit=commit, trusted=False,
                                                commit_term=term))
    assert rows == ROWSETS * ROWS_PER_ROWSET + 500
    assert read_applied(io) == commit


def _open_rowset_files(root: str) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(root) and ".parquet" in target:
            out.append(target)
    return out


def test_an_abandoned_remote_scan_releases_its_files(
        cluster: tuple[dict[str, str], TabletLeader]) -> None:
    roots, _ = cluster
    uuid = ensure_instance(roots["ts-a"]).uuid
    srv: Any = _make_server("127.0.0.1", SECRET)
    try:
        it = tserver_client.scan_remote(f"127.0.0.1:{srv.port}", SECRET, ScanRequest(
            uuid, "t", None, root=roots["ts-a"], batch_rows=1_000, trusted=True))
        assert next(it).num_rows <= 1_000
        assert _open_rowset_files(roots["ts-a"]), "the server's scan holds no open file"
        it.close()  # type: ignore[attr-defined]
        wait_until(lambda: not _open_rowset_files(roots["ts-a"]), 30,
                   "the server closing the files of a scan its client abandoned")
    finally:
        srv.shutdown()
