"""Durable log of a tablet replica: segments, CRC32C framing, group commit, recovery.

Public API (DESIGN §2, §5):

- :class:`WalStorage` -- the durable Raft ``Storage`` of one tablet directory: the
  consensus ``Storage`` protocol plus ``MemoryStorage``'s writes, ``append_async`` and
  ``gc``. This is what a tablet server hands to its ``RaftNode``.
- :class:`Log` -- the write-ahead log itself (group commit, recovery, reads, segment GC),
  usable alone by callers that keep their own metadata.
- :class:`WalOptions`, :class:`SyncPolicy` -- segment size, sync policy, preallocation.
- :class:`ConsensusMeta`, :func:`load_meta`, :func:`save_meta` -- the ``meta`` file.
- :class:`RecoveryReport`, :class:`TornTail`, :class:`LogStats` -- what recovery did and
  what the log has done.

Example::

    with WalStorage.open("/data/kudu/tablets/t1", conf_state=ConfState.of(["a", "b", "c"])) as s:
        s.set_hard_state(HardState(term=2, vote="a"))          # durable on return
        s.append([Entry(2, 1, data=b"batch-1"), Entry(2, 2, data=b"batch-2")])
        fut = s.append_async([Entry(2, 3, data=b"batch-3")])   # pipelined, group-committed
        fut.result()
        s.create_snapshot(2, s.initial_state()[1], data=b"rowsets@2")
        s.compact(2)
        s.gc()                                                 # delete compacted segments

Where things are documented: :mod:`~pyspark_kudu.wal.format` (segment and frame bytes),
:mod:`~pyspark_kudu.wal.segment` (the torn-tail-versus-corruption rule),
:mod:`~pyspark_kudu.wal.recovery` (replay), :mod:`~pyspark_kudu.wal.log` (appends, reads,
GC), :mod:`~pyspark_kudu.wal.group_commit` (the sync thread, coalescing),
:mod:`~pyspark_kudu.wal.meta` (the ``meta`` file), :mod:`~pyspark_kudu.wal.storage`
(durability of each write).
"""

from pyspark_kudu.wal.log import Log, LogStats
from pyspark_kudu.wal.meta import ConsensusMeta, load_meta, save_meta
from pyspark_kudu.wal.recovery import RecoveryReport
from pyspark_kudu.wal.segment import TornTail
from pyspark_kudu.wal.storage import WAL_DIR, WalStorage
from pyspark_kudu.wal.wal_options import DEFAULT_SEGMENT_SIZE, SyncPolicy, WalOptions

__all__ = [
    "DEFAULT_SEGMENT_SIZE",
    "WAL_DIR",
    "ConsensusMeta",
    "Log",
    "LogStats",
    "RecoveryReport",
    "SyncPolicy",
    "TornTail",
    "WalOptions",
    "WalStorage",
    "load_meta",
    "save_meta",
]
