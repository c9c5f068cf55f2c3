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
2. Answers a Flight stream whose schema metadata (``FILES_KEY``) describes those files
   (path, the visibility conditions and the ended rows of each at the snapshot) and whose
   batches are the scan's MemRowSet rows only (in memory, at most one MemRowSet).

The task opens every linked file, removes the directory (the open descriptors keep the
files readable), and reads them with the same filter the server would apply
(:func:`~pyspark_kudu.spark.host.tserver_client.read_shared`,
:func:`~pyspark_kudu.tablet.scan.rowset_batches`): the same rows, decoded once, in the
process that hands them to Spark. A directory a task never removed (it died between the
answer and opening the files) is removed by the server's next shared scan once it is older
than :data:`STALE_S`.

The server shares only what it can: a replica not on a local file system, or a file it
could not link (another process's compaction deleted it after it was opened), is streamed
as before, and the stream then carries every row (no ``FILES_KEY``). A task that cannot
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
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from pyspark_kudu.spark.host.handlers import tablet_dir
from pyspark_kudu.spark.host.replica_scan import stream_scan
from pyspark_kudu.spark.host.tserver_protocol import FILES_KEY
from pyspark_kudu.tablet import TabletScanner

__all__ = ["SCANS_DIR", "STALE_S", "share_scan", "sweep_stale"]

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
