"""Tablet copy: a replica's consistent state as a stream of chunks, and its installation.

The source pins its persisted superblock (flushed index ``F``), the files it lists, and a
log anchor; the stream then carries, in order::

    begin       tablet id, the copy's index A (the source's applied index), file sizes
    file*       each listed file in pieces of at most ``chunk_bytes``, with a CRC32 per piece
    log*        every committed log record in (F, A], exactly as the source's log holds it
    superblock  the superblock bytes; its arrival completes the copy

:func:`install_tablet_copy` writes the files under an **empty** root, hands the log records to
a :data:`~pyspark_kudu.tablet.committed_log.LogSink` (the target's WAL), and writes the
superblock last and atomically: an interrupted install leaves no superblock, so the target is
recognisably incomplete (``Tablet.open`` raises ``NotFoundError``) and can be wiped and
retried. Opening the installed tablet replays the tail and reaches index ``A``, where it is
indistinguishable from the source: same rowsets, deltas, history mark and MemRowSet
contents, hence the same scan results at every snapshot the source could serve.

The files may also travel apart from the stream (``chunks(with_files=False)`` and
``install_tablet_copy(..., prefetched=...)``): a served copy hard-links them on the source and
the target fetches them from the source's resident tablet server
(:mod:`pyspark_kudu.spark.host.copy_fetch`). The order of installation is the same.

Chunks are frozen dataclasses (picklable, for task results and shuffles) with a compact
:meth:`CopyChunk.to_bytes` form.

Thread-safety: a :class:`TabletCopySource` is used by one thread; the source tablet keeps
applying writes meanwhile.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from types import TracebackType
from typing import IO

from pyspark_kudu.errors import CorruptionError, IllegalStateError, InvalidArgumentError
from pyspark_kudu.fileio import FileIO, make_private_dirs
from pyspark_kudu.tablet.committed_log import LogRecord, LogSink
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE, Superblock
from pyspark_kudu.tablet.tablet import Tablet, tablet_dir

__all__ = ["CopyChunk", "TabletCopySource", "install_tablet_copy"]

_HEADER = struct.Struct(">I")


@dataclass(frozen=True)
class CopyChunk:
    """One piece of a tablet copy stream. ``kind`` is begin, file, log or superblock."""

    kind: str
    name: str = ""
    offset: int = 0
    data: bytes = b""
    size: int = 0
    crc: int = 0
    index: int = 0
    term: int = 0
    entry_type: str = ""

    def to_bytes(self) -> bytes:
        header = {k: v for k, v in asdict(self).items() if k != "data"}
        h = json.dumps(header, separators=(",", ":")).encode()
        return _HEADER.pack(len(h)) + h + self.data

    @classmethod
    def from_bytes(cls, raw: bytes | memoryview) -> CopyChunk:
        try:
            (n,) = _HEADER.unpack_from(raw)
            header = json.loads(bytes(raw[_HEADER.size: _HEADER.size + n]))
            return cls(data=bytes(raw[_HEADER.size + n:]), **header)
        except (struct.error, ValueError, TypeError) as e:
            raise CorruptionError(f"malformed tablet copy chunk ({e})") from e


class TabletCopySource:
    """Streams a consistent copy of ``tablet``; use as a context manager or call close()."""

    def __init__(self, tablet: Tablet, chunk_bytes: int = 4 << 20) -> None:
        if chunk_bytes < 1:
            raise InvalidArgumentError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self._tablet = tablet
        self._chunk_bytes = chunk_bytes
        self._pin = tablet.pin_for_copy()
        self._closed = False

    @property
    def index(self) -> int:
        """The index at which the installed copy will equal the source."""
        return self._pin.applied_index

    @property
    def superblock(self) -> Superblock:
        return self._pin.superblock

    def __enter__(self) -> TabletCopySource:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._tablet.unpin_copy(self._pin)

    def files(self) -> dict[str, int]:
        """The pinned files (names relative to the tablet directory) and their sizes. They
        are immutable once written, so they may be linked rather than read (a served copy,
        :mod:`pyspark_kudu.spark.host.copy_fetch`)."""
        d = self._tablet.directory
        return {n: d.size(n) for n in sorted(self._pin.superblock.files())}

    def chunks(self, with_files: bool = True) -> Iterator[CopyChunk]:
        """The copy stream (module docstring). Without ``with_files`` the stream omits the
        file chunks: the files then travel on their own (:meth:`files`) and the installer
        is handed them (``install_tablet_copy(..., prefetched=...)``)."""
        if self._closed:
            raise IllegalStateError("this tablet copy source is closed; start a new copy")
        sb = self._pin.superblock
        d = self._tablet.directory
        sizes = self.files()
        yield CopyChunk("begin", self._tablet.tablet_id, index=self.index,
                        data=json.dumps(sizes, sort_keys=True).encode())
        for name in sizes if with_files else ():
            yield from self._file_chunks(d, name, sizes[name])
        log = self._tablet.log
        if log is not None and self.index > sb.last_flushed_index:
            for rec in log.read_from(sb.last_flushed_index + 1):
                if rec.index > self.index:
                    break
                yield CopyChunk("log", index=rec.index, term=rec.term, data=rec.data,
                                crc=zlib.crc32(rec.data), entry_type=rec.entry_type)
        yield CopyChunk("superblock", SUPERBLOCK_FILE, data=sb.to_bytes(), index=self.index)

    def _file_chunks(self, d: FileIO, name: str, size: int) -> Iterator[CopyChunk]:
        with d.open(name, mode="rb") as f:
            offset = 0
            while True:
                data = f.read(self._chunk_bytes)
                if not data and offset > 0:
                    break
                yield CopyChunk("file", name, offset, data, size, zlib.crc32(data))
                offset += len(data)
                if offset >= size:
                    break


def install_tablet_copy(root: str | FileIO, chunks: Iterable[CopyChunk | bytes],
                        log_sink: LogSink | None = None,
                        prefetched: Mapping[str, str] | None = None) -> Superblock:
    """Install a copy stream under ``root``; returns the installed superblock.

    Open the result with ``Tablet.open(root, tablet_id, log=<the log log_sink wrote to>)``.

    ``prefetched`` maps file names of the copy to local files (on the same file system as a
    local ``root``) that already hold them whole, checked and synced by whoever fetched
    them; they are moved into place right after the begin chunk, and the stream then
    carries no chunks for them. The superblock is still written last.

    Raises:
        IllegalStateError: the tablet already has files under ``root``.
        CorruptionError: a chunk fails its checksum, arrives out of order, or the stream ends
            before the superblock; a prefetched file is not one of the copy's or has
            another size.
        InvalidArgumentError: the copy carries log records but no ``log_sink`` was given.
    """
    it = iter(chunks)
    first = _chunk(next(it, None))
    if first is None or first.kind != "begin":
        raise CorruptionError("tablet copy stream does not start with a begin chunk")
    d = tablet_dir(root, first.name)
    if d.exists(SUPERBLOCK_FILE) or d.listdir("rowsets"):
        raise IllegalStateError(
            f"tablet {first.name} already has files at {d.root}; delete them before installing"
            " a copy"
        )
    sizes: dict[str, int] = json.loads(first.data)
    written: dict[str, int] = {}
    d.makedirs("rowsets")
    for name, path in (prefetched or {}).items():
        size = os.path.getsize(path)
        if sizes.get(name) != size:
            raise CorruptionError(
                f"prefetched tablet copy file {name} has {size} bytes, the copy lists "
                f"{sizes.get(name)}")
        dest = d.local_path(name)
        make_private_dirs(os.path.dirname(dest))
        os.replace(path, dest)
        written[name] = size
    current: tuple[str, IO[bytes]] | None = None
    for raw in it:
        c = _chunk(raw)
        assert c is not None
        if zlib.crc32(c.data) != c.crc and c.kind in ("file", "log"):
            raise CorruptionError(f"tablet copy chunk {c.kind} {c.name or c.index} failed its CRC")
        if c.kind == "file":
            if (c.name in (prefetched or {}) or c.name not in sizes
                    or c.offset != written.get(c.name, 0)):
                raise CorruptionError(
                    f"tablet copy chunk for {c.name} at offset {c.offset} is out of order")
            if current is None or current[0] != c.name:
                if current is not None:
                    _finish(d, current)
                current = (c.name, d.open(c.name, mode="wb"))
            current[1].write(c.data)
            written[c.name] = c.offset + len(c.data)
        elif c.kind == "log":
            if log_sink is None:
                raise InvalidArgumentError(
                    "the tablet copy carries log records after its flushed index; pass a log_sink"
                    " that appends them to the new replica's log"
                )
            log_sink(LogRecord(c.index, c.data, c.term, c.entry_type or "normal"))
        elif c.kind == "superblock":
            if current is not None:
                _finish(d, current)
                current = None
            missing = [n for n, s in sizes.items() if written.get(n, -1) != s]
            if missing:
                raise CorruptionError(f"tablet copy ended without complete files {missing}")
            d.fsync_dir("rowsets")
            sb = Superblock.from_bytes(c.data, "copied superblock")
            sb.store(d)
            return sb
        else:
            raise CorruptionError(f"unknown tablet copy chunk kind {c.kind!r}")
    if current is not None:
        _finish(d, current)
    raise CorruptionError(
        f"tablet copy stream for {first.name} ended before its superblock; delete the partial"
        " copy and retry"
    )


def _chunk(raw: CopyChunk | bytes | None) -> CopyChunk | None:
    if raw is None or isinstance(raw, CopyChunk):
        return raw
    return CopyChunk.from_bytes(raw)


def _finish(d: FileIO, current: tuple[str, IO[bytes]]) -> None:
    d.fsync(current[1])
    current[1].close()
