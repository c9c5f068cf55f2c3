"""Scans of one replica on this host: only committed rows, at a snapshot or the latest.

Used by scan tasks that landed on a replica's host and by the host's resident tablet server
(:mod:`~pyspark_kudu.spark.host.tablet_server`) for scans from any other host. A failed
replica (corrupt files, a full or failing disk, an interrupted copy) serves nothing.

Thread-safety: functions only; a scan holds the replica's ``flock`` while it reads.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from pyspark_kudu.errors import CorruptionError, DiskFullError, ServiceUnavailableError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Predicate
from pyspark_kudu.spark.host.handlers import (
    DISK_ERRNOS,
    failed_reason,
    mark_failed,
    read_applied,
    require_replica,
    tablet_dir,
)
from pyspark_kudu.spark.host.replica_cache import open_replica
from pyspark_kudu.spark.host.tabletcopy import COPYING_FILE
from pyspark_kudu.spark.host.wal_committed_log import WalCommittedLog
from pyspark_kudu.tablet import Tablet
from pyspark_kudu.wal import WalOptions

__all__ = ["scan_replica"]


def scan_replica(
    root: str, tablet_id: str, columns: Sequence[str] | None,
    predicates: Sequence[Predicate], snapshot: int | None, known_commit: int | None = None,
    options: WalOptions | None = None, batch_rows: int = 65536,
    require_index: int | None = None,
) -> list[bytes]:
    """Scan one replica at ``snapshot`` (default: everything it knows committed).

    ``require_index``: the read must see the log up to this index (a linearizable read's
    point); a replica whose log ends before it refuses (ServiceUnavailableError) rather than
    serve less.

    Returns Arrow IPC streams (one per output batch) so results travel as task results.
    Only committed entries are ever visible: the scan reads the replica's own tablet when it
    has applied everything committed (its commit index, or ``known_commit`` from the
    client), else a tablet rebuilt from the WAL bounded by that index
    (:class:`WalCommittedLog`).
    """
    io = tablet_dir(root, tablet_id)
    require_replica(io, tablet_id)
    why = failed_reason(io) or (
        "a tablet copy into it was interrupted" if io.exists(COPYING_FILE) else None)
    if why is not None:
        raise ServiceUnavailableError(
            f"replica of tablet {tablet_id} under {root} is failed and serves nothing ({why})")
    try:
        return _scan_open(root, io, tablet_id, columns, predicates, snapshot, known_commit,
                          options, batch_rows, require_index)
    except (CorruptionError, DiskFullError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in DISK_ERRNOS:
            raise
        mark_failed(io, f"{type(e).__name__}: {e}")
        raise ServiceUnavailableError(
            f"replica of tablet {tablet_id} under {root} failed during a scan ({e}); it "
            f"serves nothing from now on") from e


def _scan_open(
    root: str, io: FileIO, tablet_id: str, columns: Sequence[str] | None,
    predicates: Sequence[Predicate], snapshot: int | None, known_commit: int | None,
    options: WalOptions | None, batch_rows: int, require_index: int | None = None,
) -> list[bytes]:
    # Opening a tablet may flush, hence ``mutate``.
    with open_replica(root, io, tablet_id, options, mutate=True) as handle:
        storage = handle.storage
        if require_index is not None and storage.last_index() < require_index:
            raise ServiceUnavailableError(
                f"replica of tablet {tablet_id} under {root} holds the log up to "
                f"{storage.last_index()}, the read needs {require_index}: retry the read")
        target = storage.initial_state()[0].commit
        if known_commit is not None:
            target = max(target, min(known_commit, storage.last_index()))
        applied = read_applied(io)
        own = applied < target
        if own:
            # The replica has not applied everything the reader may see: a tablet rebuilt
            # from the WAL up to the target, for this scan only.
            tablet = Tablet.open(root, tablet_id,
                                 log=WalCommittedLog(storage, known_commit=known_commit))
        else:
            # The replica's own tablet is current: reuse (and keep) it, as the write path does.
            if handle.tablet is None:
                handle.tablet_log = WalCommittedLog(storage, upto=applied)
                handle.tablet = Tablet.open(root, tablet_id, log=handle.tablet_log)
            tablet = handle.tablet
        try:
            out = []
            for batch in tablet.scan(columns, predicates, snapshot, batch_rows):
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, batch.schema) as w:
                    w.write_batch(batch)
                out.append(sink.getvalue().to_pybytes())
            return out
        finally:
            if own:
                tablet.close()
