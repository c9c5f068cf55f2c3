"""The committed log as a tablet replica sees it: a read-only ``Protocol`` plus GC.

A replica only ever consumes **committed** entries, in index order (DESIGN §3); it never
appends (the Raft layer and the WAL own writes, the etcd ``Storage`` habit). Two operations:

- ``read_from(index)`` yields every committed record with ``record.index >= index`` in
  ascending order (configuration changes and no-ops included; the tablet skips them). Bootstrap
  calls it with ``last_flushed_index + 1``.
- ``gc(up_to_index)`` *allows* the log to delete records ``<= up_to_index``; it may keep more
  (a segmented WAL deletes whole segments only). The tablet never passes an index above its
  last flushed index, nor above an anchor held by an in-flight tablet copy.

The durable WAL (:class:`pyspark_kudu.wal.log.Log`) satisfies this with a thin adapter:
``read_from(i)`` pages through ``Log.read(i, commit + 1, max_size)`` up to the commit index
(from the consensus metadata) and maps each ``Entry`` to
``LogRecord(e.index, e.data, e.term, e.type.value)``; ``gc(i)`` is ``Log.gc(i)``, which deletes
whole segments only. A :data:`LogSink` for installing a copy appends
``Entry(r.term, r.index, EntryType(r.entry_type), r.data)``. :class:`MemoryLog` is the
reference implementation and test double.

Thread-safety: :class:`MemoryLog` is not thread-safe; callers serialise access.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from pyspark_kudu.errors import CompactedError, InvalidArgumentError

__all__ = ["CommittedLog", "LogRecord", "LogSink", "MemoryLog"]


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One committed entry: Raft ``index`` (the MVCC timestamp), opaque ``data``, its ``term``
    and ``entry_type`` (``EntryType.value`` of the consensus entry: ``"normal"`` or
    ``"conf_change"``).

    The tablet ignores ``term`` and ``entry_type``; they travel in tablet copies so the
    receiving WAL can store the records exactly as the source had them.
    """

    index: int
    data: bytes
    term: int = 0
    entry_type: str = "normal"


@runtime_checkable
class CommittedLog(Protocol):
    """Committed records, read-only except for garbage collection."""

    def read_from(self, index: int) -> Iterator[LogRecord]:
        """Committed records with ``index >= index``, ascending."""
        ...

    def gc(self, up_to_index: int) -> None:
        """Records ``<= up_to_index`` are no longer needed by the tablet."""
        ...


LogSink = Callable[[LogRecord], None]
"""Receives the log records of an installed tablet copy, in index order (see ``copy``)."""


class MemoryLog:
    """In-memory :class:`CommittedLog` that also offers the append a Raft layer performs."""

    def __init__(self, records: list[LogRecord] | None = None) -> None:
        self._records: list[LogRecord] = []
        self._first_kept = 1
        for r in records or []:
            self.append(r)

    def append(self, record: LogRecord | tuple[int, bytes]) -> None:
        rec = record if isinstance(record, LogRecord) else LogRecord(*record)
        last = self._records[-1].index if self._records else self._first_kept - 1
        if rec.index <= last:
            raise InvalidArgumentError(
                f"log record {rec.index} does not follow the last index {last}; append in order"
            )
        self._records.append(rec)

    @property
    def last_index(self) -> int:
        return self._records[-1].index if self._records else self._first_kept - 1

    def read_from(self, index: int) -> Iterator[LogRecord]:
        if index < self._first_kept:
            raise CompactedError(
                f"log records before {self._first_kept} were garbage-collected; index {index}"
                " is gone, copy the tablet instead"
            )
        return iter([r for r in self._records if r.index >= index])

    def gc(self, up_to_index: int) -> None:
        self._records = [r for r in self._records if r.index > up_to_index]
        self._first_kept = max(self._first_kept, up_to_index + 1)

    def __len__(self) -> int:
        return len(self._records)
