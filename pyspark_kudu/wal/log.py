"""The write-ahead log of one tablet: group commit, recovery, reads and segment GC.

Appending: an appender encodes its entries and their CRCs on its own thread, then, under
the log lock, *reserves* a location (segment, offset) for every frame, records it in the
in-memory index and enqueues the frames with a :class:`~concurrent.futures.Future` for the
sync thread of :mod:`pyspark_kudu.wal.group_commit`. That is Kudu's ``Reserve()`` +
``AsyncAppend()``: :meth:`Log.append_async` returns the future, :meth:`Log.append` waits on
it. Reservation and enqueueing happen in one critical section, so the order of calls is
the order on disk.

Visibility: an entry is readable (:meth:`Log.term`, :meth:`Log.read`) as soon as it is
enqueued (served from memory until written) and durable once its future completes. Raft
needs no more: the node acts on its own entries only after the append returned.

Appending follows the replay rule of :mod:`pyspark_kudu.wal.index`: an entry whose index is
at most the last index truncates the suffix. Recovery (:meth:`Log.open`) replays every
segment through the same rule and applies the torn-tail rule of
:mod:`pyspark_kudu.wal.segment`. After a reopen, appends always go to a new segment.

A failed write or sync puts the log in a failed state: the group's futures and every later
call raise :class:`~pyspark_kudu.errors.IOError_` (or ``DiskFullError``); the replica must
be reopened (recovery decides what survived), as Kudu does.

Thread-safety: :class:`Log` is thread-safe. Future callbacks run on the sync thread and must
not block on the log.
"""

from __future__ import annotations

import itertools
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from types import TracebackType

from pyspark_kudu.consensus.messages import Entry
from pyspark_kudu.errors import (
    CompactedError,
    CorruptionError,
    EntryUnavailableError,
    IllegalStateError,
    InvalidArgumentError,
    IOError_,
    KuduError,
    NotSupportedError,
)
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal.format import (
    HEADER_SIZE,
    PreparedFrame,
    decode_entry,
    entry_size_of_frame,
    prepare_frame,
    segment_name,
)
from pyspark_kudu.wal.group_commit import GroupCommitter, Pending
from pyspark_kudu.wal.index import Location, LogIndex
from pyspark_kudu.wal.recovery import RecoveryReport, recover
from pyspark_kudu.wal.segment import SegmentReader, wrap_os_error
from pyspark_kudu.wal.wal_options import SyncPolicy, WalOptions

__all__ = ["Log", "LogStats"]

@dataclass(frozen=True)
class LogStats:
    """Counters since the log was opened. ``syncs`` counts every fsync/fdatasync issued,
    segment creation and closing included; ``groups`` counts groups written.

    Immutable snapshot, so thread-safe.
    """

    appends: int
    entries: int
    bytes: int
    groups: int
    syncs: int
    segments_created: int
    largest_group: int


class Log:
    """One tablet's WAL directory. Create with :meth:`open`. Thread-safe."""

    def __init__(self, io: FileIO, options: WalOptions, index: LogIndex,
                 seg_max: dict[int, int], plan_seq: int, recovery: RecoveryReport) -> None:
        """Use :meth:`open`; this adopts the state recovery rebuilt."""
        self._io = io
        self._opts = options
        self._recovery = recovery
        self._lock = threading.Lock()
        self._index = index
        self._seg_max = seg_max  # seq -> largest index framed in it (-1: none)
        self._plan_seq = plan_seq
        self._plan_off = HEADER_SIZE
        # Every segment numbered below the floor is closed and never written again.
        self._open_floor = plan_seq
        self._unwritten: dict[int, Entry] = {}
        self._cache: OrderedDict[int, Entry] = OrderedDict()
        self._cache_bytes = 0
        self._readers: dict[int, SegmentReader] = {}
        self._closing = False
        self._appends = self._entries = self._bytes = 0
        self._committer = GroupCommitter(io, options, on_written=self._written,
                                         on_segment_closed=self._segment_closed)

    # -- opening and recovery ------------------------------------------------------------
    @classmethod
    def open(cls, io: FileIO, options: WalOptions | None = None, *, start_seq: int = 0) -> Log:
        """Open (creating if needed) the WAL directory ``io`` and recover it.

        Args:
            io: the ``wal`` directory of a tablet.
            options: segment size, sync policy...; defaults to :class:`WalOptions`.
            start_seq: segments numbered below it are obsolete (a snapshot replaced the log
                they hold) and are deleted.

        Raises:
            NotSupportedError: ``io`` is not on the local file system.
            CorruptionError: see :func:`pyspark_kudu.wal.recovery.recover`.
        """
        options = options or WalOptions()
        if not io.is_local:
            raise NotSupportedError(
                f"the WAL at {io.root} needs a local file system (in-place appends and "
                f"fsync); put the tablet server's data root on local disk"
            )
        recovered = recover(io, start_seq)
        return cls(io, options, recovered.index, recovered.seg_max, recovered.next_seq,
                   recovered.report)

    # -- introspection -------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self._io.root

    @property
    def recovery(self) -> RecoveryReport:
        return self._recovery

    @property
    def fresh(self) -> bool:
        """True while the log holds no entry since it was created or reset."""
        with self._lock:
            return self._index.fresh

    @property
    def first_index(self) -> int:
        with self._lock:
            return self._index.first

    @property
    def last_index(self) -> int:
        """The last index (``first_index - 1`` when empty)."""
        with self._lock:
            return self._index.last

    @property
    def failure(self) -> KuduError | None:
        """The write or sync error that failed the log, if any (it must then be reopened)."""
        return self._committer.failure

    def stats(self) -> LogStats:
        c = self._committer
        return LogStats(self._appends, self._entries, self._bytes, c.groups, c.syncs,
                        c.segments_created, c.largest_group)

    # -- appending -----------------------------------------------------------------------
    def append_async(self, entries: Sequence[Entry]) -> Future[int]:
        """Enqueue consecutive ``entries``; the future yields the last index once durable.

        An entry at or below the last index truncates the suffix first. Callers that need
        ``next index`` semantics across threads reserve indexes under their own lock and
        call this inside it (order of calls = order on disk), then wait outside it.

        Raises:
            InvalidArgumentError: entries not consecutive, or a gap after the last index.
            IllegalStateError: the log is closed.
            IOError_: the log failed earlier.
        """
        ents = list(entries)
        for a, b in itertools.pairwise(ents):
            if b.index != a.index + 1:
                raise InvalidArgumentError(
                    f"WAL append needs consecutive indexes, got {a.index} then {b.index}"
                )
        frames = [prepare_frame(e) for e in ents]
        fut: Future[int] = Future()
        with self._lock:
            self._check_usable()
            if not ents:
                fut.set_result(self._index.last)
                return fut
            if not self._index.accepts(ents[0].index):
                raise InvalidArgumentError(
                    f"WAL append at index {ents[0].index} would leave a gap: the log ends at "
                    f"{self._index.last}"
                )
            if not self._index.fresh and ents[0].index <= self._index.last:
                self._forget_cached(lambda i: i >= ents[0].index)
            planned: list[tuple[PreparedFrame, int, int]] = []
            for e, fr in zip(ents, frames, strict=True):
                seq, off = self._reserve(fr.size)
                self._index.append(e.index, Location(e.term, seq, off, fr.size))
                self._seg_max[seq] = max(self._seg_max[seq], e.index)
                self._unwritten[e.index] = e
                planned.append((fr, seq, off))
                self._bytes += fr.size
            self._appends += 1
            self._entries += len(ents)
            self._committer.enqueue(Pending(planned, fut, ents[-1].index))
        return fut

    def append(self, entries: Sequence[Entry]) -> int:
        """Append and wait until durable; returns the last index. See :meth:`append_async`."""
        return self.append_async(entries).result()

    def sync(self) -> None:
        """Wait until everything enqueued so far is durable."""
        self._barrier(finish_segment=False).result()

    def _reserve(self, size: int) -> tuple[int, int]:
        # Roll before a frame that would overflow a segment that already holds one; a
        # frame bigger than a whole segment gets a fresh segment to itself.
        if self._plan_off > HEADER_SIZE and self._plan_off + size > self._opts.segment_size:
            self._plan_seq += 1
            self._plan_off = HEADER_SIZE
        loc = (self._plan_seq, self._plan_off)
        self._plan_off += size
        self._seg_max.setdefault(self._plan_seq, -1)
        return loc

    def _barrier(self, *, finish_segment: bool) -> Future[int]:
        with self._lock:
            return self._barrier_locked(finish_segment=finish_segment)

    def _barrier_locked(self, *, finish_segment: bool) -> Future[int]:
        self._check_usable()
        fut: Future[int] = Future()
        self._committer.enqueue(Pending([], fut, self._index.last, finish_segment))
        return fut

    # -- reading -------------------------------------------------------------------------
    def term(self, index: int) -> int:
        with self._lock:
            self._check_readable(index, index + 1)
            return self._index.term(index)

    def frame_sizes(self, lo: int, hi: int) -> list[int]:
        """Frame sizes of entries ``[lo, hi)``, from the index (nothing is read). Raises as
        :meth:`read`."""
        with self._lock:
            if lo >= hi:
                return []
            self._check_readable(lo, hi)
            return list(self._index.sizes(lo, hi))

    def read(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        """Entries ``[lo, hi)``, cut to ``max_size`` bytes like ``storage.limit_size``.

        Raises:
            CompactedError: ``lo`` is below the first index (garbage-collected).
            EntryUnavailableError: ``hi - 1`` is beyond the last index.
            CorruptionError: a frame no longer passes its checksum.
        """
        with self._lock:
            if lo >= hi:
                return []
            self._check_readable(lo, hi)
            n = hi - lo
            if max_size is not None:
                sizes = self._index.sizes(lo, hi)
                total, n = entry_size_of_frame(sizes[0]), 1
                while n < len(sizes):
                    total += entry_size_of_frame(sizes[n])
                    if total > max_size:
                        break
                    n += 1
            out: list[Entry | None] = []
            missing: list[tuple[int, Location]] = []
            for i in range(lo, lo + n):
                e = self._unwritten.get(i)
                if e is None:
                    e = self._cache.get(i)
                    if e is not None:
                        self._cache.move_to_end(i)
                if e is None:
                    missing.append((i, self._index.location(i)))
                out.append(e)
            for e in self._read_frames(missing):
                out[e.index - lo] = e
                self._cache_put(e)
            return [e for e in out if e is not None]

    def _read_frames(self, wanted: list[tuple[int, Location]]) -> list[Entry]:
        """Decode frames from disk, one ``pread`` per run of adjacent frames."""
        got: list[Entry] = []
        k = 0
        while k < len(wanted):
            j, first = k, wanted[k][1]
            end = first.offset + first.size
            while (j + 1 < len(wanted) and wanted[j + 1][1].seq == first.seq
                   and wanted[j + 1][1].offset == end):
                j += 1
                end += wanted[j][1].size
            reader = self._reader(first.seq)
            buf = reader.read(first.offset, end - first.offset)
            for index, loc in wanted[k:j + 1]:
                rel = loc.offset - first.offset
                e = decode_entry(buf, loc.offset, reader.path, rel, loc.size)
                if e.index != index or e.term != loc.term:
                    raise CorruptionError(
                        f"WAL segment {reader.path}: offset {loc.offset} holds entry "
                        f"{e.term}.{e.index}, the index expected {loc.term}.{index}"
                    )
                got.append(e)
            k = j + 1
        return got

    def _reader(self, seq: int) -> SegmentReader:
        reader = self._readers.get(seq)
        if reader is None:
            reader = self._readers[seq] = SegmentReader(self._io, seq)
        return reader

    def _cache_put(self, e: Entry) -> None:
        size = e.size()
        if size > self._opts.cache_bytes:
            return
        old = self._cache.pop(e.index, None)
        if old is not None:
            self._cache_bytes -= old.size()
        self._cache[e.index] = e
        self._cache_bytes += size
        while self._cache_bytes > self._opts.cache_bytes:
            _, evicted = self._cache.popitem(last=False)
            self._cache_bytes -= evicted.size()

    def _forget_cached(self, doomed: Callable[[int], bool]) -> None:
        for i in [i for i in self._unwritten if doomed(i)]:
            del self._unwritten[i]
        for i in [i for i in self._cache if doomed(i)]:
            self._cache_bytes -= self._cache.pop(i).size()

    # -- GC and reset --------------------------------------------------------------------
    def gc(self, up_to: int) -> list[str]:
        """Forget entries ``<= up_to`` and delete the oldest segments holding only those.

        Only a prefix of closed segments is deleted: a later segment may hold the
        truncation that supersedes an earlier one's entries, so replay must start at a
        segment boundary with nothing after it depending on what went before.
        Returns the deleted file names.
        """
        with self._lock:
            self._check_usable()
            doomed: list[int] = []
            for seq in sorted(self._seg_max):
                if seq >= self._open_floor or self._seg_max[seq] > up_to:
                    break
                doomed.append(seq)
            deleted = self._delete_segments(doomed)
            self._index.forget_through(up_to)
            self._forget_cached(lambda i: i <= up_to)
            return deleted

    def start_new_epoch(self) -> int:
        """Close the current segment and empty the log; returns the next segment's number.

        Used when a snapshot replaces the whole log: the caller records the number as its
        ``start_seq`` durably, then calls :meth:`drop_segments_before`.
        """
        with self._lock:
            # Enqueue the barrier and move the plan in one critical section: a frame
            # reserved in between would land in the segment the barrier closes.
            barrier = self._barrier_locked(finish_segment=True)
            self._plan_seq += 1
            self._plan_off = HEADER_SIZE
            self._seg_max.setdefault(self._plan_seq, -1)
            self._index.reset()
            self._forget_cached(lambda i: True)
            new_seq = self._plan_seq
        barrier.result()
        with self._lock:
            # Below new_seq every segment is now closed or was never created.
            self._open_floor = max(self._open_floor, new_seq)
        return new_seq

    def drop_segments_before(self, seq: int) -> list[str]:
        """Delete every closed segment numbered below ``seq`` (see :meth:`start_new_epoch`)."""
        with self._lock:
            self._check_usable()
            limit = min(seq, self._open_floor)
            return self._delete_segments([s for s in sorted(self._seg_max) if s < limit])

    def _delete_segments(self, seqs: list[int]) -> list[str]:
        deleted: list[str] = []
        try:
            for seq in seqs:
                reader = self._readers.pop(seq, None)
                if reader is not None:
                    reader.close()
                name = segment_name(seq)
                self._io.delete(name)
                del self._seg_max[seq]
                deleted.append(name)
            if deleted and self._opts.sync_policy is not SyncPolicy.NONE:
                self._io.fsync_dir()
        except OSError as e:
            raise wrap_os_error(e, f"deleting WAL segments in {self._io.root}") from e
        return deleted

    # -- lifecycle -----------------------------------------------------------------------
    def close(self) -> None:
        """Write and sync everything enqueued, truncate the active segment, stop. Idempotent."""
        self._stop(self._committer.close)

    def detach(self) -> None:
        """Close without touching the files (see ``GroupCommitter.detach``). Idempotent."""
        self._stop(self._committer.detach)

    def _stop(self, stop_committer: Callable[[], None]) -> None:
        with self._lock:
            if self._closing:
                return
            self._closing = True
        try:
            stop_committer()
        finally:
            with self._lock:
                for reader in self._readers.values():
                    reader.close()
                self._readers.clear()

    def __enter__(self) -> Log:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Log({self._io.root!r})"

    def _check_usable(self) -> None:
        failure = self._committer.failure
        if failure is not None:
            cls = type(failure) if isinstance(failure, IOError_) else IOError_
            raise cls(f"WAL {self._io.root} failed earlier ({failure}); reopen the "
                      f"tablet to recover") from failure
        if self._closing:
            raise IllegalStateError(f"WAL {self._io.root} is closed")

    def _check_readable(self, lo: int, hi: int) -> None:
        self._check_usable()
        if lo < self._index.first:
            raise CompactedError(
                f"WAL entries from index {lo} were garbage-collected (first is "
                f"{self._index.first})"
            )
        if hi - 1 > self._index.last:
            raise EntryUnavailableError(
                f"WAL entries up to index {hi - 1} requested, but the log ends at "
                f"{self._index.last}"
            )

    # -- callbacks from the sync thread -----------------------------------------------------
    def _written(self, group: list[Pending]) -> None:
        with self._lock:
            for p in group:
                for fr, _, _ in p.frames:
                    e = fr.entry
                    # Identity, not index: the entry may have been truncated and replaced.
                    if self._unwritten.get(e.index) is e:
                        del self._unwritten[e.index]
                        self._cache_put(e)

    def _segment_closed(self, seq: int) -> None:
        with self._lock:
            self._open_floor = max(self._open_floor, seq + 1)
