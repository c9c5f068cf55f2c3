"""Raw file streams between resident tablet servers: a tablet copy's bytes at disk speed.

A tablet copy (:mod:`~pyspark_kudu.spark.host.copy_fetch`) moves hundreds of megabytes from
the source host's server to the target. Over Arrow Flight every byte also crosses gRPC's
framing and buffers: on the 2-core test machine one stream moved 120-280 MB/s and three at
once 310-540 MB/s, against 470-550 MB/s and 1.1-1.6 GB/s here (a probe of 67 MB per stream
between two processes, unsynced). Here the source's server hands the file range to the kernel
(``sendfile``: page cache to socket, no byte through Python) and the target receives it into
one reused buffer that it writes in place.

Each server listens on a second port of the Flight server's host (``STREAM_ADDRESS_ENV``
tells the processes that stage copies, as ``PYSPARK_KUDU_TSERVER_ADDRESS`` tells them the
Flight one). With TLS configured there is none: file streams then travel over Flight, inside
TLS. One connection carries one file range; K is the cluster's secret, H HMAC-SHA256, ``|``
concatenation:

1. client -> server: ``b"KFS1"`` | Nc (32 random bytes);
2. server -> client: Ns (32 random bytes) | H(K, ``b"kudu-stream-server"`` | Nc | Ns); the
   client refuses a server that does not know K (mutual authentication, as in
   :mod:`pyspark_kudu.rpc.auth`);
3. client -> server: the request's length (u32) | the request (a
   :class:`~pyspark_kudu.spark.host.tserver_protocol.FileRequest` ticket) |
   H(K, ``b"kudu-stream-client"`` | Nc | Ns | request): the proof binds the request, so a
   recorded one cannot be replayed (Ns is new on every connection) nor altered;
4. server -> client: ``0`` (u8) | the range's length (u64) and then exactly that many bytes;
   or ``1`` | the length of an error text (u32) | the text (``"NotFoundError: ..."``), for
   a request the server refuses.

Integers are big-endian. The bytes are not encrypted, as Flight's without TLS; the copy's
manifest (replicated through Raft) carries every segment's CRC32C, which the target checks.

Thread-safety: the server accepts on its own thread and serves each connection on another,
at most ``_MAX_CONNECTIONS`` at a time; :func:`fetch_range` may run on any thread.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import BinaryIO

import pyarrow as pa

from pyspark_kudu.errors import (
    CorruptionError,
    CredentialError,
    KuduError,
    NetworkError,
    NotFoundError,
    TimedOutError,
)
from pyspark_kudu.spark.host.tserver_protocol import FileRequest, parse_ticket

__all__ = ["BUFFER_ALIGN", "STREAM_ADDRESS_ENV", "FileStreamServer", "fetch_range"]

#: The ``host:port`` of this host's file stream server, exported by the resident tablet
#: server to itself and to the workers the executor's daemon forks.
STREAM_ADDRESS_ENV = "PYSPARK_KUDU_TSERVER_STREAM_ADDRESS"
_MAGIC = b"KFS1"
_NONCE = 32
_MAC = 32
_U32 = struct.Struct("!I")
_U64 = struct.Struct("!Q")
_OK, _REFUSED = 0, 1
_MAX_REQUEST = 64 * 1024
_MAX_CONNECTIONS = 32
_HANDSHAKE_TIMEOUT_S = 10.0
_IO_TIMEOUT_S = 60.0  # no byte moved for this long: the stream is hung
_SEND_BYTES = 8 << 20  # one sendfile call's range
_RECV_BYTES = 4 << 20  # the target's reused receive buffer
#: Alignment of the receive buffer's start: a page, so the target may write its chunks with
#: ``O_DIRECT`` (:mod:`~pyspark_kudu.spark.host.copy_fetch`).
BUFFER_ALIGN = 4096


def _h(key: bytes, *parts: bytes) -> bytes:
    # The same HMAC as :mod:`pyspark_kudu.rpc.auth`'s, written here on purpose: that module
    # imports ``pyarrow.flight``, and this one is loaded by the executor's daemon (through
    # the tablet server), which must never load gRPC before it forks.
    return hmac.new(key, b"".join(parts), hashlib.sha256).digest()


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"the peer closed the stream after {len(out)} of {n} bytes")
        out += chunk
    return bytes(out)


class FileStreamServer:
    """Serves file ranges of this host's replicas on ``host`` (an ephemeral port).

    ``path_of(request)`` is the local path of a request's file (raising
    :class:`~pyspark_kudu.errors.KuduError`, e.g. ``NotFoundError``, to refuse it);
    ``on_bytes(n)`` counts what was sent (the server's ``ping`` statistics)."""

    def __init__(self, host: str, secret: bytes, path_of: Callable[[FileRequest], str],
                 on_bytes: Callable[[int], None] = lambda n: None) -> None:
        self._secret = secret
        self._path_of = path_of
        self._on_bytes = on_bytes
        self._slots = threading.BoundedSemaphore(_MAX_CONNECTIONS)
        self._sock = socket.create_server((host, 0), backlog=64)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="kudu-file-streams",
                                        daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop accepting; streams in progress finish on their own threads."""
        self._stopped.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected: closing below ends accept()
        self._sock.close()
        self._thread.join(timeout=5.0)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed by shutdown()
            self._slots.acquire()
            threading.Thread(target=self._serve, args=(conn,), name="kudu-file-stream",
                             daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(_HANDSHAKE_TIMEOUT_S)
                request = self._handshake(conn)
                if request is None:
                    return
                conn.settimeout(_IO_TIMEOUT_S)
                try:
                    req = parse_ticket(request)
                    if not isinstance(req, FileRequest):
                        raise NotFoundError("a file stream serves file ranges only")
                    f = open(self._path_of(req), "rb")  # closed by the with below
                except (KuduError, OSError) as e:
                    text = f"{type(e).__name__}: {e}".encode()
                    conn.sendall(bytes([_REFUSED]) + _U32.pack(len(text)) + text)
                    return
                with f:
                    self._send_range(conn, f, req)
        except OSError:
            pass  # the client went away: nothing of the server's state depends on it
        finally:
            self._slots.release()

    def _handshake(self, conn: socket.socket) -> bytes | None:
        hello = _recv_exact(conn, len(_MAGIC) + _NONCE)
        if hello[:len(_MAGIC)] != _MAGIC:
            return None
        nc, ns = hello[len(_MAGIC):], secrets.token_bytes(_NONCE)
        conn.sendall(ns + _h(self._secret, b"kudu-stream-server", nc, ns))
        (n,) = _U32.unpack(_recv_exact(conn, _U32.size))
        if n > _MAX_REQUEST:
            return None
        request = _recv_exact(conn, n)
        proof = _recv_exact(conn, _MAC)
        if not hmac.compare_digest(proof, _h(self._secret, b"kudu-stream-client", nc, ns,
                                              request)):
            return None  # not the cluster's: closed without an answer
        return request

    def _send_range(self, conn: socket.socket, f: BinaryIO, req: FileRequest) -> None:
        size = os.fstat(f.fileno()).st_size
        start = min(req.offset, size)
        length = size - start if req.length is None else min(req.length, size - start)
        conn.sendall(bytes([_OK]) + _U64.pack(length))
        sent = 0
        while sent < length:
            # socket.sendfile: os.sendfile (page cache to socket in the kernel), waiting for
            # the socket as its timeout says; in pieces, so the bytes are counted as they go.
            n = conn.sendfile(f, start + sent, min(_SEND_BYTES, length - sent))
            if n == 0:
                break  # the file shrank meanwhile: the client sees a short stream
            sent += n
            self._on_bytes(n)


def fetch_range(address: str, secret: bytes, req: FileRequest,
                write: Callable[[pa.Buffer, int], object], *,
                timeout_s: float = _IO_TIMEOUT_S, total_s: float | None = None) -> int:
    """Fetch ``req``'s range from the file stream server at ``address``; ``write(chunk,
    at)`` gets its bytes in order (``at``: the chunk's offset in the range; the chunk is a
    reused buffer starting on a ``BUFFER_ALIGN`` boundary, valid during the call; every
    chunk but the last is ``_RECV_BYTES`` long). Returns the bytes received: less than asked
    if the file ends first.

    Raises:
        NetworkError: the server is unreachable, or the stream broke.
        TimedOutError: no byte arrived for ``timeout_s``, or the range took longer than
            ``total_s`` (None: no limit).
        CredentialError: the server does not know the cluster's secret.
        NotFoundError: the server refused the request (the reason is in the message).
    """
    deadline = None if total_s is None else time.monotonic() + total_s
    host, _, port = address.rpartition(":")
    what = f"a file stream of {req.path} from tablet server {address}"
    try:
        sock = socket.create_connection((host, int(port)), timeout=_HANDSHAKE_TIMEOUT_S)
    except OSError as e:
        raise NetworkError(f"tablet server {address} is unreachable for {what}: {e}") from e
    try:
        with sock:
            nc = secrets.token_bytes(_NONCE)
            sock.sendall(_MAGIC + nc)
            answer = _recv_exact(sock, _NONCE + _MAC)
            ns, proof = answer[:_NONCE], answer[_NONCE:]
            if not hmac.compare_digest(proof, _h(secret, b"kudu-stream-server", nc, ns)):
                raise CredentialError(
                    f"tablet server {address} did not prove it knows this process's cluster "
                    f"secret during {what} (the two hold different secrets); nothing was "
                    f"fetched")
            request = req.to_ticket()
            sock.sendall(_U32.pack(len(request)) + request +
                         _h(secret, b"kudu-stream-client", nc, ns, request))
            sock.settimeout(timeout_s)
            first = sock.recv(1)
            if not first:
                raise CredentialError(
                    f"tablet server {address} closed {what} without answering: it did not "
                    f"accept this process's credential (or it stopped); nothing was fetched")
            status = first[0]
            if status != _OK:
                (n,) = _U32.unpack(_recv_exact(sock, _U32.size))
                text = _recv_exact(sock, n).decode(errors="replace")
                raise NotFoundError(f"tablet server {address} refused {what}: {text}")
            (length,) = _U64.unpack(_recv_exact(sock, _U64.size))
            got = _receive(sock, length, write, deadline)
            if got < 0:
                raise TimedOutError(f"{what} took longer than {total_s:.0f} s")
            return got
    except _WriteFailed as e:
        raise e.cause from None  # the caller's own failure (e.g. a full disk), unwrapped
    except KuduError:
        raise
    except TimeoutError as e:
        raise TimedOutError(f"{what} timed out: {e}") from e
    except (OSError, ValueError) as e:
        raise NetworkError(f"{what} broke: {e}") from e


class _WriteFailed(Exception):
    """The caller's ``write`` raised: not a network failure."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _receive(sock: socket.socket, length: int, write: Callable[[pa.Buffer, int], object],
             deadline: float | None) -> int:
    """The bytes received (fewer if the stream ended early), or -1 past ``deadline``."""
    size = min(_RECV_BYTES, max(length, 1))
    raw = pa.allocate_buffer(size + BUFFER_ALIGN)
    pad = (-raw.address) % BUFFER_ALIGN
    view = memoryview(raw).cast("B")[pad:pad + size]  # page-aligned (BUFFER_ALIGN), writable
    buf = pa.py_buffer(view)

    def hand_over(n: int, at: int) -> None:
        try:
            write(buf.slice(0, n), at)
        except BaseException as e:
            raise _WriteFailed(e) from e

    got = 0
    while got < length:
        want = min(len(view), length - got)
        filled = 0
        while filled < want:
            n = sock.recv_into(view[filled:want])
            if n == 0:
                if filled:
                    hand_over(filled, got)
                return got + filled  # a short stream: the caller's size check says so
            filled += n
        hand_over(filled, got)
        got += filled
        if deadline is not None and got < length and time.monotonic() > deadline:
            return -1
    if sock.recv(1):
        raise CorruptionError("the server sent more bytes than the range it announced")
    return got
