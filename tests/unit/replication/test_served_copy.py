"""Served tablet copies (spark/host/copy_fetch.py): the copy's files travel from the source
host's resident tablet server to the target, fetched by the target; no shuffle carries them.

A real Flight server serves the source's data root; the rounds run through DirectTransport,
which would deliver staged refs just as a Spark shuffle does, so "no ref in any request" is
"no shuffle carried part bytes".
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pyspark_kudu.errors import IllegalStateError
from pyspark_kudu.rpc.auth import SECRET_ENV
from pyspark_kudu.schema import ColumnSchema, Schema
from pyspark_kudu.spark.host import copy_fetch, copy_segments, tserver_client
from pyspark_kudu.spark.host.copy_fetch import COPY_IN_DIR, COPY_OUT_DIR, TAIL, ServedCopy
from pyspark_kudu.spark.host.dataplane import refs_in
from pyspark_kudu.spark.host.file_stream import BUFFER_ALIGN, STREAM_ADDRESS_ENV
from pyspark_kudu.spark.host.handlers import (
    FAILED_FILE,
    PeerRequest,
    PeerResponse,
    RequestKind,
    handle_requests,
    read_applied,
    replica_storage,
    tablet_dir,
)
from pyspark_kudu.spark.host.identity import ensure_instance
from pyspark_kudu.spark.host.replica_cache import open_replica
from pyspark_kudu.spark.host.tablet_server import _make_server
from pyspark_kudu.spark.host.tabletcopy import COPYING_FILE, served_copy
from pyspark_kudu.spark.host.tserver_protocol import ADDRESS_ENV
from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
from pyspark_kudu.spark.replication.peer_transport import DirectTransport
from pyspark_kudu.spark.replication.tablet_leader import TabletLeader, TabletReplicas
from pyspark_kudu.tablet import OpType, Tablet, encode_write_batch
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE
from pyspark_kudu.wal import SyncPolicy, WalOptions

pytestmark = pytest.mark.unit

SECRET = "s" * 32
OPTS = WalOptions(segment_size=64 << 10, sync_policy=SyncPolicy.FDATASYNC, preallocate=False)
TS = ("ts-a", "ts-b", "ts-c")
SCHEMA = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                ("id",))


def _batch(lo: int, n: int) -> bytes:
    return encode_write_batch(SCHEMA, OpType.UPSERT, pa.table({
        "id": list(range(lo, lo + n)), "v": [f"v{i}" * 20 for i in range(lo, lo + n)]}))


def _rows(root: str) -> list[tuple[int, str]]:
    with replica_storage(root, "t", OPTS) as st:
        t = Tablet.open(root, "t", log=WalCommittedLog(st))
        try:
            return sorted((r["id"], r["v"]) for r in t.scan_table().to_pylist())
        finally:
            t.close()


def _flush(root: str) -> None:
    """Flush the replica's MemRowSet to a rowset file (what maintenance would do), through
    the replica's cached handle as the resident server's maintenance does."""
    io = tablet_dir(root, "t")
    with open_replica(root, io, "t", OPTS, mutate=True) as handle:
        handle.open_tablet(root, "t", read_applied(io)).flush()


class _Recording:
    """DirectTransport that keeps every request it ran."""

    def __init__(self, inner: DirectTransport) -> None:
        self.inner = inner
        self.requests: list[PeerRequest] = []

    def run(self, requests: Mapping[str, Sequence[PeerRequest]]
            ) -> dict[str, list[PeerResponse] | None]:
        for reqs in requests.values():
            self.requests.extend(reqs)
        return self.inner.run(requests)

    def unreachable(self) -> set[str]:
        return self.inner.unreachable()

    def prefetch_copy(self, ts: str, tablet_id: str, manifest: bytes, index: int) -> None:
        self.inner.prefetch_copy(ts, tablet_id, manifest, index)


@pytest.fixture(params=["streams", "flight"])
def server(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A resident tablet server; this process acts as every host's task and knows it. Its
    copies travel over its raw file streams, or over Flight (a server without them: TLS)."""
    srv = _make_server("127.0.0.1", SECRET.encode())
    monkeypatch.setenv(SECRET_ENV, SECRET)
    monkeypatch.setenv(ADDRESS_ENV, f"127.0.0.1:{srv.port}")
    if request.param == "streams":
        assert srv.stream_address.startswith("127.0.0.1:")
        monkeypatch.setenv(STREAM_ADDRESS_ENV, srv.stream_address)
    else:
        monkeypatch.delenv(STREAM_ADDRESS_ENV, raising=False)
    try:
        yield srv
    finally:
        srv.shutdown()


def _setup(tmp_path: Path, rows: int = 600) -> tuple[_Recording, TabletLeader]:
    roots = {ts: str(tmp_path / ts) for ts in (*TS, "ts-d")}
    for r in roots.values():
        ensure_instance(r)
    transport = _Recording(DirectTransport(roots, OPTS))
    tablet = TabletReplicas("t", TS)
    TabletLeader(tablet, "ts-a", transport).create(SCHEMA.to_json())  # type: ignore[arg-type]
    lead = TabletLeader(tablet, "ts-a", transport)  # type: ignore[arg-type]
    lead.elect()
    for k in range(0, rows, 100):
        lead.propose([_batch(k, 100)])
        if k == rows // 2:
            lead.heartbeat()
            _flush(roots["ts-a"])  # half the rows in a rowset file, half in the log tail
    lead.heartbeat()
    return transport, lead


def _stats(srv: Any) -> dict[str, Any]:
    return tserver_client.ping(f"127.0.0.1:{srv.port}", SECRET.encode())


def test_a_new_replica_fetches_its_copy_from_the_sources_server_without_a_shuffle(
        tmp_path: Path, server: Any) -> None:
    transport, lead = _setup(tmp_path)
    before = _stats(server)["file_bytes_served"]
    lead.add_replica("ts-d")
    lead.heartbeat()

    installs = [r for r in transport.requests if r.kind == RequestKind.INSTALL_COPY]
    assert len(installs) == 1, "the whole copy must travel in one install round"
    copy = served_copy(installs[0].entries)
    assert copy is not None and any(f.name != TAIL for f in copy.files), \
        "the install must carry a served copy with the source's rowset files"
    assert copy.stream == os.environ.get(STREAM_ADDRESS_ENV, ""), \
        "the copy must name the source's file stream server, if it has one"
    assert not any(refs_in(r.messages, r.entries) for r in transport.requests), \
        "no request may carry a staged ref (a shuffle would have carried its bytes)"
    assert _stats(server)["file_bytes_served"] - before == copy.total_bytes
    roots = transport.inner.roots
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"]) and len(_rows(roots["ts-a"])) == 600
    # Staged links and fetched files are gone once the install and DROP_COPY ran.
    assert not os.listdir(tablet_dir(roots["ts-a"], "t").local_path(COPY_OUT_DIR))
    assert not tablet_dir(roots["ts-d"], "t").exists(COPY_IN_DIR)


def _copy_out(tmp_path: Path) -> tuple[dict[str, str], PeerResponse]:
    transport, _ = _setup(tmp_path, rows=300)
    roots = transport.inner.roots
    (out,) = handle_requests(roots["ts-a"], [PeerRequest(
        RequestKind.COPY_OUT, "t", "ts-a", copy_id="c1")], host="ts-a", options=OPTS)
    assert out.ok, out.error
    (created,) = handle_requests(roots["ts-d"], [PeerRequest(RequestKind.CREATE, "t", "ts-d")],
                                 host="ts-d", options=OPTS)
    assert created.ok, created.error
    return roots, out


def _install(roots: dict[str, str], out: PeerResponse) -> PeerResponse:
    from pyspark_kudu.consensus.messages import SnapshotMetadata

    assert out.state is not None
    snap = SnapshotMetadata(out.last_index, out.prev_term, out.state.conf_state)
    (resp,) = handle_requests(roots["ts-d"], [PeerRequest(
        RequestKind.INSTALL_COPY, "t", "ts-d", entries=out.entries, lo=0, hi=1, copy_id="c1",
        snapshot=snap)], host="ts-d", options=OPTS)
    return resp


def test_a_copy_out_run_again_with_the_same_id_stages_afresh_and_installs(
        tmp_path: Path, server: Any) -> None:
    """A round carrying COPY_OUT that is retried runs it again with the same copy id: the
    first attempt's links are in the way (a fault run failed with SameFileError there)."""
    roots, first = _copy_out(tmp_path)
    (again,) = handle_requests(roots["ts-a"], [PeerRequest(
        RequestKind.COPY_OUT, "t", "ts-a", copy_id="c1")], host="ts-a", options=OPTS)
    assert again.ok, again.error
    assert served_copy(again.entries) == served_copy(first.entries)
    # A fetch is reused only for the manifest it fetched: one of this id staged again with
    # other contents (more applied meanwhile) is fetched afresh, never installed from it.
    import dataclasses

    copy = served_copy(first.entries)
    assert copy is not None
    io = tablet_dir(roots["ts-d"], "t")
    copy_fetch.prefetch_served(io, copy).join(60)
    assert copy_fetch._fetched_window(io, copy) is not None
    tail = next(f for f in copy.files if f.name == TAIL)
    other = dataclasses.replace(copy, files=tuple(
        dataclasses.replace(f, crcs=(f.crcs[0] ^ 1, *f.crcs[1:])) if f is tail else f
        for f in copy.files))
    assert copy_fetch._fetched_window(io, other) is None
    with pytest.raises(IllegalStateError, match="was not fetched"):
        copy_fetch.fetched_files(io, other)
    resp = _install(roots, again)
    assert resp.ok and resp.installed, resp.error
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"]) and len(_rows(roots["ts-a"])) == 300


@pytest.mark.parametrize("damage", ["flipped", "short"])
def test_a_damaged_or_short_fetched_file_is_refused_and_nothing_is_installed(
        tmp_path: Path, server: Any, damage: str) -> None:
    roots, out = _copy_out(tmp_path)
    copy = served_copy(out.entries)
    assert copy is not None
    f = max(copy.files, key=lambda f: f.size)
    staged = tablet_dir(roots["ts-a"], "t").local_path(copy.source_path(f))
    data = bytearray(Path(staged).read_bytes())
    os.remove(staged)  # a hard link to the source's own file: leave that one intact
    if damage == "flipped":
        data[len(data) // 2] ^= 0xFF
    else:
        del data[len(data) // 2:]
    Path(staged).write_bytes(bytes(data))

    resp = _install(roots, out)
    assert not resp.ok and "CorruptionError" in resp.error and "damaged" in resp.error
    assert f.name in resp.error and "nothing was installed" in resp.error
    target = tablet_dir(roots["ts-d"], "t")
    assert not target.exists(SUPERBLOCK_FILE) or not target.listdir("rowsets")
    assert not target.exists(COPY_IN_DIR, "c1") and not target.exists(COPYING_FILE)
    assert not target.exists(FAILED_FILE), "a damaged transfer is not the target's fault"


def test_a_copy_whose_source_server_is_gone_falls_back_to_the_shuffle(
        tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    transport, lead = _setup(tmp_path)
    roots = transport.inner.roots
    # The source advertises a server that is no longer there (its executor restarted).
    gone = _make_server("127.0.0.1", SECRET.encode())
    port, streams = gone.port, gone.stream_address
    gone.shutdown()
    monkeypatch.setenv(ADDRESS_ENV, f"127.0.0.1:{port}")
    if os.environ.get(STREAM_ADDRESS_ENV):
        monkeypatch.setenv(STREAM_ADDRESS_ENV, streams)

    lead.add_replica("ts-d")
    lead.heartbeat()
    assert lead.copy_by_shuffle and "unreachable" in lead.last_catch_up_error
    installs = [r for r in transport.requests if r.kind == RequestKind.INSTALL_COPY]
    assert served_copy(installs[0].entries) is not None
    assert any(refs_in((), r.entries) for r in installs[1:]), "the retry must use the shuffle"
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"])
    assert ServedCopy.decode(installs[0].entries[0].data) == served_copy(installs[0].entries)


def test_copy_out_and_install_report_when_their_bytes_moved(tmp_path: Path,
                                                            server: Any) -> None:
    """The timings the recovery benchmark reads: the source's staging and the target's
    fetch each say how many bytes they handled and when (wall clock, start <= end)."""
    roots, out = _copy_out(tmp_path)
    copy = served_copy(out.entries)
    assert copy is not None
    nbytes, started, ended, flush_s = out.copy_timing
    assert nbytes == copy.total_bytes and started <= ended, out.copy_timing
    assert 0 <= flush_s <= ended - started, "the MemRowSet's flush is part of the staging"
    resp = _install(roots, out)
    assert resp.ok and resp.installed, resp.error
    fetched, f_started, f_ended = resp.copy_timing
    assert fetched == copy.total_bytes, "the install must report the bytes it fetched"
    assert ended <= f_started <= f_ended, "the fetch runs after the staging, and takes time"
    files = [f for f in copy.files if f.name != TAIL]
    assert files and all(f.size > 0 for f in files)


def test_each_fetched_file_is_synced_once_when_its_last_segment_is_in(
        tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are synced by the stream that lands their last segment (so syncs overlap the
    other transfers), each exactly once, and never before all of its bytes are in."""
    import google_crc32c

    from pyspark_kudu.spark.host import copy_fetch
    from pyspark_kudu.tablet import checksums

    monkeypatch.setattr(checksums, "SEGMENT_BYTES", 1024)  # several segments per file
    monkeypatch.setenv(copy_fetch.STREAMS_ENV, "3")
    roots, out = _copy_out(tmp_path)
    copy = served_copy(out.entries)
    assert copy is not None and any(len(f.crcs) > 2 for f in copy.files), \
        "the test needs files of several segments"
    want = {f.name: f.crcs for f in copy.files}
    synced: list[tuple[str, bool]] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if f"{os.sep}{COPY_IN_DIR}{os.sep}" in path:
            name = TAIL if os.path.basename(path) == TAIL else path.split(
                f"{os.sep}files{os.sep}", 1)[1]
            with open(path, "rb") as f:
                data = f.read()
            crcs = tuple(google_crc32c.value(data[k:k + 1024])
                         for k in range(0, len(data), 1024))
            synced.append((name, crcs == want[name]))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    resp = _install(roots, out)
    assert resp.ok and resp.installed, resp.error
    names = [n for n, _ in synced]
    assert sorted(names) == sorted(want), f"each file synced once: {names}"
    assert all(whole for _, whole in synced), f"a file was synced before all its bytes: {synced}"


def _aligned(data: bytes) -> pa.Buffer:
    """``data`` in a buffer starting on a page, as a raw file stream hands chunks over."""
    raw = pa.allocate_buffer(len(data) + BUFFER_ALIGN)
    pad = (-raw.address) % BUFFER_ALIGN
    view = memoryview(raw).cast("B")[pad:pad + len(data)]
    view[:] = data
    return pa.py_buffer(view)


def _flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


def test_fetched_chunks_bypass_the_page_cache_where_aligned_and_land_byte_exact(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment's aligned chunks go through an O_DIRECT descriptor, the unaligned rest
    (a file's last chunk's tail, a chunk at an unaligned offset) through the page cache;
    the file holds exactly the bytes sent."""
    path = tmp_path / "f"
    direct = copy_segments.open_direct(str(path.touch() or path))
    if direct < 0:
        pytest.skip(f"the file system of {tmp_path} refuses O_DIRECT here; the fallback "
                    f"is tested by the EINVAL test below")
    assert _flags(direct) & os.O_DIRECT
    writes: list[tuple[bool, int, int]] = []
    real = os.pwrite

    def recording(fd: int, data: Any, at: int) -> int:
        writes.append((bool(_flags(fd) & os.O_DIRECT), at, len(memoryview(data))))
        return real(fd, data, at)

    monkeypatch.setattr(os, "pwrite", recording)
    chunk, tail = os.urandom(4 * BUFFER_ALIGN), os.urandom(BUFFER_ALIGN + 123)
    out = copy_segments.SegmentWriter(os.open(path, os.O_WRONLY), direct)
    out.write(_aligned(chunk), 0)
    out.write(_aligned(tail), len(chunk))
    out.write(_aligned(b"xyz"), len(chunk) + len(tail))  # an unaligned offset
    out.close()
    assert path.read_bytes() == chunk + tail + b"xyz"
    assert writes == [(True, 0, len(chunk)), (True, len(chunk), BUFFER_ALIGN),
                      (False, len(chunk) + BUFFER_ALIGN, 123),
                      (False, len(chunk) + len(tail), 3)]


def test_a_direct_write_the_file_system_refuses_goes_through_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "f"
    path.touch()
    direct = os.open(path, os.O_WRONLY)  # stands in for the O_DIRECT descriptor
    real = os.pwrite
    refused: list[int] = []

    def refusing(fd: int, data: Any, at: int) -> int:
        if fd == direct:
            refused.append(at)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, at)

    monkeypatch.setattr(os, "pwrite", refusing)
    a, b = os.urandom(2 * BUFFER_ALIGN), os.urandom(2 * BUFFER_ALIGN)
    out = copy_segments.SegmentWriter(os.open(path, os.O_WRONLY), direct)
    out.write(_aligned(a), 0)
    out.write(_aligned(b), len(a))  # no second try: direct writes stopped after the refusal
    out.close()
    assert path.read_bytes() == a + b
    assert refused == [0]


def test_a_raw_file_stream_hands_over_page_aligned_chunks(tmp_path: Path) -> None:
    """What lets the target write them with O_DIRECT: every chunk starts on a page, and
    every one but the last is the full receive buffer (so offsets stay aligned)."""
    from pyspark_kudu.spark.host import file_stream
    from pyspark_kudu.spark.host.tserver_protocol import FileRequest

    data = os.urandom(2 * file_stream._RECV_BYTES + 5000)
    (tmp_path / "f").write_bytes(data)
    srv = file_stream.FileStreamServer("127.0.0.1", SECRET.encode(),
                                       lambda req: str(tmp_path / req.path))
    got: list[tuple[int, int, int]] = []
    parts: list[bytes] = []

    def write(buf: pa.Buffer, at: int) -> None:
        got.append((buf.address % BUFFER_ALIGN, at, buf.size))
        parts.append(buf.to_pybytes())

    try:
        n = file_stream.fetch_range(srv.address, SECRET.encode(),
                                    FileRequest("ts", "t", "f"), write)
    finally:
        srv.shutdown()
    assert n == len(data) and b"".join(parts) == data
    step = file_stream._RECV_BYTES
    assert got == [(0, 0, step), (0, step, step), (0, 2 * step, 5000)]


def test_a_prefetched_copy_is_installed_without_being_fetched_again(
        tmp_path: Path, server: Any) -> None:
    """The leader asks the new replica's host to fetch the copy as soon as COPY_OUT has
    answered; the install round then finds it fetched: the source served its bytes once,
    and the install's fetch window is the prefetch's."""
    transport, lead = _setup(tmp_path)
    transport.inner.prefetch = True
    before = _stats(server)["file_bytes_served"]
    lead.add_replica("ts-d")
    lead.heartbeat()
    (install,) = [r for r in transport.requests if r.kind == RequestKind.INSTALL_COPY]
    copy = served_copy(install.entries)
    assert copy is not None
    assert transport.inner.prefetched == [("ts-d", "t", copy_index(install))]
    assert _stats(server)["file_bytes_served"] - before == copy.total_bytes, \
        "the install must reuse the prefetched files, not fetch them again"
    roots = transport.inner.roots
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"]) and len(_rows(roots["ts-a"])) == 600
    assert not tablet_dir(roots["ts-d"], "t").exists(COPY_IN_DIR)


def test_a_prefetch_holds_the_servers_applier_back_while_it_fetches(
        tmp_path: Path, server: Any) -> None:
    """The resident server's ``busy`` (its background applier's ``foreground``) is held
    around the fetch: no file of the copy is in before it is entered, all are when it is
    left, and a real applier counts the fetch as foreground work meanwhile."""
    import contextlib

    from pyspark_kudu.spark.host.background_apply import BackgroundApplier

    roots, out = _copy_out(tmp_path)
    copy = served_copy(out.entries)
    assert copy is not None
    io = tablet_dir(roots["ts-d"], "t")
    applier = BackgroundApplier(start=False)
    seen: list[tuple[str, bool, int]] = []

    def fetched() -> bool:
        return copy_fetch._fetched_window(io, copy) is not None

    @contextlib.contextmanager
    def busy() -> Iterator[None]:
        with applier.foreground():
            seen.append(("enter", fetched(), applier._foreground))
            yield
            seen.append(("leave", fetched(), applier._foreground))

    copy_fetch.prefetch_served(io, copy, busy=busy).join(60)
    assert seen == [("enter", False, 1), ("leave", True, 1)], seen
    assert applier._foreground == 0
    resp = _install(roots, out)
    assert resp.ok and resp.installed, resp.error
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"])


def copy_index(install: PeerRequest) -> int:
    assert install.snapshot is not None
    return install.snapshot.index


def test_an_install_waits_for_a_prefetch_in_flight_and_uses_its_files(
        tmp_path: Path, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-copy lock: an install that arrives while the prefetch still fetches waits for
    it, then installs its files; the bytes travel once."""
    import threading

    roots, out = _copy_out(tmp_path)
    copy = served_copy(out.entries)
    assert copy is not None
    release = threading.Event()
    entered = threading.Event()
    real = copy_fetch._fetch_segment

    def slow(*args: Any) -> None:
        entered.set()
        assert release.wait(60), "the test never released the prefetch"
        real(*args)

    monkeypatch.setattr(copy_fetch, "_fetch_segment", slow)
    before = _stats(server)["file_bytes_served"]
    prefetch = copy_fetch.prefetch_served(tablet_dir(roots["ts-d"], "t"), copy)
    assert entered.wait(60), "the prefetch never started fetching"
    done: list[PeerResponse] = []
    install = threading.Thread(target=lambda: done.append(_install(roots, out)))
    install.start()
    install.join(0.5)
    assert install.is_alive() and not done, "the install must wait for the prefetch's lock"
    release.set()
    prefetch.join(60)
    install.join(60)
    assert done and done[0].ok and done[0].installed, done
    assert _stats(server)["file_bytes_served"] - before == copy.total_bytes
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"])


def test_a_resident_server_prefetches_a_copy_when_asked_and_not_once_installed(
        tmp_path: Path, server: Any) -> None:
    """The ``prefetch_copy`` action: the server starts the fetch and answers at once; the
    install then reuses it. Asked again once the copy is installed, it does nothing."""
    from tests.waiting import wait_until

    roots, out = _copy_out(tmp_path)
    copy = served_copy(out.entries)
    assert copy is not None
    address, secret = f"127.0.0.1:{server.port}", SECRET.encode()
    ts_d = ensure_instance(roots["ts-d"]).uuid
    before = _stats(server)["file_bytes_served"]
    assert tserver_client.prefetch_copy(address, secret, ts_d, roots["ts-d"],
                                        out.entries[0].data, out.last_index)
    io = tablet_dir(roots["ts-d"], "t")
    wait_until(lambda: io.exists(COPY_IN_DIR, copy.copy_id, "fetched"), 60,
               "the prefetched copy's fetched marker")
    resp = _install(roots, out)
    assert resp.ok and resp.installed, resp.error
    assert _stats(server)["file_bytes_served"] - before == copy.total_bytes
    assert not tserver_client.prefetch_copy(address, secret, ts_d, roots["ts-d"],
                                            out.entries[0].data, out.last_index)
    assert _rows(roots["ts-d"]) == _rows(roots["ts-a"])
