"""A file-backed :class:`~pyspark_kudu.tablet.committed_log.CommittedLog` stub for tests.

Stands in for the durable WAL until ``pyspark_kudu.wal`` lands: one append-only file of
``[u64 index][u64 term][u32 length][data]`` frames, fsynced on every append; a torn last frame
(a crash mid-append) is ignored on read. ``gc`` rewrites the file without the dropped records
(atomic replace), which is coarser than segment deletion but has the same contract.

Thread-safety: not thread-safe.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

from pyspark_kudu.errors import CompactedError
from pyspark_kudu.tablet.committed_log import LogRecord

_FRAME = struct.Struct(">QQI")


class FileLog:
    def __init__(self, path: str) -> None:
        self.path = path
        self.first_kept = 1
        meta = path + ".first"
        if os.path.exists(meta):
            with open(meta) as f:
                self.first_kept = int(f.read())

    def _records(self) -> list[LogRecord]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, "rb") as f:
            raw = f.read()
        out, pos = [], 0
        while pos + _FRAME.size <= len(raw):
            index, term, n = _FRAME.unpack_from(raw, pos)
            if pos + _FRAME.size + n > len(raw):
                break  # torn tail
            out.append(LogRecord(index, raw[pos + _FRAME.size: pos + _FRAME.size + n], term))
            pos += _FRAME.size + n
        return out

    def append(self, record: LogRecord | tuple[int, bytes]) -> None:
        rec = record if isinstance(record, LogRecord) else LogRecord(*record)
        with open(self.path, "ab") as f:
            f.write(_FRAME.pack(rec.index, rec.term, len(rec.data)) + rec.data)
            f.flush()
            os.fsync(f.fileno())

    def read_from(self, index: int) -> Iterator[LogRecord]:
        if index < self.first_kept:
            raise CompactedError(f"records before {self.first_kept} were collected")
        return iter([r for r in self._records() if r.index >= index])

    def gc(self, up_to_index: int) -> None:
        keep = [r for r in self._records() if r.index > up_to_index]
        tmp = self.path + ".tmp"
        with open(tmp, "wb") as f:
            for r in keep:
                f.write(_FRAME.pack(r.index, r.term, len(r.data)) + r.data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.first_kept = max(self.first_kept, up_to_index + 1)
        with open(self.path + ".first", "w") as f:
            f.write(str(self.first_kept))

    def indexes(self) -> list[int]:
        return [r.index for r in self._records()]
