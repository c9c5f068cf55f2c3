"""Scans of one replica on this host: only committed rows, at a snapshot or the latest.

Used by scan tasks that landed on a replica's host and by the host's resident tablet server
(:mod:`~pyspark_kudu.spark.host.tablet_server`) for scans from any other host. A failed
replica (corrupt files, a full or failing disk, an interrupted copy) serves nothing.

Thread-safety: functions only; a scan holds the replica's ``flock`` while it is planned,
not while it streams (its files are pinned and open by then).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pyarrow as pa

from pyspark_kudu.errors import CorruptionError, DiskFullError, ServiceUnavailableError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Predicate
from pyspark_kudu.spark.host.handlers import (
    DISK_ERRNOS,
    failed_reason,
    mark_failed,
    require_replica,
    tablet_dir,
)
from pyspark_kudu.spark.host.identity import current_host
from pyspark_kudu.spark.host.replica_apply import catch_up
from pyspark_kudu.spark.host.replica_cache import open_replica
from pyspark_kudu.spark.host.tabletcopy import COPYING_FILE
from pyspark_kudu.tablet import TabletScanner
from pyspark_kudu.wal import WalOptions

__all__ = ["plan_replica_scan", "scan_replica", "stream_scan"]


def scan_replica(
    root: str, tablet_id: str, columns: Sequence[str] | None,
    predicates: Sequence[Predicate], snapshot: int | None, known_commit: int | None = None,
    options: WalOptions | None = None, batch_rows: int = 65536,
    require_index: int | None = None, *, trusted: bool = True,
    commit_term: int | None = None,
) -> Iterator[pa.RecordBatch]:
    """Scan one replica at ``snapshot`` (default: everything it knows committed).

    The scan is planned now, under the replica's lock: the replica first applies every
    entry it knows committed (:func:`~pyspark_kudu.spark.host.replica_apply.catch_up`: its
    own commit index, or ``known_commit`` from the reader when ``trusted`` -- it is the
    leader's replica -- or when its log holds that entry at ``commit_term``), then the
    rowsets the scan reads are pinned and opened and the lock is released. The returned
    iterator streams batches of at most ``batch_rows`` rows from those files, reading each
    batch when asked for it: a scan's memory does not grow with the tablet, and writes to
    the replica do not wait for a slow reader. Close the iterator if you stop early.

    ``require_index``: the read must see the log up to this index (a linearizable read's
    point); a replica whose log ends before it refuses (ServiceUnavailableError) rather than
    serve less.

    Raises (now, before any batch): ServiceUnavailableError (failed, lagging or missing
    replica), InvalidArgumentError (a snapshot older than the history kept). A disk or
    corruption error while streaming marks the replica failed and raises
    ServiceUnavailableError from the iterator.
    """
    scanner = plan_replica_scan(root, tablet_id, columns, predicates, snapshot, known_commit,
                                options, batch_rows, require_index, trusted=trusted,
                                commit_term=commit_term)
    return stream_scan(root, tablet_id, scanner)


def plan_replica_scan(
    root: str, tablet_id: str, columns: Sequence[str] | None,
    predicates: Sequence[Predicate], snapshot: int | None, known_commit: int | None = None,
    options: WalOptions | None = None, batch_rows: int = 65536,
    require_index: int | None = None, *, trusted: bool = True,
    commit_term: int | None = None,
) -> TabletScanner:
    """The first half of :func:`scan_replica`: the scan planned (caught up, rowsets pinned
    and open), not yet streamed. Stream it with :func:`stream_scan`, or close it."""
    io = tablet_dir(root, tablet_id)
    require_replica(io, tablet_id)
    why = failed_reason(io) or (
        "a tablet copy into it was interrupted" if io.exists(COPYING_FILE) else None)
    if why is not None:
        raise ServiceUnavailableError(
            f"replica of tablet {tablet_id} under {root} is failed and serves nothing ({why})")
    with _failing_replica(root, io, tablet_id, "planning a scan"):
        return _open_scan(root, io, tablet_id, columns, predicates, snapshot, known_commit,
                          options, batch_rows, require_index, trusted, commit_term)


def stream_scan(root: str, tablet_id: str, scanner: TabletScanner) -> Iterator[pa.RecordBatch]:
    """The batches of a planned scan; a disk or corruption error while streaming marks the
    replica failed (ServiceUnavailableError)."""
    return _stream(root, tablet_dir(root, tablet_id), tablet_id, scanner)


@contextlib.contextmanager
def _failing_replica(root: str, io: FileIO, tablet_id: str, doing: str) -> Iterator[None]:
    """A disk or corruption error marks the replica failed (it serves nothing from now on)."""
    try:
        yield
    except (CorruptionError, DiskFullError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in DISK_ERRNOS:
            raise
        mark_failed(io, f"{type(e).__name__}: {e}")
        raise ServiceUnavailableError(
            f"replica of tablet {tablet_id} under {root} failed {doing} ({e}); it "
            f"serves nothing from now on") from e


def _stream(root: str, io: FileIO, tablet_id: str, scanner: TabletScanner
            ) -> Iterator[pa.RecordBatch]:
    with scanner, _failing_replica(root, io, tablet_id, "during a scan"):
        yield from scanner


def _open_scan(
    root: str, io: FileIO, tablet_id: str, columns: Sequence[str] | None,
    predicates: Sequence[Predicate], snapshot: int | None, known_commit: int | None,
    options: WalOptions | None, batch_rows: int, require_index: int | None,
    trusted: bool, commit_term: int | None,
) -> TabletScanner:
    with open_replica(root, io, tablet_id, options, mutate=False) as handle:
        storage = handle.storage
        if require_index is not None and storage.last_index() < require_index:
            raise ServiceUnavailableError(
                f"replica of tablet {tablet_id} under {root} holds the log up to "
                f"{storage.last_index()}, the read needs {require_index}: retry the read")
        applied = catch_up(root, tablet_id, io, handle, known_commit, trusted=trusted,
                           commit_term=commit_term, host=current_host())
        if handle.tablet is None:
            handle.will_mutate()  # a bootstrap may flush
        tablet = handle.open_tablet(root, tablet_id, applied)
        return tablet.open_scan(columns, predicates, snapshot, batch_rows)
