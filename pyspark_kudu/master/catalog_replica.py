"""``MasterReplica``: one master's ``RaftNode`` driven by a real clock, storage and transport.

Rules of the loop (one thread owns the node; see ``consensus/raft.py`` for the contract):

1. Inputs -- ticks (every ``tick_interval_s``), inbound envelopes, proposals -- are queued by
   any thread and drained by the loop, which then handles every ``Ready``: persist the
   snapshot, entries and hard state (``WalStorage``: durable when the call returns), send the
   messages, apply committed entries to the :class:`~pyspark_kudu.master.catalog.Catalog`,
   ``advance``, persist a changed configuration. A leader whose term and vote are already
   durable sends *before* its own fsync (Raft thesis §10.2.1): it counts itself toward
   commit only after ``advance`` (raft.py rule 3), so nothing commits early.
2. The catalog reference is swapped only after an entry is applied: readers never see an
   uncommitted operation (seed: kudu-multi-master).
3. A proposal is answered when the entry at its index is applied (and ``status()`` shows it):
   with the apply error (if any) when the entry is ours (same term), with
   :class:`NotLeaderError` when another leader's entry took the index. A deposed leader
   keeps following, so a proposal it made is still answered correctly once the new
   leader's log reaches it, or times out (outcome unknown; the client retries and gets
   ``AlreadyPresent`` / ``NotFound``).
4. Freshness: a follower records when the leader last told it a commit index its catalog has
   since reached; ``staleness()`` is the time since (KUDU-500).
5. Every ``snapshot_every`` applied entries the catalog is written as the Raft snapshot and
   the log is compacted (keeping ``keep_entries`` for slow followers).

Storage: any ``WritableStorage``; masters use :func:`open_storage` (``WalStorage`` under the
master's directory). A storage failure stops the replica (fail-stop).

Thread-safety: thread-safe. Public methods may be called from any thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from pyspark_kudu.consensus.messages import (
    ConfChange,
    ConfChangeType,
    ConfState,
    Entry,
    EntryType,
    HardState,
    MessageType,
    decode_conf_change,
    encode_conf_change,
)
from pyspark_kudu.consensus.raft import Config, RaftNode, Ready, Role
from pyspark_kudu.consensus.raft_storage import WritableStorage
from pyspark_kudu.errors import (
    InvalidArgumentError,
    KuduError,
    NotLeaderError,
    ServiceUnavailableError,
    TimedOutError,
)
from pyspark_kudu.master.catalog import Catalog, apply, apply_conf_change, apply_entry
from pyspark_kudu.master.raft_transport import Envelope, Transport
from pyspark_kudu.master.records import Record, encode_record

__all__ = [
    "MasterReplica",
    "ReplicaOptions",
    "ReplicaStatus",
    "bootstrap_group",
    "is_fresh_storage",
    "open_storage",
]

_log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class ReplicaOptions:
    """Timing and housekeeping of one master replica (defaults: ~1-2 s elections)."""

    tick_interval_s: float = 0.05
    election_ticks: int = 20
    heartbeat_ticks: int = 2
    snapshot_every: int = 10_000
    keep_entries: int = 1_000
    check_quorum: bool = True
    pre_vote: bool = True

    def __post_init__(self) -> None:
        if self.tick_interval_s <= 0:
            raise InvalidArgumentError("tick_interval_s must be > 0")


@dataclass(frozen=True)
class ReplicaStatus:
    """What a replica knows about itself, published after every loop iteration."""

    id: str
    role: Role
    term: int
    leader: str
    commit: int
    applied: int
    leader_ready: bool
    voters: frozenset[str]
    learners: frozenset[str]
    progress: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    failed: str = ""
    read_lease: bool = False  # leader only: may serve linearizable reads locally (Raft lease)


def is_fresh_storage(storage: WritableStorage) -> bool:
    return storage.last_index() == 0 and storage.initial_state()[0].is_empty() and (
        storage.snapshot().is_empty())


def bootstrap_group(storage: WritableStorage, addresses: Mapping[str, str]) -> None:
    """Found a master group: one ``ADD_VOTER`` per founder, its address as the context.

    Like :func:`pyspark_kudu.consensus.raft_storage.bootstrap`, but the addresses travel in the log
    so every replica -- joiners included -- learns where the founders listen.
    """
    if not addresses:
        raise InvalidArgumentError("a master group needs at least one master")
    if not is_fresh_storage(storage):
        raise InvalidArgumentError("bootstrap needs empty storage (this one has a log or state)")
    ents = [Entry(1, i + 1, EntryType.CONF_CHANGE,
                  encode_conf_change(ConfChange(ConfChangeType.ADD_VOTER, m, a.encode())))
            for i, (m, a) in enumerate(sorted(addresses.items()))]
    storage.append(ents)
    storage.set_hard_state(HardState(term=1, commit=len(ents)))
    storage.set_conf_state(ConfState(frozenset(addresses)))


def open_storage(directory: str, sync: str = "fdatasync") -> WritableStorage:
    """The durable storage of one master replica under ``directory`` (``meta`` + ``wal/``).

    This is the adapter point between the master and :mod:`pyspark_kudu.wal`.
    """
    from pyspark_kudu.wal import SyncPolicy, WalOptions, WalStorage

    return WalStorage.open(directory, WalOptions(segment_size=8 << 20,
                                                 sync_policy=SyncPolicy(sync)))


@dataclass
class _Proposal:
    kind: str  # "record" | "conf" | "transfer" | "campaign"
    payload: Any
    future: Future[Any]


class MasterReplica:
    """One replica of the master catalog. Thread-safe (see the module docstring)."""

    def __init__(
        self,
        node_id: str,
        storage: WritableStorage,
        transport: Transport,
        options: ReplicaOptions | None = None,
        *,
        seed: int | None = None,
        on_leader_change: Callable[[int, bool], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.id = node_id
        self.options = options or ReplicaOptions()
        self._storage = storage
        self._transport = transport
        self._clock = clock
        self._on_leader_change = on_leader_change
        snap = storage.snapshot()
        self._catalog = Catalog.from_snapshot(snap.data)
        o = self.options
        self._node = RaftNode(Config(
            id=node_id, storage=storage, election_tick=o.election_ticks,
            heartbeat_tick=o.heartbeat_ticks, applied=snap.metadata.index,
            check_quorum=o.check_quorum, pre_vote=o.pre_vote,
            rng=random.Random(seed),
        ))
        self._snap_index = snap.metadata.index
        hs = storage.initial_state()[0]
        self._durable_tv = (hs.term, hs.vote)
        self._cond = threading.Condition()
        self._progress = threading.Condition()
        self._inbox: list[Envelope] = []
        self._props: list[_Proposal] = []
        # index -> (term, waiter, the record itself so the leader need not decode it)
        self._pending: dict[int, tuple[int, Future[Any], Record | None]] = {}
        self._answers: list[tuple[Future[Any], KuduError | None]] = []
        self._contacts: deque[tuple[float, int]] = deque(maxlen=4096)
        self._fresh_at = float("-inf")
        self._leader_index = 0
        self._stopping = False
        self._failed = ""
        self._solo = self._node.conf_state.voters == {node_id}
        self._thread: threading.Thread | None = None
        self._status = self._make_status()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> MasterReplica:
        self._thread = threading.Thread(target=self._run, name=f"master-{self.id}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop, fail waiting proposals, close the transport and the storage."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)
        self._transport.close()
        close = getattr(self._storage, "close", None)
        if callable(close):
            try:
                close()
            except KuduError:
                _log.warning("closing the storage of master %s failed", self.id, exc_info=True)
        self._fail_all(ServiceUnavailableError(f"master {self.id} is shutting down"))

    # -- inputs (any thread) ---------------------------------------------------------------
    def deliver(self, envelopes: Sequence[Envelope]) -> None:
        with self._cond:
            self._inbox.extend(envelopes)
            self._cond.notify()

    def propose(self, record: Record) -> Future[None]:
        """Replicate ``record``; the future fails with the apply error or NotLeaderError."""
        return self._submit("record", (record, encode_record(record)))

    def propose_conf_change(self, cc: ConfChange) -> Future[None]:
        return self._submit("conf", cc)

    def transfer_leader(self, to: str) -> Future[None]:
        return self._submit("transfer", to)

    def campaign(self) -> Future[None]:
        return self._submit("campaign", None)

    def _submit(self, kind: str, payload: Any) -> Future[Any]:
        fut: Future[Any] = Future()
        with self._cond:
            if self._stopping or self._failed:
                why = f": {self._failed}" if self._failed else ""
                fut.set_exception(ServiceUnavailableError(f"master {self.id} is not running{why}"))
                return fut
            self._props.append(_Proposal(kind, payload, fut))
            self._cond.notify()
        return fut

    # -- outputs (any thread) --------------------------------------------------------------
    @property
    def catalog(self) -> Catalog:
        """The catalog as of the last applied entry (an immutable value)."""
        return self._catalog

    def status(self) -> ReplicaStatus:
        return self._status

    def staleness(self) -> float:
        """Seconds since this replica's catalog was known to be up to date (0 on a ready leader)."""
        st = self._status
        if st.role is Role.LEADER and st.leader_ready and st.read_lease:
            return 0.0
        return max(0.0, self._clock() - self._fresh_at)

    def wait_for(self, predicate: Callable[[MasterReplica], T], timeout: float,
                 what: str) -> T:
        """Block until ``predicate(self)`` is truthy; TimedOutError naming ``what`` if not."""
        end = time.monotonic() + timeout
        with self._progress:
            while True:
                v = predicate(self)
                if v:
                    return v
                left = end - time.monotonic()
                if left <= 0:
                    raise TimedOutError(f"master {self.id}: {what} did not happen within "
                                        f"{timeout:.1f} s")
                self._progress.wait(min(left, 0.1))

    # == the loop ===========================================================================
    def _run(self) -> None:
        interval = self.options.tick_interval_s
        next_tick = self._clock() + interval
        try:
            while True:
                with self._cond:
                    while not (self._inbox or self._props or self._stopping):
                        left = next_tick - self._clock()
                        if left <= 0:
                            break
                        self._cond.wait(left)
                    if self._stopping:
                        return
                    inbox, self._inbox = self._inbox, []
                    props, self._props = self._props, []
                now = self._clock()
                if now >= next_tick:
                    self._node.tick()
                    next_tick = now + interval
                for env in inbox:
                    self._on_envelope(env, now)
                for p in props:
                    self._on_proposal(p)
                self._drain()
                if self._solo and self._node.log.applied >= self._node.commit_index:
                    # A one-voter group need not wait out an election timeout.
                    self._solo = False
                    self._node.campaign()
                    self._drain()
                self._publish()
        except Exception as e:  # fail-stop: storage or invariant failure
            _log.exception("master replica %s stopped", self.id)
            self._failed = f"{type(e).__name__}: {e}"
            self._fail_all(ServiceUnavailableError(f"master {self.id} failed: {self._failed}"))
            self._publish()

    def _drain(self) -> None:
        while self._node.has_ready():
            self._handle_ready(self._node.ready())

    def _on_envelope(self, env: Envelope, now: float) -> None:
        m = env.msg
        try:
            self._node.step(m)
        except KuduError:
            _log.debug("master %s dropped %s from %s", self.id, m.type, m.frm, exc_info=True)
            return
        if (m.type in (MessageType.APP, MessageType.HEARTBEAT, MessageType.SNAP)
                and self._node.lead == m.frm and self._node.term == m.term):
            self._contacts.append((now, env.commit))

    def _on_proposal(self, p: _Proposal) -> None:
        node = self._node
        try:
            if p.kind == "campaign":
                node.campaign()
                p.future.set_result(None)
                return
            if p.kind == "transfer":
                if node.role is not Role.LEADER:
                    raise self._not_leader()
                node.transfer_leader(str(p.payload))
                p.future.set_result(None)
                return
            if node.role is not Role.LEADER:
                raise self._not_leader()
            record: Record | None = None
            if p.kind == "conf":
                node.propose_conf_change(p.payload)
            else:
                record, data = p.payload
                node.propose(data)
            self._pending[node.log.last_index()] = (node.term, p.future, record)
        except KuduError as e:
            if not isinstance(e, NotLeaderError) and node.role is not Role.LEADER:
                e = self._not_leader()
            p.future.set_exception(e)

    def _not_leader(self) -> NotLeaderError:
        lead = self._node.lead
        return NotLeaderError(
            f"master {self.id} is not the leader (leader: {lead or 'unknown'}); retry on the "
            f"leader", lead or None)

    def _handle_ready(self, rd: Ready) -> None:
        node, st = self._node, self._storage
        hs = rd.hard_state
        early = (node.role is Role.LEADER and rd.snapshot is None
                 and (hs is None or (hs.term, hs.vote) == self._durable_tv))
        if early:
            self._send(rd)
        if rd.snapshot is not None:
            st.apply_snapshot(rd.snapshot)
            self._catalog = Catalog.from_snapshot(rd.snapshot.data)
            self._snap_index = rd.snapshot.metadata.index
        if rd.entries:
            st.append(rd.entries)
        if hs is not None:
            st.set_hard_state(hs)
            self._durable_tv = (hs.term, hs.vote)
        if not early:
            self._send(rd)
        for e in rd.committed_entries:
            self._apply(e)
        before = node.conf_state
        node.advance(rd)
        if node.conf_state != before:
            st.set_conf_state(node.conf_state)
        if rd.soft_state is not None:
            self._leadership_changed()
        self._maybe_snapshot()

    def _send(self, rd: Ready) -> None:
        if rd.messages:
            commit = self._node.commit_index
            self._transport.send([Envelope(m, commit) for m in rd.messages])

    def _apply(self, e: Entry) -> None:
        err: KuduError | None = None
        if e.index <= self._catalog.index:
            return  # already in the catalog (restored from a snapshot)
        if e.type is EntryType.CONF_CHANGE:
            self._catalog = apply_conf_change(self._catalog, decode_conf_change(e.data), e.index)
        else:
            own = self._pending.get(e.index)
            if own is not None and own[0] == e.term and own[2] is not None:
                try:  # our own entry: apply the record we encoded, no need to decode it
                    self._catalog = apply(self._catalog, own[2], e.index)
                except KuduError as ex:
                    self._catalog, err = replace(self._catalog, index=e.index), ex
            else:
                self._catalog, err = apply_entry(self._catalog, e.data, e.index)
        waiter = self._pending.pop(e.index, None)
        if waiter is not None:
            term, fut, _ = waiter
            if term != e.term:
                err = NotLeaderError(
                    f"master {self.id} lost leadership before the operation committed; it was "
                    f"not applied, retry on the leader", self._node.lead or None)
            # Answered in _publish, once status() reflects the entry (read-your-writes).
            self._answers.append((fut, err))

    def _leadership_changed(self) -> None:
        node = self._node
        is_leader = node.role is Role.LEADER
        if is_leader:
            self._leader_index = node.log.last_index()
        _log.info("master %s: %s in term %d (leader %s)", self.id, node.role.value, node.term,
                  node.lead or "unknown")
        if self._on_leader_change is not None:
            self._on_leader_change(node.term, is_leader)

    def _maybe_snapshot(self) -> None:
        o = self.options
        applied = self._node.log.applied
        if applied - self._snap_index < o.snapshot_every or self._catalog.index != applied:
            return
        st = self._storage
        st.create_snapshot(applied, self._node.conf_state,  # type: ignore[attr-defined]
                           self._catalog.to_snapshot())
        self._snap_index = applied
        upto = applied - o.keep_entries
        if upto >= st.first_index():
            st.compact(upto)  # type: ignore[attr-defined]
            gc = getattr(st, "gc", None)
            if callable(gc):
                gc()

    def _publish(self) -> None:
        applied = self._node.log.applied
        while self._contacts and self._contacts[0][1] <= applied:
            self._fresh_at = self._contacts.popleft()[0]
        with self._progress:
            self._status = self._make_status()
            if self._status.read_lease:
                self._fresh_at = self._clock()  # a leased leader's catalog is current
            self._progress.notify_all()
        answers, self._answers = self._answers, []
        for fut, err in answers:
            if err is None:
                fut.set_result(None)
            else:
                fut.set_exception(err)

    def _make_status(self) -> ReplicaStatus:
        s = self._node.status()
        return ReplicaStatus(
            self.id, s.role, s.term, s.lead, s.commit, s.applied,
            s.role is Role.LEADER and s.applied >= self._leader_index > 0,
            s.conf_state.voters, s.conf_state.learners, dict(s.progress), self._failed,
            read_lease=self._node.has_read_lease(),
        )

    def _fail_all(self, err: KuduError) -> None:
        with self._cond:
            props, self._props = self._props, []
        pending, self._pending = self._pending, {}
        for p in props:
            if not p.future.done():
                p.future.set_exception(err)
        for _, fut, _ in pending.values():
            if not fut.done():
                fut.set_exception(err)
