"""Scans whose rowset files are read by the task itself, when it runs on the replica's host.

A scan through the resident tablet server (:mod:`~pyspark_kudu.spark.host.tablet_server`)
streams every batch over Arrow Flight: the server decodes the rowset files, then both
processes copy the bytes through gRPC and the loopback socket. Measured on the 6-worker
cluster (10M rows, 5 columns, settled; CPU time of every process per full-scan aggregate):
the servers took ~1.5 of the ~6 CPU-s a ``read_table`` scan cost, and a scan there is
CPU-bound on 2 cores. With the files shared, the servers take ~0.1 CPU-s and the tasks
~0.8 CPU-s more (they decode the files), and the scan is ~10% faster.

So a task on the replica's own host asks the server to *share* the scan
(``ScanRequest.share_files``). The server plans it exactly as any other (the replica caught
up to the read point under its lock, rowsets chosen and pinned, the rows deltas ended at or
before the snapshot collected), then:

1. **Hard-links** each rowset file the scan reads into a private directory
   ``<data root>/scans/<random>/`` and releases its pins at once: a compaction may retire
   the rowset now, and the link keeps its bytes (rowset files are immutable).
2. Answers a Flight stream whose schema metadata (:data:`FILES_KEY`) describes those files
   (path, the visibility conditions and the ended rows of each at the snapshot) and whose
   batches are the scan's MemRowSet rows only (in memory, at most one MemRowSet).

The task opens every linked file, removes the directory (the open descriptors keep the
files readable), and reads them with the same filter the server would apply
(:func:`~pyspark_kudu.tablet.scan.rowset_filter`): the same rows, decoded once, in the
process that hands them to Spark. A directory a task never removed (it died between the
answer and opening the files) is removed by the server's next shared scan once it is older
than :data:`STALE_S`.

The server shares only what it can: a replica not on a local file system, or a file it
could not link (another process's compaction deleted it after it was opened), is streamed
as before, and the stream then carries every row (no :data:`FILES_KEY`). A task that cannot
open a linked file fails the attempt on that replica before its first batch (the reader
tries the next replica), never half-way through.

Thread-safety: functions only.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from pyspark_kudu.errors import ServiceUnavailableError
from pyspark_kudu.schema import Predicate, Schema
from pyspark_kudu.spark.host.handlers import tablet_dir
from pyspark_kudu.spark.host.replica_scan import stream_scan
from pyspark_kudu.tablet import TabletScanner
from pyspark_kudu.tablet.scan import combine, fragment_batches, rowset_filter

__all__ = ["FILES_KEY", "SCANS_DIR", "STALE_S", "read_shared", "share_scan", "sweep_stale"]

#: Schema-metadata key of a shared scan's answer: the JSON description of its linked files.
FILES_KEY = b"pyspark_kudu.shared_files"
#: Directory under a data root holding shared scans' links until their task opened them.
SCANS_DIR = "scans"
#: Seconds after which a shared scan's directory is stale (its task died before opening it).
STALE_S = 600.0


def sweep_stale(root: str, now: float | None = None) -> int:
    """Remove the shared-scan directories under ``root`` older than :data:`STALE_S`;
    returns how many were removed."""
    base = os.path.join(root, SCANS_DIR)
    now = time.time() if now is None else now
    removed = 0
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return 0
    for name in names:
        path = os.path.join(base, name)
        with contextlib.suppress(FileNotFoundError):
            if now - os.stat(path).st_mtime > STALE_S:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
    return removed


def share_scan(root: str, tablet_id: str, scanner: TabletScanner
               ) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """The server's side (module docstring): the stream schema and batches answering a
    shared scan planned as ``scanner``. Takes ``scanner`` over: it is closed (pins
    released) once its files are linked, or streamed whole when they cannot be."""
    plan = scanner.plan
    schema = plan.schema.project(list(plan.columns))
    io = tablet_dir(root, tablet_id)
    if not io.is_local or not plan.rowsets:  # nothing to share: the rows are in memory
        return schema, stream_scan(root, tablet_id, scanner)
    try:
        sweep_stale(root)
        links = os.path.join(root, SCANS_DIR, uuid.uuid4().hex)
        os.makedirs(links)
    except OSError:
        return schema, stream_scan(root, tablet_id, scanner)
    files: list[dict[str, Any]] = []
    try:
        for k, src in enumerate(plan.rowsets):
            meta = src.rowset.meta
            path = os.path.join(links, f"{k}.parquet")
            os.link(io.local_path(meta.file), path)
            files.append({"path": path, "max_ts": meta.max_ts, "min_end": meta.min_end,
                          "dead": base64.b64encode(
                              np.ascontiguousarray(src.dead, dtype="<i8").tobytes()).decode()})
    except OSError:
        shutil.rmtree(links, ignore_errors=True)
        return schema, stream_scan(root, tablet_id, scanner)
    user = plan.user_filter()
    mrs = plan.mrs_batches(user)
    scanner.close()  # the links keep the files; compactions need not wait for this scan
    described = json.dumps({"dir": links, "snapshot": plan.snapshot,
                            "schema": plan.schema.to_dict(), "files": files})
    return schema.with_metadata({FILES_KEY: described.encode()}), mrs


def read_shared(described: bytes, columns: Sequence[str] | None,
                predicates: Sequence[Predicate], batch_rows: int
                ) -> Iterator[pa.RecordBatch]:
    """The task's side: opens every file ``described`` (a :data:`FILES_KEY` value) names
    and removes their directory *now*, then returns an iterator reading them with the
    scan's ``columns`` and ``predicates``, ``batch_rows`` rows at most per batch.

    Raises:
        ServiceUnavailableError: a file could not be opened here (nothing was read).
    """
    d = json.loads(described)
    opened: list[tuple[pa.NativeFile, Mapping[str, Any]]] = []
    try:
        for f in d["files"]:
            opened.append((pa.OSFile(f["path"]), f))
    except OSError as e:
        for fh, _ in opened:
            fh.close()
        raise ServiceUnavailableError(
            f"the rowset files a tablet server shared are not readable here ({e})") from e
    finally:
        shutil.rmtree(d["dir"], ignore_errors=True)
    return _read(opened, Schema.from_dict(d["schema"]), int(d["snapshot"]), columns,
                 predicates, batch_rows)


def _read(opened: list[tuple[pa.NativeFile, Mapping[str, Any]]], schema: Schema,
          snapshot: int, columns: Sequence[str] | None, predicates: Sequence[Predicate],
          batch_rows: int) -> Iterator[pa.RecordBatch]:
    try:
        cols = tuple(schema.names if columns is None else columns)
        user = combine([p.bind(schema).to_expression(schema) for p in predicates])
        fmt = ds.ParquetFileFormat()
        for fh, f in opened:
            dead = np.frombuffer(base64.b64decode(f["dead"]), dtype="<i8")
            filt = rowset_filter(user, snapshot, int(f["max_ts"]), f["min_end"], dead)
            yield from fragment_batches(fmt.make_fragment(fh), schema, cols, filt, batch_rows)
    finally:
        for fh, _ in opened:
            fh.close()
