"""The replica side of replication: what a pinned task does to the replicas on its host.

DESIGN §3: the leader's Raft state machine runs in the client's driver; every replica's
*persistent* state (term, vote, log, configuration) lives on its tablet server. A pinned task
receives :class:`PeerRequest`s for the replicas of its tablet server and returns one
:class:`PeerResponse` each. Nothing here imports Spark, so the same code runs in executor
tasks, in ``local[*]`` virtual tablet servers and in plain unit tests.

Requests:

=============  ==============================================================================
CREATE         create the replica; founding members get the group's configuration bootstrapped
               into their log (:func:`~pyspark_kudu.consensus.raft_storage.bootstrap`), joiners
               start empty and learn it from the leader.
READ_STATE     hard state, configuration, log bounds and the uncommitted tail: what a client
               needs to act as this replica's leader state machine.
PERSIST        the *leader's own* log and hard state, written on the leader replica's host.
               Fencing: refused unless the replica's durable term equals the request's and
               it voted for itself in that term; a replica that moved on to a newer term
               never takes entries from an older leader.
STEP           Raft messages to a follower (AppendEntries, heartbeats, RequestVote, ...). A
               follower ``RaftNode`` is rebuilt from durable state, steps the messages,
               persists (entries fsynced through the WAL's group commit) and returns its
               responses; durable state is all a follower needs to answer correctly.
READ_ENTRIES   log entries ``[lo, hi)`` and the term at ``lo - 1``, for catching a lagging
               follower up from a healthy replica; with ``as_refs`` large entries come back
               as refs to this replica's log, delivered to the follower by shuffle.
COPY_OUT       stage a tablet copy of this replica (:mod:`~pyspark_kudu.spark.host.tabletcopy`):
               answers a served copy's manifest, or with ``as_refs`` (or no resident server
               here) refs to its parts (``entries``), the applied index it stands for
               (``last_index``; the replica first applies everything it knows committed),
               that index's term (``prev_term``) and configuration.
INSTALL_COPY   fetch a served copy from its source's resident server, or store delivered
               copy parts ``[lo, lo + len(entries))`` of ``hi``; the request that completes
               the set installs the copy (``installed``) as a Raft snapshot.
DROP_COPY      remove what COPY_OUT staged for copy ``copy_id`` on this host.
WIPE           delete this server's replica files of the tablet, if any: sent only by a leader
               about to add the server as a *new* member (raft.py rule 6: a replica id that
               left the configuration comes back empty, never with an old log).
UNSAFE_CONFIG  manual recovery of a tablet that lost its majority (config change seed,
               "unsafe config change"): force ``voters`` as this replica's configuration,
               treat its whole log as committed and move to a new term. Loses whatever only
               the lost replicas had; a tool asks for it explicitly, never the runtime.
=============  ==============================================================================

**Failed replicas** (DESIGN §5): a replica whose files turn out corrupt (a bad CRC inside the
log, an unreadable rowset or metadata) or whose disk is full or failing is marked failed: a
``failed`` file in its directory records why, and from then on every request for it --
scans included -- is refused with ``replica_failed`` set, so it never serves data again. The
client reports it to the master (a REPLACE mark) and it is replaced like a dead one; its files
go when the sweep deletes the evicted replica. A bad CRC at the very tail of the last WAL
segment is a torn write, which WAL recovery truncates: that is not a failure.

Where a replica's configuration is applied: a follower applies configuration entries when
they commit (module rule 5 of :mod:`pyspark_kudu.consensus.raft`). The index up to which
that happened is kept in ``<tablet>/applied`` (atomic replace) with the configuration in
``meta``; ``meta`` is written first, so a crash between the two only replays idempotent
configuration entries.

Concurrency: one process at a time uses a replica, under an exclusive ``flock`` on
``<tablet>/lock`` (two Python workers of one executor, or executors of two applications may
touch the same replica); inside it, a request that applies nothing (with a background
applier: every ``STEP``, a ``PERSIST`` not collecting results; log reads) holds only the
replica's log lock, any other both its locks (:func:`_handle_locked`; a log-only request
that must apply after all runs again holding both). Open replicas are reused across tasks
of one worker process when no other process changed them in between
(:mod:`pyspark_kudu.spark.host.replica_cache`, "Two locks per replica").

**Applying**: a request applies the committed entries it learns of -- all of them; in a
process with a background applier, only configuration entries, or on the leader's replica
in a round collecting per-row results for a bounded time, scheduling the replica with the
applier for the rest (:mod:`~pyspark_kudu.spark.host.replica_apply`); :func:`apply_backlog`
is the applier's step.

**Staged batches are resolved a slice at a time**
(:mod:`~pyspark_kudu.spark.host.resolve_slices`): a PERSIST's entries and a STEP's append
messages are resolved, appended and released slice by slice, so a large write never has all
of a host's batches in memory at once. Committed entries a request leaves to a later apply
(``ApplyLimit``) are remembered by index, not held.

Thread-safety: :func:`handle_requests` is reentrant; per-replica exclusion is the lock above.
"""

from __future__ import annotations

import enum
import errno
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

from pyspark_kudu.consensus.messages import (
    NONE,
    ConfState,
    Entry,
    HardState,
    Message,
    SnapshotMetadata,
)
from pyspark_kudu.consensus.raft_storage import bootstrap
from pyspark_kudu.errors import (
    CompactedError,
    CorruptionError,
    DiskFullError,
    InvalidArgumentError,
    KuduError,
    NotFoundError,
)
from pyspark_kudu.fileio import FileIO
from pyspark_kudu.schema import Schema
from pyspark_kudu.spark.host.dataplane import WAL_REF_MIN_BYTES, wal_ref
from pyspark_kudu.spark.host.replica_apply import (
    ApplyLimit,
    TabletSink,
    apply_committed,
    apply_in_background,
    background_applier,
    drain,
    read_applied,
    replica_node,
    request_limit,
    waited_for,
    write_applied,
)
from pyspark_kudu.spark.host.replica_cache import NeedsTablet, delete_replica, open_replica
from pyspark_kudu.spark.host.resolve_slices import (
    NotResolved,
    Resolver,
    append_slices,
    entry_slices,
)
from pyspark_kudu.spark.host.tabletcopy import (
    COPYING_FILE,
    copy_out,
    drop_copy,
    fetch_copies,
    install_copy,
)
from pyspark_kudu.spark.host.writers_record import WRITERS_FILE, read_writers, record_writer
from pyspark_kudu.tablet import Tablet, WriteResult
from pyspark_kudu.tablet.superblock import SUPERBLOCK_FILE
from pyspark_kudu.wal import WalOptions, WalStorage
from pyspark_kudu.wal.meta import META_FILE

__all__ = [
    "DISK_ERRNOS",
    "FAILED_FILE",
    "WRITERS_FILE",
    "PeerRequest",
    "PeerResponse",
    "ReplicaState",
    "RequestKind",
    "apply_backlog",
    "handle_requests",
    "read_writers",
    "replica_storage",
    "require_replica",
    "tablet_dir",
]

_TAIL_LIMIT_BYTES = 64 * 1024 * 1024
FAILED_FILE = "failed"
# OS errors that mean the replica's disk failed it (not e.g. a descriptor limit).
DISK_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EROFS, errno.EDQUOT})


class RequestKind(enum.Enum):
    CREATE = "create"
    READ_STATE = "read_state"
    PERSIST = "persist"
    STEP = "step"
    READ_ENTRIES = "read_entries"
    COPY_OUT = "copy_out"
    INSTALL_COPY = "install_copy"
    DROP_COPY = "drop_copy"
    WIPE = "wipe"
    UNSAFE_CONFIG = "unsafe_config"


@dataclass(frozen=True)
class PeerRequest:
    kind: RequestKind
    tablet_id: str
    replica_id: str
    term: int = 0
    messages: tuple[Message, ...] = ()
    entries: tuple[Entry, ...] = ()
    hard_state: HardState | None = None
    voters: tuple[str, ...] = ()
    lo: int = 0
    hi: int = 0
    schema_json: str = ""
    as_refs: bool = False  # READ_ENTRIES: large entries as refs to this replica's log
    copy_id: str = ""  # COPY_OUT / INSTALL_COPY
    snapshot: SnapshotMetadata | None = None  # INSTALL_COPY: the Raft position of the copy
    #: The request belongs to a round that collects per-row results, which a write waits
    #: for: on the leader's replica (PERSIST) a resident server applies for up to its
    #: leader budget before leaving the rest to its applier (in any other round it leaves
    #: it all: nobody waits for that apply); a follower (STEP) persists what the messages
    #: carry (entries, the commit index) and applies no committed write, leaving them to
    #: a later request, its applier or a scan's
    #: :func:`~pyspark_kudu.spark.host.replica_apply.catch_up` (``background_apply``).
    collecting: bool = False


@dataclass(frozen=True)
class ReplicaState:
    hard_state: HardState
    conf_state: ConfState
    first_index: int
    last_index: int
    last_term: int
    commit_term: int
    applied: int
    tail: tuple[Entry, ...] = ()


@dataclass(frozen=True)
class PeerResponse:
    tablet_id: str
    replica_id: str
    ok: bool
    host: str = ""
    error: str = ""
    fenced: bool = False
    messages: tuple[Message, ...] = ()
    state: ReplicaState | None = None
    entries: tuple[Entry, ...] = ()
    prev_term: int = 0
    last_index: int = 0
    applied: tuple[int, ...] = field(default=())
    results: tuple[WriteResult, ...] = ()
    installed: bool = False
    replica_failed: bool = False
    #: Tablet copies (for benchmarks and logs): ``(bytes, started, ended)``, wall clock, of
    #: the fetch that brought a served copy here (``INSTALL_COPY``: the window of the whole
    #: task's fetch, shared by the copies it fetched together), or of the source staging its
    #: copy (``COPY_OUT``), then the seconds of that staging spent flushing the MemRowSet.
    copy_timing: tuple[float, ...] = ()


def tablet_dir(root: str, tablet_id: str) -> FileIO:
    return FileIO(root).child("tablets", tablet_id)


def handle_requests(
    root: str,
    requests: Sequence[PeerRequest],
    host: str = "",
    options: WalOptions | None = None,
    delivered: Mapping[str, bytes] | None = None,
) -> list[PeerResponse]:
    """Serve ``requests`` against the replicas under data root ``root``, in order.

    Entries that are staged-batch refs (:mod:`~pyspark_kudu.spark.host.dataplane`) are first
    replaced by the batches ``delivered`` by the round's shuffle; a request that still
    carries a ref is refused, so a ref never reaches a log. Served tablet copies of
    ``INSTALL_COPY`` requests are fetched first, all at once, from their sources' resident
    servers (:mod:`~pyspark_kudu.spark.host.copy_fetch`); one that fails is refused. A
    failure of one replica (corruption, disk full, fencing, a batch not delivered) is
    reported in its response and does not stop the others.
    """
    out: list[PeerResponse] = []
    installs = [(k, r) for k, r in enumerate(requests) if r.kind == RequestKind.INSTALL_COPY]
    fetches, (started, ended) = fetch_copies(root,
                                             [(r.tablet_id, r.entries) for _, r in installs])
    fetched = dict(zip((k for k, _ in installs), fetches, strict=True))
    for k, req in enumerate(requests):
        try:
            resolver = Resolver(delivered or {})
            if req.kind not in (RequestKind.PERSIST, RequestKind.STEP):  # these resolve
                req = _resolved(req, resolver)                           # slice by slice
            fetch = fetched.get(k)
            if fetch is not None and (err := fetch.error) is not None:  # a served copy
                if isinstance(err, DiskFullError):                     # not fetched
                    mark_failed(tablet_dir(root, req.tablet_id), f"DiskFullError: {err}")
                raise err
            resp = _handle_one(root, req, host, options, resolver)
            if fetch is not None and fetch.total_bytes is not None:
                resp = replace(resp, copy_timing=(float(fetch.total_bytes), started, ended))
            out.append(resp)
        except NotResolved as e:
            out.append(PeerResponse(req.tablet_id, req.replica_id, ok=False, host=host,
                                    error=f"{type(e.cause).__name__}: {e.cause}"))
        except KuduError as e:
            out.append(PeerResponse(req.tablet_id, req.replica_id, ok=False, host=host,
                                    error=f"{type(e).__name__}: {e}"))
    return out


def _resolved(req: PeerRequest, resolver: Resolver) -> PeerRequest:
    return replace(req, entries=resolver.entries(req.entries),
                   messages=tuple(resolver.message(m) for m in req.messages))


@contextmanager
def replica_storage(root: str, tablet_id: str, options: WalOptions | None = None
                    ) -> Iterator[WalStorage]:
    """A replica's WAL storage, locked, for tools and tests. Never open a replica's WAL
    directly while tasks may serve it: a process that caches it open would not notice
    (:mod:`pyspark_kudu.spark.host.replica_cache`)."""
    with open_replica(root, tablet_dir(root, tablet_id), tablet_id, options,
                      mutate=True) as handle:
        yield handle.storage


def require_replica(io: FileIO, tablet_id: str, create: bool = False) -> None:
    """Only CREATE makes a replica: any other request for a tablet that has none here (never
    created, or deleted with its table) is refused instead of creating an empty one."""
    if not create and not io.exists(META_FILE):
        raise NotFoundError(f"tablet {tablet_id} has no replica under {io.root} (never "
                            f"created here, or deleted with its table)")


def _state(storage: WalStorage, applied: int) -> ReplicaState:
    hs, cs = storage.initial_state()
    last = storage.last_index()
    first = storage.first_index()
    commit = hs.commit
    tail: list[Entry] = []
    if last > commit:
        tail = storage.entries(max(commit + 1, first), last + 1, _TAIL_LIMIT_BYTES)
    return ReplicaState(
        hard_state=hs, conf_state=cs, first_index=first, last_index=last,
        last_term=storage.term(last), commit_term=storage.term(max(commit, first - 1)),
        applied=applied, tail=tuple(tail),
    )


def _handle_one(
    root: str, req: PeerRequest, host: str, options: WalOptions | None,
    resolver: Resolver | None = None,
) -> PeerResponse:
    mutate = req.kind not in (RequestKind.READ_STATE, RequestKind.READ_ENTRIES,
                              RequestKind.DROP_COPY)
    io = tablet_dir(root, req.tablet_id)
    if req.kind == RequestKind.WIPE:
        return _ok(req, host, installed=delete_replica(root, io, req.tablet_id))
    require_replica(io, req.tablet_id, create=req.kind == RequestKind.CREATE)
    if io.exists(FAILED_FILE):
        return _failed_response(req, host, io)
    if req.kind != RequestKind.INSTALL_COPY and io.exists(COPYING_FILE):
        return _failed_response(req, host, io, "a tablet copy into it was interrupted")
    bg = background_applier()
    wal_only = req.kind in (RequestKind.READ_STATE, RequestKind.READ_ENTRIES) or (
        bg is not None and (req.kind == RequestKind.STEP or (
            req.kind == RequestKind.PERSIST and not req.collecting)))
    try:
        try:
            return _handle_locked(root, req, host, io, options, resolver, mutate, wal_only)
        except NeedsTablet:  # a configuration entry to apply: again, holding the tablet too
            return _handle_locked(root, req, host, io, options, resolver, mutate, False)
    except (CorruptionError, DiskFullError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in DISK_ERRNOS:
            raise
        why = f"{type(e).__name__}: {e}"
        mark_failed(io, why)
        return _failed_response(req, host, io, why)


def _handle_locked(
    root: str, req: PeerRequest, host: str, io: FileIO, options: WalOptions | None,
    resolver: Resolver | None, mutate: bool, wal_only: bool,
) -> PeerResponse:
    """Serve ``req`` holding the replica's log lock only (``wal_only``: a round that applies
    nothing never waits for the background applier's apply or flush; it raises
    ``NeedsTablet`` if it must apply after all) or both its locks."""
    with open_replica(root, io, req.tablet_id, options, mutate,
                      mode="wal" if wal_only else "full") as handle:
        applied = read_applied(io)
        sink = TabletSink(root, req.tablet_id, io, handle, applied, wal_only=wal_only)
        resp = _dispatch(root, req, host, io, handle.storage, applied, sink,
                         resolver or Resolver({}))
        bg = background_applier()
        if (bg is not None and resp.ok
                and req.kind in (RequestKind.STEP, RequestKind.PERSIST)
                and (handle.storage.initial_state()[0].commit > read_applied(io)
                     or (not wal_only and handle.tablet is not None
                         and handle.tablet.flush_due()))):
            bg.schedule(root, req.tablet_id, options, leader=req.kind == RequestKind.PERSIST)
        return resp


def mark_failed(io: FileIO, reason: str) -> None:
    """Mark the replica under ``io`` failed (see module docs). Best effort on a full disk:
    the marker is tiny, and a replica that cannot even record it fails again next time."""
    try:
        io.atomic_write(reason.encode(), FAILED_FILE)
    except (OSError, KuduError):
        pass


def failed_reason(io: FileIO) -> str | None:
    """Why the replica under ``io`` was marked failed, or None if it was not."""
    if not io.exists(FAILED_FILE):
        return None
    try:
        return io.read_bytes(FAILED_FILE).decode(errors="replace") or "unknown"
    except OSError as e:
        return f"unreadable failure record ({e})"


def _failed_response(req: PeerRequest, host: str, io: FileIO, why: str | None = None
                     ) -> PeerResponse:
    return PeerResponse(req.tablet_id, req.replica_id, ok=False, host=host,
                        replica_failed=True,
                        error=f"ReplicaFailedError: replica {req.replica_id} of tablet "
                              f"{req.tablet_id} on {host} is failed and serves nothing "
                              f"({why or failed_reason(io)}); it is being replaced")


def _dispatch(
    root: str, req: PeerRequest, host: str, io: FileIO, storage: WalStorage, applied: int,
    applier: TabletSink, resolver: Resolver,
) -> PeerResponse:
    match req.kind:
        case RequestKind.CREATE:
            hs, _ = storage.initial_state()
            if storage.last_index() == 0 and hs.is_empty() and req.voters:
                bootstrap(storage, req.voters)
            if req.schema_json and not io.exists(SUPERBLOCK_FILE):
                Tablet.create(root, req.tablet_id, Schema.from_json(req.schema_json)).close()
            return _ok(req, host, state=_state(storage, applied))
        case RequestKind.READ_STATE:
            return _ok(req, host, state=_state(storage, applied))
        case RequestKind.PERSIST:
            return _persist_leader(req, host, io, storage, applied, applier, resolver)
        case RequestKind.STEP:
            return _step_follower(req, host, io, storage, applied, applier, resolver)
        case RequestKind.READ_ENTRIES:
            try:
                prev_term = storage.term(req.lo - 1)
                ents = storage.entries(req.lo, min(req.hi, storage.last_index() + 1),
                                       _TAIL_LIMIT_BYTES)
            except CompactedError as e:
                return PeerResponse(req.tablet_id, req.replica_id, ok=False, host=host,
                                    error=f"CompactedError: {e}")
            if req.as_refs:
                ents = [replace(e, data=wal_ref(host, root, req.tablet_id, e).encode())
                        if len(e.data) >= WAL_REF_MIN_BYTES else e for e in ents]
            return _ok(req, host, entries=tuple(ents), prev_term=prev_term)
        case RequestKind.COPY_OUT:
            # The backlog (committed entries the background applier has not reached, as
            # after a large ingest or on a replica elected right after a fail-over) is
            # applied first: a copy at the applied index would stop short of the commit
            # index, the entries in between are often only the driver's released staged
            # refs, and the new replica would then need a second copy.
            commit = storage.initial_state()[0].commit
            if commit > applied:
                span = apply_committed(io, storage, applied, commit, applier, host)
                applied = span[-1] if span else applied
            started = time.time()
            out = copy_out(root, host, req.tablet_id, applier.handle, applied, req.copy_id,
                           served=not req.as_refs)
            nbytes = out.served.total_bytes if out.served is not None else sum(
                p.size for p in out.parts)
            return _ok(req, host, entries=out.entries(), last_index=out.index,
                       copy_timing=(float(nbytes), started, time.time(), out.flush_s),
                       prev_term=out.term, results=applier.all_results(),
                       state=replace(_state(storage, applied), conf_state=out.conf_state,
                                     tail=()))
        case RequestKind.INSTALL_COPY:
            if req.snapshot is None:
                raise InvalidArgumentError("INSTALL_COPY needs the copy's snapshot position")
            done = install_copy(root, req.tablet_id, applier.handle, req.copy_id, req.entries,
                                req.lo, req.hi, req.snapshot)
            if done:
                write_applied(io, req.snapshot.index)
            return _ok(req, host, installed=done, last_index=storage.last_index())
        case RequestKind.DROP_COPY:
            drop_copy(root, io, req.copy_id)
            return _ok(req, host)
        case RequestKind.UNSAFE_CONFIG:
            if not req.voters:
                raise InvalidArgumentError("UNSAFE_CONFIG needs the new voters")
            hs, _ = storage.initial_state()
            storage.set_conf_state(ConfState(voters=frozenset(req.voters)))
            storage.set_hard_state(HardState(hs.term + 1, NONE, storage.last_index()))
            return _ok(req, host, state=_state(storage, applied))
    raise AssertionError(f"unhandled request kind {req.kind}")  # pragma: no cover


def _ok(req: PeerRequest, host: str, **kw: object) -> PeerResponse:
    return PeerResponse(req.tablet_id, req.replica_id, ok=True, host=host, **kw)  # type: ignore[arg-type]


def _persist_leader(
    req: PeerRequest, host: str, io: FileIO, storage: WalStorage, applied: int,
    applier: TabletSink, resolver: Resolver,
) -> PeerResponse:
    hs, _ = storage.initial_state()
    if hs.term != req.term or hs.vote != req.replica_id:
        return PeerResponse(
            req.tablet_id, req.replica_id, ok=False, host=host, fenced=True,
            error=(f"replica {req.replica_id} of tablet {req.tablet_id} is at term {hs.term} "
                   f"(vote {hs.vote or 'none'}); a leader of term {req.term} is fenced"),
        )
    for part in entry_slices(req.entries):  # resolved and appended a slice at a time
        fresh = _not_yet_present(storage, part)
        if fresh:
            fresh = list(resolver.entries(fresh))
            storage.append(fresh)
            record_writer(io, host, fresh)
        del fresh
    if req.hard_state is not None:
        commit = min(max(hs.commit, req.hard_state.commit), storage.last_index())
        storage.set_hard_state(HardState(hs.term, hs.vote, commit))
    new_hs, _ = storage.initial_state()
    limit = request_limit(leader=True, collecting=req.collecting)
    with waited_for(leader=True, collecting=req.collecting):
        applied_now = apply_committed(io, storage, applied, new_hs.commit, applier, host, limit)
    return _ok(req, host, last_index=storage.last_index(), applied=applied_now,
               results=applier.all_results())


def _not_yet_present(storage: WalStorage, entries: Sequence[Entry]) -> list[Entry]:
    """Suffix of ``entries`` from the first one the log lacks (same index, other term, or new)."""
    last = storage.last_index()
    first = storage.first_index()
    for k, e in enumerate(entries):
        if e.index > last or e.index < first or storage.term(e.index) != e.term:
            return list(entries[k:])
    return []


def apply_backlog(root: str, tablet_id: str, options: WalOptions | None, budget_s: float,
                  yield_to: Callable[[], bool] | None = None
                  ) -> tuple[bool, list[WriteResult], int]:
    """(The background applier.) Apply the replica's committed, unapplied entries for about
    ``budget_s`` (at least one entry, and a configuration entry with everything before it),
    or until ``yield_to`` says a request is waiting, holding its lock meanwhile. Returns
    whether some remain, the per-row results, and how many entries were applied. A replica
    that is gone, failed or being copied into is left alone; one whose files turn out
    corrupt or whose disk fails is marked failed."""
    io = tablet_dir(root, tablet_id)
    if not io.exists(META_FILE) or io.exists(FAILED_FILE) or io.exists(COPYING_FILE):
        return False, [], 0
    try:
        with open_replica(root, io, tablet_id, options, mutate=False, require=META_FILE,
                          mode="tablet") as handle:
            if io.exists(FAILED_FILE) or io.exists(COPYING_FILE):
                return False, [], 0
            storage = handle.storage
            applied = read_applied(io)
            with handle.wal_lock:
                commit = storage.initial_state()[0].commit
            if commit <= applied:
                tablet = handle.tablet
                if tablet is not None and tablet.flush_due():  # a flush a request deferred
                    handle.will_mutate()
                    tablet.flush_if_due()
                return False, [], 0
            handle.will_mutate()
            sink = TabletSink(root, tablet_id, io, handle, applied)
            limit = ApplyLimit(deadline=time.monotonic() + budget_s, yield_to=yield_to)
            now = apply_in_background(io, handle, applied, sink, limit)
            with handle.wal_lock:  # both locks: a configuration entry is next (or a gap)
                commit = storage.initial_state()[0].commit
                if now is None:
                    now = read_applied(io)
                    span = apply_committed(io, storage, now, commit, sink, "", limit)
                    now = span[-1] if span else now
            return now < commit, sink.results, now - applied
    except NotFoundError:  # deleted meanwhile
        return False, [], 0
    except (CorruptionError, DiskFullError, OSError) as e:
        if isinstance(e, OSError) and e.errno not in DISK_ERRNOS:
            raise
        mark_failed(io, f"{type(e).__name__}: {e}")
        return False, [], 0


def _step_follower(
    req: PeerRequest, host: str, io: FileIO, storage: WalStorage, applied: int,
    applier: TabletSink, resolver: Resolver,
) -> PeerResponse:
    hs, _ = storage.initial_state()
    node = replica_node(storage, min(applied, hs.commit), req.replica_id)
    out: list[Message] = []
    span: list[int] = []
    limit = request_limit(leader=False, collecting=req.collecting)
    drain(node, storage, io, out, span, applier, host, limit)  # catch up configuration first
    for m in req.messages:
        for part in append_slices(m):  # resolved and appended a slice at a time
            if part is not m and part.index != m.index and not node.log.match_term(
                    part.index, part.log_term):
                break  # the slice before was refused (a newer term, a gap): so are these
            node.step(resolver.message(part))
            drain(node, storage, io, out, span, applier, host, limit)
    return _ok(req, host, messages=tuple(m for m in out if m.to != NONE),
               last_index=storage.last_index(),
               applied=(span[0], span[-1]) if span else (), results=applier.all_results())


