"""Raw file streams between tablet servers (spark/host/file_stream.py): a real server on
loopback serves file ranges to clients that prove they know the cluster's secret, and only
to them; a client refuses a server that does not know it."""

from __future__ import annotations

import errno
import hashlib
import hmac
import os
import socket
import struct
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_kudu.errors import CredentialError, NetworkError, NotFoundError, TimedOutError
from pyspark_kudu.spark.host.file_stream import FileStreamServer, fetch_range
from pyspark_kudu.spark.host.tserver_protocol import FileRequest

pytestmark = pytest.mark.unit

SECRET = b"k" * 32


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[FileStreamServer, bytes, list[int]]]:
    data = os.urandom(9 << 20) + b"tail"  # more than two of the client's 4 MiB buffers
    (tmp_path / "f").write_bytes(data)
    sent: list[int] = []

    def path_of(req: FileRequest) -> str:
        path = tmp_path / req.path
        if not path.is_file():
            raise NotFoundError(f"no file {req.path!r}")
        return str(path)

    srv = FileStreamServer("127.0.0.1", SECRET, path_of, sent.append)
    try:
        yield srv, data, sent
    finally:
        srv.shutdown()


def _req(path: str = "f", offset: int = 0, length: int | None = None) -> FileRequest:
    return FileRequest("ts", "t", path, offset, length)


def _fetch(address: str, req: FileRequest, secret: bytes = SECRET) -> bytes:
    out = bytearray()

    def write(buf: pa.Buffer, at: int) -> None:
        assert at == len(out), "chunks arrive in order, each at its offset"
        out.extend(buf.to_pybytes())

    n = fetch_range(address, secret, req, write)
    assert n == len(out)
    return bytes(out)


def test_ranges_arrive_whole_and_in_order(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    srv, data, sent = served
    assert srv.address.startswith("127.0.0.1:")
    assert _fetch(srv.address, _req()) == data
    assert _fetch(srv.address, _req(offset=5, length=(4 << 20) + 7)) == data[5:(4 << 20) + 12]
    assert _fetch(srv.address, _req(offset=len(data) - 3, length=100)) == data[-3:], \
        "a range past the end of the file ends with the file"
    assert _fetch(srv.address, _req(offset=len(data) + 10, length=5)) == b""
    assert sum(sent) == len(data) + (4 << 20) + 7 + 3, "every byte sent is counted once"


def test_a_client_without_the_secret_gets_nothing(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    srv, _, sent = served
    # Its check of the server's proof fails first: the two hold different secrets.
    with pytest.raises(CredentialError, match="different secrets"):
        _fetch(srv.address, _req(), secret=b"x" * 32)
    assert sent == []


def test_a_server_without_the_secret_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"secret data")
    impostor = FileStreamServer("127.0.0.1", b"y" * 32, lambda req: str(tmp_path / "f"))
    try:
        with pytest.raises(CredentialError, match="did not prove it knows"):
            _fetch(impostor.address, _req())
    finally:
        impostor.shutdown()


def test_the_proof_binds_the_request(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    """A client's proof covers its request: the same proof with another request (a replay
    or an alteration on the wire) gets the connection closed, and no byte."""
    srv, _, sent = served
    host, port = srv.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        nc = os.urandom(32)
        s.sendall(b"KFS1" + nc)
        answer = b""
        while len(answer) < 64:
            answer += s.recv(64 - len(answer))
        ns = answer[:32]
        proved = _req(length=10).to_ticket()
        sent_req = _req().to_ticket()  # the whole file instead
        proof = hmac.new(SECRET, b"kudu-stream-client" + nc + ns + proved,
                         hashlib.sha256).digest()
        s.sendall(struct.pack("!I", len(sent_req)) + sent_req + proof)
        assert s.recv(1) == b"", "the server must close without answering"
    assert sent == []


def test_a_missing_file_is_refused_with_its_reason(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    srv, _, _ = served
    with pytest.raises(NotFoundError, match="no file 'gone'"):
        _fetch(srv.address, _req("gone"))


def test_the_callers_own_failure_is_not_a_network_failure(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    srv, _, _ = served

    def full_disk(buf: pa.Buffer, at: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as info:
        fetch_range(srv.address, SECRET, _req(), full_disk)
    assert info.value.errno == errno.ENOSPC and not isinstance(info.value, NetworkError)


def test_an_unreachable_server_is_a_network_error(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    srv, _, _ = served
    address = srv.address
    srv.shutdown()
    with pytest.raises(NetworkError, match="unreachable"):
        _fetch(address, _req())


def test_a_range_past_its_deadline_times_out(
        served: tuple[FileStreamServer, bytes, list[int]]) -> None:
    srv, _, _ = served
    with pytest.raises(TimedOutError, match="took longer than"):
        fetch_range(srv.address, SECRET, _req(), lambda buf, at: None, total_s=0.0)
