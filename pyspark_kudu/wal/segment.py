"""One WAL segment file: creating and appending to it, reading it back, recovering it.

Creation. A segment is written as ``<seq>.log.tmp`` (header, fsync, preallocation), then
renamed to ``<seq>.log`` and the directory fsynced: Kudu's "preallocate, then rename into
place" (seed ``kudu-consensus-wal``). A file under its final name therefore always has a
complete, durable header, and a crash during creation leaves only a ``.tmp`` file, which
recovery deletes. Closing a segment truncates the unused preallocated tail and fsyncs.

Recovery rule (torn tail versus corruption). Segments are scanned in sequence order; ``X``
is the offset of the first byte where no valid frame starts (partial frame header, length
out of range or past the end of the file, bad tag, CRC32C mismatch, unknown entry type, or a
``group_start`` after the frame itself).

1. A bad segment header is always :class:`~pyspark_kudu.errors.CorruptionError` (see above).
2. In any segment but the last, ``X`` before the end of the file is ``CorruptionError``
   naming the file and ``X``: a segment is synced and truncated to its last frame, then
   synced again, *before* its successor is created, so it cannot end in a torn write.
3. In the last segment the rest of the file after ``X`` is searched for a valid frame
   (at any byte offset) whose ``group_start`` is greater than ``X``. Such a frame was
   written by a later group, and the sync thread begins a group only after the previous
   group's sync returned; the bytes at ``X`` had therefore been acknowledged as durable and
   their damage is ``CorruptionError`` naming the file and ``X``.
4. Otherwise the damage lies in the final group, whose sync never completed (pages of one
   write can reach the disk in any order, so a later frame of that same group may survive a
   hole). That is a torn write: the file is truncated to ``X`` and fsynced, and the dropped
   range is returned as a :class:`TornTail` (and logged as a warning if it held any
   non-zero byte; an all-zero tail is just the unused preallocation of a segment that was
   not closed cleanly).

This refines Kudu's ``ReadableLogSegment`` rule, which treats a bad entry as a torn tail
only when no valid entry header follows it: counting only frames of a *later group* keeps a
crash in the middle of a multi-page group write from failing the replica. The ambiguity both
rules share: a bit flip inside the final group (one frame, for Kudu) is indistinguishable
from a torn write and is truncated. Under ``SyncPolicy.NONE`` groups are not separated by
syncs, so after a machine crash rule 3 may report corruption that is really lost buffers.

Thread-safety: :class:`SegmentWriter` is not thread-safe (the log's sync thread owns it);
:class:`SegmentReader` is (positional reads only); the scan functions are pure.
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from pyspark_kudu.errors import CorruptionError, DiskFullError, IllegalStateError, IOError_
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal.format import (
    FRAME_HEADER_SIZE,
    FRAME_TAG_BYTE,
    HEADER_SIZE,
    TMP_SUFFIX,
    FrameView,
    check_header,
    encode_header,
    parse_frame,
    segment_name,
)
from pyspark_kudu.wal.wal_options import SyncPolicy, WalOptions

__all__ = [
    "SegmentReader",
    "SegmentScan",
    "SegmentWriter",
    "TornTail",
    "scan_segment",
    "truncate_segment",
    "wrap_os_error",
]

_log = logging.getLogger(__name__)

_NO_PREALLOCATION = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}


def wrap_os_error(e: OSError, what: str) -> IOError_:
    """The project error for an ``OSError`` while doing ``what`` (ENOSPC -> DiskFullError)."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"{what}: no space left on the data root ({e})")
    return IOError_(f"{what}: {e}")


class SegmentWriter:
    """Appends groups of frames to the newest segment. Not thread-safe (sync thread only).

    ``on_sync`` is called after every real fsync/fdatasync (the log counts them for stats).
    """

    def __init__(self, io: FileIO, f: IO[bytes], seq: int, policy: SyncPolicy,
                 on_sync: Callable[[], None]) -> None:
        self._io = io
        self._f = f
        self._seq = seq
        self._policy = policy
        self._on_sync = on_sync
        self._offset = HEADER_SIZE

    @classmethod
    def create(cls, io: FileIO, seq: int, options: WalOptions,
               on_sync: Callable[[], None]) -> SegmentWriter:
        """Create segment ``seq`` durably (tmp + header + fsync + preallocate + rename)."""
        name = segment_name(seq)
        tmp = name + TMP_SUFFIX
        if io.exists(name):
            # The rename below would replace it: a planning bug must not destroy a segment.
            raise IllegalStateError(f"WAL segment {io.path(name)} already exists")
        try:
            f = io.open(tmp, mode="wb")
        except OSError as e:
            raise wrap_os_error(e, f"creating WAL segment {io.path(tmp)}") from e
        try:
            if options.preallocate:
                _preallocate(f, options.segment_size)
            f.write(encode_header(seq))
            durable = options.sync_policy is not SyncPolicy.NONE
            if durable:
                # A full fsync even under FDATASYNC: the new file's size and allocation are
                # metadata, and the rename must never expose a header that is not durable.
                io.fsync(f)
                on_sync()
            else:
                f.flush()
            io.rename(tmp, name)
            if durable:
                io.fsync_dir()
        except OSError as e:
            f.close()
            raise wrap_os_error(e, f"creating WAL segment {io.path(name)}") from e
        return cls(io, f, seq, options.sync_policy, on_sync)

    @property
    def seq(self) -> int:
        return self._seq

    @property
    def offset(self) -> int:
        """Where the next frame goes."""
        return self._offset

    @property
    def path(self) -> str:
        return self._io.path(segment_name(self._seq))

    def write(self, data: bytes) -> None:
        try:
            self._f.write(data)
        except OSError as e:
            raise wrap_os_error(e, f"writing WAL segment {self.path}") from e
        self._offset += len(data)

    def sync(self) -> None:
        """Make everything written so far durable according to the sync policy."""
        try:
            if self._policy is SyncPolicy.NONE:
                # Still hand the bytes to the OS: readers use their own descriptors.
                self._f.flush()
                return
            self._io.fsync(self._f, data_only=self._policy is SyncPolicy.FDATASYNC)
        except OSError as e:
            raise wrap_os_error(e, f"syncing WAL segment {self.path}") from e
        self._on_sync()

    def finish(self) -> None:
        """Close the segment: truncate the preallocated tail and make it durable.

        Recovery rule 2 depends on this completing before the next segment is created.
        """
        try:
            self._f.flush()
            self._f.truncate(self._offset)
            if self._policy is not SyncPolicy.NONE:
                self._io.fsync(self._f)
                self._on_sync()
        except OSError as e:
            raise wrap_os_error(e, f"closing WAL segment {self.path}") from e
        finally:
            self._f.close()

    def abandon(self) -> None:
        """Close without truncating or syncing (after a failure; recovery sorts it out)."""
        try:
            self._f.close()
        except OSError:
            _log.warning("closing failed WAL segment %s also failed", self.path, exc_info=True)


def _preallocate(f: IO[bytes], size: int) -> None:
    try:
        os.posix_fallocate(f.fileno(), 0, size)
    except OSError as e:
        if e.errno not in _NO_PREALLOCATION:
            raise
        # Some file systems cannot preallocate; the segment just grows as it is written.


class SegmentReader:
    """Positional reads of one segment file. Thread-safe (``pread`` has no shared offset)."""

    def __init__(self, io: FileIO, seq: int) -> None:
        self._path = io.path(segment_name(seq))
        try:
            self._f = io.open(segment_name(seq), mode="rb")
        except OSError as e:
            raise wrap_os_error(e, f"opening WAL segment {self._path}") from e

    @property
    def path(self) -> str:
        return self._path

    def read(self, offset: int, size: int) -> bytes:
        try:
            data = os.pread(self._f.fileno(), size, offset)
        except OSError as e:
            raise wrap_os_error(e, f"reading WAL segment {self._path}") from e
        if len(data) != size:
            raise CorruptionError(
                f"WAL segment {self._path}: expected {size} bytes at offset {offset}, "
                f"the file ends after {len(data)}"
            )
        return data

    def close(self) -> None:
        self._f.close()


@dataclass(frozen=True)
class TornTail:
    """What recovery cut off the last segment (rule 4 of the module docstring). Immutable."""

    segment: str
    offset: int
    dropped_bytes: int
    nonzero: bool
    reason: str


@dataclass(frozen=True)
class SegmentScan:
    """The valid frames of one segment, in file order, and where they end.

    Never changed once made: recovery's scan cache shares it read-only between threads.
    """

    seq: int
    frames: list[FrameView]
    end: int
    torn: TornTail | None


def scan_segment(buf: bytes, seq: int, where: str, *, last: bool) -> SegmentScan:
    """Validate a whole segment image and apply the recovery rule.

    Args:
        buf: the complete file contents.
        seq: the sequence number from the file name.
        where: the file's path, for messages.
        last: whether this is the newest segment (only it may end in a torn write).

    Raises:
        CorruptionError: rules 1-3 of the module docstring, naming ``where`` and the offset.
    """
    check_header(buf, where, seq)
    end = len(buf)
    frames: list[FrameView] = []
    pos = HEADER_SIZE
    while pos < end:
        view = parse_frame(buf, pos, end)
        if isinstance(view, str):
            return _bad_frame(buf, seq, where, pos, view, frames, last=last)
        frames.append(view)
        pos += view.size
    return SegmentScan(seq, frames, pos, None)


def _bad_frame(buf: bytes, seq: int, where: str, bad: int, reason: str,
               frames: list[FrameView], *, last: bool) -> SegmentScan:
    end = len(buf)
    if not last:
        raise CorruptionError(
            f"WAL segment {where}: {reason} at offset {bad} in a closed segment "
            f"({end - bad} bytes follow); the replica must be re-replicated"
        )
    later = _later_group_frame(buf, bad, end)
    if later is not None:
        raise CorruptionError(
            f"WAL segment {where}: {reason} at offset {bad}, but a valid frame of a later "
            f"write group (index {later.index}) follows at offset {later.offset}; "
            f"the replica must be re-replicated"
        )
    nonzero = buf.count(0, bad, end) != end - bad
    return SegmentScan(seq, frames, bad, TornTail(where, bad, end - bad, nonzero, reason))


def _later_group_frame(buf: bytes, bad: int, end: int) -> FrameView | None:
    """The first valid frame after ``bad`` that belongs to a group started after ``bad``."""
    pos = bad + 1
    while True:
        # Every frame has FRAME_TAG right after its 8-byte header: find() skips the long
        # zero runs of a preallocated tail at C speed.
        i = buf.find(FRAME_TAG_BYTE, pos + FRAME_HEADER_SIZE, end)
        if i < 0:
            return None
        candidate = i - FRAME_HEADER_SIZE
        view = parse_frame(buf, candidate, end)
        if not isinstance(view, str) and view.group_start > bad:
            return view
        pos = candidate + 1


def truncate_segment(io: FileIO, seq: int, offset: int) -> None:
    """Cut segment ``seq`` at ``offset`` durably (dropping a torn tail)."""
    name = segment_name(seq)
    try:
        with io.open(name, mode="r+b") as f:
            f.truncate(offset)
            io.fsync(f)
    except OSError as e:
        raise wrap_os_error(e, f"truncating WAL segment {io.path(name)}") from e
