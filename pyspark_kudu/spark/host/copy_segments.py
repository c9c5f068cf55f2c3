"""One segment of a served tablet copy's file, fetched into place on the target host.

Part of :mod:`~pyspark_kudu.spark.host.copy_fetch` (step 2, the target's side): a segment
(``SEGMENT_BYTES`` of a file, :mod:`~pyspark_kudu.tablet.checksums`) comes over the source
server's raw file stream (:func:`~pyspark_kudu.spark.host.file_stream.fetch_range`:
``sendfile`` at the source), or over Flight ``DoGet`` where the source has none (TLS); its
chunks are written in place (:class:`SegmentWriter`: ``O_DIRECT`` where aligned), paced by
the process-wide rate cap, and its size and CRC32C checked against the manifest.

Thread-safety: :func:`fetch_segment` may run on many threads at once (one per stream); the
rate cap is process-wide and thread-safe; a :class:`SegmentWriter` belongs to one stream.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import google_crc32c

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.spark.host.file_stream import BUFFER_ALIGN, fetch_range
from pyspark_kudu.spark.host.tserver_protocol import FileRequest

__all__ = ["STALL_S", "SegmentWriter", "fetch_segment", "open_direct", "segment_timeout"]

# A stream slower than this (plus a minute) is considered hung: the round must end.
_MIN_STREAM_BYTES_PER_S = 5e6
STALL_S = 60.0  # a file stream that moved no byte for this long is hung


def segment_timeout(length: int, rate: float) -> float:
    """How long a segment's stream may take before it counts as hung."""
    return STALL_S + length / (rate if 0 < rate < _MIN_STREAM_BYTES_PER_S
                               else _MIN_STREAM_BYTES_PER_S)


def _fetch_flight(address: str, req: FileRequest, secret: bytes, rate: float,
                  put: Callable[[Any], bool]) -> None:
    """A segment over Flight (a source without a file stream server, e.g. with TLS)."""
    from pyspark_kudu.spark.host.tserver_client import fetch_file_buffers

    stream = fetch_file_buffers(address, secret, req,
                                timeout_s=segment_timeout(req.length or 0, rate))
    try:
        for buf in stream:
            if not put(buf):
                break
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()  # ends the stream (and its connection) now, not at collection


class _RateCap:
    """Paces the bytes fetched by every stream of this process to ``bytes_per_s``.
    Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0

    def take(self, n: int, bytes_per_s: float) -> None:
        if bytes_per_s <= 0:
            return
        with self._lock:
            now = time.monotonic()
            self._next = max(self._next, now) + n / bytes_per_s
            wait = self._next - now - 0.05  # up to 50 ms of burst
        if wait > 0:
            time.sleep(wait)  # pacing a stream, not waiting for a condition


_CAP = _RateCap()


def open_direct(path: str) -> int:
    """``path`` opened for writing with ``O_DIRECT``, or -1 where that is not possible (no
    such flag on this platform, a file system without direct I/O such as tmpfs)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return -1
    try:
        return os.open(path, os.O_WRONLY | flag)
    except OSError:
        return -1


class SegmentWriter:
    """Writes a segment's chunks in place, bypassing the page cache where it can.

    The copy's bytes are written once and read by nobody soon, so aligned chunks (the
    stream's page-aligned buffer at a page-aligned file offset: every chunk of a raw file
    stream but a file's last) go through a second descriptor opened with ``O_DIRECT``, the
    rest through the page cache; the file is fsynced when complete either way. On the
    test VM, buffered writes of new data ran at 350 MB/s (every page cache page a fresh
    guest page to fault in) while ``O_DIRECT`` wrote the same bytes at 1.6-2.0 GB/s; a
    200 MB served copy fetched through the page cache spent almost all of its 0.5-0.7 s in
    its 4 MiB ``pwrite`` calls. A direct write the file system refuses (``EINVAL``: an
    alignment it does not accept) is done through the page cache, and so is everything
    after it.

    Thread-safety: one per stream."""

    def __init__(self, fd: int, direct: int) -> None:
        self._fd = fd
        self._direct = direct

    def write(self, buf: Any, at: int) -> None:
        size = buf.size
        aligned = size - size % BUFFER_ALIGN
        if (self._direct >= 0 and aligned and at % BUFFER_ALIGN == 0
                and buf.address % BUFFER_ALIGN == 0):
            try:
                done = os.pwrite(self._direct, buf.slice(0, aligned), at)
            except OSError as e:
                if e.errno != errno.EINVAL:
                    raise
                self._stop_direct()
                done = 0
            _write_all(self._fd, buf.slice(done), at + done)
        else:
            _write_all(self._fd, buf, at)

    def _stop_direct(self) -> None:
        os.close(self._direct)
        self._direct = -1

    def close(self) -> None:
        if self._direct >= 0:
            self._stop_direct()
        os.close(self._fd)


def _write_all(fd: int, buf: Any, at: int) -> None:
    """``buf`` written at ``at`` (``pwrite`` may write less than asked)."""
    view = memoryview(buf)
    done = 0
    while done < len(view):
        done += os.pwrite(fd, view[done:], at + done)


def fetch_segment(req: FileRequest, want_crc: int, path: str, *, stream: str, address: str,
                  secret: bytes, rate: float, what: str) -> None:
    """Fetch the segment ``req`` names (``req.offset``, ``req.length``) from the source's
    file stream server at ``stream`` (Flight at ``address`` if ``stream`` is empty) into
    ``path`` at the same offset, paced by the process's rate cap of ``rate`` bytes/s.

    Raises:
        CorruptionError: the bytes that came are not ``req.length`` bytes with CRC32C
            ``want_crc`` (``what`` names the file in the message).
        KuduError, OSError: the stream failed, or writing failed.
    """
    offset, length = req.offset, req.length or 0
    crc = n = 0
    fd = os.open(path, os.O_WRONLY)
    out = SegmentWriter(fd, open_direct(path))

    def put(buf: Any) -> bool:
        """Write the next chunk in place; False once the stream ran past the segment."""
        nonlocal crc, n
        if n + buf.size > length:
            n += buf.size
            return False
        _CAP.take(buf.size, rate)
        out.write(buf, offset + n)
        crc = google_crc32c.extend(crc, buf)
        n += buf.size
        return True

    try:
        if stream:  # the source's file stream server: sendfile, no gRPC
            fetch_range(stream, secret, req, lambda buf, _at: put(buf),
                        timeout_s=STALL_S, total_s=segment_timeout(length, rate))
        else:
            _fetch_flight(address, req, secret, rate, put)
    finally:
        out.close()
    if n != length or crc != want_crc:
        raise CorruptionError(
            f"{what} fetched from {address} is damaged at bytes {offset}..{offset + length} "
            f"({n} bytes with CRC32C {crc}, expected {length} bytes with CRC32C "
            f"{want_crc}); nothing was installed")
