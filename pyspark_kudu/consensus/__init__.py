"""Sans-IO Raft consensus (DESIGN §2-3): no files, sockets, threads or clocks.

Drive a :class:`RaftNode` with ``tick()`` / ``step()`` / ``propose()``, drain ``ready()``,
persist, send, apply, then ``advance()``. Stable state is read through the
:class:`Storage` protocol; :class:`MemoryStorage` is the in-memory reference and
:mod:`pyspark_kudu.wal` the durable implementation.
"""

from pyspark_kudu.consensus.messages import (
    NONE,
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
    decode_conf_change,
    encode_conf_change,
)
from pyspark_kudu.consensus.raft import Config, RaftNode, Ready, Role, SoftState, Status
from pyspark_kudu.consensus.raft_storage import MemoryStorage, Storage

__all__ = [
    "NONE",
    "ConfChange",
    "ConfChangeType",
    "ConfState",
    "Config",
    "Entry",
    "EntryType",
    "HardState",
    "MemoryStorage",
    "Message",
    "MessageType",
    "RaftNode",
    "Ready",
    "Role",
    "Snapshot",
    "SnapshotMetadata",
    "SoftState",
    "Status",
    "Storage",
    "decode_conf_change",
    "encode_conf_change",
]
