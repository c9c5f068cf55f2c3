"""The resident tablet server (DESIGN §1): a host's replicas scanned and streamed from any
host over authenticated Arrow Flight, and a server process that dies with its daemon."""

from __future__ import annotations

import base64
import datetime as dt
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import google_crc32c
import pyarrow as pa
import pytest

from pyspark_kudu.errors import (
    InvalidArgumentError,
    NetworkError,
    NotFoundError,
    ServiceUnavailableError,
)
from pyspark_kudu.schema import ColumnSchema, Predicate, Schema
from pyspark_kudu.spark.healing.replica_management import delete_via_server
from pyspark_kudu.spark.host import replica_cache, tserver_client
from pyspark_kudu.spark.host.dataplane import REF_MAGIC, StagedRef
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.replica_scan import scan_replica
from pyspark_kudu.spark.host.tablet_server import _make_server
from pyspark_kudu.spark.host.tserver_protocol import (
    FileRequest,
    ScanRequest,
    StagedRequest,
    decode_predicates,
    encode_predicates,
)
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, encode_write_batch
from tests.netcapture import CapturingProxy
from tests.waiting import wait_until

pytestmark = pytest.mark.unit

SECRET = b"k" * 32
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[tuple[dict[str, str], str]]:
    """Three replicas of tablet "t" with 300 committed rows; the roots are tablet-server
    data roots (with instance files). Yields (roots by replica id, uuid of ts-b's root).
    This process's replica cache then holds exactly these three replicas."""
    replica_cache.clear_cache()
    roots = {ts: str(tmp_path / ts) for ts in TS}
    infos = {ts: ensure_instance(r) for ts, r in roots.items()}
    transport = DirectTransport(roots)
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())
    lead = TabletLeader(tablet, "ts-a", transport)
    lead.elect()
    for k in range(3):
        lead.propose([encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
            "id": list(range(k * 100, k * 100 + 100)),
            "v": [f"v{i}" for i in range(k * 100, k * 100 + 100)]}))])
    lead.heartbeat()  # followers learn the commit index and apply
    yield roots, infos["ts-b"].uuid


@pytest.fixture
def server() -> Iterator[Any]:
    srv = _make_server("127.0.0.1", SECRET)
    try:
        yield srv
    finally:
        srv.shutdown()


def _addr(srv: Any) -> str:
    return f"127.0.0.1:{srv.port}"


def _local_rows(root: str, **kw: Any) -> pa.Table:
    return pa.Table.from_batches(list(scan_replica(root, "t", **kw)))


def test_a_remote_scan_returns_exactly_what_a_local_scan_of_that_replica_returns(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    roots, ts_b = replicas
    req = ScanRequest(ts_b, "t", None, root=roots["ts-b"], batch_rows=64)
    got = pa.Table.from_batches(list(tserver_client.scan_remote(_addr(server), SECRET, req)))
    want = _local_rows(roots["ts-b"], columns=None, predicates=(), snapshot=None)
    assert got.num_rows == 300
    assert got.sort_by("id").equals(want.sort_by("id"))


def test_a_remote_scan_applies_columns_and_typed_predicates(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    roots, ts_b = replicas
    preds = (Predicate.ge("id", 10), Predicate.lt("id", 20), Predicate.in_("v", ["v12", "v15"]))
    req = ScanRequest(ts_b, "t", ("v",), preds, root=roots["ts-b"],
                      types={c.name: c.type for c in SCHEMA.columns})
    got = pa.Table.from_batches(list(tserver_client.scan_remote(_addr(server), SECRET, req)))
    assert got.column_names == ["v"]
    assert sorted(got.column("v").to_pylist()) == ["v12", "v15"]


def test_predicates_keep_their_exact_types_on_the_wire() -> None:
    preds = [Predicate.eq("ts", dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.timezone.utc)),
             Predicate.in_("d", [Decimal("1.25"), Decimal("-3.50")]),
             Predicate.le("day", dt.date(2026, 11, 25)), Predicate.ne("b", b"\x00\xff"),
             Predicate.is_null("n"), Predicate.is_not_null("m")]
    assert decode_predicates(encode_predicates(preds)) == preds


def test_a_scan_of_a_server_or_tablet_not_on_that_host_is_not_found(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    roots, ts_b = replicas
    with pytest.raises(NotFoundError, match="not served here"):
        list(tserver_client.scan_remote(_addr(server), SECRET,
                                        ScanRequest("someone-else", "t", None,
                                                    root=roots["ts-b"])))
    with pytest.raises(NotFoundError, match="no replica"):
        list(tserver_client.scan_remote(_addr(server), SECRET,
                                        ScanRequest(ts_b, "nope", None, root=roots["ts-b"])))


def test_a_replica_behind_a_linearizable_read_point_refuses_instead_of_serving_less(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    roots, ts_b = replicas
    req = ScanRequest(ts_b, "t", None, known_commit=10_000, require_index=10_000,
                      root=roots["ts-b"])
    with pytest.raises(ServiceUnavailableError, match="needs 10000"):
        list(tserver_client.scan_remote(_addr(server), SECRET, req))


def test_a_file_stream_returns_the_exact_bytes_of_a_range(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    roots, ts_b = replicas
    wal = Path(roots["ts-b"]) / "tablets" / "t" / "wal"
    seg = max(wal.iterdir(), key=lambda p: p.stat().st_size)
    data = seg.read_bytes()
    rel = f"wal/{seg.name}"
    whole = b"".join(tserver_client.fetch_file(
        _addr(server), SECRET, FileRequest(ts_b, "t", rel, root=roots["ts-b"])))
    assert whole == data
    part = b"".join(tserver_client.fetch_file(
        _addr(server), SECRET, FileRequest(ts_b, "t", rel, 7, 100, root=roots["ts-b"])))
    assert part == data[7:107]


@pytest.mark.parametrize("path", ["../../instance", "/etc/passwd", "wal/../../x", ".", ""])
def test_a_file_request_outside_the_tablet_directory_is_refused(path: str) -> None:
    with pytest.raises(InvalidArgumentError, match="relative path"):
        FileRequest("ts", "t", path)


def _staged(root: Path, data: bytes, host: str = "127.0.0.1") -> StagedRef:
    rel = f"staging/w1/p0-{google_crc32c.value(data):x}.bin"
    (root / rel).parent.mkdir(parents=True, exist_ok=True)
    (root / rel).write_bytes(data)
    return StagedRef(host, str(root), rel, len(data), google_crc32c.value(data), 3, 0, 1)


def _ticket_ref(ref: StagedRef) -> str:
    return ref.encode()[len(REF_MAGIC):].decode()


def test_a_staged_batch_is_pulled_exactly_and_a_damaged_one_is_not_found(
        tmp_path: Path, server: Any) -> None:
    data = os.urandom(9 << 20)  # more than two stream chunks
    ref = _staged(tmp_path, data)
    got = tserver_client.fetch_staged(_addr(server), SECRET, StagedRequest(_ticket_ref(ref)))
    assert got == data
    assert tserver_client.ping(_addr(server), SECRET)["staged_bytes_served"] >= len(data)
    wrong = StagedRef(ref.host, ref.root, ref.path, ref.size, ref.crc ^ 1, 3, 0, 1)
    with pytest.raises(NotFoundError, match="not on"):
        tserver_client.fetch_staged(_addr(server), SECRET, StagedRequest(_ticket_ref(wrong)))


@pytest.mark.parametrize("path", ["../instance", "staging/../../etc/passwd", "/etc/passwd",
                                  "tablets/t/superblock", "staging//x", "staging\\..\\x"])
def test_a_staged_request_names_only_staged_batches_and_log_entries(path: str) -> None:
    ref = StagedRef("h", "/r", path, 1, 0, 1, 0)
    with pytest.raises(InvalidArgumentError, match="staged"):
        StagedRequest(_ticket_ref(ref))


def test_pulled_payloads_read_this_hosts_batches_and_fetch_the_others(
        tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from pyspark_kudu.consensus.messages import Entry
    from pyspark_kudu.spark.host import round_tasks
    from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind
    from pyspark_kudu.spark.host.round_tasks import HostTask, PulledPayloads

    monkeypatch.setenv("PYSPARK_KUDU_SECRET", SECRET.decode())
    monkeypatch.setattr(round_tasks, "current_host", lambda: "this-host")
    mine = _staged(tmp_path / "mine", b"local batch", host="this-host")
    theirs = _staged(tmp_path / "theirs", b"remote batch", host="other-host")
    lost = _staged(tmp_path / "lost", b"lost batch", host="gone-host")
    entries = tuple(Entry(1, k + 1, data=r.encode()) for k, r in enumerate((mine, theirs, lost)))
    req = PeerRequest(RequestKind.PERSIST, "t", "ts-a", entries=entries)
    task = HostTask("this-host", (("ts-a", None, (req,)),), None, pull=True,
                    sources=(("other-host", _addr(server)),))
    pulled = PulledPayloads(task, {})
    assert pulled.get(mine.path) == b"local batch" and pulled.fetched == 0
    assert pulled.get(theirs.path) == b"remote batch" and pulled.fetched == 1
    assert pulled.get(lost.path) is None  # no server known on its host: not delivered
    assert set(pulled) == {mine.path, theirs.path, lost.path}
    pulled.close()


def test_a_task_pulls_its_batches_from_a_server_over_one_client_and_drops_a_failed_one(
        tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Four batches of one host come over one client, kept between them; a batch the server
    does not have intact (a damaged file) is not delivered and its client is not used
    again: the next batch opens a new one. Closing closes them all."""
    from pyspark_kudu.consensus.messages import Entry
    from pyspark_kudu.spark.host import round_tasks
    from pyspark_kudu.spark.host.handlers import PeerRequest, RequestKind
    from pyspark_kudu.spark.host.round_tasks import HostTask, PulledPayloads

    monkeypatch.setenv("PYSPARK_KUDU_SECRET", SECRET.decode())
    monkeypatch.setattr(round_tasks, "current_host", lambda: "this-host")
    refs = [_staged(tmp_path / f"r{k}", f"batch {k}".encode() * (k + 1), host="other-host")
            for k in range(5)]
    damaged = tmp_path / "r4" / refs[4].path
    damaged.write_bytes(b"X" + damaged.read_bytes()[1:])
    entries = tuple(Entry(1, k + 1, data=r.encode()) for k, r in enumerate(refs))
    req = PeerRequest(RequestKind.PERSIST, "t", "ts-a", entries=entries)
    task = HostTask("this-host", (("ts-a", None, (req,)),), None, pull=True,
                    sources=(("other-host", _addr(server)),))
    pulled = PulledPayloads(task, {})
    for k in range(4):
        assert pulled.get(refs[k].path) == f"batch {k}".encode() * (k + 1)
    assert (pulled.fetched, pulled.clients.opened) == (4, 1)
    assert pulled.get(refs[4].path) is None
    assert pulled.get(refs[0].path) == b"batch 0"
    assert (pulled.fetched, pulled.clients.opened) == (5, 2)
    pulled.close()
    assert not pulled.clients._clients


def test_a_client_without_the_secret_is_served_nothing(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    roots, ts_b = replicas
    with pytest.raises(InvalidArgumentError, match="secret"):
        list(tserver_client.scan_remote(_addr(server), b"w" * 32,
                                        ScanRequest(ts_b, "t", None, root=roots["ts-b"])))
    assert tserver_client.ping(_addr(server), SECRET)["served"] == 0


def test_ping_reports_the_servers_memory_and_the_open_replicas_against_the_budget(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    """The fixture's rounds ran in this process (DirectTransport): its cache holds the three
    replicas, each with its 300 rows in a MemRowSet."""
    mem = tserver_client.ping(_addr(server), SECRET)["memory"]
    assert mem["open_replicas"] == 3, mem
    assert mem["memrowset_bytes"] > 0, mem
    assert mem["budget_bytes"] == replica_cache.cache_budget_bytes()
    assert 0 < mem["rss_bytes"] <= mem["peak_rss_bytes"], mem
    assert 0 <= mem["arrow_bytes"] <= mem["arrow_peak_bytes"], mem
    replica_cache.clear_cache()
    after = tserver_client.ping(_addr(server), SECRET)["memory"]
    assert (after["open_replicas"], after["memrowset_bytes"], after["index_bytes"]) == (0, 0, 0)


def test_a_table_deletion_through_the_server_deletes_the_replica_and_closes_it(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    """What ``KuduContext.delete_table`` does from the driver: the server deletes the files
    and drops the open replica (a pinned task would have left it open in the server)."""
    roots, ts_b = replicas
    tdir = Path(roots["ts-b"], "tablets", "t")
    assert tserver_client.ping(_addr(server), SECRET)["memory"]["open_replicas"] == 3
    assert not delete_via_server(_addr(server), SECRET, "not-this-server", roots["ts-b"], ["t"])
    assert not delete_via_server(_addr(server), b"w" * 32, ts_b, roots["ts-b"], ["t"])
    assert tdir.exists()
    assert delete_via_server(_addr(server), SECRET, ts_b, roots["ts-b"], ["t"])
    assert not tdir.exists()
    assert tserver_client.ping(_addr(server), SECRET)["memory"]["open_replicas"] == 2


def test_neither_the_secret_nor_a_reusable_token_crosses_the_wire(
        replicas: tuple[dict[str, str], str], server: Any) -> None:
    """What an observer of the loopback connection sees: the scan's rows (the data is not
    encrypted: TLS would be the way), never the secret in any encoding."""
    roots, ts_b = replicas
    proxy = CapturingProxy(server.port)
    try:
        req = ScanRequest(ts_b, "t", None, root=roots["ts-b"])
        for _ in range(2):
            rows = sum(b.num_rows for b in tserver_client.scan_remote(
                f"127.0.0.1:{proxy.port}", SECRET, req))
            assert rows == 300
    finally:
        proxy.close()
    wire = proxy.captured()
    assert b"v123" in wire, "the capture must have seen the scan's rows"
    for form in (SECRET, SECRET.hex().encode(), base64.b64encode(SECRET)):
        assert form not in wire


def test_an_unreachable_server_is_a_network_error() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(NetworkError):
        list(tserver_client.scan_remote(f"127.0.0.1:{port}", SECRET,
                                        ScanRequest("ts", "t", None)))


def test_no_server_listens_without_a_credential() -> None:
    with pytest.raises(InvalidArgumentError, match="PYSPARK_KUDU_SECRET"):
        _make_server("127.0.0.1", b"")


_DAEMON = textwrap.dedent("""
    import os, sys, time
    from pyspark_kudu.spark.host.tablet_server import start_resident
    address = start_resident()
    print(address, os.environ.get("PYSPARK_KUDU_TSERVER_ADDRESS"),
          os.environ.get("PYSPARK_KUDU_TSERVER_STREAM_ADDRESS"), flush=True)
    sys.stdin.read()  # like pyspark's daemon: lives until the executor closes stdin
""")


def _start_daemon(env: dict[str, str]) -> tuple[subprocess.Popen[str], list[str]]:
    proc = subprocess.Popen([sys.executable, "-c", _DAEMON], env=env, cwd=REPO, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    return proc, proc.stdout.readline().split()


def _alive(address: str) -> bool:
    try:
        tserver_client.ping(address, SECRET, timeout_s=2.0)
        return True
    except NetworkError:
        return False


@pytest.mark.parametrize("how", ["stdin closed", "SIGKILL"])
def test_the_resident_server_lives_exactly_as_long_as_its_daemon(how: str) -> None:
    env = dict(os.environ, PYSPARK_KUDU_SECRET=SECRET.decode(), SPARK_LOCAL_IP="127.0.0.1")
    proc, (address, exported, streams) = _start_daemon(env)
    try:
        assert address == exported, "workers forked by the daemon must see the address"
        pong = tserver_client.ping(address, SECRET)
        assert pong["address"] == address
        assert streams == pong["stream_address"] != "", \
            "workers must see the server's file stream address too"
        if how == "SIGKILL":
            proc.send_signal(signal.SIGKILL)
        else:
            assert proc.stdin is not None
            proc.stdin.close()
        proc.wait(timeout=30)
        wait_until(lambda: not _alive(address), 30, f"the server at {address} going away")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_without_a_credential_the_daemon_starts_no_server() -> None:
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_KUDU_SECRET"}
    proc, words = _start_daemon(env)
    try:
        assert words == ["None", "None", "None"]
    finally:
        proc.kill()
        proc.wait(timeout=30)


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True,
                         text=True, check=False).stdout
    return [int(p) for p in out.split()]


def test_a_second_daemon_of_the_application_uses_the_hosts_server_and_starts_none(
        tmp_path: Path) -> None:
    """An executor runs one Python daemon per worker environment (SQL tasks add
    ``SPARK_SIMPLIFIED_TRACEBACK``): it must still have one server, or two would run
    maintenance on the same replicas. (The daemons here are children of one process, as
    an executor's are.) Another application (another credential) keeps its own; once the
    server is gone, the next daemon starts a new one."""
    env = dict(os.environ, PYSPARK_KUDU_SECRET=SECRET.decode(), SPARK_LOCAL_IP="127.0.0.1",
               PYSPARK_KUDU_DATA_ROOT=str(tmp_path / "root"))
    other_secret = "o" * 32
    procs: list[subprocess.Popen[str]] = []
    try:
        first, (address, _, streams) = _start_daemon(env)
        procs.append(first)
        second, (address2, exported2, streams2) = _start_daemon(
            dict(env, SPARK_SIMPLIFIED_TRACEBACK="1"))
        procs.append(second)
        other, (address3, _, _) = _start_daemon(dict(env, PYSPARK_KUDU_SECRET=other_secret))
        procs.append(other)
        assert address2 == exported2 == address and streams2 == streams, \
            "the second daemon's workers must see the first daemon's server"
        assert _children(second.pid) == [], "the second daemon must not start a server"
        assert len(_children(first.pid)) == 1 and len(_children(other.pid)) == 1
        assert address3 != address, "another application has its own server"
        assert tserver_client.ping(address3, other_secret.encode())["address"] == address3

        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
        wait_until(lambda: not _alive(address), 30, f"the server at {address} going away")
        third, (address4, _, _) = _start_daemon(env)
        procs.append(third)
        assert len(_children(third.pid)) == 1, "with the server gone, a new one starts"
        assert tserver_client.ping(address4, SECRET)["address"] == address4 != "None"
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
