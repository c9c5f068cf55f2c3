"""Recovery of a WAL directory: rebuild the in-memory index from the segment files.

Segments are replayed in sequence order through the append rule of
:mod:`pyspark_kudu.wal.index` (an entry at or below the last index truncates the suffix),
so a conflicting-suffix truncation written append-only is undone exactly as it happened.
Every segment is validated by :func:`~pyspark_kudu.wal.segment.scan_segment`, which
applies the torn-tail-versus-corruption rule documented in :mod:`pyspark_kudu.wal.segment`;
a torn tail is cut off the file (durably) and reported. Segments are read whole, one at a
time, so recovery needs memory for one segment (64 MiB by default).

A process reopens the same replicas often (a replica another process changed is reopened,
:mod:`pyspark_kudu.spark.host.replica_cache`), and every reopen used to read and CRC-check the whole
WAL again. A segment that is not the newest is closed for good: nothing appends to it or
truncates it again. So the scan of a whole, clean segment is remembered per process, keyed
by its path, inode, size and modification and change times, and reused while the file is
unchanged; a changed file (a byte written into it moves its times) is read and checked
again. Only files unchanged for two seconds are remembered, so that a later write moves
their times even where timestamps are coarse. Damage that does not move them (the medium
decaying under the file) is still caught where it matters: every frame's CRC is checked
again when its entry is read. Only scans without a torn tail are remembered, at most
``SCAN_CACHE_LIMIT`` of them.

Thread-safety: :func:`recover` keeps no state but that cache (guarded by a lock); run it
before the log is shared.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from pyspark_kudu.errors import CorruptionError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal.format import TMP_SUFFIX, parse_segment_name, segment_name
from pyspark_kudu.wal.index import Location, LogIndex
from pyspark_kudu.wal.segment import (
    SegmentScan,
    TornTail,
    scan_segment,
    truncate_segment,
    wrap_os_error,
)

__all__ = ["SCAN_CACHE_LIMIT", "Recovered", "RecoveryReport", "recover", "scan_cache_stats"]

_log = logging.getLogger(__name__)

SCAN_CACHE_LIMIT = 512
_SETTLED_NS = 2_000_000_000
_scans: OrderedDict[tuple[str, int, int, int, int, int, bool], SegmentScan] = OrderedDict()
_scans_lock = threading.Lock()
_scan_stats = {"hits": 0, "reads": 0}


def scan_cache_stats() -> dict[str, int]:
    """Segments this process took from the scan cache (hits) or read and checked (reads)."""
    with _scans_lock:
        return dict(_scan_stats)


def _scan(io: FileIO, seq: int, where: str, last: bool) -> SegmentScan:
    name = segment_name(seq)
    try:
        st = os.stat(io.local_path(name))
        key = (where, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, last)
        with _scans_lock:
            hit = _scans.get(key)
            if hit is not None:
                _scans.move_to_end(key)
                _scan_stats["hits"] += 1
                return hit
        buf = io.read_bytes(name)
        with _scans_lock:
            _scan_stats["reads"] += 1
    except OSError as e:
        raise wrap_os_error(e, f"reading WAL segment {where}") from e
    scan = scan_segment(buf, seq, where, last=last)
    del buf
    with _scans_lock:
        # Only a file last changed a while ago: any later write then moves its times past
        # the remembered ones even on a file system with coarse timestamps.
        if scan.torn is None and time.time_ns() - st.st_mtime_ns > _SETTLED_NS:
            _scans[key] = scan
            while len(_scans) > SCAN_CACHE_LIMIT:
                _scans.popitem(last=False)
    return scan


@dataclass(frozen=True)
class RecoveryReport:
    """What recovery found: replayed segments, frames, and any torn tail it cut.

    Immutable, so thread-safe.
    """

    segments: tuple[str, ...]
    frames: int
    first_index: int
    last_index: int
    torn_tail: TornTail | None
    removed: tuple[str, ...]


@dataclass
class Recovered:
    """Everything the log needs to resume. Not thread-safe (handed over to one ``Log``).

    ``seg_max`` maps each segment to the largest index framed in it (-1: none);
    ``next_seq`` is the segment the next append creates (recovered segments are closed).
    """

    index: LogIndex
    seg_max: dict[int, int]
    next_seq: int
    report: RecoveryReport


def recover(io: FileIO, start_seq: int) -> Recovered:
    """Replay the WAL directory ``io``, deleting temp files and segments below ``start_seq``.

    Raises:
        CorruptionError: a segment breaks the rule of :mod:`pyspark_kudu.wal.segment`, or
            two consecutive frames leave a gap between their indexes.
        IOError_: the directory or a file cannot be read or changed.
    """
    removed: list[str] = []
    try:
        io.makedirs()
        seqs: list[int] = []
        for name in io.listdir():
            seq = parse_segment_name(name)
            if name.endswith(TMP_SUFFIX) or (seq is not None and seq < start_seq):
                io.delete(name)
                removed.append(name)
            elif seq is not None:
                seqs.append(seq)
        if removed:
            io.fsync_dir()
    except OSError as e:
        raise wrap_os_error(e, f"listing WAL directory {io.root}") from e
    seqs.sort()
    index = LogIndex()
    seg_max: dict[int, int] = {}
    frames = 0
    torn: TornTail | None = None
    for k, seq in enumerate(seqs):
        where = io.path(segment_name(seq))
        scan = _scan(io, seq, where, last=k == len(seqs) - 1)
        for v in scan.frames:
            if not index.accepts(v.index):
                raise CorruptionError(
                    f"WAL segment {where}: entry {v.index} at offset {v.offset} leaves a "
                    f"gap after index {index.last}"
                )
            index.append(v.index, Location(v.term, seq, v.offset, v.size))
        frames += len(scan.frames)
        seg_max[seq] = max((v.index for v in scan.frames), default=-1)
        if scan.torn is not None:
            torn = scan.torn
            truncate_segment(io, seq, torn.offset)
            level = logging.WARNING if torn.nonzero else logging.DEBUG
            _log.log(level, "WAL %s: dropped %d bytes at offset %d (%s)", torn.segment,
                     torn.dropped_bytes, torn.offset, torn.reason)
    report = RecoveryReport(tuple(segment_name(s) for s in seqs), frames, index.first,
                            index.last, torn, tuple(removed))
    return Recovered(index, seg_max, max(seqs[-1] if seqs else 0, start_seq - 1) + 1, report)
