"""``WalStorage``: the durable Raft ``Storage`` of one replica, over the WAL and ``meta``.

It answers the read-only :class:`~pyspark_kudu.consensus.raft_storage.Storage` protocol and offers
exactly the writes of :class:`~pyspark_kudu.consensus.raft_storage.MemoryStorage`, with the same
index conventions, the same checks in the same order and the same errors (a property test
runs both side by side). Where each piece of state lives (DESIGN §5)::

    <tablet>/meta          hard state, snapshot, compaction point, first live WAL segment
    <tablet>/wal/<seq>.log log entries (see pyspark_kudu.wal.segment for the format)

Durability of each write when it returns:

- ``append``: the entries are durable (group commit, see :mod:`pyspark_kudu.wal.log`);
  ``append_async`` returns a future instead, so a caller can pipeline.
- ``set_hard_state``: a new term or vote is written to ``meta`` (atomic replace) before the
  call returns. A change of ``commit`` alone is kept in memory and written with the next
  ``meta`` write or by :meth:`WalStorage.close`: the commit index is volatile state in Raft
  (Fig. 2) and a restarted replica relearns it from the leader, so persisting it on every
  advance would only cost an fsync per round.
- ``set_conf_state``, ``create_snapshot``, ``compact``: ``meta`` is replaced before return.
  ``compact`` only moves the compaction point; :meth:`WalStorage.gc` reclaims the disk.
- ``apply_snapshot``: the current segment is closed, ``meta`` records the snapshot and the
  number of the first segment of the new log (the commit point: on reopen, older segments
  are deleted), then older segments are deleted.

Any failure while writing leaves the storage failed: every later call raises, and the
replica must be reopened (recovery decides what survived) or re-replicated.

Thread-safety: :class:`WalStorage` is thread-safe. Calls are serialised by one lock, except
that ``append`` waits for durability outside it, so appends from several threads share
syncs (entries are visible to readers once enqueued, durable once the call returns).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import replace
from types import TracebackType

from pyspark_kudu.consensus.messages import ConfState, Entry, HardState, Snapshot, SnapshotMetadata
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
from pyspark_kudu.wal.format import parse_segment_name
from pyspark_kudu.wal.log import Log, LogStats
from pyspark_kudu.wal.meta import ConsensusMeta, load_meta, save_meta
from pyspark_kudu.wal.recovery import RecoveryReport
from pyspark_kudu.wal.wal_options import WalOptions

__all__ = ["WAL_DIR", "WalStorage"]

WAL_DIR = "wal"

_logger = logging.getLogger(__name__)


class WalStorage:
    """Durable ``Storage`` plus ``MemoryStorage``'s writes. Open with :meth:`open`.

    Thread-safe (see the module docstring).
    """

    def __init__(self, io: FileIO, log: Log, meta: ConsensusMeta) -> None:
        self._io = io
        self._log = log
        self._meta = meta  # as last written to disk
        self._hs = meta.hard_state  # may be ahead of meta in ``commit`` only
        self._lock = threading.RLock()
        self._failure: KuduError | None = None
        self._closed = False

    @classmethod
    def open(cls, tablet: FileIO | str, options: WalOptions | None = None, *,
             conf_state: ConfState | None = None) -> WalStorage:
        """Open the replica state under ``tablet`` (a tablet directory), creating it if new.

        Args:
            tablet: the tablet directory, ``<root>/tablets/<tablet_id>``.
            options: WAL options; defaults to :class:`WalOptions`.
            conf_state: the initial configuration of a *new* tablet (ignored when ``meta``
                exists), like ``MemoryStorage(conf_state)``.

        Raises:
            NotSupportedError: the directory is not on the local file system.
            CorruptionError: ``meta`` or the WAL fails its checks, or they disagree.
        """
        io = tablet if isinstance(tablet, FileIO) else FileIO(tablet)
        if not io.is_local:
            raise NotSupportedError(
                f"tablet {io.root}: WalStorage needs a local file system (in-place appends "
                f"and fsync); put the tablet server's data root on local disk"
            )
        try:
            io.makedirs()
        except OSError as e:
            raise IOError_(f"creating tablet directory {io.root}: {e}") from e
        wal_io = io.child(WAL_DIR)
        meta = load_meta(io)
        if meta is None:
            if any(parse_segment_name(n) is not None for n in wal_io.listdir()):
                raise CorruptionError(
                    f"tablet {io.root} has WAL segments but no consensus metadata "
                    f"({io.path('meta')} is missing); the replica must be re-replicated"
                )
            meta = ConsensusMeta(snapshot=Snapshot(SnapshotMetadata(
                conf_state=conf_state or ConfState())))
            save_meta(io, meta)
        log = Log.open(wal_io, options, start_seq=meta.wal_start_seq)
        try:
            _check_consistent(io, log, meta)
        except BaseException:
            log.close()
            raise
        return cls(io, log, meta)

    # -- Storage protocol ------------------------------------------------------------------
    def initial_state(self) -> tuple[HardState, ConfState]:
        with self._lock:
            self._check_open()
            return self._hs, self._meta.snapshot.metadata.conf_state

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        with self._lock:
            self._check_open()
            offset = self._meta.log_start_index
            if lo <= offset:
                raise CompactedError(
                    f"entries from index {lo} were compacted (snapshot at {offset})")
            if hi > self._last() + 1:
                raise EntryUnavailableError(
                    f"entries up to index {hi - 1} requested, but the log ends at {self._last()}"
                )
            if lo >= hi:
                return []
            return self._log.read(lo, hi, max_size)

    def frame_sizes(self, lo: int, hi: int) -> list[int]:
        """On-disk frame sizes of entries ``[lo, hi)``, without reading them (an entry's
        frame is its payload plus a fixed header). Raises as :meth:`entries`."""
        with self._lock:
            self._check_open()
            if lo <= self._meta.log_start_index:
                raise CompactedError(
                    f"entries from index {lo} were compacted (snapshot at "
                    f"{self._meta.log_start_index})")
            return self._log.frame_sizes(lo, hi)

    def term(self, index: int) -> int:
        with self._lock:
            self._check_open()
            offset = self._meta.log_start_index
            if index < offset:
                raise CompactedError(
                    f"term of index {index} was compacted (snapshot at {offset})")
            if index > self._last():
                raise EntryUnavailableError(
                    f"index {index} is beyond the last index {self._last()}")
            if index == offset:
                return self._meta.log_start_term
            return self._log.term(index)

    def first_index(self) -> int:
        with self._lock:
            self._check_open()
            return self._meta.log_start_index + 1

    def last_index(self) -> int:
        with self._lock:
            self._check_open()
            return self._last()

    def snapshot(self) -> Snapshot:
        with self._lock:
            self._check_open()
            return self._meta.snapshot

    def _last(self) -> int:
        # The log is fresh right after a snapshot replaced it; otherwise it reaches at least
        # the compaction point (checked on open, kept by compact() and append()).
        return self._meta.log_start_index if self._log.fresh else self._log.last_index

    # -- writes ----------------------------------------------------------------------------
    @property
    def hard_state(self) -> HardState:
        with self._lock:
            return self._hs

    def set_hard_state(self, hs: HardState) -> None:
        """Record ``hs``; term and vote are durable on return, commit lazily (module doc)."""
        with self._lock:
            self._check_open()
            durable = self._meta.hard_state
            self._hs = hs
            if hs.term != durable.term or hs.vote != durable.vote:
                self._persist(self._meta)

    def set_conf_state(self, cs: ConfState) -> None:
        """Record the configuration in force after applying entries (kept with the snapshot)."""
        with self._lock:
            self._check_open()
            snap = self._meta.snapshot
            md = snap.metadata
            self._persist(replace(self._meta, snapshot=Snapshot(
                SnapshotMetadata(md.index, md.term, cs), snap.data)))

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the whole log by ``snap`` (a follower installing a copy)."""
        with self._lock:
            self._check_open()
            current = self._meta.snapshot
            if snap.metadata.index <= current.metadata.index and not (
                current.is_empty() and snap.is_empty()
            ):
                raise InvalidArgumentError(
                    f"snapshot at index {snap.metadata.index} is older than the current one "
                    f"at {current.metadata.index}"
                )
            try:
                new_seq = self._log.start_new_epoch()
            except KuduError as e:
                self._failure = e
                raise
            self._persist(replace(
                self._meta, snapshot=snap, log_start_index=snap.metadata.index,
                log_start_term=snap.metadata.term, wal_start_seq=new_seq))
            try:
                self._log.drop_segments_before(new_seq)
            except IOError_:
                # The snapshot is committed in meta; the next open deletes what is left.
                _logger.warning("could not delete old WAL segments of %s", self._io.root,
                                exc_info=True)

    def create_snapshot(self, index: int, conf_state: ConfState, data: bytes = b"") -> Snapshot:
        """Record a snapshot of the applied state at ``index`` (call :meth:`compact` after)."""
        with self._lock:
            self._check_open()
            current = self._meta.snapshot.metadata.index
            if index <= current:
                raise InvalidArgumentError(
                    f"snapshot index {index} is not after the current snapshot at {current}"
                )
            if index > self._last():
                raise InvalidArgumentError(f"snapshot index {index} is beyond the last index")
            snap = Snapshot(SnapshotMetadata(index, self.term(index), conf_state), data)
            self._persist(replace(self._meta, snapshot=snap))
            return snap

    def compact(self, index: int) -> None:
        """Make entries up to and including ``index`` unreadable; :meth:`gc` frees the disk."""
        with self._lock:
            self._check_open()
            offset = self._meta.log_start_index
            if index <= offset:
                raise CompactedError(
                    f"index {index} is already compacted (snapshot at {offset})")
            if index > self._last():
                raise InvalidArgumentError(
                    f"cannot compact to {index}: the log ends at {self._last()}")
            term = self._log.term(index)
            self._persist(replace(self._meta, log_start_index=index, log_start_term=term))

    def append(self, entries: Sequence[Entry]) -> None:
        """Append durably, truncating any existing suffix that ``entries`` overwrite.

        Unlike ``MemoryStorage``, entries with non-consecutive indexes are refused
        (``InvalidArgumentError``) instead of being stored as given.
        """
        self.append_async(entries).result()

    def append_async(self, entries: Sequence[Entry]) -> Future[int]:
        """Like :meth:`append` but returns at once; the future completes when durable.

        Checks (and their errors) happen before this returns; the future only carries an
        I/O failure. Appends become visible to readers in call order.
        """
        with self._lock:
            self._check_open()
            first = self._meta.log_start_index + 1
            if not entries or entries[-1].index < first:
                done: Future[int] = Future()
                done.set_result(self._last())
                return done
            ents = list(entries)
            if first > ents[0].index:
                ents = ents[first - ents[0].index:]
            if ents[0].index > self._last() + 1:
                raise InvalidArgumentError(
                    f"missing log entries: last index {self._last()}, appending at "
                    f"{ents[0].index}"
                )
            return self._log.append_async(ents)

    def gc(self, up_to_index: int | None = None) -> list[str]:
        """Log GC: delete whole WAL segments all of whose entries are ``<= up_to_index``.

        Defaults to the compaction point (``first_index() - 1``); a larger index would drop
        entries the storage still serves. Returns the deleted file names.

        Raises:
            InvalidArgumentError: ``up_to_index`` is beyond the compaction point.
        """
        with self._lock:
            self._check_open()
            start = self._meta.log_start_index
            up_to = start if up_to_index is None else up_to_index
            if up_to > start:
                raise InvalidArgumentError(
                    f"cannot garbage-collect the WAL of {self._io.root} through index {up_to}: "
                    f"only entries up to {start} are compacted; call compact() first"
                )
            return self._log.gc(up_to)

    # -- introspection and lifecycle -------------------------------------------------------
    @property
    def recovery(self) -> RecoveryReport:
        """What opening the WAL found (segments replayed, torn tail cut)."""
        return self._log.recovery

    def wal_stats(self) -> LogStats:
        return self._log.stats()

    def sync_commit(self) -> None:
        """Persist a lazily kept commit index now, as :meth:`close` would, and stay open
        (for a caller that keeps the storage open between uses by several processes)."""
        with self._lock:
            self._check_open()
            if self._hs != self._meta.hard_state:
                self._persist(self._meta)

    def close(self) -> None:
        """Persist a lazily kept commit index, then close the WAL. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._failure is None and self._hs != self._meta.hard_state:
                    self._persist(self._meta)
            finally:
                self._log.close()

    def detach(self) -> None:
        """Close without writing anything: no commit persisted, no segment truncated. For a
        holder whose view may be stale because another process has written since (see
        :mod:`pyspark_kudu.spark.host.replica_cache`). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._log.detach()

    def __enter__(self) -> WalStorage:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"WalStorage({self._io.root!r})"

    def _persist(self, meta: ConsensusMeta) -> None:
        # Every write carries the current hard state: that is how a lazily kept commit
        # index reaches the disk.
        meta = replace(meta, hard_state=self._hs)
        try:
            save_meta(self._io, meta)
        except KuduError as e:
            self._failure = e
            raise
        self._meta = meta

    def _check_open(self) -> None:
        if self._closed:
            raise IllegalStateError(f"storage of tablet {self._io.root} is closed")
        if self._failure is None:
            self._failure = self._log.failure
        if self._failure is not None:
            raise IOError_(
                f"storage of tablet {self._io.root} failed earlier ({self._failure}); "
                f"reopen the tablet to recover"
            ) from self._failure


def _check_consistent(io: FileIO, log: Log, meta: ConsensusMeta) -> None:
    """The WAL must continue right after the compaction point recorded in ``meta``."""
    if log.fresh:
        return
    start = meta.log_start_index
    if log.last_index < start:
        raise CorruptionError(
            f"tablet {io.root}: the WAL ends at index {log.last_index} but entries through "
            f"{start} were compacted; acknowledged entries were lost (was the WAL run with "
            f"sync policy 'none'?)"
        )
    if log.first_index > start + 1:
        raise CorruptionError(
            f"tablet {io.root}: the WAL starts at index {log.first_index} but the storage "
            f"needs every entry after the compaction point {start}"
        )
