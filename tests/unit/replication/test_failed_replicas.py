"""Failed replicas (DESIGN §5): corrupt files or a full disk mark a replica failed; it never
serves data again, the write still commits on the healthy majority, and the leader records
the failure so that the client has the replica replaced. The full disk is injected through
the FileIO (``PYSPARK_KUDU_FULL_DISKS``) so it runs everywhere; a real 1 MiB tmpfs variant
runs where mounting is allowed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import ServiceUnavailableError
from pyspark_kudu.fileio import FULL_DISKS_ENV, set_disk_full
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host.handlers import FAILED_FILE, PeerRequest, RequestKind
from pyspark_kudu.spark.host.replica_cache import clear_cache
from pyspark_kudu.spark.host.replica_scan import scan_replica
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, encode_write_batch
from pyspark_kudu.wal import SyncPolicy, WalOptions

OPTS = WalOptions(segment_size=1 << 20, sync_policy=SyncPolicy.FDATASYNC, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))


def _batch(lo: int, n: int, width: int = 8) -> bytes:
    return encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
        "id": list(range(lo, lo + n)), "v": [os.urandom(width).hex() for _ in range(n)]}))


def _leader(transport: DirectTransport) -> TabletLeader:
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    return lead


def _corrupt_middle_of_wal(root: str) -> None:
    wal = Path(root) / "tablets" / "t" / "wal"
    seg = max(wal.iterdir(), key=lambda p: p.stat().st_size)
    data = bytearray(seg.read_bytes())
    mid = len(data) // 3
    data[mid] ^= 0xFF
    seg.write_bytes(bytes(data))


def test_a_replica_with_a_corrupt_wal_is_failed_and_the_majority_goes_on(
    tmp_path: Path,
) -> None:
    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = _leader(transport)
    for k in range(6):
        lead.propose([_batch(k * 50, 50, 64)])
    lead.heartbeat()
    _corrupt_middle_of_wal(transport.roots["ts-c"])
    clear_cache()  # the executor's Python worker restarts: replicas are reopened from disk

    (pos,) = lead.propose([_batch(1000, 10)])
    assert lead.committed(pos[0]), "a and b are a majority: the write must commit"
    assert "ts-c" in lead.failed_replicas, lead.failed_replicas
    assert "Corruption" in lead.failed_replicas["ts-c"]
    marker = Path(transport.roots["ts-c"]) / "tablets" / "t" / FAILED_FILE
    assert marker.exists() and "Corruption" in marker.read_text()
    # It never serves anything again: no state, no scan.
    answer = transport.run({"ts-c": [PeerRequest(RequestKind.READ_STATE, "t", "ts-c")]})["ts-c"]
    assert answer is not None and not answer[0].ok and answer[0].replica_failed
    with pytest.raises(ServiceUnavailableError, match="failed"):
        scan_replica(transport.roots["ts-c"], "t", None, (), None)
    # The healthy replicas still have every row (once told the last commit).
    lead.heartbeat()
    assert sum(b.num_rows
               for b in scan_replica(transport.roots["ts-b"], "t", None, (), None)) == 310


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs: a real full disk (needs the right to mount, i.e. CAP_SYS_ADMIN)."""
    path = tmp_path / "tiny"
    path.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"mounting a size-limited tmpfs is not permitted here ({proc.stderr.strip()}"
                    f"); the same behaviour is tested everywhere with ENOSPC injected through "
                    f"the FileIO (test_a_replica_whose_disk_fills_up_is_failed_...)")
    try:
        yield path
    finally:
        clear_cache()
        subprocess.run(["umount", "-l", str(path)], check=False)


def _write_until_ts_c_fails(roots: dict[str, str]) -> None:
    """Writes go on until ts-c's full disk fails its replica; the majority commits every
    one, and ts-c is reported failed (the client then has it replaced, DESIGN §5)."""
    transport = DirectTransport(roots, OPTS)
    lead = _leader(transport)
    for k in range(200):  # up to ~4 MB of batches: more than ts-c's 1 MiB disk holds
        (pos,) = lead.propose([_batch(k * 200, 200, 64)])
        assert lead.committed(pos[0])
        if "ts-c" in lead.failed_replicas:
            break
    assert "ts-c" in lead.failed_replicas, "ts-c's full disk was never reported"
    assert "DiskFull" in lead.failed_replicas["ts-c"] or "No space" in lead.failed_replicas[
        "ts-c"], lead.failed_replicas["ts-c"]
    (pos,) = lead.propose([_batch(90_000, 5)])
    assert lead.committed(pos[0])
    lead.heartbeat()
    assert sum(b.num_rows
               for b in scan_replica(roots["ts-a"], "t", None, (), None)) > 100


def test_a_replica_whose_disk_fills_up_is_failed_and_the_majority_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENOSPC injected through the FileIO (no root needed): ts-c's data root holds 1 MiB,
    like the tmpfs below; the WAL, tablet and handler code that meets it is the product's."""
    roots = {ts: str(tmp_path / ts) for ts in TS}
    monkeypatch.setenv(FULL_DISKS_ENV, str(tmp_path / "full-disks.json"))
    set_disk_full(roots["ts-c"], max_bytes=1 << 20)
    try:
        _write_until_ts_c_fails(roots)
    finally:
        clear_cache()


def test_a_replica_whose_real_tmpfs_fills_up_is_failed_and_the_majority_goes_on(
    tmp_path: Path, tiny_disk: Path,
) -> None:
    roots = {ts: str(tmp_path / ts) for ts in TS}
    roots["ts-c"] = str(tiny_disk / "ts-c")
    _write_until_ts_c_fails(roots)


def test_a_replica_left_mid_copy_by_a_crash_serves_nothing(tmp_path: Path) -> None:
    """An install replaces the old tablet step by step; a crash in between leaves the
    ``copying`` marker, and such a replica is refused like a failed one until replaced."""
    from pyspark_kudu.spark.host.tabletcopy import COPYING_FILE

    transport = DirectTransport({ts: str(tmp_path / ts) for ts in TS}, OPTS)
    lead = _leader(transport)
    lead.propose([_batch(0, 20)])
    lead.heartbeat()
    (Path(transport.roots["ts-c"]) / "tablets" / "t" / COPYING_FILE).write_text("x")
    (pos,) = lead.propose([_batch(100, 5)])
    assert lead.committed(pos[0])
    assert "interrupted" in lead.failed_replicas.get("ts-c", ""), lead.failed_replicas
    with pytest.raises(ServiceUnavailableError, match="interrupted"):
        scan_replica(transport.roots["ts-c"], "t", None, (), None)
