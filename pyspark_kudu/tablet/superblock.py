"""The tablet superblock: the one file that says which rowsets make up the replica.

``<root>/tablets/<tablet_id>/superblock`` (DESIGN §5) is JSON with a CRC32 of its body::

    {"crc32": <crc of body>, "body": {"format": 1, "tablet_id": ..., "schema": {...},
     "schema_version": 1, "last_flushed_index": F, "ancient_history_mark": H,
     "next_rowset_id": N, "rowsets": [<RowSetMeta>...]}}

It is only ever replaced with :meth:`FileIO.atomic_write` (temp file, fsync, rename, fsync
dir), so after a crash it is either the old or the new one. Every flush and compaction writes
its new files first and the superblock last: files the superblock does not list are leftovers
of an interrupted flush or compaction and are deleted when the tablet is opened.

- ``last_flushed_index``: every entry ``<= F`` is reflected in the listed files; bootstrap
  replays the log from ``F + 1``.
- ``ancient_history_mark``: versions ended at or before ``H`` may have been dropped by
  compaction, so scans at snapshots ``< H`` are refused.

Thread-safety: :class:`Superblock` is immutable.
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from typing import Any

from pyspark_kudu.errors import CorruptionError, InvalidArgumentError, NotFoundError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.tablet.rowset import RowSetMeta

__all__ = ["SUPERBLOCK_FILE", "Superblock", "tablet_dir"]

SUPERBLOCK_FILE = "superblock"
FORMAT_VERSION = 1


def tablet_dir(root: str | FileIO, tablet_id: str) -> FileIO:
    """The FileIO of ``<root>/tablets/<tablet_id>``."""
    if not tablet_id or "/" in tablet_id or tablet_id in (".", ".."):
        raise InvalidArgumentError(f"invalid tablet id {tablet_id!r}: use a plain name")
    base = root if isinstance(root, FileIO) else FileIO(root)
    return base.child("tablets", tablet_id)


@dataclass(frozen=True)
class Superblock:
    tablet_id: str
    schema: Schema
    last_flushed_index: int = 0
    ancient_history_mark: int = 0
    next_rowset_id: int = 1
    rowsets: tuple[RowSetMeta, ...] = field(default=())
    schema_version: int = 1

    def to_bytes(self) -> bytes:
        body = {
            "format": FORMAT_VERSION,
            "tablet_id": self.tablet_id,
            "schema": self.schema.to_dict(),
            "schema_version": self.schema_version,
            "last_flushed_index": self.last_flushed_index,
            "ancient_history_mark": self.ancient_history_mark,
            "next_rowset_id": self.next_rowset_id,
            "rowsets": [r.to_dict(self.schema) for r in self.rowsets],
        }
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        return json.dumps({"crc32": zlib.crc32(text.encode()), "body": text}).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "superblock") -> Superblock:
        try:
            outer = json.loads(data)
            text = outer["body"]
            if zlib.crc32(text.encode()) != outer["crc32"]:
                raise CorruptionError(f"{where}: checksum mismatch; the replica must be re-copied")
            body: dict[str, Any] = json.loads(text)
            if body.get("format") != FORMAT_VERSION:
                raise CorruptionError(
                    f"{where}: unknown format {body.get('format')!r} (this build reads"
                    f" {FORMAT_VERSION})"
                )
            schema = Schema.from_dict(body["schema"])
            return cls(
                tablet_id=str(body["tablet_id"]), schema=schema,
                last_flushed_index=int(body["last_flushed_index"]),
                ancient_history_mark=int(body["ancient_history_mark"]),
                next_rowset_id=int(body["next_rowset_id"]),
                rowsets=tuple(RowSetMeta.from_dict(r, schema) for r in body["rowsets"]),
                schema_version=int(body.get("schema_version", 1)),
            )
        except CorruptionError:
            raise
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptionError(f"{where} is unreadable ({e}); the replica must be re-copied"
                                  ) from e

    def store(self, fileio: FileIO) -> None:
        fileio.atomic_write(self.to_bytes(), SUPERBLOCK_FILE)

    @classmethod
    def load(cls, fileio: FileIO) -> Superblock:
        """Read the superblock of the tablet directory ``fileio``.

        Raises:
            NotFoundError: there is no superblock (no tablet, or an unfinished copy).
            CorruptionError: the file exists but is damaged.
        """
        if not fileio.exists(SUPERBLOCK_FILE):
            raise NotFoundError(
                f"no tablet superblock at {fileio.path(SUPERBLOCK_FILE)}: create the tablet or"
                " install a copy first"
            )
        return cls.from_bytes(fileio.read_bytes(SUPERBLOCK_FILE), fileio.path(SUPERBLOCK_FILE))

    def files(self) -> set[str]:
        return {f for r in self.rowsets for f in r.files()}
