"""One tablet replica: ops, MVCC, MemRowSet, rowsets, flush, compaction, scans, copy.

Usage::

    import pyarrow as pa
    from pyspark_kudu.schema import ColumnSchema, Predicate, Schema
    from pyspark_kudu.tablet import MemoryLog, OpType, Tablet, encode_write_batch

    schema = Schema((ColumnSchema("id", "int64", nullable=False), ColumnSchema("v", "string")),
                    ("id",))
    log = MemoryLog()  # stands in for the WAL: committed entries only
    tablet = Tablet.create("/data/ts1", "t-0001", schema, log=log)
    data = encode_write_batch(schema, OpType.INSERT, pa.table({"id": [1, 2], "v": ["a", "b"]}))
    log.append((1, data))  # the Raft layer commits the entry at index 1 ...
    result = tablet.apply(1, data)  # ... and every replica applies it
    assert result.ok
    tablet.flush()
    rows = tablet.scan_table(predicates=[Predicate.eq("id", 2)], snapshot=result.index)
    assert rows.to_pylist() == [{"id": 2, "v": "b"}]
    assert tablet.lookup(1) == {"id": 1, "v": "a"}

The package follows DESIGN §5 for files and §3 for what it consumes (committed entries).
Where things are documented: :mod:`.ops` (the replicated write-batch bytes), :mod:`.apply`
(per-row semantics), :mod:`.keys` (versions, MVCC visibility, the key index),
:mod:`.memrowset`, :mod:`.rowset` (Parquet rowsets and delta files), :mod:`.parquet_files`
(how those files are written and read), :mod:`.bloom` (their key filters), :mod:`.lookup`
(the row groups a point lookup reads), :mod:`.superblock` (the commit point of flush and
compaction), :mod:`.compaction`, :mod:`.scan` (pruning and
pushdown), :mod:`.tablet` (bootstrap, crash safety, threads), :mod:`.copy`,
:mod:`.committed_log` (the committed-log protocol and the WAL adapter), :mod:`.state`
(lifecycle), :mod:`.faults`.
"""

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark_kudu.tablet.committed_log import CommittedLog, LogRecord, LogSink, MemoryLog
    from pyspark_kudu.tablet.copy import CopyChunk, TabletCopySource, install_tablet_copy
    from pyspark_kudu.tablet.faults import CRASH_ENV, CRASH_EXIT_CODE, CRASH_POINTS
    from pyspark_kudu.tablet.ops import (
        OpType,
        RowError,
        WriteBatch,
        WriteResult,
        decode_write_batch,
        encode_write_batch,
        is_write_batch,
    )
    from pyspark_kudu.tablet.rowset import DeltaFileMeta, RowSetMeta
    from pyspark_kudu.tablet.scan import TabletScanner
    from pyspark_kudu.tablet.state import TabletEvent, TabletState
    from pyspark_kudu.tablet.superblock import Superblock, tablet_dir
    from pyspark_kudu.tablet.tablet import Tablet
    from pyspark_kudu.tablet.tablet_options import TabletMetrics, TabletOptions

#: Where each name of the package lives. Imported on first use (:func:`__getattr__`), so that
#: a process needing one small part (``OpType`` to parse write options, in the driver's
#: Python worker planning a ``format("kudu")`` write) does not import the whole tablet code
#: with pyarrow's dataset and Parquet modules and pandas (~0.3 s). :func:`load_all` imports
#: everything, for processes that fork workers.
_HOMES: dict[str, str] = {
    "CRASH_ENV": "faults",
    "CRASH_EXIT_CODE": "faults",
    "CRASH_POINTS": "faults",
    "CommittedLog": "committed_log",
    "CopyChunk": "copy",
    "DeltaFileMeta": "rowset",
    "LogRecord": "committed_log",
    "LogSink": "committed_log",
    "MemoryLog": "committed_log",
    "OpType": "ops",
    "RowError": "ops",
    "RowSetMeta": "rowset",
    "Superblock": "superblock",
    "Tablet": "tablet",
    "TabletCopySource": "copy",
    "TabletEvent": "state",
    "TabletMetrics": "tablet_options",
    "TabletOptions": "tablet_options",
    "TabletScanner": "scan",
    "TabletState": "state",
    "WriteBatch": "ops",
    "WriteResult": "ops",
    "decode_write_batch": "ops",
    "encode_write_batch": "ops",
    "install_tablet_copy": "copy",
    "is_write_batch": "ops",
    "tablet_dir": "superblock",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_all() -> None:
    """Import every name of the package now (a daemon before it forks its workers)."""
    for name in _HOMES:
        __getattr__(name)


__all__ = [
    "CRASH_ENV",
    "CRASH_EXIT_CODE",
    "CRASH_POINTS",
    "CommittedLog",
    "CopyChunk",
    "DeltaFileMeta",
    "LogRecord",
    "LogSink",
    "MemoryLog",
    "OpType",
    "RowError",
    "RowSetMeta",
    "Superblock",
    "Tablet",
    "TabletCopySource",
    "TabletEvent",
    "TabletMetrics",
    "TabletOptions",
    "TabletScanner",
    "TabletState",
    "WriteBatch",
    "WriteResult",
    "decode_write_batch",
    "encode_write_batch",
    "install_tablet_copy",
    "is_write_batch",
    "tablet_dir",
]
