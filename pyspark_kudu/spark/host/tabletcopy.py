"""Tablet copy between tablet servers: pinned read, Spark shuffle, pinned write (DESIGN §3).

A replica that is new (re-replication adds it empty) or that lags behind what the leader
replica's WAL still holds cannot be caught up entry by entry; it receives a *tablet copy*
(:mod:`pyspark_kudu.tablet.copy`) of a healthy replica instead, as in Kudu:

1. ``COPY_OUT`` runs on the source replica's host, under the replica's lock. It pins the
   source tablet's consistent state (superblock, rowset files, log records after its flush)
   and writes the copy stream to ``<root>/staging/copy-<id>/part-<n>`` files of at most
   ``PART_BYTES`` each (whole chunks per part, each chunk length-prefixed). It answers with
   one ref per part (:class:`~pyspark_kudu.spark.host.dataplane.StagedRef`) and the Raft position
   the copy stands for: the source's *applied* index ``A``, its term, and the configuration
   as of ``A`` (configuration entries are applied with everything else, so the replica's
   durable configuration is the one at its applied index).
2. ``INSTALL_COPY`` runs on the target's host. Its entries carry the part refs, so the
   round's shuffle moves the parts from the source's host (exactly as write batches move);
   a request that brings every part installs them straight from memory; otherwise several
   rounds each bring some parts (bounded memory), kept under ``<tablet>/copy-in/<id>/``,
   and the request that completes the set installs:

   - the target's tablet files are removed (a lagging replica being re-copied) and the
     stream installed (:func:`~pyspark_kudu.tablet.copy.install_tablet_copy`: superblock
     last, so an interrupted install is recognisably incomplete);
   - the installed tablet is opened over the copied log records, marked applied up to ``A``
     (the entries between the copied tablet's last write and ``A`` carry no rows) and flushed,
     so its superblock says "flushed at ``A``" and it needs no log before ``A + 1``;
   - the WAL is replaced by a Raft snapshot at ``(A, term)`` with the copied configuration;
     the replica's own term and vote are kept (a voter must never forget a vote), its commit
     index becomes at least ``A``;
   - ``applied`` is set to ``A`` and the part files removed.

   While the old tablet is being replaced a ``copying`` marker stands in the replica's
   directory; a replica that still has it (the install was interrupted by a crash) is
   refused by every request but another ``INSTALL_COPY``, like a failed one, and replaced.

The copy stands for a committed prefix of the source (only applied, hence committed, state is
copied), so installing it on any replica is safe: Raft's InstallSnapshot.

Thread-safety: each function runs inside one pinned request holding the replica's lock.
"""

from __future__ import annotations

import os
import shutil
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import IO, Any

import google_crc32c

from pyspark_kudu.consensus.messages import (
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.errors import CorruptionError, IllegalStateError, InvalidArgumentError
from pyspark_kudu.fileio import FileIO, make_private_dirs, open_private
from pyspark_kudu.spark.host.dataplane import STAGING_DIR, StagedRef
from pyspark_kudu.spark.host.replica_cache import ReplicaHandle
from pyspark_kudu.tablet import Tablet
from pyspark_kudu.tablet.committed_log import MemoryLog
from pyspark_kudu.tablet.copy import CopyChunk, TabletCopySource, install_tablet_copy
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE

__all__ = ["COPYING_FILE", "PART_BYTES", "CopyOut", "copy_out", "install_copy", "part_refs"]

PART_BYTES = 64 << 20
COPYING_FILE = "copying"
_LEN = struct.Struct(">I")
_COPY_IN = "copy-in"


class CopyOut:
    """What ``COPY_OUT`` answers: the parts' refs and the Raft position of the copy."""

    __slots__ = ("conf_state", "index", "parts", "term")

    def __init__(self, parts: Sequence[StagedRef], index: int, term: int,
                 conf_state: ConfState) -> None:
        self.parts = tuple(parts)
        self.index = index
        self.term = term
        self.conf_state = conf_state


def _check_id(copy_id: str) -> None:
    if not copy_id or os.sep in copy_id or copy_id in (".", "..") or "\0" in copy_id:
        raise InvalidArgumentError(f"bad tablet copy id {copy_id!r}")


def copy_out(root: str, host: str, tablet_id: str, handle: ReplicaHandle, applied: int,
             copy_id: str, part_bytes: int | None = None) -> CopyOut:
    """Source side (see module step 1). ``root`` is this host's data root, ``handle`` the
    replica held locked by the request."""
    _check_id(copy_id)
    part_bytes = part_bytes or PART_BYTES
    if not handle.io.exists(SUPERBLOCK_FILE):
        raise IllegalStateError(
            f"tablet {tablet_id} on {host} has no tablet (a consensus-only replica); it "
            f"cannot be the source of a tablet copy")
    storage = handle.storage
    tablet = handle.open_tablet(root, tablet_id, applied)
    _, conf = storage.initial_state()
    term = storage.term(applied) if applied > 0 else 0
    rel_dir = os.path.join(STAGING_DIR, f"copy-{copy_id}")
    out_dir = os.path.join(root, rel_dir)
    make_private_dirs(out_dir)
    parts: list[StagedRef] = []
    # Chunks are written to the current part file as they come (no part held in memory),
    # its CRC extended piece by piece.
    f: IO[Any] | None = None
    size = crc = 0

    def close_part() -> None:
        nonlocal f
        assert f is not None
        f.close()
        f = None
        name = f"part-{len(parts):06d}"
        parts.append(StagedRef(host, root, os.path.join(rel_dir, name), size, crc, 0, -1))

    try:
        with TabletCopySource(tablet) as src:
            for chunk in src.chunks():
                raw = chunk.to_bytes()
                n = _LEN.size + len(raw)
                if f is not None and size and size + n > part_bytes:
                    close_part()
                if f is None:
                    f = open_private(os.path.join(out_dir, f"part-{len(parts):06d}"), "wb")
                    size = crc = 0
                for piece in (_LEN.pack(len(raw)), raw):
                    f.write(piece)
                    crc = google_crc32c.extend(crc, piece)
                size += n
        if f is not None:
            close_part()
    finally:
        if f is not None:
            f.close()
    return CopyOut(parts, applied, term, conf)


def part_refs(parts: Sequence[StagedRef]) -> tuple[Entry, ...]:
    """The parts as the entries of an ``INSTALL_COPY`` request (refs until delivered)."""
    return tuple(Entry(0, k + 1, EntryType.NORMAL, p.encode()) for k, p in enumerate(parts))


def _chunks(parts: Iterable[bytes], names: Sequence[str]) -> Iterator[CopyChunk]:
    for data, name in zip(parts, names, strict=True):
        view = memoryview(data)
        off = 0
        while off < len(view):
            (n,) = _LEN.unpack_from(view, off)
            off += _LEN.size
            if off + n > len(view):
                raise CorruptionError(f"tablet copy part {name} ends inside a chunk")
            yield CopyChunk.from_bytes(view[off:off + n])
            off += n


def _read(paths: Sequence[str]) -> Iterator[bytes]:
    for path in paths:
        with open(path, "rb") as f:
            yield f.read()


def install_copy(root: str, tablet_id: str, handle: ReplicaHandle, copy_id: str,
                 parts: Sequence[Entry], first_part: int, total_parts: int,
                 snapshot: SnapshotMetadata) -> bool:
    """Target side (see module step 2). ``parts`` are delivered part bytes numbered from
    ``first_part``; returns True once the copy is installed (all ``total_parts`` here)."""
    _check_id(copy_id)
    io: FileIO = handle.io
    storage = handle.storage
    if storage.first_index() - 1 >= snapshot.index or storage.initial_state()[0].commit > \
            snapshot.index:
        raise IllegalStateError(
            f"tablet {tablet_id}: this replica is already at or past index {snapshot.index} "
            f"(log starts after {storage.first_index() - 1}); a copy would take it back")
    in_dir = io.local_path(_COPY_IN, copy_id)
    names = [f"part-{n:06d}" for n in range(total_parts)]
    if first_part == 0 and len(parts) == total_parts:
        # The whole copy in this request: install it from memory, nothing staged here.
        chunks = _chunks((e.data for e in parts), names)
    else:
        # Parts over several requests (bounded memory): kept under copy-in/ until the last
        # arrives. Not synced: a copy id is used by one copy only, and a copy cut short by
        # a crash is started again under a new id (each chunk carries its own CRC).
        make_private_dirs(in_dir)
        for k, e in enumerate(parts):
            path = os.path.join(in_dir, names[first_part + k])
            with open_private(path + ".tmp", "wb") as f:
                f.write(e.data)
            os.replace(path + ".tmp", path)
        paths = [os.path.join(in_dir, n) for n in names]
        if not all(os.path.exists(p) for p in paths):
            return False
        chunks = _chunks(_read(paths), names)
    # Everything is here: replace the replica's tablet by the copy. Until the last step the
    # replica is half old, half new: ``COPYING`` marks it, and a replica found so (a crash
    # mid-install) is treated as failed by every request but another install (peer.py).
    io.atomic_write(copy_id.encode(), COPYING_FILE)
    if handle.tablet is not None:
        handle.tablet.close()
        handle.tablet, handle.tablet_log = None, None
    for name in (SUPERBLOCK_FILE,):
        if io.exists(name):
            os.remove(io.local_path(name))
    shutil.rmtree(io.local_path("rowsets"), ignore_errors=True)
    log = MemoryLog()
    install_tablet_copy(root, chunks, log_sink=log.append)
    tablet = Tablet.open(root, tablet_id, log=log)
    try:
        tablet.apply(snapshot.index, b"")  # no rows between the copy's last write and A
        tablet.flush()
    finally:
        tablet.close()
    hs, _ = storage.initial_state()
    storage.apply_snapshot(Snapshot(snapshot))
    storage.set_hard_state(HardState(hs.term, hs.vote, snapshot.index))
    shutil.rmtree(io.local_path(_COPY_IN), ignore_errors=True)
    os.remove(io.local_path(COPYING_FILE))
    return True
