"""Served tablet copies: a copy's bytes go host to host through the resident tablet servers.

The fast path of :mod:`~pyspark_kudu.spark.host.tabletcopy` (DESIGN §1: file streams are the
resident tablet server's job). No Spark shuffle, no driver, no Python -> JVM -> Python hop:

1. **Source** (``COPY_OUT``, replica lock held, :func:`stage_served`): the pinned files of the
   copy (rowset and delta files, immutable once written) are *hard-linked* under
   ``<tablet>/copy-out/<copy id>/files/`` (copied once where a link is impossible, e.g.
   across file systems), so a compaction that deletes the originals meanwhile changes
   nothing; the rest of the copy stream (begin, the log records after the flush, the
   superblock: small) is written once to ``copy-out/<copy id>/tail``. Each file's size and
   the CRC32C of each of its segments (taken as the file was written,
   :mod:`~pyspark_kudu.tablet.checksums`; computed now only for a file this process did
   not write or has forgotten) go into a :class:`ServedCopy` manifest with this
   host's resident server address, its tablet-server uuid and data root: the only thing
   the round carries (an entry of a few hundred bytes instead of the part bytes).
2. **Target** (:func:`prefetch_served`, asked by the driver as soon as the source answered;
   else ``INSTALL_COPY``, before the replica lock is taken, :func:`fetch_served_copies`):
   the target host's resident server (or the pinned task serving the round) pulls every
   file from the source's server into ``<tablet>/copy-in/<copy id>/``, holding that copy's
   lock file: over the server's raw file streams
   (:mod:`~pyspark_kudu.spark.host.file_stream`: ``sendfile`` at the source, one reused,
   page-aligned 4 MiB buffer per stream at the target, written with ``O_DIRECT`` where
   aligned; :mod:`~pyspark_kudu.spark.host.copy_segments`), or, where the source has none
   (TLS), over
   Flight ``DoGet`` (:func:`~pyspark_kudu.spark.host.tserver_client.fetch_file_buffers`, a
   few 4 MiB batches in memory per stream); each file in segments of ``SEGMENT_BYTES``
   (32 MiB) fetched as separate streams written in place, every segment's size and CRC32C
   checked against the manifest, each file fsynced once when complete. The segments of
   every file of every copy the task installs are fetched concurrently, at most
   ``PYSPARK_KUDU_COPY_STREAMS`` (default 4) streams at a time, together at most
   ``PYSPARK_KUDU_COPY_MAX_MB_S`` MB/s per process (default 0: no cap) -- both read from
   the environment of the process serving the round (``spark.executorEnv.*``). When every
   file is in, a ``fetched`` marker is written (with the fetch's window; an install that
   finds it fetches nothing); only then may the install (replica lock held,
   :func:`~pyspark_kudu.spark.host.tabletcopy.install_copy`) move the files into place and
   write the superblock last, exactly as for a shuffled copy.

A fetch that fails (the source server unreachable or gone, a short or damaged file, a
refused credential) removes everything it fetched and fails that ``INSTALL_COPY`` with the
reason; nothing of the replica is touched. The leader then falls back to the shuffle path
for its next copy (``COPY_OUT`` with ``as_refs``; see
:mod:`~pyspark_kudu.spark.replication.leader_membership`). A full or failing disk while
fetching marks the target replica failed, as any write to it would.

Thread-safety: :func:`fetch_served_copies` runs its streams on its own threads and returns
when they are done; the rate cap is process-wide and thread-safe.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import google_crc32c

from pyspark_kudu.errors import (
    DiskFullError,
    IllegalStateError,
    InvalidArgumentError,
    IOError_,
    KuduError,
)
from pyspark_kudu.fileio import FileIO, make_private_dirs, open_private
from pyspark_kudu.rpc.auth import secret_from_env
from pyspark_kudu.spark.host import copy_traffic
from pyspark_kudu.spark.host.copy_segments import fetch_segment
from pyspark_kudu.spark.host.file_stream import STREAM_ADDRESS_ENV
from pyspark_kudu.spark.host.tserver_protocol import ADDRESS_ENV, FileRequest
from pyspark_kudu.tablet import checksums
from pyspark_kudu.tablet.copy import TabletCopySource

__all__ = [
    "COPY_IN_DIR",
    "COPY_OUT_DIR",
    "MAX_RATE_ENV",
    "STREAMS_ENV",
    "FetchReport",
    "ServedCopy",
    "ServedFile",
    "check_copy_id",
    "fetch_served_copies",
    "fetched_files",
    "prefetch_served",
    "served_source",
    "stage_served",
]

_log = logging.getLogger(__name__)

SERVED_MAGIC = b"\x00KCPY1"
COPY_OUT_DIR = "copy-out"
COPY_IN_DIR = "copy-in"
TAIL = "tail"
_FETCHED = "fetched"
STREAMS_ENV = "PYSPARK_KUDU_COPY_STREAMS"
MAX_RATE_ENV = "PYSPARK_KUDU_COPY_MAX_MB_S"
_DEFAULT_STREAMS = 4
_STALE_S = 3600.0  # a copy-out older than this was abandoned (its driver died before DROP)


@dataclass(frozen=True)
class ServedFile:
    name: str  # relative to the tablet directory; TAIL for the copy stream's tail
    size: int
    crcs: tuple[int, ...]  # CRC32C of each checksums.SEGMENT_BYTES segment (the last shorter)

    def segments(self) -> list[tuple[int, int, int]]:
        """``(offset, length, crc)`` of each segment: fetched as separate streams (one large
        rowset file uses several)."""
        seg = checksums.SEGMENT_BYTES
        return [(k * seg, min(seg, self.size - k * seg), c) for k, c in enumerate(self.crcs)]


@dataclass(frozen=True)
class ServedCopy:
    """Where a staged copy's files wait, on which resident server: the ``INSTALL_COPY``
    entry of the served path (the tail first, then the files)."""

    address: str
    ts_uuid: str
    root: str
    tablet_id: str
    copy_id: str
    files: tuple[ServedFile, ...]
    #: The source's file stream server (:mod:`~pyspark_kudu.spark.host.file_stream`), which
    #: the target fetches from; "" (TLS, or a source without one): Flight at ``address``.
    stream: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def source_path(self, f: ServedFile) -> str:
        """The file's path under the source tablet's directory."""
        tail = f.name if f.name == TAIL else os.path.join("files", f.name)
        return os.path.join(COPY_OUT_DIR, self.copy_id, tail)

    def encode(self) -> bytes:
        return SERVED_MAGIC + json.dumps(
            [self.address, self.ts_uuid, self.root, self.tablet_id, self.copy_id,
             [[f.name, f.size, list(f.crcs)] for f in self.files], self.stream]).encode()

    @staticmethod
    def decode(data: bytes) -> ServedCopy | None:
        """The manifest in an entry's data, or None if it is not one."""
        if not data.startswith(SERVED_MAGIC):
            return None
        address, ts, root, tablet, copy_id, files, *rest = json.loads(
            data[len(SERVED_MAGIC):])
        return ServedCopy(str(address), str(ts), str(root), str(tablet), str(copy_id),
                          tuple(ServedFile(str(n), int(s), tuple(int(c) for c in cs))
                                for n, s, cs in files), str(rest[0]) if rest else "")


def served_source() -> tuple[str, bytes] | None:
    """This host's resident server address and the cluster credential, if both are known
    here (else a copy must travel by shuffle)."""
    address, secret = os.environ.get(ADDRESS_ENV, ""), secret_from_env()
    return (address, secret) if address and secret else None


def stage_served(io: FileIO, src: TabletCopySource, tablet_id: str, copy_id: str,
                 address: str, ts_uuid: str, root: str, tail: Iterable[bytes]) -> ServedCopy:
    """Source side (module step 1): link the pinned files of ``src`` and write ``tail`` (the
    copy stream without file chunks, framed) under ``<tablet>/copy-out/<copy_id>/``."""
    _sweep_stale(io)
    out = io.local_path(COPY_OUT_DIR, copy_id)
    # A COPY_OUT run again with the same id (its round was retried) starts over: linking
    # onto the first attempt's links would fail, and its tail may be older.
    shutil.rmtree(out, ignore_errors=True)
    make_private_dirs(out)
    size = 0
    tail_crcs = checksums.SegmentCrcs()  # as it is written: not read back
    with open_private(os.path.join(out, TAIL), "wb") as f:
        for piece in tail:
            f.write(piece)
            tail_crcs.update(piece)
            size += len(piece)
    files = [ServedFile(TAIL, size, tail_crcs.value())]
    for name, size in src.files().items():
        dest = os.path.join(out, "files", name)
        make_private_dirs(os.path.dirname(dest))
        try:
            os.link(io.local_path(name), dest)
        except OSError:
            shutil.copyfile(io.local_path(name), dest)  # another file system: copy once
        if os.path.getsize(dest) != size:
            raise IllegalStateError(f"tablet {tablet_id}: pinned file {name} changed size "
                                    f"while being copied; retry the copy")
        # Written by this process: its checksums were taken as it was written.
        files.append(ServedFile(name, size, checksums.segment_crcs(dest)))
    return ServedCopy(address, ts_uuid, root, tablet_id, copy_id, tuple(files),
                      os.environ.get(STREAM_ADDRESS_ENV, ""))


def _sweep_stale(io: FileIO) -> None:
    base = io.local_path(COPY_OUT_DIR)
    with contextlib.suppress(OSError):
        for name in os.listdir(base):
            path = os.path.join(base, name)
            if time.time() - os.path.getmtime(path) > _STALE_S:
                shutil.rmtree(path, ignore_errors=True)


def drop_served(io: FileIO, copy_id: str) -> None:
    """Remove the staged (linked) files of copy ``copy_id`` on the source."""
    if io.is_local:
        shutil.rmtree(io.local_path(COPY_OUT_DIR, copy_id), ignore_errors=True)


def _settings() -> tuple[int, float]:
    try:
        streams = max(1, int(os.environ.get(STREAMS_ENV) or _DEFAULT_STREAMS))
        rate = float(os.environ.get(MAX_RATE_ENV) or 0) * 1e6
    except ValueError as e:
        raise InvalidArgumentError(f"bad {STREAMS_ENV} / {MAX_RATE_ENV} setting: {e}") from e
    return streams, rate


def fetched_files(io: FileIO, copy: ServedCopy) -> tuple[str, dict[str, str]]:
    """(Target.) The local paths of a fetched copy: its tail, and the files by name.

    Raises:
        IllegalStateError: the copy was not (completely) fetched here.
    """
    base = io.local_path(COPY_IN_DIR, copy.copy_id)
    if _fetched_window(io, copy) is None:
        raise IllegalStateError(
            f"tablet copy {copy.copy_id} of {copy.tablet_id} was not fetched from "
            f"{copy.address}; nothing installed")
    return (os.path.join(base, TAIL),
            {f.name: os.path.join(base, "files", f.name) for f in copy.files if f.name != TAIL})


@dataclass(frozen=True)
class FetchReport:
    """What :func:`fetch_served_copies` did: per copy, None (fetched, ``fetched_files`` finds
    it) or the error (its partial files removed); and when the fetch ran, wall clock
    (``time.time()``, comparable between the hosts of a cluster with synchronised clocks),
    from the first stream opened to the last file synced."""

    errors: list[KuduError | None]
    started: float
    ended: float


def fetch_served_copies(root: str, copies: Sequence[tuple[FileIO, ServedCopy]]
                        ) -> FetchReport:
    """Target side (module step 2): fetch each copy into its replica's ``copy-in/`` under
    ``root``, all of them together (see :class:`FetchReport`).

    A copy fetched here already (by :func:`prefetch_served`: its ``fetched`` marker is
    there) is not fetched again; the report's window then includes that fetch. Each copy's
    fetch holds the lock file ``copy-in/<copy id>.lock`` (``flock``), so a prefetch and an
    install never write one copy at once, in one process or two: the second waits, then
    finds the copy fetched (or fetches it, if the first failed and removed its files)."""
    errors: list[KuduError | None] = [None] * len(copies)
    for k, (_, copy) in enumerate(copies):
        try:
            check_copy_id(copy.copy_id)
        except InvalidArgumentError as e:
            errors[k] = e
    valid = [k for k, e in enumerate(errors) if e is None]
    with contextlib.ExitStack() as held:
        for k in sorted(valid, key=lambda k: copies[k][1].copy_id):
            held.enter_context(_copy_lock(*copies[k], wait=True))
        windows = {k: _fetched_window(*copies[k]) for k in valid}
        todo = [k for k in valid if windows[k] is None]
        report = _fetch_all([copies[k] for k in todo])
    for k, err in zip(todo, report.errors, strict=True):
        errors[k] = err
    spans = [w for w in windows.values() if w is not None] + (
        [(report.started, report.ended)] if todo else [])
    if not spans:
        now = time.time()
        return FetchReport(errors, now, now)
    return FetchReport(errors, min(s for s, _ in spans), max(e for _, e in spans))


def prefetch_served(io: FileIO, copy: ServedCopy,
                    busy: Callable[[], contextlib.AbstractContextManager[Any]] | None = None
                    ) -> threading.Thread:
    """Start fetching ``copy`` into the replica at ``io`` on a thread of this process, ahead
    of the round that installs it: the resident server does this when the leader's client
    has the copy's manifest (``COPY_OUT``'s answer; ``tablet_server``'s ``prefetch_copy``
    action), so the bytes move while the driver and Spark set up the install round, and no
    Spark task launch sits between the targets' starts. The install then finds it fetched
    (:func:`fetch_served_copies`). The thread does nothing if another fetch of the copy
    holds its lock or it is fetched already; a failed prefetch removes what it fetched,
    and the install fetches the copy itself. ``busy()`` is held around the fetch (the
    resident server's: its background applier lets the fetch go first, as it does a
    request's: a copy restores fault tolerance, the applies it defers only settle)."""
    def run() -> None:
        with _copy_lock(io, copy, wait=False) as got:
            if not got or _fetched_window(io, copy) is not None:
                return
            with busy() if busy is not None else contextlib.nullcontext():
                report = _fetch_all([(io, copy)])
        if report.errors[0] is not None:
            _log.info("prefetching tablet copy %s of %s failed (the install fetches it): "
                      "%s", copy.copy_id, copy.tablet_id, report.errors[0])

    t = threading.Thread(target=run, daemon=True, name="kudu-copy-prefetch")
    t.start()
    return t


def check_copy_id(copy_id: str) -> None:
    """A copy id names files and directories: one path component, nothing else."""
    if not copy_id or os.sep in copy_id or copy_id in (".", "..") or "\0" in copy_id:
        raise InvalidArgumentError(f"bad tablet copy id {copy_id!r}")


@contextlib.contextmanager
def _copy_lock(io: FileIO, copy: ServedCopy, wait: bool) -> Iterator[bool]:
    """Hold ``copy-in/<copy id>.lock``; yields False if ``wait`` is off and another fetch
    holds it."""
    import fcntl

    make_private_dirs(io.local_path(COPY_IN_DIR))
    fd = os.open(io.local_path(COPY_IN_DIR, f"{copy.copy_id}.lock"),
                 os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _digest(copy: ServedCopy) -> int:
    """The manifest's CRC32C: a fetch is reused only for the very manifest it fetched."""
    return int(google_crc32c.value(copy.encode()))


def _fetched_window(io: FileIO, copy: ServedCopy) -> tuple[float, float] | None:
    """When the complete fetch of ``copy`` here ran, or None if it is not fetched here."""
    try:
        with open(io.local_path(COPY_IN_DIR, copy.copy_id, _FETCHED), "rb") as f:
            mark = json.loads(f.read())
        if mark.get("copy_id") != copy.copy_id or mark.get("manifest") != _digest(copy):
            return None  # another copy's, or this id's from a COPY_OUT run again since
        return float(mark["started"]), float(mark["ended"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _fetch_all(copies: Sequence[tuple[FileIO, ServedCopy]]) -> FetchReport:
    """(Each copy's lock held.) Fetch every copy, together (module step 2), counted as copy
    traffic while it runs (:func:`~pyspark_kudu.spark.host.copy_traffic.wait_for_copies`)."""
    with copy_traffic.fetching():
        return _fetch_every(copies)


def _fetch_every(copies: Sequence[tuple[FileIO, ServedCopy]]) -> FetchReport:
    started = time.time()
    secret = secret_from_env()
    streams, rate = _settings()
    errors: list[KuduError | None] = [None] * len(copies)
    jobs: list[tuple[int, ServedCopy, ServedFile, str, tuple[int, int, int]]] = []
    files: list[tuple[int, str, tuple[int, ...]]] = []
    for k, (io, copy) in enumerate(copies):
        base = io.local_path(COPY_IN_DIR, copy.copy_id)
        shutil.rmtree(base, ignore_errors=True)  # a fetch cut short earlier
        if not secret:
            errors[k] = InvalidArgumentError(
                f"tablet copy {copy.copy_id}: this process has no cluster credential to "
                f"fetch it from {copy.address}")
            continue
        try:
            for f in copy.files:
                path = os.path.join(base, f.name if f.name == TAIL else
                                    os.path.join("files", f.name))
                make_private_dirs(os.path.dirname(path))
                with open_private(path, "wb") as out:  # segments are written in place
                    out.truncate(f.size)
                files.append((k, path, f.crcs))
                jobs.extend((k, copy, f, path, seg) for seg in f.segments())
        except (KuduError, OSError) as e:
            errors[k] = _as_kudu(e, copy, None)
    jobs.sort(key=lambda j: -j[4][1])  # largest first: the streams finish together
    lock = threading.Lock()
    # Segments still to come per file: the stream that lands a file's last segment syncs
    # it, so the flushes of finished files overlap the transfers of the others.
    left = {path: 0 for _, path, _ in files}
    for job in jobs:
        left[job[3]] += 1

    def one(job: tuple[int, ServedCopy, ServedFile, str, tuple[int, int, int]]) -> None:
        k, copy, f, path, seg = job
        if errors[k] is not None:
            return
        try:
            _fetch_segment(copy, f, path, seg, secret or b"", rate)
            with lock:
                left[path] -= 1
                last = left[path] == 0
            if last:
                _fsync(path)
        except (KuduError, OSError) as e:
            with lock:
                errors[k] = errors[k] or _as_kudu(e, copy, f)

    if jobs:
        with ThreadPoolExecutor(min(streams, len(jobs)),
                                thread_name_prefix="kudu-copy-fetch") as pool:
            list(pool.map(one, jobs))
    segmented = {job[3] for job in jobs}
    for k, path, crcs in files:
        if errors[k] is None and path not in segmented:
            try:  # an empty file (no segment): nothing synced it yet
                _fsync(path)
            except OSError as e:
                errors[k] = _as_kudu(e, copies[k][1], None)
        if errors[k] is None:  # checked against them: a copy from here need not read it
            with contextlib.suppress(OSError):
                checksums.remember(path, crcs)
    for k, (io, copy) in enumerate(copies):
        base = io.local_path(COPY_IN_DIR, copy.copy_id)
        if errors[k] is None:
            try:
                with open_private(os.path.join(base, _FETCHED), "wb") as m:
                    m.write(json.dumps({"copy_id": copy.copy_id, "started": started,
                                        "ended": time.time(),
                                        "manifest": _digest(copy)}).encode())
            except (KuduError, OSError) as e:
                errors[k] = _as_kudu(e, copy, None)
        if errors[k] is not None:
            shutil.rmtree(base, ignore_errors=True)
    return FetchReport(errors, started, time.time())


def _fetch_segment(copy: ServedCopy, f: ServedFile, path: str, seg: tuple[int, int, int],
                   secret: bytes, rate: float) -> None:
    """Segment ``seg`` (offset, length, CRC32C) of ``f`` into ``path``
    (:func:`~pyspark_kudu.spark.host.copy_segments.fetch_segment`)."""
    offset, length, want = seg
    req = FileRequest(copy.ts_uuid, copy.tablet_id, copy.source_path(f), offset, length,
                      copy.root)
    fetch_segment(req, want, path, stream=copy.stream, address=copy.address, secret=secret,
                  rate=rate, what=f"tablet copy {copy.copy_id} of {copy.tablet_id}: file "
                                  f"{f.name}")


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_kudu(e: BaseException, copy: ServedCopy, f: ServedFile | None) -> KuduError:
    if isinstance(e, KuduError):
        return e
    what = f"tablet copy {copy.copy_id} of {copy.tablet_id}" + (f", file {f.name}" if f else "")
    if isinstance(e, OSError) and e.errno == 28:
        return DiskFullError(f"{what}: no space left on this host: {e}")
    return IOError_(f"{what}: writing the fetched bytes failed: {e}")


