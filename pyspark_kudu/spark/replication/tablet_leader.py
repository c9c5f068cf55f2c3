"""The client-side leader of one tablet: a ``RaftNode`` in the driver, replicas on executors.

DESIGN §3. The driver runs the leader's Raft state machine *on behalf of* one replica L
(its node id is L's tablet-server UUID); L's durable state lives on L's host. Every exchange
with replicas is a *round*: one request list per tablet server, executed by a
:class:`~pyspark_kudu.spark.replication.peer_transport.PeerTransport` (a barrier stage of pinned
tasks on a cluster, direct calls in tests), one response list back. Responses are stepped into
the
``RaftNode``. A round is taken in two halves (``start_round`` / ``finish_round``) so that many
tablets' leaders share one (:mod:`pyspark_kudu.spark.replication.multitablet`); this module's
``elect`` / ``propose`` / ``flush`` are those shared rounds with one leader.

Rules:

- **Election** (two rounds, never one): first L persists its own vote for the new term (a
  RequestVote from L to itself, through the same code path as every vote), and only then do
  the other voters get RequestVote. Sending both at once would let a crash of L forget its
  self-vote while others counted on it (two leaders in one term).
- **Write round**: the leader's entries are persisted on L (``PERSIST``, fenced by term)
  *in parallel* with AppendEntries to followers (thesis §10.2.1); the ``RaftNode`` counts L
  only after L's PERSIST succeeded (its rule 3), so "committed" = durable on a majority.
- **Retry**: when a round fails as a whole (a barrier stage aborts if any task dies), it is
  re-sent without the tablet servers the transport reports unreachable; re-sent entries with
  the same index and term are acknowledged without being written twice.
- **Catch-up**: the driver only holds L's log tail, so a follower needing older entries makes
  the ``RaftNode`` emit a snapshot request (its compaction hook). The driver intercepts it and
  copies the missing entries from L (``READ_ENTRIES`` on L's host answers with refs to its
  log entries; the AppendEntries to the follower carries the refs and the round's shuffle
  moves the bytes from L's host to the follower's), then reports the "snapshot" done.
- **Tablet copy**: a follower that has nothing yet (a replica just added) or whose missing
  entries the leader replica's WAL no longer holds gets a tablet copy of the leader replica
  instead (:mod:`pyspark_kudu.spark.host.tabletcopy`: ``COPY_OUT`` on L's host, the parts shuffled
  to the follower's host, ``INSTALL_COPY`` there), then the entries after the copy.
- **Attached requests**: requests that are not Raft traffic (creating a replica, staging or
  installing a tablet copy, dropping its parts) ride in the same task as a round's Raft
  traffic (``_round_with``, ``_defer``), so they cost no Spark job of their own.
- **Membership** (Raft config change seed): one change at a time, each committed and applied
  by the leader's ``RaftNode`` before the next is proposed (Raft thesis §4.1: a change may
  start once the previous one is committed). :meth:`TabletLeader.add_replica` creates an
  empty replica, adds it as a NON_VOTER (it cannot affect commit while it catches up),
  copies the tablet to it and
  promotes it once its log matches the commit index; :meth:`TabletLeader.remove_replica`
  evicts one. Replacing a replica is add-then-remove (3-4-3). A replica id is its tablet
  server's UUID: a server evicted from a tablet may only come back as a NON_VOTER after its
  old replica was deleted, so a voter never forgets a log it acknowledged (raft.py rule 6).
- **Commit notices ride with the next round** (:meth:`TabletLeader.apply_ahead`): a Ready
  that only announces a higher commit index (no entries, no snapshot) may be acknowledged
  without a round of its own, so the driver applies what a majority holds (e.g. a
  configuration change) at once. Its requests (L's new commit index, followers'
  AppendEntries) then travel at the front of the next round, ahead of anything proposed
  after it: L never holds an entry proposed after a configuration change without first
  recording that change as committed, so every replica has at most one configuration
  change above its commit index (the simulator's ``lazy_commit`` mode checks this).
- **Fencing**: a newer leader (another client) has a higher term; replicas refuse the old
  one and the old ``RaftNode`` steps down on the first response carrying the newer term.
  Every call then fails with :class:`FencedError`; nothing it did not see committed is
  reported committed.

Thread-safety: not thread-safe; one owner drives a ``TabletLeader`` (the client groups
concurrent writes into shared rounds above this layer).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace

from pyspark_kudu.consensus.messages import (
    Message,
    MessageType,
    Snapshot,
    SnapshotMetadata,
)
from pyspark_kudu.consensus.raft import Config, RaftNode, Ready, Role
from pyspark_kudu.consensus.raft_storage import MemoryStorage
from pyspark_kudu.errors import (
    FencedError,
    IllegalStateError,
    RoundFailedError,
)
from pyspark_kudu.spark.host.handlers import PeerRequest, PeerResponse, ReplicaState, RequestKind
from pyspark_kudu.spark.replication.leader_membership import LeaderMembership, _all_ok
from pyspark_kudu.spark.replication.multitablet import (
    collect_results,
    elect_all,
    replicate,
    run_round,
)
from pyspark_kudu.spark.replication.peer_transport import (
    MAX_ROUND_ATTEMPTS,
    MAX_ROUNDS,
    PeerTransport,
)
from pyspark_kudu.tablet import WriteResult

__all__ = [
    "FencedError",
    "PeerTransport",
    "RoundFailedError",
    "TabletLeader",
    "TabletReplicas",
    "collect_results",
    "elect_all",
    "replicate",
    "run_round",
]

_TRIM_BATCH = 64  # compact the driver's log mirror in steps of at least this many entries


@dataclass(frozen=True)
class TabletReplicas:
    """A tablet and its replicas (tablet-server UUIDs); ``voters`` founded the group."""

    tablet_id: str
    voters: tuple[str, ...]


class TabletLeader(LeaderMembership):
    """Leader state of one tablet in the client, acting for replica ``leader_id``."""

    def __init__(self, tablet: TabletReplicas, leader_id: str, transport: PeerTransport,
                 seed: int = 0) -> None:
        if leader_id not in tablet.voters:
            raise IllegalStateError(
                f"tablet {tablet.tablet_id}: {leader_id} is not one of its voters {tablet.voters}"
            )
        self.tablet = tablet
        self.leader_id = leader_id
        self._transport = transport
        self._rng = random.Random(seed)
        self.node: RaftNode | None = None
        self._elected: tuple[int, tuple[int, int], dict[int, int]] = (0, (0, 0), {})
        # The driver's mirror of the leader replica's log (what L has durably): the Storage
        # its RaftNode reads. It starts at L's commit index (see _leader_view).
        self._view = MemoryStorage()
        self.fenced_reason = ""
        # Per-row outcomes reported by replicas as they apply committed entries (identical on
        # every replica: application is deterministic), until a writer takes them.
        self._results: dict[int, WriteResult] = {}
        self.copies = 0  # tablet copies this leader made
        self.last_catch_up_error = ""
        # Replicas that answered "failed" (corrupt files, full disk), with why: the client
        # reports them to the master, which has them replaced (peer.py, failed replicas).
        self.failed_replicas: dict[str, str] = {}
        self.config_index = 0  # log index of the last configuration change it applied
        # Requests that ride along with the next round (see _round_with, _defer): the round's
        # stage carries them in the same task as the Raft traffic, so they cost no job.
        self._attached: dict[str, list[PeerRequest]] = {}
        self._attached_front = False
        self._attached_out: dict[str, list[PeerResponse] | None] = {}
        self._deferred: list[PeerRequest] = []  # best effort, on L's host (e.g. DROP_COPY)
        # Requests of a Ready acknowledged ahead of its round (apply_ahead): they lead the
        # next round, before its own Raft traffic.
        self._carried: dict[str, list[PeerRequest]] = {}
        self._taken: Ready | None = None  # a Ready apply_ahead took but left to a round

    # -- lifecycle ---------------------------------------------------------------------------
    def create(self, schema_json: str = "") -> None:
        """Create every replica of a new tablet, bootstrapping the founding configuration.

        With ``schema_json`` each replica also gets its tablet (storage engine); without, the
        replicas are consensus-only (used by tests of the replication layer alone).
        """
        reqs = {v: [PeerRequest(RequestKind.CREATE, self.tablet.tablet_id, v,
                                voters=self.tablet.voters, schema_json=schema_json)]
                for v in self.tablet.voters}
        out = self._transport.run(reqs)
        failed = [v for v in self.tablet.voters if not _all_ok(out.get(v))]
        if len(failed) > len(self.tablet.voters) // 2:
            raise RoundFailedError(
                f"tablet {self.tablet.tablet_id}: could not create a majority of replicas "
                f"(failed on {failed}: {_errors(out, failed)})"
            )

    def elect(self) -> int:
        """Win an election for ``leader_id``; returns the term. Raises if it loses."""
        result = elect_all(self._transport, [self])[self]
        if isinstance(result, Exception):
            raise result
        return result

    # -- election phases (see elect_all) -----------------------------------------------------
    def begin_election(self, state: ReplicaState) -> tuple[Ready, PeerRequest]:
        """Become candidate over L's durable state; returns the Ready and L's self-vote."""
        self._view = _leader_view(state)
        self._carried = {}  # a previous leadership's notices are not this one's
        self._taken = None
        # What L's log held when it stood: lets a writer whose round failed under the
        # previous leader learn which of its entries this leader carries (terms_at).
        self._elected = (state.last_index, (state.hard_state.commit, state.commit_term),
                         {e.index: e.term for e in state.tail})
        self.node = node = RaftNode(Config(
            id=self.leader_id, storage=self._view, applied=state.hard_state.commit,
            rng=self._rng, max_size_per_msg=None, pre_vote=False, check_quorum=False,
        ))
        node.campaign()
        if node.role == Role.FOLLOWER:
            # Raft ignored the campaign: L is not a voter in the configuration its replica
            # has applied (a new voter that has not yet learned that its promotion
            # committed), or L committed a configuration change it has not applied yet.
            self.node = None
            raise FencedError(
                f"tablet {self.tablet.tablet_id}: replica {self.leader_id} may not stand for "
                f"election yet (voters in the configuration it has applied: "
                f"{sorted(state.conf_state.voters)}, commit index {state.hard_state.commit})")
        rd = node.ready()
        self_vote = Message(MessageType.VOTE, to=self.leader_id, frm=self.leader_id,
                            term=node.term, index=state.last_index, log_term=state.last_term)
        return rd, PeerRequest(RequestKind.STEP, self.tablet.tablet_id, self.leader_id,
                               messages=(self_vote,))

    def self_voted(self, rd: Ready, resp: PeerResponse | None) -> list[Message]:
        """L's own vote came back: acknowledge the candidacy; the votes to ask for."""
        node = self.node
        assert node is not None
        term = node.term
        granted = resp is not None and resp.ok and any(
            m.type == MessageType.VOTE_RESP and not m.reject and m.term == term
            for m in resp.messages)
        if not granted:
            self.node = None
            why = (resp.error if resp is not None and not resp.ok else
                   "it has moved on to a newer term or vote" if resp is not None else
                   "its tablet server did not answer")
            raise FencedError(f"tablet {self.tablet.tablet_id}: replica {self.leader_id} did "
                              f"not vote for itself in term {term} ({why})")
        assert rd.hard_state is not None
        if rd.entries:
            # A single-voter group: the self-vote already won, and the Ready carries the new
            # term's no-op. It is "persisted" by advance(), so L must really hold it first.
            self._run_one(self.leader_id, PeerRequest(
                RequestKind.PERSIST, self.tablet.tablet_id, self.leader_id, term=node.term,
                entries=rd.entries, hard_state=rd.hard_state))
            self._view.append(rd.entries)
        self._view.set_hard_state(rd.hard_state)
        node.advance(rd)
        return [m for m in rd.messages if m.type == MessageType.VOTE]

    def won(self) -> int:
        node = self.node
        if node is None or node.role != Role.LEADER:
            term = node.term if node is not None else 0
            self.node = None
            raise FencedError(f"tablet {self.tablet.tablet_id}: replica {self.leader_id} lost "
                              f"the election for term {term}")
        return node.term

    # -- writes ------------------------------------------------------------------------------
    def propose(self, batches: Sequence[bytes]) -> list[tuple[int, int]]:
        """Replicate ``batches``; returns each one's (index, term) once committed."""
        result = replicate(self._transport, {self: batches})[self]
        if isinstance(result, Exception):
            raise result
        return result

    def heartbeat(self) -> None:
        """A commit-only round: tells followers the commit index and collects their progress."""
        self._leader().broadcast_heartbeat()
        self.flush()

    def flush(self) -> None:
        """Run rounds until the ``RaftNode`` has nothing more to persist or send."""
        for _ in range(MAX_ROUNDS):
            errors = run_round(self._transport, [self])
            if self in errors:
                raise errors[self]
            if not self._leader().has_ready():
                return
        raise IllegalStateError(f"tablet {self.tablet.tablet_id}: rounds did not quiesce")

    # -- one round, in two halves (so that many tablets can share one stage) -----------------
    def stage_proposals(self, batches: Sequence[bytes]) -> list[tuple[int, int]]:
        """Append ``batches`` to the leader's log (not yet replicated); their positions."""
        node = self._leader()
        first = node.log.last_index() + 1
        node.propose_batch(batches)
        return [(first + k, node.term) for k in range(len(batches))]

    def take_results(self, indexes: Sequence[int]) -> dict[int, WriteResult]:
        """Per-row results of committed write entries ``indexes`` (see :func:`collect_results`)."""
        out = collect_results(self._transport, {self: indexes})[self]
        if isinstance(out, Exception):
            raise out
        return out

    def pop_results(self, indexes: Sequence[int]) -> dict[int, WriteResult] | None:
        if not set(indexes) <= self._results.keys():
            return None
        return {i: self._results.pop(i) for i in sorted(set(indexes))}

    def results_count(self, indexes: Sequence[int]) -> int:
        """How many of ``indexes`` have their per-row results here already."""
        return len(set(indexes) & self._results.keys())

    def terms_at(self, indexes: Sequence[int]) -> dict[int, int | None]:
        """The term of L's log entry at each of ``indexes`` when L was elected (None: L's
        log did not reach the index). Entries the election's state did not carry are read
        from L's log (one request). Call after this leader was elected, on the thread that
        runs its rounds.

        Raises:
            RoundFailedError: L's log could not be read (e.g. compacted past the index).
        """
        last, (commit, commit_term), tail = self._elected
        out: dict[int, int | None] = {}
        ask: list[int] = []
        for i in indexes:
            if i > last:
                out[i] = None
            elif i in tail:
                out[i] = tail[i]
            elif i == commit:
                out[i] = commit_term
            else:
                ask.append(i)
        lo, hi = (min(ask), max(ask) + 1) if ask else (0, 0)
        while lo < hi:
            resp = self._run_one(self.leader_id, PeerRequest(
                RequestKind.READ_ENTRIES, self.tablet.tablet_id, self.leader_id, lo=lo, hi=hi,
                as_refs=True))
            if not resp.entries:
                raise RoundFailedError(
                    f"tablet {self.tablet.tablet_id}: replica {self.leader_id} returned no "
                    f"log entry from index {lo}")
            out.update((e.index, e.term) for e in resp.entries if e.index in ask)
            lo = resp.entries[-1].index + 1
        return out

    def committed(self, index: int) -> bool:
        return self.node is not None and self.node.commit_index >= index

    def start_round(self, collecting: bool = False) -> _Round | None:
        """Take the ``RaftNode``'s Ready and turn it into requests per tablet server, plus
        any attached or deferred requests (a round of those alone when nothing is ready).
        ``collecting``: the round collects per-row results: L's replica is always asked,
        and followers persist what they are sent but apply committed writes later
        (``PeerRequest.collecting``)."""
        node = self._leader()
        extra = bool(self._attached or self._deferred or self._carried)
        rd, self._taken = self._taken, None
        if rd is None and node.has_ready():
            rd = node.ready()
        if rd is None and not extra:
            return None
        reqs = self._ready_requests(rd, collecting)
        carried, self._carried = self._carried, {}
        for ts, first in carried.items():
            lst = reqs.setdefault(ts, [])
            if (lst and first and lst[0].kind == first[-1].kind == RequestKind.STEP
                    and lst[0].collecting == first[-1].collecting):
                # One follower task steps both, older messages first.
                lst[0] = replace(lst[0], messages=(*first[-1].messages, *lst[0].messages))
                first = first[:-1]
            lst[0:0] = first
        attached: dict[str, tuple[int, int]] = {}  # ts -> (position, count) in its list
        for ts, extra_reqs in self._attached.items():
            lst = reqs.setdefault(ts, [])
            pos = 0 if self._attached_front else len(lst)
            lst[pos:pos] = extra_reqs
            attached[ts] = (pos, len(extra_reqs))
        if self._deferred:
            reqs.setdefault(self.leader_id, []).extend(self._deferred)
            self._deferred = []
        snaps = [m.to for m in rd.messages if m.type == MessageType.SNAP] if rd else []
        return _Round(rd, reqs, snaps, attached)

    def _ready_requests(self, rd: Ready | None, collecting: bool = False
                        ) -> dict[str, list[PeerRequest]]:
        """A Ready's requests per tablet server: L's PERSIST first, then AppendEntries etc.
        (SNAP messages are not sent: the driver catches such a follower up itself)."""
        node = self._leader()
        reqs: dict[str, list[PeerRequest]] = {}
        for m in rd.messages if rd is not None else ():
            if m.type == MessageType.SNAP:
                continue
            lst = reqs.setdefault(m.to, [])
            if lst and lst[-1].kind == RequestKind.STEP:
                lst[-1] = replace(lst[-1], messages=(*lst[-1].messages, m))
            else:
                lst.append(PeerRequest(RequestKind.STEP, self.tablet.tablet_id, m.to,
                                       messages=(m,), collecting=collecting))
        if (rd is not None and (rd.entries or rd.hard_state is not None)) or collecting:
            # A round collecting results always asks L's replica: it applies what committed
            # (a resident server for a bounded time, see ``spark/host/background_apply``)
            # and returns the results of what it applied since, in the background too.
            reqs.setdefault(self.leader_id, []).insert(0, PeerRequest(
                RequestKind.PERSIST, self.tablet.tablet_id, self.leader_id, term=node.term,
                entries=rd.entries if rd is not None else (),
                hard_state=rd.hard_state if rd is not None else None,
                collecting=collecting))
        return reqs

    def apply_ahead(self) -> bool:
        """Acknowledge the ``RaftNode``'s Ready now if it only announces a higher commit
        index (no entries or snapshot to persist first, no tablet copy due): the driver
        applies the newly committed entries -- a configuration change takes effect, and the
        next one may be proposed -- and the Ready's requests lead the next round (module
        rules). Returns whether it did."""
        node = self._leader()
        if not node.has_ready():
            return False
        rd = node.ready()
        if rd.entries or rd.snapshot is not None or any(
                m.type == MessageType.SNAP for m in rd.messages):
            self._taken = rd  # not a commit notice alone: the next round carries it
            return False
        for ts, reqs in self._ready_requests(rd).items():
            self._carried.setdefault(ts, []).extend(reqs)
        if rd.hard_state is not None:
            self._view.set_hard_state(rd.hard_state)
        node.advance(rd)
        return True

    def finish_round(self, rnd: _Round,
                     out: Mapping[str, Sequence[PeerResponse] | None]) -> None:
        """Step the responses to ``rnd`` into the ``RaftNode`` and acknowledge its Ready."""
        node = self._leader()
        persist_sent = any(r.kind == RequestKind.PERSIST
                           for r in rnd.requests.get(self.leader_id, []))
        leader_persisted = not persist_sent  # every PERSIST to L succeeded (a carried one too)
        persist_failed = False
        self._attached_out = {}
        for ts, (pos, count) in rnd.attached.items():
            resps = out.get(ts)
            self._attached_out[ts] = None if resps is None else list(resps[pos:pos + count])
        for ts, resps in out.items():
            if resps is None:
                continue
            for req, resp in zip(rnd.requests[ts], resps, strict=True):
                if resp.replica_failed:
                    self.failed_replicas[resp.replica_id] = resp.error
                if req.kind == RequestKind.PERSIST:
                    if resp.fenced:
                        self.fenced_reason = resp.error
                        self.node = None
                        raise FencedError(resp.error)
                    persist_failed = persist_failed or not resp.ok
                    leader_persisted = not persist_failed
                for m in resp.messages:
                    node.step(m)
                for res in resp.results:
                    self._results.setdefault(res.index, res)
        if not leader_persisted:
            # Without L's own write the Ready cannot be acknowledged (advance = "L persisted
            # it"), so this leadership is over: the client must elect again.
            self.node = None
            raise RoundFailedError(
                f"tablet {self.tablet.tablet_id}: the leader replica {self.leader_id} could not "
                f"persist its log; elect a leader again (possibly on another replica)")
        if rnd.ready is None:  # a round of attached requests only
            return
        # L persisted the Ready: mirror it, then let the RaftNode count L (its rule 3).
        self._view.append(rnd.ready.entries)
        if rnd.ready.hard_state is not None:
            self._view.set_hard_state(rnd.ready.hard_state)
        node.advance(rnd.ready)
        self._trim_view()
        for follower in rnd.snaps:
            self._catch_up(follower)
        if node.role != Role.LEADER:
            self.node = None
            raise FencedError(self.fenced_reason or (
                f"tablet {self.tablet.tablet_id}: {self.leader_id} is no longer the leader "
                f"(a newer term {node.term} exists)"))

    # -- internals ---------------------------------------------------------------------------
    def _leader(self) -> RaftNode:
        if self.node is None or self.node.role != Role.LEADER:
            raise FencedError(self.fenced_reason or (
                f"tablet {self.tablet.tablet_id}: this client is not the leader; call elect()"))
        return self.node

    def _run_many(self, ts: str, reqs: Sequence[PeerRequest]) -> list[PeerResponse]:
        """Several requests on one tablet server in one task, in order; all must succeed."""
        for _ in range(MAX_ROUND_ATTEMPTS):
            out = self._transport.run({ts: list(reqs)}).get(ts)
            if out is not None:
                bad = [r for r in out if not r.ok]
                if bad:
                    raise RoundFailedError(
                        f"tablet {self.tablet.tablet_id}: on replica {ts}: {bad[0].error}")
                return out
        raise RoundFailedError(
            f"tablet {self.tablet.tablet_id}: tablet server {ts} did not answer "
            f"after {MAX_ROUND_ATTEMPTS} attempts")

    def _run_one(self, ts: str, req: PeerRequest, allow_error: str = "") -> PeerResponse:
        """One request on one tablet server (retried if its task fails). A refused request
        raises, unless its error starts with ``allow_error``: then it is returned."""
        for _ in range(MAX_ROUND_ATTEMPTS):
            out = self._transport.run({ts: [req]}).get(ts)
            if out is not None:
                if out[0].replica_failed:
                    self.failed_replicas[ts] = out[0].error
                if allow_error and not out[0].ok and out[0].error.startswith(allow_error):
                    return out[0]
                if not out[0].ok:
                    raise RoundFailedError(
                        f"tablet {req.tablet_id}: {req.kind.value} on replica {ts} failed: "
                        f"{out[0].error}")
                return out[0]
        raise RoundFailedError(
            f"tablet {req.tablet_id}: tablet server {ts} did not answer {req.kind.value} "
            f"after {MAX_ROUND_ATTEMPTS} attempts")

    def _round_with(self, extra: Mapping[str, Sequence[PeerRequest]], front: bool = False
                    ) -> dict[str, list[PeerResponse] | None]:
        """One round carrying the ``RaftNode``'s Ready (if any) and ``extra`` requests, put
        before (``front``) or after the Raft traffic in each tablet server's task. Returns
        the extra requests' responses per tablet server (None: its task failed)."""
        self._attached = {ts: list(reqs) for ts, reqs in extra.items()}
        self._attached_front = front
        self._attached_out = {}
        try:
            errors = run_round(self._transport, [self])
        finally:
            self._attached = {}
        if self in errors:
            raise errors[self]
        return self._attached_out

    def _defer(self, req: PeerRequest) -> None:
        """A best-effort request for L's host, sent with the next round (its answer is not
        checked; e.g. dropping a tablet copy's staged parts). Known limit: if this
        leadership ends before another round, the parts stay under ``staging/copy-<id>`` on
        that host until its data root is cleaned."""
        self._deferred.append(req)

    def release(self, upto: int) -> None:
        """Entries up to ``upto`` must no longer be sent from the driver: their data may be
        staged-batch refs whose files are about to be removed. Drop them from the mirror
        (as far as they are committed and applied); a follower still missing them is then
        caught up from the leader replica's log (``_catch_up``), which holds the batches."""
        node = self.node
        if node is None or node.role != Role.LEADER:
            return
        floor = min(upto, node.log.applied, node.commit_index)
        if floor < self._view.first_index():
            return
        self._view.create_snapshot(floor, node.conf_state)
        self._view.compact(floor)

    @contextmanager
    def rounds_via(self, transport: PeerTransport) -> Iterator[None]:
        """Run this leader's rounds through ``transport`` meanwhile (e.g. a
        :class:`~pyspark_kudu.spark.replication.sharedrounds.SharedRounds` party)."""
        old, self._transport = self._transport, transport
        try:
            yield
        finally:
            self._transport = old

    def drop_results(self) -> None:
        """Forget per-row results nobody is waiting for (writes that did not ask)."""
        self._results.clear()

    def abandon(self, reason: str) -> None:
        """Give up this leadership (after a failed write): the next write elects again and
        rebuilds the log mirror from the replicas, which hold real batches, not refs."""
        self.node = None
        self.fenced_reason = reason

    def _trim_view(self) -> None:
        """Drop mirrored entries every member has and that are applied: the driver keeps
        only the log tail, not every batch ever written. A follower that still needs older
        entries gets them from the leader replica's WAL (``_catch_up``)."""
        node = self.node
        if node is None or node.role != Role.LEADER:
            return
        matches = [m for pid, (m, _) in node.status().progress.items() if pid != self.leader_id]
        floor = min([node.log.applied, node.commit_index, *matches])
        if floor - self._view.first_index() + 1 < _TRIM_BATCH or floor > node.log.applied:
            return
        self._view.create_snapshot(floor, node.conf_state)
        self._view.compact(floor)

@dataclass(frozen=True)
class _Round:
    ready: Ready | None  # None: a round of attached or deferred requests only
    requests: dict[str, list[PeerRequest]]
    snaps: list[str]
    attached: dict[str, tuple[int, int]]  # tablet server -> (position, count) of attached


def _leader_view(state: ReplicaState) -> MemoryStorage:
    """The driver's copy of L's log: a 'snapshot' at L's commit index plus L's tail."""
    hs = state.hard_state
    st = MemoryStorage(state.conf_state)
    if hs.commit > 0:
        st.apply_snapshot(Snapshot(SnapshotMetadata(hs.commit, state.commit_term,
                                                    state.conf_state)))
    st.append(list(state.tail))
    st.set_hard_state(hs)
    return st


def _errors(out: Mapping[str, list[PeerResponse] | None], which: Sequence[str]) -> str:
    parts = []
    for ts in which:
        resps = out.get(ts)
        parts.append(f"{ts}: " + ("task failed" if resps is None else
                                  "; ".join(r.error for r in resps if not r.ok)))
    return ", ".join(parts)

