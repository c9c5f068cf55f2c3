"""The Raft log as the core sees it: stable ``Storage`` plus an in-memory unstable tail.

``RaftLog`` = entries already persisted (read through :class:`Storage`) followed by
``_Unstable`` entries (and possibly a snapshot) handed out in a ``Ready`` but not yet
acknowledged as persisted by ``advance()``. Invariants:

- ``applied <= committed <= last_index()``;
- ``committed`` never decreases (Raft Fig. 2: commitIndex is monotonic);
- the unstable tail starts at ``unstable.offset``; entries before it are in storage (or in a
  pending unstable snapshot).

Thread-safety: not thread-safe; owned by one ``RaftNode``.
"""

from __future__ import annotations

from pyspark_kudu.consensus.messages import Entry, Snapshot
from pyspark_kudu.consensus.raft_storage import Storage, limit_size
from pyspark_kudu.errors import CompactedError, ConsensusError, EntryUnavailableError

__all__ = ["RaftLog"]


class _Unstable:
    """Entries (and a snapshot) not yet persisted. ``entries[i].index == offset + i``."""

    def __init__(self, offset: int) -> None:
        self.snapshot: Snapshot | None = None
        self.entries: list[Entry] = []
        self.offset = offset

    def maybe_first_index(self) -> int | None:
        return self.snapshot.metadata.index + 1 if self.snapshot is not None else None

    def maybe_last_index(self) -> int | None:
        if self.entries:
            return self.offset + len(self.entries) - 1
        if self.snapshot is not None:
            return self.snapshot.metadata.index
        return None

    def maybe_term(self, i: int) -> int | None:
        if i < self.offset:
            if self.snapshot is not None and self.snapshot.metadata.index == i:
                return self.snapshot.metadata.term
            return None
        last = self.maybe_last_index()
        if last is None or i > last:
            return None
        return self.entries[i - self.offset].term

    def stable_to(self, index: int, term: int) -> None:
        t = self.maybe_term(index)
        if t is None or t != term or index < self.offset:
            # The entries were replaced by a newer leader's before persistence finished.
            return
        del self.entries[: index + 1 - self.offset]
        self.offset = index + 1

    def stable_snap_to(self, index: int) -> None:
        if self.snapshot is not None and self.snapshot.metadata.index == index:
            self.snapshot = None

    def restore(self, snap: Snapshot) -> None:
        self.offset = snap.metadata.index + 1
        self.entries = []
        self.snapshot = snap

    def truncate_and_append(self, ents: list[Entry]) -> None:
        after = ents[0].index
        if after == self.offset + len(self.entries):
            self.entries.extend(ents)
        elif after <= self.offset:
            # Replace the whole unstable tail (and re-persist from ``after``).
            self.offset = after
            self.entries = list(ents)
        else:
            del self.entries[after - self.offset:]
            self.entries.extend(ents)


class RaftLog:
    """Stable storage + unstable tail, with commit and apply cursors."""

    def __init__(self, storage: Storage, max_next_ents_size: int | None = None) -> None:
        self.storage = storage
        first = storage.first_index()
        last = storage.last_index()
        self.unstable = _Unstable(last + 1)
        # Everything up to the snapshot is committed and applied by construction.
        self.committed = first - 1
        self.applied = first - 1
        self.max_next_ents_size = max_next_ents_size

    def __repr__(self) -> str:
        return (
            f"RaftLog(committed={self.committed}, applied={self.applied}, "
            f"unstable.offset={self.unstable.offset}, len(unstable)={len(self.unstable.entries)})"
        )

    # -- indexes and terms -----------------------------------------------------------------
    def first_index(self) -> int:
        i = self.unstable.maybe_first_index()
        return i if i is not None else self.storage.first_index()

    def last_index(self) -> int:
        i = self.unstable.maybe_last_index()
        return i if i is not None else self.storage.last_index()

    def term(self, i: int) -> int:
        """Term of entry ``i``; raises CompactedError / EntryUnavailableError when unknown."""
        dummy = self.first_index() - 1
        if i < dummy:
            raise CompactedError(f"index {i} is compacted (first index {dummy + 1})")
        if i > self.last_index():
            raise EntryUnavailableError(f"index {i} is beyond the last index {self.last_index()}")
        t = self.unstable.maybe_term(i)
        if t is not None:
            return t
        return self.storage.term(i)

    def term_or_zero(self, i: int) -> int:
        try:
            return self.term(i)
        except (CompactedError, EntryUnavailableError):
            return 0

    def last_term(self) -> int:
        return self.term(self.last_index())

    def match_term(self, i: int, term: int) -> bool:
        try:
            return self.term(i) == term
        except (CompactedError, EntryUnavailableError):
            return False

    def is_up_to_date(self, last_index: int, term: int) -> bool:
        """Raft §5.4.1: is a candidate's log (last_index, term) at least as up to date as ours?"""
        lt = self.last_term()
        return term > lt or (term == lt and last_index >= self.last_index())

    # -- appending -------------------------------------------------------------------------
    def find_conflict(self, ents: tuple[Entry, ...] | list[Entry]) -> int:
        """Index of the first entry whose term differs from ours (or is new); 0 if none."""
        for e in ents:
            if not self.match_term(e.index, e.term):
                return e.index
        return 0

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """Largest ``i <= index`` whose term is ``<= term`` (fast backtracking).

        Returns ``(i, term(i))``. Every entry in ``(i, index]`` has a term above ``term``, so
        the leader can skip them all in one probe.
        """
        i = index
        while i > 0:
            try:
                t = self.term(i)
            except (CompactedError, EntryUnavailableError):
                return i, 0
            if t <= term:
                return i, t
            i -= 1
        return 0, 0

    def maybe_append(
        self, index: int, log_term: int, committed: int, ents: tuple[Entry, ...]
    ) -> int | None:
        """Follower side of AppendEntries (§5.3). Returns the last new index, or None on reject."""
        if not self.match_term(index, log_term):
            return None
        last_new = index + len(ents)
        ci = self.find_conflict(ents)
        if ci:
            if ci <= self.committed:
                raise ConsensusError(
                    f"entry {ci} conflicts with committed entry (committed={self.committed}); "
                    "a leader tried to overwrite committed state"
                )
            self.append(list(ents[ci - index - 1:]))
        self.commit_to(min(committed, last_new))
        return last_new

    def append(self, ents: list[Entry]) -> int:
        if not ents:
            return self.last_index()
        after = ents[0].index - 1
        if after < self.committed:
            raise ConsensusError(f"append after {after} is below committed {self.committed}")
        self.unstable.truncate_and_append(ents)
        return self.last_index()

    # -- cursors ---------------------------------------------------------------------------
    def commit_to(self, to: int) -> None:
        if self.committed < to:
            if self.last_index() < to:
                raise ConsensusError(
                    f"commit index {to} is out of range [last index {self.last_index()}]"
                )
            self.committed = to

    def maybe_commit(self, max_index: int, term: int) -> bool:
        """Leader: advance commit to ``max_index`` only if that entry is of ``term`` (§5.4.2)."""
        if max_index > self.committed and self.term_or_zero(max_index) == term:
            self.commit_to(max_index)
            return True
        return False

    def applied_to(self, i: int) -> None:
        if i == 0:
            return
        if self.committed < i or i < self.applied:
            raise ConsensusError(
                f"applied {i} is out of range "
                f"[prev applied {self.applied}, committed {self.committed}]"
            )
        self.applied = i

    def stable_to(self, index: int, term: int) -> None:
        self.unstable.stable_to(index, term)

    def stable_snap_to(self, index: int) -> None:
        self.unstable.stable_snap_to(index)

    def restore(self, snap: Snapshot) -> None:
        self.committed = snap.metadata.index
        self.unstable.restore(snap)

    # -- reading ---------------------------------------------------------------------------
    def unstable_entries(self) -> list[Entry]:
        return list(self.unstable.entries)

    def slice(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        """Entries ``[lo, hi)`` across storage and the unstable tail."""
        if lo > hi:
            raise ConsensusError(f"invalid slice {lo} > {hi}")
        if lo == hi:
            return []
        fi = self.first_index()
        if lo < fi:
            raise CompactedError(f"entries from {lo} were compacted (first index {fi})")
        if hi > self.last_index() + 1:
            raise EntryUnavailableError(f"slice [{lo},{hi}) out of bound {fi}..{self.last_index()}")
        ents: list[Entry] = []
        uoff = self.unstable.offset
        if lo < uoff:
            stored = self.storage.entries(lo, min(hi, uoff), max_size)
            if len(stored) < min(hi, uoff) - lo:
                return stored  # hit the size limit inside storage
            ents = stored
        if hi > uoff:
            ents = ents + self.unstable.entries[max(lo, uoff) - uoff: hi - uoff]
        return limit_size(ents, max_size)

    def entries_from(self, i: int, max_size: int | None = None) -> list[Entry]:
        if i > self.last_index():
            return []
        return self.slice(i, self.last_index() + 1, max_size)

    def has_next_committed(self) -> bool:
        return self.committed > max(self.applied, self.first_index() - 1)

    def next_committed(self) -> list[Entry]:
        """Committed entries not yet applied (bounded by ``max_next_ents_size``)."""
        off = max(self.applied + 1, self.first_index())
        if self.committed + 1 > off:
            return self.slice(off, self.committed + 1, self.max_next_ents_size)
        return []

    def snapshot(self) -> Snapshot:
        if self.unstable.snapshot is not None:
            return self.unstable.snapshot
        return self.storage.snapshot()
