"""Shared scans (issue "scale", scans at 0.8x of Parquet): a task on a replica's host has the
resident tablet server plan the scan and share the rowset files, which the task decodes
itself. The rows are exactly the server's; the server's pins are released when it answers;
links a task never opened are swept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.flight as fl
import pytest

from pyspark_kudu.errors import ServiceUnavailableError
from pyspark_kudu.rpc.auth import connect
from pyspark_kudu.schema import ColumnSchema, Predicate, Schema
from pyspark_kudu.spark.host import shared_scan, tserver_client
from pyspark_kudu.spark.host.handlers import tablet_dir
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.replica_apply import catch_up
from pyspark_kudu.spark.host.replica_cache import clear_cache, open_replica
from pyspark_kudu.spark.host.replica_reader import ReplicaChoice, TabletScan, read_tablet
from pyspark_kudu.spark.host.replica_scan import plan_replica_scan, scan_replica
from pyspark_kudu.spark.host.tablet_server import _make_server
from pyspark_kudu.spark.host.tserver_protocol import FILES_KEY, ScanRequest
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, encode_write_batch

pytestmark = pytest.mark.unit

TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string"),
                 ColumnSchema("n", "int64")), ("id",))
ROWSETS = 3
ROWS = 5_000
SECRET = b"q" * 32
REPO = Path(__file__).resolve().parents[3]


def _batch(lo: int, n: int, tag: str) -> bytes:
    ids = list(range(lo, lo + n))
    return encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
        "id": ids, "v": [f"{tag}{i}" for i in ids],
        "n": [None if i % 7 == 0 else i * 3 for i in ids]}))


def _flush(root: str) -> None:
    io = tablet_dir(root, "t")
    with open_replica(root, io, "t", None, mutate=True) as h:
        h.open_tablet(root, "t", catch_up(root, "t", io, h)).flush()


@pytest.fixture
def replica(tmp_path: Path) -> Iterator[tuple[str, str, TabletLeader, int]]:
    """ts-a's replica of "t": ROWSETS flushed rowsets, then an upsert of every 10th row that
    stays in the MemRowSet (it ends versions in the rowsets). Yields (root, ts uuid, leader,
    the commit index before that upsert)."""
    clear_cache()
    roots = {ts: str(tmp_path / ts) for ts in TS}
    uuid = ensure_instance(roots["ts-a"]).uuid
    for ts in TS[1:]:
        ensure_instance(roots[ts])
    transport = DirectTransport(roots)
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    for k in range(ROWSETS):
        lead.propose([_batch(k * ROWS, ROWS, "old")])
        lead.heartbeat()
        _flush(roots["ts-a"])
    assert lead.node is not None
    before = lead.node.commit_index
    ids = list(range(0, ROWSETS * ROWS, 10))
    lead.propose([encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
        "id": ids, "v": [f"new{i}" for i in ids], "n": [-i for i in ids]}))])
    lead.heartbeat()
    yield roots["ts-a"], uuid, lead, before
    clear_cache()


@pytest.fixture
def server() -> Iterator[Any]:
    srv = _make_server("127.0.0.1", SECRET)
    try:
        yield srv
    finally:
        srv.shutdown()


def _shared(srv: Any, root: str, uuid: str, **kw: Any) -> pa.Table:
    req = ScanRequest(uuid, "t", kw.pop("columns", None), root=root, trusted=True,
                      share_files=True, types={c.name: c.type for c in SCHEMA.columns}, **kw)
    out = list(tserver_client.scan_shared(f"127.0.0.1:{srv.port}", SECRET, req))
    return pa.Table.from_batches(out, schema=out[0].schema) if out else pa.table({})


def _links(root: str) -> list[str]:
    base = os.path.join(root, shared_scan.SCANS_DIR)
    return os.listdir(base) if os.path.isdir(base) else []


@pytest.mark.parametrize("kw", [
    {},
    {"columns": ("v", "n"), "predicates": (Predicate.ge("id", 1_000), Predicate.lt("id", 9_000),
                                          Predicate.is_not_null("n"))},
    {"snapshot": "before"},
], ids=["all", "projected-and-filtered", "older-snapshot"])
def test_a_shared_scan_returns_exactly_what_the_replica_scan_returns(
        replica: tuple[str, str, TabletLeader, int], server: Any, kw: dict[str, Any]) -> None:
    root, uuid, _, before = replica
    if kw.get("snapshot") == "before":
        kw = {"snapshot": before}
    got = _shared(server, root, uuid, **kw)
    want = pa.Table.from_batches(list(scan_replica(
        root, "t", kw.get("columns"), kw.get("predicates", ()), kw.get("snapshot"))))
    assert got.num_rows == want.num_rows > 0
    key = [(c, "ascending") for c in got.column_names]
    assert got.sort_by(key).equals(want.sort_by(key))
    if "snapshot" not in kw and "predicates" not in kw:
        # The upsert's new versions (MemRowSet, streamed) replace the old (rowset files).
        assert got.num_rows == ROWSETS * ROWS
        assert sum(v.startswith("new") for v in got.column("v").to_pylist()) == ROWSETS * ROWS // 10
    assert _links(root) == [], "the task left the shared files' links behind"


def test_the_server_shares_the_files_and_streams_only_the_memrowset(
        replica: tuple[str, str, TabletLeader, int], server: Any) -> None:
    root, uuid, _, _ = replica
    req = ScanRequest(uuid, "t", None, root=root, trusted=True, share_files=True)
    client = connect(fl.Location.for_grpc_tcp("127.0.0.1", server.port), SECRET)
    try:
        reader = client.do_get(fl.Ticket(req.to_ticket()))
        described = json.loads((reader.schema.metadata or {})[FILES_KEY])
        streamed = reader.read_all()
    finally:
        client.close()
    assert len(described["files"]) == ROWSETS
    assert all(os.path.exists(f["path"]) for f in described["files"])
    # The streamed rows are the MemRowSet's: the upsert's new versions only.
    assert streamed.num_rows == ROWSETS * ROWS // 10
    assert all(v.startswith("new") for v in streamed.column("v").to_pylist())
    # Every old version the upsert ended is named, so the task filters it out.
    dead = sum(len(f["dead"]) > 0 for f in described["files"])
    assert dead == ROWSETS
    shared_scan.sweep_stale(root, now=time.time() + shared_scan.STALE_S + 1)
    assert _links(root) == [], "a stale shared scan was not swept"


def test_a_compaction_after_the_answer_does_not_change_what_the_task_reads(
        replica: tuple[str, str, TabletLeader, int], server: Any) -> None:
    root, uuid, lead, _ = replica
    req = ScanRequest(uuid, "t", ("id", "v"), root=root, trusted=True, share_files=True,
                      batch_rows=1_000)
    it = tserver_client.scan_shared(f"127.0.0.1:{server.port}", SECRET, req)
    got = [next(it)]  # the server answered and released its pins
    lead.propose([_batch(0, ROWSETS * ROWS, "newer")])
    lead.heartbeat()
    script = textwrap.dedent(f"""
        from pyspark_kudu.spark.host.handlers import tablet_dir
        from pyspark_kudu.spark.host.replica_apply import catch_up
        from pyspark_kudu.spark.host.replica_cache import open_replica
        from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
        from pyspark_kudu.tablet import Tablet
        root = {root!r}
        io = tablet_dir(root, "t")
        with open_replica(root, io, "t", None, mutate=True) as h:
            applied = catch_up(root, "t", io, h)
            h.tablet = Tablet.open(root, "t", log=WalCommittedLog(h.storage, upto=applied))
            h.tablet.flush()
            assert h.tablet.compact(), "nothing compacted"
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names = os.listdir(os.path.join(root, "tablets", "t", "rowsets"))
    assert "00000000.parquet" not in names, "the compaction did not replace the old files"
    got.extend(it)
    table = pa.Table.from_batches(got)
    assert table.num_rows == ROWSETS * ROWS
    vs = table.column("v").to_pylist()
    assert not any(v.startswith("newer") for v in vs), "the scan saw a later write"
    assert sum(v.startswith("new") for v in vs) == ROWSETS * ROWS // 10


def test_files_the_task_cannot_open_fail_the_replica_before_any_batch(tmp_path: Path) -> None:
    gone = tmp_path / "scans" / "x"
    gone.mkdir(parents=True)
    described = json.dumps({"dir": str(gone), "snapshot": 1, "schema": SCHEMA.to_dict(),
                            "files": [{"path": str(gone / "0.parquet"), "max_ts": 1,
                                       "min_end": None, "dead": ""}]}).encode()
    with pytest.raises(ServiceUnavailableError, match="not readable here"):
        tserver_client.read_shared(described, None, (), 100)
    assert not gone.exists()


def test_a_stale_shared_scan_is_swept_and_a_fresh_one_kept(tmp_path: Path) -> None:
    base = tmp_path / shared_scan.SCANS_DIR
    (base / "old").mkdir(parents=True)
    (base / "fresh").mkdir()
    old = time.time() - shared_scan.STALE_S - 5
    os.utime(base / "old", (old, old))
    assert shared_scan.sweep_stale(str(tmp_path)) == 1
    assert os.listdir(base) == ["fresh"]


def test_a_task_on_the_replicas_host_reads_the_shared_files(
        replica: tuple[str, str, TabletLeader, int], server: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    root, uuid, _, _ = replica
    shared: list[int] = []
    real = tserver_client.read_shared

    def spy(*a: Any, **kw: Any) -> Iterator[pa.RecordBatch]:
        shared.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(tserver_client, "read_shared", spy)
    scan = TabletScan("tbl", "t", (ReplicaChoice(uuid, root, True, "127.0.0.1",
                                                 f"127.0.0.1:{server.port}"),), None)
    got = pa.Table.from_batches(list(read_tablet(scan, host="127.0.0.1", secret=SECRET)))
    assert got.num_rows == ROWSETS * ROWS
    assert shared == [1], "the local replica was not read from shared files"


def test_a_replica_holding_only_a_memrowset_shares_nothing_and_streams_every_row(
        tmp_path: Path) -> None:
    clear_cache()
    roots = {ts: str(tmp_path / ts) for ts in TS}
    for r in roots.values():
        ensure_instance(r)
    tablet = TabletReplicas("t", TS)
    transport = DirectTransport(roots)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    lead.propose([_batch(0, 500, "m")])
    lead.heartbeat()
    scanner = plan_replica_scan(roots["ts-a"], "t", ("id",), (), None)
    schema, it = shared_scan.share_scan(roots["ts-a"], "t", scanner)
    assert FILES_KEY not in (schema.metadata or {})
    assert sum(b.num_rows for b in it) == 500
    assert _links(roots["ts-a"]) == []
    clear_cache()
