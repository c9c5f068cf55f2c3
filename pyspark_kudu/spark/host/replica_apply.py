"""Applying committed entries on a replica's host: how much a request applies itself, and
what it leaves to the resident tablet server's background applier.

DESIGN §3.6. A request (:mod:`~pyspark_kudu.spark.host.handlers`) persists what its round
carries, then applies the committed entries it learns of through a throw-away
``RaftNode`` (:func:`drain`), so configuration entries are applied by the same code on every
replica and writes reach the tablet through a :class:`TabletSink`, which keeps their per-row
results for the response. Without a background applier (executor tasks without a resident
server, ``local[*]`` virtual servers, unit tests) a request applies everything it learns of.
Once a process registered one (:func:`use_background_apply`: the resident tablet server
does, :mod:`~pyspark_kudu.spark.host.background_apply`), a request applies only within an
:class:`ApplyLimit` and the applier applies the rest between requests
(:func:`~pyspark_kudu.spark.host.handlers.apply_backlog` is its step). A scan that finds
committed entries unapplied applies them first (:func:`catch_up`), instead of rebuilding
the tablet from the WAL.

The index up to which a replica applied is kept in ``<tablet>/applied`` (atomic replace,
:func:`read_applied`), written after the entries up to it were applied.

Thread-safety: every function here runs with the replica's locks held (the caller's: both,
or the log's only with a :class:`TabletSink` made ``wal_only``, or the tablet's only in
:func:`apply_in_background`, which takes the log's for its reads); the registered applier
is process-wide state, set once by the resident server.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol

from pyspark_kudu.consensus.messages import Entry, EntryType, HardState, Message
from pyspark_kudu.consensus.raft import Config, RaftNode
from pyspark_kudu.errors import CompactedError
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.spark.host.replica_cache import NeedsTablet, ReplicaHandle
from pyspark_kudu.spark.host.writers_record import record_writer
from pyspark_kudu.tablet import WriteResult
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE
from pyspark_kudu.wal import WalOptions, WalStorage

__all__ = [
    "CONF_FRAME_MAX",
    "READY_LIMIT_BYTES",
    "ApplyLimit",
    "BackgroundApply",
    "TabletSink",
    "apply_committed",
    "apply_in_background",
    "background_applier",
    "catch_up",
    "drain",
    "read_applied",
    "replica_node",
    "request_limit",
    "use_background_apply",
    "waited_for",
    "write_applied",
]

#: Committed entries a request's ``RaftNode`` hands out at a time: what a request holds of
#: a replica's backlog in memory at once.
READY_LIMIT_BYTES = 16 * 1024 * 1024
#: A configuration entry (one ``ConfChange``: a type and a member) is a few hundred bytes;
#: a log entry whose frame is at least this large is a write, known without reading it.
CONF_FRAME_MAX = 64 * 1024
_APPLIED_FILE = "applied"


class BackgroundApply(Protocol):
    """Where requests leave committed entries they did not apply
    (:class:`~pyspark_kudu.spark.host.background_apply.BackgroundApplier`)."""

    leader_inline_s: float

    def schedule(self, root: str, tablet_id: str, options: WalOptions | None, *,
                 leader: bool = False) -> None: ...

    def take_results(self, root: str, tablet_id: str) -> list[WriteResult]: ...

    def urgent(self) -> AbstractContextManager[None]: ...


_background: BackgroundApply | None = None


def waited_for(leader: bool, collecting: bool) -> AbstractContextManager[None]:
    """Around a request's own apply: the leader's in a round collecting per-row results
    (a write waits for it) holds this process's background applier back
    (:meth:`~pyspark_kudu.spark.host.background_apply.BackgroundApplier.urgent`)."""
    bg = _background
    return bg.urgent() if bg is not None and leader and collecting else nullcontext()


def use_background_apply(applier: BackgroundApply | None) -> BackgroundApply | None:
    """Requests served by this process from now on apply committed entries only for a
    bounded time and leave the rest to ``applier`` (the resident tablet server's, see
    :mod:`~pyspark_kudu.spark.host.background_apply`); None: apply everything inline.
    Returns the previous one."""
    global _background
    previous, _background = _background, applier
    return previous


def background_applier() -> BackgroundApply | None:
    """The applier :func:`use_background_apply` registered in this process, if any."""
    return _background


def read_applied(io: FileIO) -> int:
    if not io.exists(_APPLIED_FILE):
        return 0
    return int(json.loads(io.read_bytes(_APPLIED_FILE))["index"])


def write_applied(io: FileIO, index: int) -> None:
    io.atomic_write(json.dumps({"index": index}).encode(), _APPLIED_FILE)


class TabletSink:
    """Applies committed entries to the replica's tablet, if it has one (a superblock).

    The tablet is the one a previous task of this process left open (the cache of
    :mod:`pyspark_kudu.spark.host.replica_cache`), or is opened on first use with a log bounded by
    what was applied *before* this task (``applied_before``), so bootstrap replays only that
    and the new entries are applied here, yielding their per-row results. Replicas created
    without a schema are consensus-only and skip this.
    """

    def __init__(self, root: str, tablet_id: str, io: FileIO, handle: ReplicaHandle,
                 applied_before: int, *, wal_only: bool = False) -> None:
        """``wal_only``: the request holds only the replica's log lock; it may not apply
        (:class:`~pyspark_kudu.spark.host.replica_cache.NeedsTablet` if it must)."""
        self.wal_only = wal_only
        self._root = root
        self._tablet_id = tablet_id
        self.handle = handle
        self._applied_before = applied_before
        self._has_tablet = io.exists(SUPERBLOCK_FILE)
        self.results: list[WriteResult] = []

    def all_results(self) -> tuple[WriteResult, ...]:
        """Results of what this request applied, after those of entries the background
        applier applied on this replica since the last request."""
        bg = _background
        earlier = bg.take_results(self._root, self._tablet_id) if bg is not None else []
        return (*earlier, *self.results)

    def apply(self, entries: Sequence[Entry], *, defer_flush: bool = False) -> None:
        """Apply ``entries``; ``defer_flush``: see :class:`ApplyLimit`."""
        if self.wal_only and entries:
            raise NeedsTablet(f"tablet {self._tablet_id}: {len(entries)} committed entries "
                              f"to apply, from {entries[0].index}")
        writes = [e for e in entries if e.type == EntryType.NORMAL and e.data]
        if not self._has_tablet or not entries:
            return
        h = self.handle
        if h.tablet is None and not writes:
            return
        tablet = h.open_tablet(self._root, self._tablet_id, self._applied_before)
        self.results.extend(tablet.apply(e.index, e.data, defer_flush=defer_flush)
                            for e in writes)
        assert h.tablet_log is not None
        h.tablet_log.advance_upto(entries[-1].index)


@dataclass
class ApplyLimit:
    """How much of what commits a request applies itself (:func:`drain`); the rest stays
    unapplied (held) for a later request, a scan's :func:`catch_up` or the background
    applier (the next request builds its node from the ``applied`` file and hands the held
    entries out again). Held entries are remembered by index (``held_from``..``held_to``),
    not kept: a configuration entry committing later in the request reads them back from
    the log to apply them first; the request's entries are never all in memory at once.

    ``defer``: nothing (a follower in a round collecting the leader's per-row results, or
    any request but such a round's PERSIST in a process with a background applier).
    ``deadline`` (``time.monotonic()``): entries one by one until then, at least one.
    Either way a configuration entry that commits is applied, after everything held.

    ``defer_flush`` (with ``deadline``; the leader's apply a write waits on for its per-row
    results): the entries applied until the deadline leave the MemRowSet's flush to the
    background applier, which the request schedules when the flush is due
    (:meth:`~pyspark_kudu.tablet.Tablet.flush_due`), up to
    ``TabletOptions.deferred_flush_max_bytes``. A flush was 0.93 of the 1.18 CPU-s of one
    replica's apply of 1.67M rows (a tablet's share of a 10M-row insert), all of it in
    front of the write's results (Kudu too flushes MemRowSets in the background)."""

    defer: bool = False
    deadline: float | None = None
    defer_flush: bool = False
    #: (With ``deadline``.) Stop sooner, after the entry being applied, once this says a
    #: request is waiting (the background applier's chunks, so that a round arriving
    #: mid-chunk waits for the replica's lock for one entry, not the whole chunk).
    yield_to: Callable[[], bool] | None = None
    stopped: bool = False
    held_from: int = 0  # first held entry's index (0: none held)
    held_to: int = 0  # last held entry's index

    def holding(self) -> bool:
        return self.defer or self.stopped

    def spent(self) -> bool:
        """(With ``deadline``.) Whether to stop applying: the deadline passed or a request
        is waiting (``yield_to``)."""
        assert self.deadline is not None
        return time.monotonic() >= self.deadline or (
            self.yield_to is not None and self.yield_to())

    def hold(self, entries: Sequence[Entry]) -> None:
        """Leave ``entries`` (committed, in the log, following any held before) unapplied."""
        if entries:
            self.hold_range(entries[0].index, entries[-1].index)

    def hold_range(self, lo: int, hi: int) -> None:
        """Leave entries ``[lo, hi]`` (committed, following any held before) unapplied."""
        if not self.held_from:
            self.held_from = lo
        self.held_to = hi

    def take_held(self, storage: WalStorage, then: Sequence[Entry]) -> list[Entry]:
        """The held entries, read back from ``storage``, followed by ``then`` (the entries
        that follow them); none are held afterwards."""
        if not self.held_from:
            return list(then)
        lo, hi = self.held_from, (then[0].index if then else self.held_to + 1)
        self.held_from = self.held_to = 0
        return [*storage.entries(lo, hi), *then]


def request_limit(*, leader: bool, collecting: bool) -> ApplyLimit | None:
    """How much a request applies itself (None: everything it learns of). Nobody waits for
    a follower's apply: with a background applier it is all left to the applier, and in a
    round collecting results (which the write waits for) to a later request. The leader's
    replica applies inline only in such a round, for up to the applier's
    ``leader_inline_s``; without an applier it applies everything."""
    bg = _background
    if leader:
        if bg is None:
            return None
        return (ApplyLimit(deadline=time.monotonic() + bg.leader_inline_s, defer_flush=True)
                if collecting else ApplyLimit(defer=True))
    return ApplyLimit(defer=True) if collecting or bg is not None else None


def configuration_between(storage: WalStorage, lo: int, hi: int) -> bool:
    """Whether log entries ``[lo, hi)`` hold a configuration entry. Only entries small
    enough to be one are read (:data:`CONF_FRAME_MAX`)."""
    if lo >= hi:
        return False
    runs: list[list[int]] = []  # [first, end) of each run of small entries
    for k, size in enumerate(storage.frame_sizes(lo, hi)):
        if size < CONF_FRAME_MAX:
            if runs and runs[-1][1] == lo + k:
                runs[-1][1] += 1
            else:
                runs.append([lo + k, lo + k + 1])
    return any(e.type != EntryType.NORMAL
               for a, b in runs for e in storage.entries(a, b))


def drain(
    node: RaftNode, storage: WalStorage, io: FileIO, out: list[Message], span: list[int],
    applier: TabletSink, host: str = "", limit: ApplyLimit | None = None,
) -> None:
    """Persist and hand out everything ``node`` has ready, and apply committed entries:
    all of them, or what ``limit`` allows (see :class:`ApplyLimit`)."""
    while True:
        if limit is not None and limit.holding():
            _hold_unread(node, storage, limit)
        if not node.has_ready():
            return
        rd = node.ready()
        if rd.snapshot is not None:
            if applier.wal_only:  # replaces the log the tablet was applied from
                raise NeedsTablet("a snapshot to install")
            storage.apply_snapshot(rd.snapshot)
        if rd.entries:
            storage.append(rd.entries)
            record_writer(io, host, rd.entries)
        if rd.hard_state is not None:
            storage.set_hard_state(rd.hard_state)
        out.extend(rd.messages)
        before = node.conf_state
        node.advance(rd)
        if rd.committed_entries:
            if node.conf_state != before:
                storage.set_conf_state(node.conf_state)
            committed = list(rd.committed_entries)
            if limit is not None and limit.holding():
                if all(e.type == EntryType.NORMAL for e in committed):  # as all held are
                    limit.hold(committed)  # (a configuration entry follows: read on to it)
                    continue
                committed = limit.take_held(storage, committed)
                applier.apply(committed)
            elif limit is not None and limit.deadline is not None:
                done, spent = 0, False
                while done < len(committed) and not spent:
                    applier.apply(committed[done:done + 1], defer_flush=limit.defer_flush)
                    done += 1
                    spent = limit.spent()
                rest = committed[done:]
                limit.stopped = spent or limit.spent()
                if any(e.type != EntryType.NORMAL for e in rest):
                    applier.apply(rest)  # a configuration entry: everything up to it
                elif rest:
                    limit.hold(rest)
                    committed = committed[:done]
            else:
                applier.apply(committed)
            last = committed[-1].index
            write_applied(io, last)
            span.extend((committed[0].index, last))


def _hold_unread(node: RaftNode, storage: WalStorage, limit: ApplyLimit) -> None:
    """(``limit`` holding.) Hold every committed entry ``node`` has yet to hand out without
    reading it, unless a configuration entry is among them (which is applied, with
    everything held before it, within the request: those are read as before). A request
    that leaves writes to the background applier reads none of them: before, each drain of
    a follower's request read up to :data:`READY_LIMIT_BYTES` of the backlog only to hold
    it, and the oldest backlog was read again by every request (with the applier's reads,
    half of the tablet servers' GIL-held time in a 50M-row composite-key insert)."""
    pending = node.unread_committed()
    if pending is None:
        return
    lo, hi = pending
    if lo < storage.first_index() or configuration_between(storage, lo, hi + 1):
        return
    limit.hold_range(lo, hi)
    node.skip_committed(hi)


def replica_node(storage: WalStorage, applied: int, replica_id: str = "_") -> RaftNode:
    """A throw-away ``RaftNode`` over a replica's durable state that has applied up to
    ``applied`` and hands committed entries out :data:`READY_LIMIT_BYTES` at a time."""
    return RaftNode(Config(id=replica_id, storage=storage, applied=applied,
                           rng=random.Random(0), max_size_per_msg=None,
                           max_committed_size_per_ready=READY_LIMIT_BYTES))


def apply_committed(
    io: FileIO, storage: WalStorage, applied: int, commit: int, applier: TabletSink,
    host: str, limit: ApplyLimit | None = None,
) -> tuple[int, ...]:
    """Leader replica: apply what its client declared committed (configuration included),
    all of it or what ``limit`` allows.

    A throw-away ``RaftNode`` hands out the committed entries exactly as a follower's would,
    so configuration entries are applied by the same code on every replica.
    """
    if commit <= applied:
        return ()
    node = replica_node(storage, applied)
    span: list[int] = []
    drain(node, storage, io, [], span, applier, host, limit)
    return (span[0], span[-1]) if span else ()


#: What the background applier reads of a replica's log at a time, holding the log lock (a
#: round appending meanwhile waits at most for one such read).
BACKGROUND_PAGE_BYTES = 4 * 1024 * 1024


def apply_in_background(io: FileIO, handle: ReplicaHandle, applied: int, sink: TabletSink,
                        limit: ApplyLimit) -> int | None:
    """(The replica's tablet lock held, not its log lock.) Apply the committed entries after
    ``applied`` until ``limit`` is spent (at least one entry), reading them from the log a
    page at a time under the log lock, so that rounds append meanwhile; the ``applied`` file
    follows each page. Returns the index applied up to, or None (nothing more applied) when
    a configuration entry is next, or the log no longer holds the next entry: the caller
    applies under both locks with :func:`apply_committed`, which handles both."""
    storage = handle.storage
    now = applied
    while True:
        with handle.wal_lock:
            commit = storage.initial_state()[0].commit
            if now >= commit:
                return now
            if now + 1 < storage.first_index():
                return None
            page = storage.entries(now + 1, commit + 1, BACKGROUND_PAGE_BYTES)
        normal = 0
        while normal < len(page) and page[normal].type == EntryType.NORMAL:
            normal += 1
        if not normal:
            return None
        spent = False
        for e in page[:normal]:
            sink.apply([e])
            now = e.index
            spent = limit.spent()
            if spent:
                break
        write_applied(io, now)
        if spent or normal < len(page):
            return now if spent else None


def catch_up(root: str, tablet_id: str, io: FileIO, handle: ReplicaHandle,
             known_commit: int | None = None, *, trusted: bool = False,
             commit_term: int | None = None, host: str = "") -> int:
    """(Replica lock held.) Bring the replica's tablet up to everything it may know committed,
    as a settle round would, and return its applied index. A scan calls this instead of
    rebuilding a tablet from the WAL.

    ``known_commit`` is a commit index the reader learned from the tablet's leader. The
    replica takes it as its own commit index (up to its last entry) when ``trusted`` (it is
    the leader's replica: the leader's log holds every committed entry, and never loses
    one), or when its log holds entry ``known_commit`` at ``commit_term`` (Log Matching: its
    log then equals the leader's up to there, all of it committed). The handle is marked
    changed (:meth:`ReplicaHandle.will_mutate`) before anything is written.
    """
    storage = handle.storage
    hs, _ = storage.initial_state()
    commit = hs.commit
    last = storage.last_index()
    if known_commit is not None and known_commit > commit:
        take = commit
        if trusted:
            take = min(known_commit, last)
        elif commit_term is not None and known_commit <= last:
            with contextlib.suppress(CompactedError):
                if storage.term(known_commit) == commit_term:
                    take = known_commit
        if take > commit:
            handle.will_mutate()
            storage.set_hard_state(HardState(hs.term, hs.vote, take))
            commit = take
    applied = read_applied(io)
    if commit <= applied:
        return applied
    handle.will_mutate()
    sink = TabletSink(root, tablet_id, io, handle, applied)
    span = apply_committed(io, storage, applied, commit, sink, host)
    return span[-1] if span else applied
