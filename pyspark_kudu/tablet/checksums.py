"""Segment checksums of a tablet's immutable files, computed as they are written.

A tablet copy sends each file in segments of :data:`SEGMENT_BYTES` with the CRC32C of every
segment (:mod:`~pyspark_kudu.spark.host.copy_fetch`), and the target checks them. Reading a
gigabyte back at the source to checksum it when a copy starts cost a tenth of the copy's
time; Kudu instead checksums its blocks as it writes them. So do we: a rowset, delta or
bloom file's writer feeds its bytes through :class:`SegmentCrcs` and :func:`remember` keeps
the result in this process, keyed by the file's identity on disk (device, inode, size,
modification time: the files never change once written, and a hard link or a rename keeps
the key). :func:`segment_crcs` answers from there, and computes (through a memory map) only
for a file this process did not write or has forgotten -- e.g. after the tablet server
restarted. The memo is bounded (:data:`MAX_FILES` files, least recently used dropped).
A wrong answer (a deleted file's inode reused by one of the same size within one tick of the
file system's clock) cannot install wrong bytes: the target checks every segment and
refuses the copy as damaged.

Thread-safety: :func:`remember`, :func:`known` and :func:`segment_crcs` may be called from
any thread; a :class:`SegmentCrcs` belongs to one writer.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections import OrderedDict
from typing import IO, Any

import google_crc32c

__all__ = ["MAX_FILES", "SEGMENT_BYTES", "ChecksummedFile", "SegmentCrcs", "known", "remember",
           "segment_crcs"]

#: A file is copied in segments of this size, each with its own CRC32C (the last shorter).
SEGMENT_BYTES = 32 << 20
#: How many files' checksums a process keeps (a few hundred bytes each at most).
MAX_FILES = 65536
_CRC_STEP = 4 << 20  # bytes checksummed per slice of a mapped file

_Key = tuple[int, int, int, int, int]
_memo: OrderedDict[_Key, tuple[int, ...]] = OrderedDict()
_lock = threading.Lock()


class SegmentCrcs:
    """The CRC32C of each ``SEGMENT_BYTES`` segment of a byte stream fed in order."""

    def __init__(self) -> None:
        self._done: list[int] = []
        self._crc = 0
        self._fill = 0  # bytes in the current segment

    def update(self, data: bytes) -> None:
        at = 0
        while at < len(data):
            take = min(len(data) - at, SEGMENT_BYTES - self._fill)
            part = data if take == len(data) else data[at:at + take]
            self._crc = google_crc32c.extend(self._crc, part)
            self._fill += take
            at += take
            if self._fill == SEGMENT_BYTES:
                self._done.append(self._crc)
                self._crc, self._fill = 0, 0

    def value(self) -> tuple[int, ...]:
        """Every segment's CRC so far (an empty stream has none)."""
        return (*self._done, self._crc) if self._fill else tuple(self._done)


class ChecksummedFile:
    """A binary file being written whose bytes also go through :class:`SegmentCrcs` (for a
    writer that takes a file object, e.g. ``pyarrow.parquet.ParquetWriter``); everything
    but ``write`` is the wrapped file's."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.crcs = SegmentCrcs()

    def write(self, data: bytes) -> int:
        self.crcs.update(data)
        return self.raw.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


def _key(path: str) -> _Key:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, SEGMENT_BYTES


def remember(path: str, crcs: tuple[int, ...]) -> None:
    """Record the segment CRCs of the finished file at ``path`` (its bytes on disk now)."""
    key = _key(path)
    with _lock:
        _memo[key] = crcs
        _memo.move_to_end(key)
        while len(_memo) > MAX_FILES:
            _memo.popitem(last=False)


def known(path: str) -> tuple[int, ...] | None:
    """The remembered segment CRCs of the file at ``path``, if it is unchanged since."""
    key = _key(path)
    with _lock:
        got = _memo.get(key)
        if got is not None:
            _memo.move_to_end(key)
        return got


def segment_crcs(path: str) -> tuple[int, ...]:
    """The segment CRCs of the file at ``path``: remembered, or read and computed."""
    got = known(path)
    if got is not None:
        return got
    out = []
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return ()
        # Slices of a memory map: no 32 MiB allocation and copy per segment.
        with mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ) as m:
            for start in range(0, size, SEGMENT_BYTES):
                end = min(start + SEGMENT_BYTES, size)
                crc = 0
                for at in range(start, end, _CRC_STEP):
                    crc = google_crc32c.extend(crc, m[at:min(at + _CRC_STEP, end)])
                out.append(crc)
    crcs = tuple(out)
    remember(path, crcs)
    return crcs
