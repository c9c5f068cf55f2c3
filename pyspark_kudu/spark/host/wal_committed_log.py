"""The tablet's view of a replica's WAL: committed records only (``tablet.CommittedLog``).

A tablet bootstraps by replaying committed records after its last flush; it must never see
an entry that is not committed (DESIGN §3: nothing uncommitted is ever visible). ``upto``
narrows that further to what the replica had *already applied* before this task: the task
then applies the newly committed entries itself, so it can report their per-row results.

Thread-safety: every use of the ``WalStorage`` holds ``lock`` when one is given (the
replica's log lock, :mod:`~pyspark_kudu.spark.host.replica_cache`: a round may append to
the log while the tablet bootstraps or collects garbage), one page at a time;
``advance_upto`` is called by the request that holds the replica's tablet lock.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager

from pyspark_kudu.errors import CompactedError
from pyspark_kudu.tablet import LogRecord
from pyspark_kudu.wal import WalStorage

__all__ = ["WalCommittedLog"]

_PAGE_BYTES = 8 * 1024 * 1024


class WalCommittedLog:
    """``CommittedLog`` over a ``WalStorage``, bounded by its commit index (and ``upto``)."""

    def __init__(self, storage: WalStorage, upto: int | None = None,
                 known_commit: int | None = None,
                 lock: AbstractContextManager[object] | None = None) -> None:
        """``known_commit``: a commit index the caller learned from the tablet's *current*
        leader, valid only on the leader replica (whose log is the leader's log); it lets a
        read see writes whose commit the replica itself has not been told yet. ``lock``:
        held around each use of ``storage`` (module docstring)."""
        self._storage = storage
        self._upto = upto
        self._known_commit = known_commit
        self._lock: AbstractContextManager[object] = (
            lock if lock is not None else contextlib.nullcontext())

    def advance_upto(self, index: int) -> None:
        """The tablet has now applied up to ``index`` (it stays open across tasks)."""
        if self._upto is not None:
            self._upto = max(self._upto, index)

    def _last(self) -> int:
        commit = self._storage.initial_state()[0].commit
        if self._known_commit is not None:
            commit = max(commit, min(self._known_commit, self._storage.last_index()))
        return commit if self._upto is None else min(commit, self._upto)

    def read_from(self, index: int) -> Iterator[LogRecord]:
        with self._lock:
            last = self._last()
            first = self._storage.first_index()
        if index > last:
            return
        if index < first:
            raise CompactedError(
                f"the tablet needs log entries from {index} but the WAL starts at {first}; "
                f"the replica must be re-copied from a healthy one"
            )
        lo = index
        while lo <= last:
            with self._lock:  # not across the yields: the caller applies meanwhile
                page = self._storage.entries(lo, last + 1, _PAGE_BYTES)
            for e in page:
                yield LogRecord(e.index, e.data, e.term, e.type.value)
            lo = page[-1].index + 1

    def gc(self, up_to_index: int) -> None:
        """Let the WAL drop entries the tablet has flushed (``compact`` then segment GC)."""
        with self._lock:
            target = min(up_to_index, self._last())
            if target >= self._storage.first_index():
                self._storage.compact(target)
                self._storage.gc()
