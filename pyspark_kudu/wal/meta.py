"""Consensus metadata: the ``<tablet>/meta`` file (DESIGN §5).

It holds everything of a replica's Raft state that is not a log entry: the hard state
(term, vote, commit), the latest snapshot (index, term, configuration and its small
``data``), the compaction point (the index and term just before the first entry the
storage still serves) and the number of the first WAL segment that belongs to the current
log (segments below it were replaced by an installed snapshot).

Layout::

    magic     8s   b"PKUDMETA"
    version   u16  1
    reserved  u16  0
    length    u32  length of the body
    crc       u32  CRC32C of the 16 bytes above followed by the body
    body      UTF-8 JSON, sorted keys

The file is only ever replaced through :meth:`~pyspark_kudu.fileio.FileIO.atomic_write`
(temp file, fsync, rename, fsync the directory), so a crash leaves the old or the new
content; a temp file left by a crash is never read (and is deleted when the tablet opens).
Any failed check raises :class:`~pyspark_kudu.errors.CorruptionError`.

Thread-safety: :class:`ConsensusMeta` is immutable; the functions keep no state.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Any

import google_crc32c

from pyspark_kudu.consensus.messages import ConfState, HardState, Snapshot, SnapshotMetadata
from pyspark_kudu.errors import CorruptionError, KuduError, NotSupportedError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.wal.segment import wrap_os_error

__all__ = ["META_FILE", "ConsensusMeta", "decode_meta", "encode_meta", "load_meta", "save_meta"]

META_FILE = "meta"
_MAGIC = b"PKUDMETA"
_VERSION = 1
_HEAD = struct.Struct("<8sHHI")
_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class ConsensusMeta:
    """The durable non-log state of one replica. Immutable, so thread-safe.

    ``log_start_index``/``log_start_term`` play the role of ``MemoryStorage``'s dummy entry:
    ``first_index() == log_start_index + 1`` and ``term(log_start_index)`` is answered.
    """

    hard_state: HardState = field(default_factory=HardState)
    snapshot: Snapshot = field(default_factory=Snapshot)
    log_start_index: int = 0
    log_start_term: int = 0
    wal_start_seq: int = 0


def encode_meta(meta: ConsensusMeta) -> bytes:
    hs, md = meta.hard_state, meta.snapshot.metadata
    body = json.dumps(
        {
            "hard_state": {"term": hs.term, "vote": hs.vote, "commit": hs.commit},
            "snapshot": {
                "index": md.index,
                "term": md.term,
                "conf_state": md.conf_state.to_dict(),
                "data": base64.b64encode(meta.snapshot.data).decode("ascii"),
            },
            "log_start": {"index": meta.log_start_index, "term": meta.log_start_term},
            "wal_start_seq": meta.wal_start_seq,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    head = _HEAD.pack(_MAGIC, _VERSION, 0, len(body))
    return head + _CRC.pack(google_crc32c.extend(google_crc32c.value(head), body)) + body


def decode_meta(data: bytes, where: str) -> ConsensusMeta:
    """Parse a meta file image.

    Raises:
        CorruptionError: truncated, bad magic, length or checksum, or malformed content.
        NotSupportedError: an intact file of a newer format version.
    """
    prefix = _HEAD.size + _CRC.size
    if len(data) < prefix:
        raise CorruptionError(f"consensus metadata {where} is truncated ({len(data)} bytes)")
    magic, version, _reserved, length = _HEAD.unpack_from(data, 0)
    (crc,) = _CRC.unpack_from(data, _HEAD.size)
    if magic != _MAGIC:
        raise CorruptionError(f"consensus metadata {where}: bad magic {magic!r} at offset 0")
    if len(data) != prefix + length:
        raise CorruptionError(
            f"consensus metadata {where}: header says {length} body bytes, "
            f"the file has {len(data) - prefix}"
        )
    body = data[prefix:]
    if google_crc32c.extend(google_crc32c.value(data[:_HEAD.size]), body) != crc:
        raise CorruptionError(f"consensus metadata {where}: checksum mismatch")
    if version != _VERSION:
        raise NotSupportedError(
            f"consensus metadata {where} has format version {version}; this build reads "
            f"version {_VERSION} only: upgrade pyspark-kudu on this host"
        )
    try:
        return _from_json(json.loads(body))
    except (ValueError, KeyError, TypeError, KuduError) as e:
        raise CorruptionError(f"consensus metadata {where}: malformed content ({e})") from e


def _from_json(d: dict[str, Any]) -> ConsensusMeta:
    hs, sn, ls = d["hard_state"], d["snapshot"], d["log_start"]
    meta = ConsensusMeta(
        hard_state=HardState(_nat(hs["term"]), _str(hs["vote"]), _nat(hs["commit"])),
        snapshot=Snapshot(
            SnapshotMetadata(_nat(sn["index"]), _nat(sn["term"]),
                             _conf(sn["conf_state"])),
            base64.b64decode(_str(sn["data"]), validate=True),
        ),
        log_start_index=_nat(ls["index"]),
        log_start_term=_nat(ls["term"]),
        wal_start_seq=_nat(d["wal_start_seq"]),
    )
    return meta


def _nat(v: object) -> int:
    if type(v) is not int or v < 0:
        raise ValueError(f"expected a non-negative integer, got {v!r}")
    return v


def _str(v: object) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected a string, got {v!r}")
    return v


def _conf(v: object) -> ConfState:
    if not isinstance(v, dict):
        raise ValueError(f"expected a configuration, got {v!r}")
    voters, learners = v.get("voters", []), v.get("learners", [])
    members_ok = isinstance(voters, list) and isinstance(learners, list) and all(
        isinstance(n, str) for n in [*voters, *learners])
    if not members_ok:
        raise ValueError(f"configuration members must be strings, got {v!r}")
    return ConfState.from_dict({"voters": voters, "learners": learners})


def load_meta(io: FileIO) -> ConsensusMeta | None:
    """Read ``meta`` under the tablet directory ``io``; None if the tablet has none yet.

    Leftover temp files of an interrupted :func:`save_meta` are deleted, never read.
    """
    try:
        for name in io.listdir():
            if name.startswith(META_FILE + ".tmp-"):
                io.delete(name)
        if not io.exists(META_FILE):
            return None
        data = io.read_bytes(META_FILE)
    except OSError as e:
        raise wrap_os_error(e, f"reading consensus metadata {io.path(META_FILE)}") from e
    return decode_meta(data, io.path(META_FILE))


def save_meta(io: FileIO, meta: ConsensusMeta) -> None:
    """Replace ``meta`` atomically and durably."""
    try:
        io.makedirs()
        io.atomic_write(encode_meta(meta), META_FILE)
    except OSError as e:
        raise wrap_os_error(e, f"writing consensus metadata {io.path(META_FILE)}") from e
