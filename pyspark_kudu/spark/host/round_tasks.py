"""The executor side of a replication round (:mod:`~pyspark_kudu.spark.replication.spark_rounds`).

What the tasks of a round run on a tablet server's host: serve each tablet server's requests
if this host really holds it (:func:`serve_host`, the instance-file check of DESIGN §1), and
the two sides of the shuffle that delivers staged write batches and tablet-copy parts to the
replicas' hosts (:func:`emit_staged` on the staging host, :func:`land` on the destination).
The driver builds the stages; these functions are what Spark pickles into them, so they
import nothing of the driver side (the executor's daemon pre-imports this module).

Thread-safety: functions only; each call works on its own task's data.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark_kudu.spark.host.dataplane import StagedRef, read_staged
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, handle_requests
from pyspark_kudu.spark.host.identity import current_host, local_data_root, run_pinned
from pyspark_kudu.wal import WalOptions

__all__ = [
    "LAND_BYTES",
    "HostTask",
    "Landed",
    "barrier_partition",
    "barrier_with_data",
    "destination",
    "emit_staged",
    "land",
    "serve_host",
    "unland",
    "where",
]

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostTask:
    host: str
    items: tuple[tuple[str, str | None, tuple[PeerRequest, ...]], ...]
    options: WalOptions | None

def serve_host(task: HostTask, delivered: Mapping[str, bytes] | None = None
                ) -> list[tuple[str, list[PeerResponse] | None, str]]:
    """Executor side: serve each tablet server's requests if this host really holds it."""
    out: list[tuple[str, list[PeerResponse] | None, str]] = []
    for ts_uuid, root_hint, reqs in task.items:
        root = local_data_root(root_hint)
        res = run_pinned(root, ts_uuid,
                         lambda r, reqs=reqs: handle_requests(  # type: ignore[misc]
                             r, reqs, host=current_host(), options=task.options,
                             delivered=delivered))
        out.append((ts_uuid, res.value if res.ok else None, res.misplaced_reason))
    return out

def barrier_partition(it: Iterator[HostTask]) -> Iterator[list[tuple[str, Any, str]]]:
    for task in it:
        yield serve_host(task)

#: Delivered payloads at least this large are *landed* by the shuffle's reduce side: written
#: to a private temporary file on the destination host, which the barrier task of the same
#: Spark task reads back (and removes). Otherwise each would be pickled once more and cross
#: between Python and the JVM twice more on its way to the barrier task (~0.3 s per 60 MB
#: tablet-copy part measured, ``benchmarks/recovery.py``). Write batches stay far below.
LAND_BYTES = 8 << 20


@dataclass(frozen=True)
class Landed:
    path: str  # a temporary file on this host holding the payload


def land(it: Iterator[tuple[int, tuple[str, bytes]]]
          ) -> Iterator[list[tuple[int, tuple[str, bytes | Landed]]]]:
    """Reduce side of a delivery, on the destination host: this partition's payloads as one
    list (the barrier side zips one element per partition), large ones landed."""
    out: list[tuple[int, tuple[str, bytes | Landed]]] = []
    try:
        for d, (path, data) in it:
            if len(data) < LAND_BYTES:
                out.append((d, (path, data)))
                continue
            fd, tmp = tempfile.mkstemp(prefix="pyspark-kudu-delivered-")  # mode 0600
            out.append((d, (path, Landed(tmp))))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
    except BaseException:
        unland(out)
        raise
    yield out


def unland(pairs: Sequence[tuple[int, tuple[str, bytes | Landed]]]) -> None:
    for _, (_, data) in pairs:
        if isinstance(data, Landed):
            with contextlib.suppress(OSError):
                os.remove(data.path)


def barrier_with_data(
    it: Iterator[tuple[HostTask, list[tuple[int, tuple[str, bytes | Landed]]]]],
) -> Iterator[list[tuple[str, Any, str]]]:
    for task, pairs in it:
        try:
            delivered: dict[str, bytes] = {}
            for _, (path, data) in pairs:
                if isinstance(data, Landed):
                    with open(data.path, "rb") as f:
                        delivered[path] = f.read()
                else:
                    delivered[path] = data
            out = serve_host(task, delivered)
        finally:
            unland(pairs)
        yield out

def emit_staged(items: Sequence[tuple[StagedRef, tuple[int, ...]]]
                 ) -> Iterator[tuple[int, tuple[str, bytes]]]:
    """Map side of a delivery: each staged batch this host holds, once per destination.
    A batch missing here is simply not emitted; its replicas report it undelivered."""
    for ref, dests in items:
        data = read_staged(ref)
        if data is None:
            _log.warning("staged batch %s is not on %s", ref.path, current_host())
            continue
        for d in dests:
            yield d, (ref.path, data)

def destination(k: int) -> int:
    return k

def where(_: object) -> str:
    return current_host()
