"""Tuning knobs of the write-ahead log: segment size, sync policy, preallocation, cache.

The defaults are Kudu's (seed ``kudu-consensus-wal``): 64 MiB segments, preallocated, and
``fdatasync`` after every group of appends. Preallocation is what makes ``fdatasync``
sufficient: while a write stays inside the preallocated length the file size does not
change, so only data blocks need flushing.

Thread-safety: both types are immutable values.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from pyspark_kudu.errors import InvalidArgumentError

__all__ = ["DEFAULT_SEGMENT_SIZE", "SyncPolicy", "WalOptions"]

DEFAULT_SEGMENT_SIZE = 64 * 1024 * 1024
"""Kudu's ``--log_segment_size_mb`` default."""

_MIN_SEGMENT_SIZE = 64
"""Small enough for tests that want a roll every few entries; a frame never splits."""


class SyncPolicy(enum.Enum):
    """How the sync thread makes a written group durable before acknowledging it.

    An enum member: immutable, thread-safe.

    ``NONE`` issues no fsync at all (not even when segments are created, closed or deleted)
    and only flushes Python's buffer to the OS: a process crash loses nothing, a machine
    crash can lose acknowledged entries and leave holes that recovery reports as corruption.
    It exists for tests and benchmarks only; never run a replica with it. The consensus
    metadata file is always written durably.
    """

    FSYNC = "fsync"
    FDATASYNC = "fdatasync"
    NONE = "none"


@dataclass(frozen=True)
class WalOptions:
    """Options of one tablet's WAL. Immutable, so thread-safe.

    Attributes:
        segment_size: target size of a segment file; the segment rolls when the next frame
            would not fit. A single frame larger than this gets a segment of its own.
        sync_policy: see :class:`SyncPolicy`; ``FDATASYNC`` is the default on local disk.
        preallocate: reserve ``segment_size`` bytes with ``posix_fallocate`` when a segment
            is created (silently skipped where the file system does not support it).
        cache_bytes: budget of the in-memory cache of recently appended or read entries;
            ``0`` makes every read go to disk.
        group_commit_wait: how long the sync thread may wait for the appenders released by
            the previous group to enqueue again, as a fraction of the recent average sync
            time; ``0`` disables it (see :mod:`pyspark_kudu.wal.group_commit`).
    """

    segment_size: int = DEFAULT_SEGMENT_SIZE
    sync_policy: SyncPolicy = SyncPolicy.FDATASYNC
    preallocate: bool = True
    cache_bytes: int = 4 * 1024 * 1024
    group_commit_wait: float = 0.5

    def __post_init__(self) -> None:
        if self.segment_size < _MIN_SEGMENT_SIZE:
            raise InvalidArgumentError(
                f"WAL segment_size {self.segment_size} is too small: use at least "
                f"{_MIN_SEGMENT_SIZE} bytes (default {DEFAULT_SEGMENT_SIZE})"
            )
        if not isinstance(self.sync_policy, SyncPolicy):
            raise InvalidArgumentError(
                f"WAL sync_policy must be a SyncPolicy, got {self.sync_policy!r}; "
                f"use SyncPolicy('fdatasync'), SyncPolicy('fsync') or SyncPolicy('none')"
            )
        if self.cache_bytes < 0:
            raise InvalidArgumentError(f"WAL cache_bytes must be >= 0, got {self.cache_bytes}")
        if not 0 <= self.group_commit_wait <= 10:
            raise InvalidArgumentError(
                f"WAL group_commit_wait must be between 0 and 10 (a fraction of the sync "
                f"time), got {self.group_commit_wait}"
            )
