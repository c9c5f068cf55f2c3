"""Tablet copy between tablet servers: host to host through the resident tablet servers,
or by Spark shuffle where there is none (DESIGN §1, §3).

A replica that is new (re-replication adds it empty) or that lags behind what the leader
replica's WAL still holds cannot be caught up entry by entry; it receives a *tablet copy*
(:mod:`pyspark_kudu.tablet.copy`) of a healthy replica instead, as in Kudu:

1. ``COPY_OUT`` runs on the source replica's host, under the replica's lock. It pins the
   source tablet's consistent state (superblock, rowset files, log records after its flush)
   and answers the Raft position the copy stands for: the source's *applied* index ``A``,
   its term, and the configuration as of ``A`` (configuration entries are applied with
   everything else, so the replica's durable configuration is the one at its applied
   index). How the bytes wait depends on the path:

   - **served** (the default when this host's resident tablet server is known, i.e.
     ``PYSPARK_KUDU_TSERVER_ADDRESS`` and the credential are in the environment): the tablet
     is flushed (so the copy is files plus a short log tail), the pinned files are
     hard-linked and the rest of the stream written once under
     ``<tablet>/copy-out/<id>/``, and the answer is one small manifest entry (the server's
     address, file names, sizes, CRC32Cs; :mod:`~pyspark_kudu.spark.host.copy_fetch`);
   - **shuffled** (no resident server here, e.g. ``local[*]`` virtual tablet servers
     without one, or the request's ``as_refs``: the leader's fallback after a served copy
     failed): the copy stream goes to ``<root>/staging/copy-<id>/part-<n>`` files of at most
     ``PART_BYTES`` each (whole chunks per part, each chunk length-prefixed), answered as one
     ref per part (:class:`~pyspark_kudu.spark.host.dataplane.StagedRef`).
2. ``INSTALL_COPY`` runs on the target's host. A served copy is fetched first, before the
   replica's lock is taken: every file streamed from the source's resident server straight
   to ``<tablet>/copy-in/<id>/`` (bounded memory, size and CRC32C checked, each file fsynced;
   several files and tablets at once within a bandwidth cap, see ``copy_fetch``); a fetch
   that fails removes what it fetched and refuses the request, nothing installed. Shuffled
   parts travel as the entries' refs in the round's shuffle (exactly as write batches move);
   a request that brings every part installs them straight from memory, otherwise several
   rounds each bring some parts (bounded memory), kept under ``<tablet>/copy-in/<id>/``.
   The request that completes the set installs, the same way for both paths:

   - the target's tablet files are removed (a lagging replica being re-copied) and the
     stream installed (:func:`~pyspark_kudu.tablet.copy.install_tablet_copy`: fetched files
     moved into place, then the superblock last, so an interrupted install is recognisably
     incomplete);
   - the installed tablet is opened over the copied log records, marked applied up to ``A``
     (the entries between the copied tablet's last write and ``A`` carry no rows) and flushed,
     so its superblock says "flushed at ``A``" and it needs no log before ``A + 1``;
   - the WAL is replaced by a Raft snapshot at ``(A, term)`` with the copied configuration;
     the replica's own term and vote are kept (a voter must never forget a vote), its commit
     index becomes at least ``A``; a replica already at or past ``A`` refuses the copy
     (never taken back in time);
   - ``applied`` is set to ``A`` and the part or fetched files removed.

   While the old tablet is being replaced a ``copying`` marker stands in the replica's
   directory; a replica that still has it (the install was interrupted by a crash) is
   refused by every request but another ``INSTALL_COPY``, like a failed one, and replaced.
3. ``DROP_COPY`` (deferred to the leader's next round on the source host) removes the
   staged parts or links.

The copy stands for a committed prefix of the source (only applied, hence committed, state is
copied), so installing it on any replica is safe: Raft's InstallSnapshot.

Thread-safety: each function runs inside one pinned request holding the replica's lock.
"""

from __future__ import annotations

import os
import shutil
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
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
from pyspark_kudu.errors import (
    CorruptionError,
    IllegalStateError,
    KuduError,
)
from pyspark_kudu.fileio import FileIO, make_private_dirs, open_private
from pyspark_kudu.spark.host.copy_fetch import (
    COPY_IN_DIR,
    ServedCopy,
    check_copy_id,
    drop_served,
    fetch_served_copies,
    fetched_files,
    served_source,
    stage_served,
)
from pyspark_kudu.spark.host.dataplane import STAGING_DIR, StagedRef, remove_staging
from pyspark_kudu.spark.host.identity import read_instance
from pyspark_kudu.spark.host.replica_cache import ReplicaHandle
from pyspark_kudu.tablet import Tablet
from pyspark_kudu.tablet.committed_log import MemoryLog
from pyspark_kudu.tablet.copy import CopyChunk, TabletCopySource, install_tablet_copy
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE
from pyspark_kudu.wal.meta import META_FILE

__all__ = ["COPYING_FILE", "PART_BYTES", "CopyFetch", "CopyOut", "copy_out", "drop_copy",
           "fetch_copies", "install_copy", "part_refs", "served_copy"]

PART_BYTES = 64 << 20
COPYING_FILE = "copying"
_LEN = struct.Struct(">I")
_COPY_IN = COPY_IN_DIR


class CopyOut:
    """What ``COPY_OUT`` answers: the parts' refs (or a served copy's manifest) and the Raft
    position of the copy; ``flush_s``: the seconds spent flushing the source's MemRowSet
    first (a served copy)."""

    __slots__ = ("conf_state", "flush_s", "index", "parts", "served", "term")

    def __init__(self, parts: Sequence[StagedRef], index: int, term: int,
                 conf_state: ConfState, served: ServedCopy | None = None,
                 flush_s: float = 0.0) -> None:
        self.parts = tuple(parts)
        self.index = index
        self.term = term
        self.conf_state = conf_state
        self.served = served
        self.flush_s = flush_s

    def entries(self) -> tuple[Entry, ...]:
        """The ``INSTALL_COPY`` entries: one manifest (served) or one ref per part."""
        if self.served is not None:
            return (Entry(0, 1, EntryType.NORMAL, self.served.encode()),)
        return part_refs(self.parts)


def copy_out(root: str, host: str, tablet_id: str, handle: ReplicaHandle, applied: int,
             copy_id: str, part_bytes: int | None = None, served: bool = True) -> CopyOut:
    """Source side (see module step 1). ``root`` is this host's data root, ``handle`` the
    replica held locked by the request. ``served``: stage a served copy when this host's
    resident server is known (else, or without ``served``, parts for a shuffle)."""
    check_copy_id(copy_id)
    part_bytes = part_bytes or PART_BYTES
    if not handle.io.exists(SUPERBLOCK_FILE):
        raise IllegalStateError(
            f"tablet {tablet_id} on {host} has no tablet (a consensus-only replica); it "
            f"cannot be the source of a tablet copy")
    storage = handle.storage
    tablet = handle.open_tablet(root, tablet_id, applied)
    _, conf = storage.initial_state()
    term = storage.term(applied) if applied > 0 else 0
    source = served_source() if served and handle.io.is_local else None
    ts_uuid = read_instance(root) if source is not None else None
    if source is not None and ts_uuid:
        # Flushed first: the MemRowSet's rows then travel as a rowset file (linked, not
        # re-encoded), and the target installs files instead of replaying a log tail and
        # writing the same rowset itself.
        started = time.perf_counter()
        tablet.flush()
        flush_s = time.perf_counter() - started
        with TabletCopySource(tablet) as src:
            copy = stage_served(handle.io, src, tablet_id, copy_id, source[0], ts_uuid, root,
                                _framed(src.chunks(with_files=False)))
        return CopyOut((), applied, term, conf, copy, flush_s)
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


def _framed(chunks: Iterable[CopyChunk]) -> Iterator[bytes]:
    for chunk in chunks:
        raw = chunk.to_bytes()
        yield _LEN.pack(len(raw))
        yield raw


def drop_copy(root: str, io: FileIO, copy_id: str) -> None:
    """Remove what ``COPY_OUT`` staged for copy ``copy_id`` on this host (either path)."""
    check_copy_id(copy_id)
    remove_staging(root, [f"copy-{copy_id}"])
    drop_served(io, copy_id)


@dataclass(frozen=True)
class CopyFetch:
    """What :func:`fetch_copies` did for one ``INSTALL_COPY``: why its fetch failed (None:
    fetched, or nothing to fetch) and, for a served copy, its manifest's total bytes."""

    error: KuduError | None = None
    total_bytes: int | None = None


def fetch_copies(root: str, installs: Sequence[tuple[str, Sequence[Entry]]]
                 ) -> tuple[list[CopyFetch], tuple[float, float]]:
    """Fetch the served copies among ``installs`` (``INSTALL_COPY`` tablet ids and entries)
    into their replicas under ``root``, all at once (:func:`copy_fetch.fetch_served_copies`).
    Returns a :class:`CopyFetch` per install, and the fetch's wall-clock start and end
    (equal if nothing was fetched). Replicas that do not exist here are skipped (their
    request is refused anyway)."""
    out = [CopyFetch()] * len(installs)
    todo = []
    for k, (tablet_id, entries) in enumerate(installs):
        copy = served_copy(entries)
        if copy is None:
            continue
        out[k] = CopyFetch(total_bytes=copy.total_bytes)
        io = FileIO(root).child("tablets", tablet_id)
        if io.is_local and io.exists(META_FILE):
            todo.append((k, io, copy))
    if not todo:
        now = time.time()
        return out, (now, now)
    report = fetch_served_copies(root, [(io, c) for _, io, c in todo])
    for (k, _, _), err in zip(todo, report.errors, strict=True):
        out[k] = replace(out[k], error=err)
    return out, (report.started, report.ended)


def served_copy(entries: Sequence[Entry]) -> ServedCopy | None:
    """The served copy an ``INSTALL_COPY`` carries, or None (shuffled parts)."""
    return ServedCopy.decode(entries[0].data) if len(entries) == 1 else None


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
    check_copy_id(copy_id)
    io: FileIO = handle.io
    storage = handle.storage
    if storage.first_index() - 1 >= snapshot.index or storage.initial_state()[0].commit > \
            snapshot.index:
        shutil.rmtree(io.local_path(_COPY_IN, copy_id), ignore_errors=True)  # fetched
        raise IllegalStateError(
            f"tablet {tablet_id}: this replica is already at or past index {snapshot.index} "
            f"(log starts after {storage.first_index() - 1}); a copy would take it back")
    in_dir = io.local_path(_COPY_IN, copy_id)
    names = [f"part-{n:06d}" for n in range(total_parts)]
    prefetched: dict[str, str] | None = None
    served = served_copy(parts)
    if served is not None:
        # A served copy: fetched before this request took the replica's lock (copy_fetch).
        tail, prefetched = fetched_files(io, served)
        chunks = _chunks(_read([tail]), [tail])
    elif first_part == 0 and len(parts) == total_parts:
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
    install_tablet_copy(root, chunks, log_sink=log.append, prefetched=prefetched)
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
