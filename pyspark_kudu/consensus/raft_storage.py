"""The read-only ``Storage`` protocol the Raft core sees, and ``MemoryStorage``.

The core never writes storage (the etcd-io/raft habit): the application persists what a
``Ready`` hands it (entries, hard state, snapshot) and the core only *reads* stable state
through this protocol. ``MemoryStorage`` is both the reference implementation and the test
double; :mod:`pyspark_kudu.wal` provides the durable one.

Index conventions (shared by every implementation):

- Entries ``first_index() .. last_index()`` are readable. Everything below ``first_index()``
  was compacted into the snapshot whose index is ``first_index() - 1``; ``term()`` of that
  index is still answered (the snapshot's term), which log matching needs.
- ``entries(lo, hi)`` returns ``[lo, hi)``; ``lo < first_index()`` raises
  :class:`~pyspark_kudu.errors.CompactedError`, ``hi > last_index() + 1`` raises
  :class:`~pyspark_kudu.errors.EntryUnavailableError`.

Thread-safety: ``MemoryStorage`` is not thread-safe; callers serialise access (the core is
single-threaded by construction).
"""

from __future__ import annotations

import itertools
import json
from typing import Protocol, runtime_checkable

from pyspark_kudu.consensus.messages import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    Snapshot,
    SnapshotMetadata,
    encode_conf_change,
)
from pyspark_kudu.errors import CompactedError, EntryUnavailableError, InvalidArgumentError

__all__ = ["MemoryStorage", "Storage", "WritableStorage", "bootstrap", "limit_size"]


@runtime_checkable
class Storage(Protocol):
    """Stable Raft state, read-only from the core's point of view."""

    def initial_state(self) -> tuple[HardState, ConfState]:
        """Hard state and configuration to start from (the configuration as of ``applied``)."""
        ...

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        """Entries ``[lo, hi)``, truncated to ``max_size`` bytes but always at least one."""
        ...

    def term(self, index: int) -> int:
        """Term of the entry at ``index`` (``first_index() - 1`` included)."""
        ...

    def first_index(self) -> int:
        ...

    def last_index(self) -> int:
        ...

    def snapshot(self) -> Snapshot:
        """The most recent snapshot, sent to a peer whose needed entries are compacted."""
        ...


class WritableStorage(Storage, Protocol):
    """A ``Storage`` plus the writes an application performs (``MemoryStorage``, ``WalStorage``)."""

    def set_hard_state(self, hs: HardState) -> None: ...

    def set_conf_state(self, cs: ConfState) -> None: ...

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None: ...

    def apply_snapshot(self, snap: Snapshot) -> None: ...


def bootstrap(storage: WritableStorage, voters: list[str] | tuple[str, ...]) -> None:
    """Found a new group: write its initial configuration into the log itself.

    Entry 1 (term 1, committed) is one ``BOOTSTRAP`` configuration change carrying the whole
    founding configuration. It must live in the log, not only in the founders' storage: a
    replica that joins later starts with an *empty* configuration and learns the group from
    the entries (or the snapshot) the leader sends it. It must be *one* entry: replaying one
    ``ADD_VOTER`` per founder, a replica re-added under a founder's id would, after the first
    entry, believe it is the only voter and elect itself (found by the simulator, pinned in
    ``tests/unit/consensus/test_core_findings.py``).
    Founders call this on empty storage; joiners start from ``MemoryStorage()``.
    """
    if not voters:
        raise InvalidArgumentError("a Raft group needs at least one voter")
    if len(set(voters)) != len(voters):
        raise InvalidArgumentError(f"duplicate voters in {list(voters)}")
    if storage.last_index() != 0 or not storage.initial_state()[0].is_empty():
        raise InvalidArgumentError("bootstrap needs empty storage (this one has a log or state)")
    conf = ConfState(frozenset(voters))
    cc = ConfChange(ConfChangeType.BOOTSTRAP, sorted(voters)[0],
                    json.dumps(conf.to_dict(), sort_keys=True).encode())
    storage.append([Entry(1, 1, EntryType.CONF_CHANGE, encode_conf_change(cc))])
    storage.set_hard_state(HardState(term=1, commit=1))
    # The founders start with the configuration in force (re-applying entry 1 is a no-op).
    storage.set_conf_state(conf)


def limit_size(entries: list[Entry], max_size: int | None) -> list[Entry]:
    """Prefix of ``entries`` whose total size fits ``max_size``; never empty if input is not."""
    if max_size is None or not entries:
        return entries
    total = entries[0].size()
    n = 1
    while n < len(entries):
        total += entries[n].size()
        if total > max_size:
            break
        n += 1
    return entries[:n]


class MemoryStorage:
    """In-memory ``Storage`` that also offers the writes an application performs.

    ``_ents[0]`` is a dummy entry carrying the snapshot's index and term, so
    ``term(first_index() - 1)`` needs no special case.
    """

    @classmethod
    def bootstrapped(cls, voters: list[str] | tuple[str, ...]) -> MemoryStorage:
        """Storage of a founding member of a new group (see :func:`bootstrap`)."""
        st = cls()
        bootstrap(st, voters)
        return st

    def __init__(self, conf_state: ConfState | None = None) -> None:
        self._hard_state = HardState()
        self._snapshot = Snapshot(SnapshotMetadata(conf_state=conf_state or ConfState()))
        self._ents: list[Entry] = [Entry(term=0, index=0)]

    # -- Storage protocol ------------------------------------------------------------------
    def initial_state(self) -> tuple[HardState, ConfState]:
        return self._hard_state, self._snapshot.metadata.conf_state

    def entries(self, lo: int, hi: int, max_size: int | None = None) -> list[Entry]:
        offset = self._ents[0].index
        if lo <= offset:
            raise CompactedError(f"entries from index {lo} were compacted (snapshot at {offset})")
        if hi > self.last_index() + 1:
            raise EntryUnavailableError(
                f"entries up to index {hi - 1} requested, but the log ends at {self.last_index()}"
            )
        return limit_size(self._ents[lo - offset:hi - offset], max_size)

    def term(self, index: int) -> int:
        offset = self._ents[0].index
        if index < offset:
            raise CompactedError(f"term of index {index} was compacted (snapshot at {offset})")
        if index - offset >= len(self._ents):
            raise EntryUnavailableError(
                f"index {index} is beyond the last index {self.last_index()}")
        return self._ents[index - offset].term

    def first_index(self) -> int:
        return self._ents[0].index + 1

    def last_index(self) -> int:
        return self._ents[0].index + len(self._ents) - 1

    def snapshot(self) -> Snapshot:
        return self._snapshot

    # -- writes (the application's side) ---------------------------------------------------
    @property
    def hard_state(self) -> HardState:
        return self._hard_state

    def set_hard_state(self, hs: HardState) -> None:
        self._hard_state = hs

    def set_conf_state(self, cs: ConfState) -> None:
        """Record the configuration in force after applying entries (kept with the snapshot)."""
        md = self._snapshot.metadata
        self._snapshot = Snapshot(SnapshotMetadata(md.index, md.term, cs), self._snapshot.data)

    def apply_snapshot(self, snap: Snapshot) -> None:
        """Replace the whole log by ``snap`` (a follower installing a copy)."""
        if snap.metadata.index <= self._snapshot.metadata.index and not (
            self._snapshot.is_empty() and snap.is_empty()
        ):
            raise InvalidArgumentError(
                f"snapshot at index {snap.metadata.index} is older than the current one "
                f"at {self._snapshot.metadata.index}"
            )
        self._snapshot = snap
        self._ents = [Entry(term=snap.metadata.term, index=snap.metadata.index)]

    def create_snapshot(self, index: int, conf_state: ConfState, data: bytes = b"") -> Snapshot:
        """Record a snapshot of the applied state at ``index`` (call :meth:`compact` after)."""
        if index <= self._snapshot.metadata.index:
            raise InvalidArgumentError(
                f"snapshot index {index} is not after the current snapshot "
                f"at {self._snapshot.metadata.index}"
            )
        if index > self.last_index():
            raise InvalidArgumentError(f"snapshot index {index} is beyond the last index")
        self._snapshot = Snapshot(SnapshotMetadata(index, self.term(index), conf_state), data)
        return self._snapshot

    def compact(self, index: int) -> None:
        """Discard entries up to and including ``index`` (log GC)."""
        offset = self._ents[0].index
        if index <= offset:
            raise CompactedError(f"index {index} is already compacted (snapshot at {offset})")
        if index > self.last_index():
            raise InvalidArgumentError(
                f"cannot compact to {index}: the log ends at {self.last_index()}"
            )
        i = index - offset
        self._ents = [Entry(term=self._ents[i].term, index=index), *self._ents[i + 1:]]

    def append(self, entries: list[Entry] | tuple[Entry, ...]) -> None:
        """Append, truncating any existing suffix that ``entries`` overwrite."""
        if not entries:
            return
        for a, b in itertools.pairwise(entries):
            if b.index != a.index + 1:
                raise InvalidArgumentError(
                    f"entries to append are not consecutive: index {a.index} then {b.index}"
                )
        first = self.first_index()
        last = entries[-1].index
        if last < first:
            return  # entirely compacted already
        ents = list(entries)
        if first > ents[0].index:
            ents = ents[first - ents[0].index:]
        offset = ents[0].index - self._ents[0].index
        if offset > len(self._ents):
            raise InvalidArgumentError(
                f"missing log entries: last index {self.last_index()}, appending at {ents[0].index}"
            )
        self._ents = self._ents[:offset] + ents
