"""One tablet replica: applies committed entries, serves snapshot scans, flushes, compacts.

Files under ``<root>/tablets/<tablet_id>/`` (DESIGN §5): ``superblock`` (see
:mod:`.superblock`) and ``rowsets/*.parquet`` with their ``*.bloom`` filters (see
:mod:`.rowset`, :mod:`.bloom`). The WAL (``wal/``) and the
consensus metadata (``meta``) belong to the log and Raft layers; the tablet reads the log
through :class:`~pyspark_kudu.tablet.committed_log.CommittedLog` only.

Lifecycle (:mod:`.state`): :meth:`Tablet.open` bootstraps — it reads the superblock, deletes
files no superblock lists (leftovers of an interrupted flush or compaction), loads the rowset
deltas, then replays the log from ``last_flushed_index + 1``. Because a flush or compaction
publishes its files with one atomic superblock replace, a crash at any point leaves either
the old file set (and the log still holds every entry after the old flushed index) or the new
one: nothing is lost and nothing is applied twice.

MVCC: an entry's Raft index is the timestamp of all its rows. ``applied_index`` is the newest
applied entry; a scan at snapshot ``S`` with ``ancient_history_mark <= S <= applied_index``
sees exactly the effects of entries ``<= S``. A writer that got ``WriteResult.index = i`` reads
its writes with ``snapshot >= i`` (the default snapshot is ``applied_index``).

Thread-safety: thread-safe. Applies, flushes and scan planning serialise on one lock; scans
then stream without it from pinned, immutable files (a compaction defers deleting its inputs
until the last scan using them finishes). A compaction takes the lock only to start and to
finish: it merges without it (:meth:`Tablet.prepare_compaction`), and its commit drops the
merge if a write ended versions in one of its inputs meanwhile.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from pyspark_kudu.errors import (
    AlreadyPresentError,
    CorruptionError,
    IllegalStateError,
    InvalidArgumentError,
    KuduError,
    ServiceUnavailableError,
)
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.tablet.apply import ApplyStats, apply_batch
from pyspark_kudu.tablet.committed_log import CommittedLog, LogRecord
from pyspark_kudu.tablet.compaction import kept_versions, prepare_versions, write_rowset
from pyspark_kudu.tablet.faults import crash_point
from pyspark_kudu.tablet.memory import KEY_INDEXES, release_unused_memory
from pyspark_kudu.tablet.memrowset import MemRowSet
from pyspark_kudu.tablet.ops import RowError, WriteResult, decode_write_batch
from pyspark_kudu.tablet.parquet_files import write_delta_file
from pyspark_kudu.tablet.rowset import (
    DeltaFileMeta,
    DiskRowSet,
    RowSetMeta,
    delta_file,
)
from pyspark_kudu.tablet.scan import (
    RowSetSource,
    ScanPlan,
    TabletScanner,
    key_predicates,
    rowset_may_match,
)
from pyspark_kudu.tablet.state import TabletEvent, TabletState, next_state
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE, Superblock, tablet_dir
from pyspark_kudu.tablet.tablet_compaction import CompactionJob, TabletCompactions
from pyspark_kudu.tablet.tablet_options import TabletMetrics, TabletOptions

__all__ = ["CompactionJob", "CopyPin", "Tablet", "TabletMetrics", "TabletOptions", "tablet_dir"]


class CopyPin(NamedTuple):
    """State frozen for a tablet copy (see :meth:`Tablet.pin_for_copy`)."""

    superblock: Superblock
    rowsets: tuple[DiskRowSet, ...]
    anchor: int
    applied_index: int


class Tablet(TabletCompactions):
    """A tablet replica. Build with :meth:`create` or :meth:`open`, never directly.

    Thread-safe (see the module docstring): one writer at a time is serialised by the tablet
    lock; any number of scans may stream concurrently.
    """

    def __init__(self, fileio: FileIO, tablet_id: str, log: CommittedLog | None,
                 options: TabletOptions) -> None:
        self._dir = fileio
        self._tablet_id = tablet_id
        self._log = log
        self._options = options
        self._lock = threading.RLock()
        self._metrics_lock = threading.Lock()
        self._state = TabletState.INITIALIZED
        self.metrics = TabletMetrics()
        self._sb: Superblock | None = None
        self._rowsets: list[DiskRowSet] = []
        self._mrs: MemRowSet | None = None
        self._applied = 0
        self._anchors: dict[int, int] = {}
        self._next_anchor = 0
        self._failure: BaseException | None = None
        self._compacting = False  # a compaction job is prepared and not yet ended

    # -- construction -------------------------------------------------------------------
    @classmethod
    def create(cls, root: str | FileIO, tablet_id: str, schema: Schema, *,
               log: CommittedLog | None = None, options: TabletOptions | None = None) -> Tablet:
        """Create an empty replica under ``root`` and open it.

        Raises:
            AlreadyPresentError: the tablet already exists under ``root``.
        """
        d = tablet_dir(root, tablet_id)
        if d.exists(SUPERBLOCK_FILE):
            raise AlreadyPresentError(
                f"tablet {tablet_id} already exists at {d.root}; open it instead"
            )
        d.makedirs("rowsets")
        Superblock(tablet_id, schema).store(d)
        return cls.open(root, tablet_id, log=log, options=options)

    @classmethod
    def open(cls, root: str | FileIO, tablet_id: str, *, log: CommittedLog | None = None,
             options: TabletOptions | None = None) -> Tablet:
        """Open (bootstrap) an existing replica: superblock, rowsets, then log replay.

        Raises:
            NotFoundError: no superblock under ``root`` for ``tablet_id``.
            CorruptionError: the superblock or a file it lists is damaged; the tablet is FAILED.
        """
        t = cls(tablet_dir(root, tablet_id), tablet_id, log, options or TabletOptions())
        t._bootstrap()
        return t

    def _transition(self, event: TabletEvent) -> None:
        self._state = next_state(self._state, event, self._tablet_id)

    def _bootstrap(self) -> None:
        with self._lock:
            self._transition(TabletEvent.BOOTSTRAP)
            with self._failing("bootstrap"):
                sb = Superblock.load(self._dir)
                if sb.tablet_id != self._tablet_id:
                    raise CorruptionError(
                        f"superblock at {self._dir.root} belongs to tablet {sb.tablet_id},"
                        f" not {self._tablet_id}"
                    )
                self._sb = sb
                self._remove_orphans(sb)
                self._rowsets = [DiskRowSet(m, self._dir, sb.schema) for m in sb.rowsets]
                for rs in self._rowsets:
                    self._count("delta_files_read", rs.load_deltas())
                self._mrs = MemRowSet(sb.schema)
                self._applied = sb.last_flushed_index
                if self._log is not None:
                    for rec in self._log.read_from(sb.last_flushed_index + 1):
                        self._apply_locked(rec.index, rec.data)
                        self._maybe_flush_locked()
            self._transition(TabletEvent.BOOTSTRAPPED)

    def _remove_orphans(self, sb: Superblock) -> None:
        listed = sb.files()
        for name in self._dir.listdir("rowsets"):
            if f"rowsets/{name}" not in listed:
                self._dir.delete("rowsets", name)
        for name in self._dir.listdir():
            if name.startswith(SUPERBLOCK_FILE + ".tmp-"):
                self._dir.delete(name)

    @contextlib.contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        """Any error inside marks the replica FAILED: its state may be half-changed.

        Kudu errors and OS errors propagate as they are; Arrow errors while reading the
        replica's own files mean a damaged file and become :class:`CorruptionError`.
        """
        try:
            yield
        except Exception as e:
            if self._state in (TabletState.BOOTSTRAPPING, TabletState.RUNNING):
                self._state = next_state(self._state, TabletEvent.FAIL, self._tablet_id)
                self._failure = e
            if isinstance(e, pa.ArrowException) and not isinstance(e, (KuduError, OSError)):
                raise CorruptionError(
                    f"tablet {self._tablet_id}: {what} failed on a damaged file ({e}); the"
                    " replica must be re-copied"
                ) from e
            raise

    def _require_running(self) -> None:
        if self._state is not TabletState.RUNNING:
            raise IllegalStateError(
                f"tablet {self._tablet_id} is {self._state.value}; it serves requests only while"
                " running (reopen it, or re-replicate it if it failed)"
            )

    def close(self) -> None:
        with self._lock:
            self._transition(TabletEvent.SHUTDOWN)

    def _count(self, name: str, n: int = 1) -> None:
        with self._metrics_lock:
            setattr(self.metrics, name, getattr(self.metrics, name) + n)

    # -- properties ---------------------------------------------------------------------
    @property
    def tablet_id(self) -> str:
        return self._tablet_id

    @property
    def state(self) -> TabletState:
        return self._state

    @property
    def failure(self) -> BaseException | None:
        """The error that moved the replica to FAILED, if it failed."""
        return self._failure

    @property
    def schema(self) -> Schema:
        assert self._sb is not None
        return self._sb.schema

    @property
    def applied_index(self) -> int:
        return self._applied

    @property
    def last_flushed_index(self) -> int:
        assert self._sb is not None
        return self._sb.last_flushed_index

    @property
    def ancient_history_mark(self) -> int:
        assert self._sb is not None
        return self._sb.ancient_history_mark

    @property
    def superblock(self) -> Superblock:
        """The superblock as last written (what a crash would recover from)."""
        assert self._sb is not None
        return self._sb

    @property
    def rowsets(self) -> list[RowSetMeta]:
        with self._lock:
            return [rs.meta for rs in self._rowsets]

    @property
    def memrowset_rows(self) -> int:
        return len(self._mrs) if self._mrs is not None else 0

    @property
    def log(self) -> CommittedLog | None:
        return self._log

    @property
    def directory(self) -> FileIO:
        return self._dir

    # -- writes -------------------------------------------------------------------------
    def apply(self, index: int, data: bytes, *, defer_flush: bool = False) -> WriteResult:
        """Apply the committed entry ``index``; non-write and already-applied entries are no-ops.

        Flushes afterwards if the MemRowSet exceeds ``flush_threshold_bytes``. With
        ``defer_flush`` (a caller someone waits on, who flushes later: see
        :meth:`flush_due`) only past ``deferred_flush_max_bytes`` (never below the
        threshold), which bounds the memory.
        """
        with self._lock:
            self._require_running()
            result = self._apply_locked(index, data)
            limit = self._options.flush_threshold_bytes
            if defer_flush and limit:
                limit = max(limit, self._options.deferred_flush_max_bytes)
            self._maybe_flush_locked(limit)
            return result

    def apply_entries(self, records: Iterable[LogRecord | tuple[int, bytes]]) -> list[WriteResult]:
        return [self.apply(*((r.index, r.data) if isinstance(r, LogRecord) else r))
                for r in records]

    def _apply_locked(self, index: int, data: bytes) -> WriteResult:
        if index <= self._applied:
            return WriteResult(index, skipped=True)
        assert self._mrs is not None
        # A failure part-way leaves part of the batch in the MemRowSet: the replica fails.
        try:
            wb = decode_write_batch(data)
        except CorruptionError as e:
            # Every replica holds these same bytes (the log checksums them), so rejecting the
            # entry is deterministic; failing would take down every replica of the tablet.
            self._applied = index
            return WriteResult(index, 0, (RowError(-1, "Corruption", str(e)),))
        with self._failing(f"applying entry {index}"):
            if wb is None:
                self._applied = index
                return WriteResult(index, skipped=True)
            stats = ApplyStats()
            result = apply_batch(self.schema, self._mrs, self._rowsets, index, wb, stats,
                                 self._options.point_lookup_max_fraction)
        self._applied = index
        KEY_INDEXES.note(self._lock, self._rowsets)
        KEY_INDEXES.enforce(self._lock)
        with self._metrics_lock:
            m = self.metrics
            m.entries_applied += 1
            m.rows_applied += result.num_rows
            m.row_errors += len(result.errors)
            m.key_index_loads += stats.index_loads
            m.point_lookups += stats.point_lookups
            m.bloom_checks += stats.bloom_checks
            m.bloom_skips += stats.bloom_skips
            m.rows_fetched_for_update += stats.rows_fetched_for_update
        return result

    def _mrs_over(self, limit: int | None = None) -> bool:
        """Whether the MemRowSet holds ``limit`` bytes or more (default: the flush
        threshold; 0 never)."""
        if limit is None:
            limit = self._options.flush_threshold_bytes
        mrs = self._mrs
        return bool(limit) and mrs is not None and mrs.nbytes >= limit

    def _maybe_flush_locked(self, limit: int | None = None) -> bool:
        return self._flush_locked() if self._mrs_over(limit) else False

    # -- flush --------------------------------------------------------------------------
    def flush(self) -> bool:
        """Persist everything applied so far; returns False if there was nothing to flush."""
        with self._lock:
            self._require_running()
            return self._flush_locked()

    def flush_due(self) -> bool:
        """Whether the MemRowSet reached ``flush_threshold_bytes``: an apply would have
        flushed it had the flush not been deferred (read without the lock: a hint)."""
        return self._mrs_over()

    def flush_if_due(self) -> bool:
        """Flush if :meth:`flush_due` (the deferred flush); returns whether it flushed."""
        with self._lock:
            self._require_running()
            return self._maybe_flush_locked()

    def _flush_locked(self) -> bool:
        sb, mrs = self._sb, self._mrs
        assert sb is not None and mrs is not None
        target = self._applied
        if target == sb.last_flushed_index:
            return False
        with self._failing("flush"):
            crash_point("flush.start")
            next_id = sb.next_rowset_id
            new_rowset: DiskRowSet | None = None
            if len(mrs):
                view = mrs.view()
                table = prepare_versions(sb.schema, view.table(), view.begin, view.end,
                                         sb.ancient_history_mark, mrs.key_order())
                if table.num_rows:
                    hashes = mrs.key_hashes()  # the index's probes, if they are hashes
                    if hashes is not None:
                        hashes = hashes[kept_versions(view.begin, view.end,
                                                      sb.ancient_history_mark)]
                    new_rowset = write_rowset(self._dir, next_id, table, sb.schema,
                                              self._options.row_group_rows,
                                              self._options.bloom_fp_rate, hashes)
                    next_id += 1
                    crash_point("flush.after_rowset")
            deltas: list[tuple[DiskRowSet, DeltaFileMeta]] = []
            for rs in self._rowsets:
                if rs.has_pending():
                    rows, ends = rs.pending()
                    name = delta_file(rs.meta.id, target)
                    write_delta_file(self._dir, name, rows, ends)
                    deltas.append((rs, DeltaFileMeta(name, len(rows), int(ends.min()))))
            crash_point("flush.after_deltas")
            self._dir.fsync_dir("rowsets")
            added = {id(rs): d for rs, d in deltas}
            metas = [replace(rs.meta, deltas=(*rs.meta.deltas, added[id(rs)]))
                     if id(rs) in added else rs.meta for rs in self._rowsets]
            if new_rowset is not None:
                metas.append(new_rowset.meta)
            new_sb = replace(sb, last_flushed_index=target, next_rowset_id=next_id,
                             rowsets=tuple(metas))
            # The atomic replace below is the commit point of the flush (see module doc).
            new_sb.store(self._dir)
            crash_point("flush.after_superblock")
        for rs, d in deltas:
            rs.persisted(d)
        if new_rowset is not None:
            self._rowsets.append(new_rowset)
        self._sb = new_sb
        self._mrs = MemRowSet(sb.schema)
        self._count("flushes")
        release_unused_memory()
        return True

    # -- scans --------------------------------------------------------------------------
    def scan(self, columns: Sequence[str] | None = None,
             predicates: Iterable[Predicate] = (), snapshot: int | None = None,
             batch_rows: int | None = None) -> Generator[pa.RecordBatch, None, None]:
        """Record batches (at most ``batch_rows`` rows each) of the rows visible at ``snapshot``.

        ``columns`` is the projection (default: all, in schema order); ``predicates`` are
        ANDed. Arguments are validated now; the scan is planned and its files opened when
        the iterator first advances (:meth:`open_scan` plans at once).

        Raises:
            NotFoundError: an unknown column.
            InvalidArgumentError: a bad value, or a snapshot below the ancient history mark.
            ServiceUnavailableError: a snapshot above the applied index (replica lagging).
        """
        cols, bound, snap, rows = self._scan_args(columns, predicates, snapshot, batch_rows)
        return self._scan_iter(cols, bound, snap, rows)

    def open_scan(self, columns: Sequence[str] | None = None,
                  predicates: Iterable[Predicate] = (), snapshot: int | None = None,
                  batch_rows: int | None = None) -> TabletScanner:
        """:meth:`scan`, planned now: the rowsets it reads are pinned and their files open
        when this returns, so the caller may release any outer lock and stream afterwards.
        Close the scanner (or exhaust it). Raises as :meth:`scan`."""
        cols, bound, snap, rows = self._scan_args(columns, predicates, snapshot, batch_rows)
        return self._plan_scan(cols, bound, snap, rows)

    def _scan_args(self, columns: Sequence[str] | None, predicates: Iterable[Predicate],
                   snapshot: int | None, batch_rows: int | None
                   ) -> tuple[tuple[str, ...], tuple[Predicate, ...], int, int]:
        with self._lock:
            self._require_running()
            schema = self.schema
            cols = tuple(schema.names if columns is None else columns)
            schema.project(list(cols))
            bound = tuple(p.bind(schema) for p in predicates)
            snap = self._applied if snapshot is None else int(snapshot)
            self._check_snapshot(snap)
        rows = batch_rows or self._options.scan_batch_rows
        if rows < 1:
            raise InvalidArgumentError(f"batch_rows must be at least 1, got {rows}")
        return cols, bound, snap, rows

    def _check_snapshot(self, snap: int) -> None:
        if snap < self.ancient_history_mark:
            raise InvalidArgumentError(
                f"snapshot {snap} is older than tablet {self._tablet_id}'s ancient history mark"
                f" {self.ancient_history_mark}: history before it was compacted away; scan at"
                f" a snapshot >= {self.ancient_history_mark}"
            )
        if snap > self._applied:
            raise ServiceUnavailableError(
                f"tablet {self._tablet_id} has applied entries up to {self._applied}, not"
                f" {snap} yet: retry later or scan another replica"
            )

    def _scan_iter(self, cols: tuple[str, ...], preds: tuple[Predicate, ...], snap: int,
                   rows: int) -> Generator[pa.RecordBatch, None, None]:
        with self._plan_scan(cols, preds, snap, rows) as scanner:
            yield from scanner

    def _plan_scan(self, cols: tuple[str, ...], preds: tuple[Predicate, ...], snap: int,
                   rows: int) -> TabletScanner:
        sources: list[RowSetSource] = []
        try:
            with self._lock:
                self._require_running()
                self._check_snapshot(snap)
                assert self._mrs is not None
                for rs in self._rowsets:
                    if (rs.meta.min_ts > snap
                            or not rowset_may_match(rs.meta, self.schema, preds)):
                        continue
                    rs.pin()
                    try:
                        fragment, f = rs.open_fragment()
                    except BaseException:
                        rs.unpin()
                        raise
                    sources.append(RowSetSource(rs, rs.dead_rows(snap), fragment, f))
                plan = ScanPlan(self.schema, cols, preds, snap, rows, tuple(sources),
                                self._mrs.view() if len(self._mrs) else None)
        except BaseException:
            for src in sources:
                if src.file is not None:
                    src.file.close()
                src.rowset.unpin()
            raise
        return TabletScanner(plan, lambda: self._count("rowset_files_opened"))

    def scan_table(self, columns: Sequence[str] | None = None,
                   predicates: Iterable[Predicate] = (), snapshot: int | None = None) -> pa.Table:
        """:meth:`scan` collected into one table (with the projection's schema)."""
        schema = self.schema.project(None if columns is None else list(columns))
        return pa.Table.from_batches(list(self.scan(columns, predicates, snapshot)),
                                     schema=schema)

    def lookup(self, key: Any, columns: Sequence[str] | None = None,
               snapshot: int | None = None) -> dict[str, Any] | None:
        """The row with primary key ``key`` (scalar, tuple or dict) at ``snapshot``, or None."""
        batches = self.scan(columns, key_predicates(self.schema, key), snapshot)
        try:
            for batch in batches:
                return dict(batch.slice(0, 1).to_pylist()[0])
            return None
        finally:
            batches.close()  # unpins its rowsets now rather than at garbage collection

    # -- log GC and copy anchors --------------------------------------------------------
    def log_gc_index(self, retention_index: int | None = None) -> int:
        """Highest index the log may delete up to: flushed, below ``retention_index`` (the
        lowest index the Raft layer still needs) and below every in-flight copy's tail."""
        with self._lock:
            upto = self.last_flushed_index
            if retention_index is not None:
                upto = min(upto, retention_index - 1)
            if self._anchors:
                upto = min(upto, min(self._anchors.values()) - 1)
            return max(upto, 0)

    def gc_log(self, retention_index: int | None = None) -> int:
        """Let the log drop what :meth:`log_gc_index` allows; returns that index."""
        with self._lock:
            upto = self.log_gc_index(retention_index)
            if self._log is not None and upto > 0:
                self._log.gc(upto)
            return upto

    def pin_for_copy(self) -> CopyPin:
        """Freeze what a tablet copy needs: the persisted superblock, its files (pinned so a
        compaction cannot delete them) and a log anchor keeping entries after its flushed
        index. Release with :meth:`unpin_copy`."""
        with self._lock:
            self._require_running()
            if self._log is None:
                self._flush_locked()  # without a log the tail must be in files
            assert self._sb is not None
            for rs in self._rowsets:
                rs.pin()
            self._next_anchor += 1
            self._anchors[self._next_anchor] = self._sb.last_flushed_index + 1
            return CopyPin(self._sb, tuple(self._rowsets), self._next_anchor, self._applied)

    def unpin_copy(self, pin: CopyPin) -> None:
        with self._lock:
            self._anchors.pop(pin.anchor, None)
        for rs in pin.rowsets:
            rs.unpin()

    def memory_bytes(self) -> tuple[int, int]:
        """Estimated memory this open replica holds: (its MemRowSet, its loaded key indexes,
        kept index sources and bloom filters). Flushing frees the first; closing the tablet
        both.

        Read without the tablet lock (a compaction may hold it for seconds): an estimate of
        a moment, never blocking."""
        mrs = self._mrs
        return (mrs.nbytes if mrs is not None else 0,
                sum(rs.memory_bytes() for rs in list(self._rowsets)))

    def debug_versions(self) -> int:
        """Number of stored versions (rowsets plus MemRowSet), for tests and metrics."""
        with self._lock:
            return int(np.sum([rs.meta.num_rows for rs in self._rowsets])) + self.memrowset_rows
