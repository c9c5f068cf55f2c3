"""The in-memory index of a WAL: log index -> (term, segment, offset, frame size).

Entries are kept for one contiguous run of indexes in four ``array('q')`` columns (about
32 bytes an entry, against ~100 for a tuple), so a replica can index millions of entries
while their payloads stay on disk.

The append rule is the WAL's replay rule, applied identically when appending and when
replaying segments: an entry whose index is at most the last index truncates the suffix
from that index (how a conflicting-suffix truncation is persisted in an append-only file,
Raft §5.3); an entry right after the last one extends the run; a gap is refused. A *fresh*
index (nothing appended since the log was created or reset) accepts any first index.

Thread-safety: not thread-safe; :class:`~pyspark_kudu.wal.log.Log` guards it with its lock.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from pyspark_kudu.errors import EntryUnavailableError

__all__ = ["Location", "LogIndex"]


class Location(NamedTuple):
    """Where one entry's frame lives, and its term. Immutable."""

    term: int
    seq: int
    offset: int
    size: int


class LogIndex:
    """Contiguous entries ``first .. last``; empty when ``last == first - 1``.

    Not thread-safe (the log's lock guards it).
    """

    def __init__(self) -> None:
        self._first = 1
        self._fresh = True
        self._terms = array("q")
        self._seqs = array("q")
        self._offsets = array("q")
        self._sizes = array("q")

    @property
    def fresh(self) -> bool:
        """True until the first entry: then any index may start the run."""
        return self._fresh

    @property
    def first(self) -> int:
        return self._first

    @property
    def last(self) -> int:
        return self._first + len(self._terms) - 1

    def __len__(self) -> int:
        return len(self._terms)

    def accepts(self, index: int) -> bool:
        """Whether an entry at ``index`` can be appended (possibly truncating)."""
        return self._fresh or index <= self.last + 1

    def append(self, index: int, loc: Location) -> None:
        """Add ``index`` at ``loc``, first truncating any entries at ``index`` or later.

        The caller checks :meth:`accepts` first.
        """
        if self._fresh:
            self._fresh = False
            self._first = index
        elif index <= self.last:
            self.truncate_from(index)
        self._terms.append(loc.term)
        self._seqs.append(loc.seq)
        self._offsets.append(loc.offset)
        self._sizes.append(loc.size)

    def truncate_from(self, index: int) -> None:
        """Drop entries ``index`` and later; below ``first`` the run restarts at ``index``."""
        if index <= self._first:
            self._first = index
            del self._terms[:], self._seqs[:], self._offsets[:], self._sizes[:]
            return
        k = index - self._first
        del self._terms[k:], self._seqs[k:], self._offsets[k:], self._sizes[k:]

    def forget_through(self, index: int) -> None:
        """Drop entries up to and including ``index`` (log GC); the last index is kept."""
        index = min(index, self.last)
        if index < self._first:
            return
        k = index - self._first + 1
        del self._terms[:k], self._seqs[:k], self._offsets[:k], self._sizes[:k]
        self._first = index + 1

    def reset(self) -> None:
        """Forget everything and become fresh (a snapshot replaced the whole log)."""
        self._first = 1
        self._fresh = True
        del self._terms[:], self._seqs[:], self._offsets[:], self._sizes[:]

    def location(self, index: int) -> Location:
        k = index - self._first
        if k < 0 or k >= len(self._terms):
            raise EntryUnavailableError(
                f"log index {index} is not in the WAL (it holds {self._first}..{self.last})"
            )
        return Location(self._terms[k], self._seqs[k], self._offsets[k], self._sizes[k])

    def term(self, index: int) -> int:
        return self.location(index).term

    def sizes(self, lo: int, hi: int) -> array[int]:
        """Frame sizes of entries ``[lo, hi)`` (both within the run)."""
        return self._sizes[lo - self._first:hi - self._first]
